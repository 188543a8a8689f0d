// Parameters of one attention call, shared with Rust (src/cuda/ffi.rs `AttnParams`,
// #[repr(C)]): same fields, same names, same order. build.rs checks the layout at build
// time (every offset and the size, from the Rust declaration).
#pragma once
#include <stdint.h>

enum AttnAlgo { ALGO_EXACT = 0, ALGO_ETQ = 1, ALGO_FUSED = 2, ALGO_EFQ = 3 };
enum ProbKind { PROB_F32 = 0, PROB_MX = 1, PROB_FP8 = 2 };
enum FusedKind { FUSED_U8 = 0, FUSED_F32BITS = 1, FUSED_EXACT_E4M3 = 2, FUSED_EXACT_F32 = 3 };
enum EfqKind { EFQ_AFFINE = 0, EFQ_LUT = 1, EFQ_EXACT = 2, EFQ_TWO_PIECE = 3 };
enum EfqScaleKind { EFQS_EFQ = 0, EFQS_FLOOR = 1, EFQS_RCEIL = 2 };
enum OperandKind { OPK_NATIVE = 0, OPK_BF16 = 1, OPK_MX = 2, OPK_PER_CHANNEL = 3 };

typedef struct {
  int32_t kind;  // OperandKind
  int32_t elem;  // MxFormat
  int32_t scale; // MxScaleMode
  int32_t block;
} OperandFmt;

typedef struct {
  // geometry
  int32_t b, hq, hkv, sq, sk, d;
  int32_t causal;
  int32_t in_dtype;   // 0 f32, 1 bf16, 2 f16
  int32_t out_dtype;  // 0 f32, 1 bf16, 2 f16
  int32_t with_lse;   // output row stride d + 1, LSE in the last column (f32 output)
  float softmax_scale;
  // score preparation
  float q_scale;
  float score_scale;
  int32_t hadamard;
  OperandFmt qk, v;
  // algorithm
  int32_t algo;       // AttnAlgo
  int32_t p_kind;     // ProbKind
  int32_t p_elem, p_scale, p_block;
  int32_t fused_kind; // FusedKind
  float fused_g, fused_off, fused_thr;
  int32_t efq_kind, efq_scale, efq_block;
  float efq_tau, efq_h;
  // host-computed constants, so both sides round them the same way
  float ln2, log2e, ln_2_over_9, ln6, log2_6;
  float lut_tau, lut_h;
  float log2_075, log2_125;
  float hadamard_scale;  // 1/sqrt(d)
  float log2_mid[7];
  // valid keys per batch entry (device pointer, b entries)
  const int32_t* kv_lens;
  // exact-threshold tables (device pointers, f32): pow2[150], six[128], code[128*7]
  const float* thr_pow2;
  const float* thr_six;
  const float* thr_code;
} AttnParams;
