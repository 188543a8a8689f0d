// [b, n, heads·hd] projection output → [b, heads, n, hd] attention operand, with the projection
// bias, the RMSNorm across all heads and the interleaved RoPE of the Wan attention folded in:
// one pass instead of bias-add, rms_norm, transpose copy, f32 cast, rope and cast back
// (src/fused/split_heads.rs). Intermediates are rounded to T where the unfused ops store T.
#include "fused_common.cuh"

template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ t, T* __restrict__ y, int64_t n,
                                   int64_t heads, int64_t hd, const T* __restrict__ bias,
                                   const T* __restrict__ norm_w, float eps,
                                   const float* __restrict__ cosv,
                                   const float* __restrict__ sinv) {
  const int64_t row = blockIdx.x;
  const int64_t bi = row / n, ti = row % n;
  const int64_t d = heads * hd;
  const T* tr = t + row * d;
  float inv = 1.f;
  if (norm_w) {
    float s = 0.f;
    for (int64_t c = threadIdx.x; c < d; c += FUSED_THREADS) {
      float u = Elem<T>::load(tr, c);
      if (bias) u = Elem<T>::round(u + Elem<T>::load(bias, c));
      s += u * u;
    }
    inv = 1.f / sqrtf(block_sum(s) / (float)d + eps);
  }
  const int64_t half = hd / 2;
  // one adjacent channel pair (2i, 2i+1) per step: the pair RoPE rotates
  for (int64_t p = threadIdx.x; p < d / 2; p += FUSED_THREADS) {
    const int64_t c = 2 * p, h = c / hd, j = c % hd;
    float u0 = Elem<T>::load(tr, c), u1 = Elem<T>::load(tr, c + 1);
    if (bias) {
      u0 = Elem<T>::round(u0 + Elem<T>::load(bias, c));
      u1 = Elem<T>::round(u1 + Elem<T>::load(bias, c + 1));
    }
    if (norm_w) {
      u0 = Elem<T>::round(u0 * inv * Elem<T>::load(norm_w, c));
      u1 = Elem<T>::round(u1 * inv * Elem<T>::load(norm_w, c + 1));
    }
    float o0 = u0, o1 = u1;
    if (cosv) {
      const float cs = cosv[ti * half + j / 2], sn = sinv[ti * half + j / 2];
      o0 = u0 * cs - u1 * sn;
      o1 = u0 * sn + u1 * cs;
    }
    T* yr = y + ((bi * heads + h) * n + ti) * hd;
    Elem<T>::store(yr, j, o0);
    Elem<T>::store(yr, j + 1, o1);
  }
}

extern "C" int mxa_split_heads(const void* t, void* y, int dtype, int64_t rows, int64_t n,
                               int64_t heads, int64_t hd, const void* bias, const void* norm_w,
                               float eps, const float* cosv, const float* sinv,
                               gpuStream_t stream) {
  if (rows <= 0 || n <= 0 || rows % n != 0 || heads <= 0 || hd <= 0 || hd % 2 != 0 ||
      (cosv == nullptr) != (sinv == nullptr))
    return MXA_ERR_ARGS;
  FUSED_DISPATCH(dtype, T,
                 split_heads_kernel<T><<<(unsigned)rows, FUSED_THREADS, 0, stream>>>(
                     (const T*)t, (T*)y, n, heads, hd, (const T*)bias, (const T*)norm_w, eps,
                     cosv, sinv));
  return mxa_status();
}
