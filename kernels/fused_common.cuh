// Shared pieces of the fused elementwise kernels (ada_layer_norm, split_heads, bias_residual,
// bias_gelu): element load/store in f32 for the three float dtypes and a block sum. One CUDA
// block per row of the last dim; rows are independent.
#pragma once
#include <stdint.h>
#include "gpu_compat.h"

enum FusedDtype { FUSED_F32 = 0, FUSED_BF16 = 1, FUSED_F16 = 2 };

template <typename T> struct Elem;
template <> struct Elem<float> {
  static __device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
  static __device__ __forceinline__ void store(float* p, int64_t i, float v) { p[i] = v; }
  static __device__ __forceinline__ float round(float v) { return v; }
};
template <> struct Elem<bf16_t> {
  static __device__ __forceinline__ float load(const bf16_t* p, int64_t i) { return bf16_to_f32(p[i]); }
  static __device__ __forceinline__ void store(bf16_t* p, int64_t i, float v) { p[i] = f32_to_bf16(v); }
  // the value a store-then-load gives: where the unfused ops hand a rounded tensor on
  static __device__ __forceinline__ float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};
template <> struct Elem<f16_t> {
  static __device__ __forceinline__ float load(const f16_t* p, int64_t i) { return f16_to_f32(p[i]); }
  static __device__ __forceinline__ void store(f16_t* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
  static __device__ __forceinline__ float round(float v) { return __half2float(__float2half_rn(v)); }
};

constexpr int FUSED_THREADS = 256;

// Sum over the block's FUSED_THREADS threads; every thread gets the result.
static __device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[FUSED_THREADS / 32];
  __shared__ float total;
  for (int m = 16; m > 0; m >>= 1) v += SHFL_XOR(v, m);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int w = 0; w < FUSED_THREADS / 32; ++w) s += part[w];
    total = s;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();  // `part`/`total` may be reused by the next call
  return r;
}

// Dispatches a templated launch on the dtype code.
#define FUSED_DISPATCH(dtype, T, ...)                       \
  switch (dtype) {                                          \
    case FUSED_F32: { typedef float T; __VA_ARGS__; break; } \
    case FUSED_BF16: { typedef bf16_t T; __VA_ARGS__; break; } \
    case FUSED_F16: { typedef f16_t T; __VA_ARGS__; break; } \
    default: return MXA_ERR_ARGS;                           \
  }
