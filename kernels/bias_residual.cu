// Residual add of a projection output with its bias and an optional f32 gate folded in:
// out = x + (y + bias)·(gate + gate_add), computed in f32 and rounded once (src/fused/bias_residual.rs).
#include "fused_common.cuh"

template <typename T>
__global__ void bias_residual_kernel(const T* __restrict__ x, const T* __restrict__ y,
                                     T* __restrict__ out, int64_t n, int64_t d,
                                     const T* __restrict__ bias, const float* __restrict__ gate,
                                     int64_t g_b, int64_t g_n, const float* __restrict__ g_add) {
  const int64_t row = blockIdx.x;
  const int64_t bi = row / n, ti = row % n;
  const float* gr = gate ? gate + bi * g_b + ti * g_n : nullptr;
  const int64_t base = row * d;
  for (int64_t c = threadIdx.x; c < d; c += FUSED_THREADS) {
    float v = Elem<T>::load(y, base + c);
    // the projection's output is a T tensor in the unfused chain: round after the bias
    if (bias) v = Elem<T>::round(v + Elem<T>::load(bias, c));
    if (gr) v *= g_add ? gr[c] + g_add[c] : gr[c];
    Elem<T>::store(out, base + c, Elem<T>::load(x, base + c) + v);
  }
}

extern "C" int mxa_bias_residual(const void* x, const void* y, void* out, int dtype, int64_t rows,
                                 int64_t n, int64_t d, const void* bias, const float* gate,
                                 int64_t g_b, int64_t g_n, const float* g_add,
                                 gpuStream_t stream) {
  if (rows <= 0 || n <= 0 || d <= 0 || rows % n != 0) return MXA_ERR_ARGS;
  FUSED_DISPATCH(dtype, T,
                 bias_residual_kernel<T><<<(unsigned)rows, FUSED_THREADS, 0, stream>>>(
                     (const T*)x, (const T*)y, (T*)out, n, d, (const T*)bias, gate, g_b, g_n, g_add));
  return mxa_status();
}
