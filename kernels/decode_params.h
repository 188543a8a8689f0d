// Parameters of one decode call, shared with Rust (src/cuda/ffi.rs `DecodeParams`,
// #[repr(C)]): same fields, same names, same order. build.rs checks the layout at build
// time (every offset and the size, from the Rust declaration).
#pragma once
#include <stdint.h>

typedef struct {
  int32_t b, hq, hkv, sq, n, causal;
  float scale_log2;  // softmax scale · log2(e)
  int32_t q_dtype, out_dtype;
  int32_t k_kind, k_fmt;  // DecKind; MxFormat when MX
  int32_t v_kind, v_fmt;
  int32_t v_full;      // MX V: keys in the quantized part (a multiple of 32)
  int32_t v_row_bytes; // MX V: code bytes per channel row
  int32_t v_tail_kind; // DecKind of the unquantized V tail
  int32_t splits;
  const void* q;
  const void* k;        // dense [b, hkv, n, D] or MX codes [b, hkv, n, packed(D)]
  const uint8_t* k_sc;  // MX: [b, hkv, n, D/32]
  const void* v;        // dense [b, hkv, n, D] or MX codes [b, hkv, D, v_row_bytes]
  const uint8_t* v_sc;  // MX: [b, hkv, D, v_full/32]
  const void* v_tail;   // MX: [b, hkv, n - v_full, D]
  float* part_o;        // [splits, b·hq·sq, D]
  float* part_ml;       // [splits, b·hq·sq, 2]
  void* out;            // [b, hq, sq, D]
} DecodeParams;
