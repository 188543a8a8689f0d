// [b, heads, n, hd] attention output → [b, n, heads·hd] input of the output projection: the
// transpose copy, one CUDA block per output row (src/fused/merge_heads.rs). Candle's strided
// copy did this at ≈0.3 TB/s on the H200.
#include "fused_common.cuh"

template <typename T>
__global__ void merge_heads_kernel(const T* __restrict__ o, T* __restrict__ y, int64_t n,
                                   int64_t heads, int64_t hd) {
  const int64_t row = blockIdx.x;
  const int64_t bi = row / n, ti = row % n;
  const int64_t d = heads * hd;
  T* yr = y + row * d;
  for (int64_t c = threadIdx.x; c < d; c += FUSED_THREADS) {
    const int64_t h = c / hd, j = c % hd;
    yr[c] = o[((bi * heads + h) * n + ti) * hd + j];
  }
}

extern "C" int mxa_merge_heads(const void* o, void* y, int dtype, int64_t rows, int64_t n,
                               int64_t heads, int64_t hd, gpuStream_t stream) {
  if (rows <= 0 || n <= 0 || rows % n != 0 || heads <= 0 || hd <= 0) return MXA_ERR_ARGS;
  FUSED_DISPATCH(dtype, T,
                 merge_heads_kernel<T><<<(unsigned)rows, FUSED_THREADS, 0, stream>>>(
                     (const T*)o, (T*)y, n, heads, hd));
  return mxa_status();
}
