// GELU (tanh approximation) of a projection output with its bias folded in, computed in f32:
// the FFN's up-projection epilogue (src/fused/bias_gelu.rs).
#include "fused_common.cuh"

template <typename T>
__global__ void bias_gelu_kernel(const T* __restrict__ t, T* __restrict__ out, int64_t d,
                                 const T* __restrict__ bias) {
  const int64_t base = (int64_t)blockIdx.x * d;
  for (int64_t c = threadIdx.x; c < d; c += FUSED_THREADS) {
    float v = Elem<T>::load(t, base + c);
    if (bias) v = Elem<T>::round(v + Elem<T>::load(bias, c));
    const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    Elem<T>::store(out, base + c, 0.5f * v * (1.f + tanhf(inner)));
  }
}

extern "C" int mxa_bias_gelu(const void* t, void* out, int dtype, int64_t rows, int64_t d,
                             const void* bias, gpuStream_t stream) {
  if (rows <= 0 || d <= 0) return MXA_ERR_ARGS;
  FUSED_DISPATCH(dtype, T,
                 bias_gelu_kernel<T><<<(unsigned)rows, FUSED_THREADS, 0, stream>>>(
                     (const T*)t, (T*)out, d, (const T*)bias));
  return mxa_status();
}
