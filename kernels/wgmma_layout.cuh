// Packed-operand layout of the wgmma attention kernel (attention_wgmma.cu), shared with
// the packing kernels (attention_wgmma_pack.cu): tile geometry, the 128-byte swizzle,
// the key permutation of Vᵀ, and the E4M3 fit of a row or tile scale.
#pragma once
#include <stdint.h>
#include "gpu_compat.h"

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
  int e;
  const float m = frexpf(amax / 448.0f, &e);
  if (m == 0.5f) e -= 1;
  if (ldexpf(448.0f, e) < amax) e += 1;
  while (e > -126 && ldexpf(448.0f, e - 1) >= amax) e -= 1;
  return e;
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

}  // namespace wg
