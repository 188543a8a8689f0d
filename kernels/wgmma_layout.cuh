// Packed-operand layout of the wgmma attention kernel (attention_wgmma.cu), shared with
// the packing kernels (attention_wgmma_pack.cu): tile geometry, the 128-byte swizzle,
// the key permutation of Vᵀ, the E4M3 fit of a row or tile scale, and the fast MX rounding
// both use.
#pragma once
#include <stdint.h>
#include <cuda_fp8.h>
#include "gpu_compat.h"
#include "attention_params.h"
#include "mx_codec.cuh"

namespace wg {

// Head dims the kernel is instantiated for. Q and K rows are D·ES bytes: 128 or 256 bytes
// (128-byte column blocks, 128-byte swizzle), or 64 for FP8 at D = 64 (one 64-byte column,
// 64-byte swizzle). Vᵀ rows are a tile's keys: BC·ES ≥ 128 bytes at every D.
constexpr int D_MAX = 128;
constexpr int BR = 64;        // query rows per CTA (one warpgroup)
constexpr int BC_ALL = 128;   // keys per KV tile (and per K scale)
// Vᵀ rows in shared memory: D channels, the ones row, 7 zero rows
static __host__ __device__ constexpr int vrows(int d) { return d + 8; }
static __host__ __device__ constexpr bool head_dim_ok(int d) { return d == 64 || d == 128; }
// Bytes per swizzled row of a Q/K tile (the swizzle span): 128, or 64 for 64-byte rows.
static __host__ __device__ constexpr int row_span(int row_bytes) { return row_bytes < 128 ? 64 : 128; }

// Byte offset of 16-byte chunk `c` of row `r` in a tile of `rows` rows stored as 128-byte
// column blocks (the layout desc_sw128 describes).
static __device__ __forceinline__ uint32_t sw128(int rows, int r, int c) {
  return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}
// The same for 64-byte rows (desc_sw64): 8-row atoms of 512 bytes, the 16-byte chunk index
// XORed with address bits 7-8, i.e. with (r / 2) mod 4.
static __device__ __forceinline__ uint32_t sw64(int r, int c) {
  return (uint32_t)(r * 64 + (((c & 3) ^ ((r >> 1) & 3)) << 4));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const uint32_t l = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// Smallest e with amax ≤ 448·2^e (0 for amax = 0): the power-of-two scale that fits a
// row or tile of quantized values into E4M3 without saturating.
static __device__ __forceinline__ int e4m3_fit_exp(float amax) {
  if (!(amax > 0.0f)) return 0;
  // Finite amax ≥ 2^−100 (every row in practice): that least e is ⌊log2 amax⌋ − 8, or − 7 where
  // amax's significand exceeds 448's (1.75), from the bits in a few instructions instead of
  // the division, frexpf and ldexpf below, which give the same e there: e ≥ −108, so
  // the loop's −126 floor is not reached (kernels/NOTES.md v3 item 19).
  const unsigned b = __float_as_uint(amax);
  if (b >= 0x0D800000u && b < 0x7F800000u) return (int)(b >> 23) - 135 + ((b & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  int e;
  const float m = frexpf(amax / 448.0f, &e);
  if (m == 0.5f) e -= 1;
  if (ldexpf(448.0f, e) < amax) e += 1;
  while (e > -126 && ldexpf(448.0f, e - 1) >= amax) e -= 1;
  return e;
}

// ldexpf(1.0f, k) for any k, from the exponent bits where 2^k is a normal float (always for
// the scales of e4m3_fit_exp's fast range) rather than ldexpf's general code.
static __device__ __forceinline__ float exp2i(int k) {
  if (k >= -126 && k <= 127) return __int_as_float((k + 127) << 23);
  return ldexpf(1.0f, k);
}

// ---------------------------------------------------------------- operand packing
//
// Global layouts the kernel copies verbatim into shared memory (one bulk copy per tile):
// * Q: per head, blocks of BR rows, each [colblock][BR rows][128 B], 16-byte chunks
//   XOR-swizzled by row (sw128); FP8 at D = 64: [BR rows][64 B], swizzled by sw64;
// * K: per head, tiles of BC keys, each [colblock][BC keys][128 B], swizzled the same way;
// * Vᵀ: per head, tiles of BC keys, each [colblock][D channels][128 B] (sw128 at every D): channel rows of
//   the tile's keys (FP8: permuted per 32-key group by perm_pos), swizzled.

// Position of key j of a 32-key group in the PV A fragment (see the file comment): the
// thread holding S columns {2t, 2t+1, 2t+8, 2t+9} of a 16-key half feeds k = 4t..4t+3.
static __host__ __device__ constexpr int perm_pos(int j) {
  return (j & 16) + 4 * ((j >> 1) & 3) + (j & 1) + 2 * ((j >> 3) & 1);
}

// Byte offset of byte `b` of row `r` in a packed tile of `rows` rows of `row_bytes` bytes.
static __device__ __forceinline__ int64_t tile_off(int rows, int row_bytes, int r, int b) {
  const uint32_t c = row_span(row_bytes) == 64 ? sw64(r, b >> 4) : sw128(rows, r, b >> 4);
  return (int64_t)c + (b & 15);
}

// mx_decode(mx_encode(a, FMT_E2M1)) for a ≥ 0 (not NaN), branch-free: from 1 up, round the
// f32 to one mantissa bit, nearest-even, on its bits; below 1, the subnormal grid of 0.5;
// saturate at 6. (Checked against mx_encode/mx_decode on every 7th f32 bit pattern.)
static __device__ __forceinline__ float e2m1_round_nonneg(float a) {
  const unsigned b = __float_as_uint(a);
  const float hi = __uint_as_float((b + 0x1FFFFFu + ((b >> 22) & 1u)) & 0xFFC00000u);
  const float lo = rintf(a * 2.0f) * 0.5f;
  return fminf(a < 1.0f ? lo : hi, 6.0f);
}

// mx_decode(mx_encode(a, FMT), FMT) for FMT E4M3 or E5M2 and a not NaN (either sign): the
// hardware's round-to-nearest-even saturating conversion and back (every E4M3/E5M2 value is
// a half), without mx_encode's per-element branches.
template <int FMT>
static __device__ __forceinline__ float fp8_round(float a) {
  constexpr __nv_fp8_interpretation_t I = FMT == FMT_E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(a, __NV_SATFINITE, I), I);
  return __half2float(__half(h));
}

// fp8_round<FMT_E4M3> of two values, one conversion each way for both (the hardware rounds
// each element as the one-element conversion does).
static __device__ __forceinline__ float2 fp8x2_round_e4m3(float a, float b) {
  const __nv_fp8x2_storage_t c = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(c, __NV_E4M3)));
}

// The packing kernels' MX rounding, specialised at compile time (kernels/NOTES.md v3 item 13):
// MXE = FMT_E4M3 or FMT_E2M1 where the call's format is that element (MX or per-channel),
// −1 for any other (the generic codec, elem at run time).
static __host__ __device__ constexpr int mx_fast_elem(int kind, int elem) {
  return (kind == OPK_MX || kind == OPK_PER_CHANNEL) && (elem == FMT_E4M3 || elem == FMT_E2M1) ? elem : -1;
}

// mx_decode(mx_encode(v, elem), elem) for a finite v: for E4M3 the hardware conversion, for
// E2M1 the rounding on the f32's bits (the sign put back: the codec is sign-symmetric, −0
// included), else the codec.
template <int MXE>
static __device__ __forceinline__ float mx_round(float v, int elem) {
  if constexpr (MXE == FMT_E4M3) return fp8_round<FMT_E4M3>(v);
  else if constexpr (MXE == FMT_E2M1) return copysignf(e2m1_round_nonneg(fabsf(v)), v);
  else return mx_decode(mx_encode(v, elem), elem);
}

}  // namespace wg
