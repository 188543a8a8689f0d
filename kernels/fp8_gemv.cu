// Decode-shaped products of mxattn-fp8's linear layers: a few tokens against FP8 E4M3 weights
// with a scale per output channel (a tensor scale broadcast to that vector), where cuBLASLt's
// FP8 GEMM, built for large tiles, stays far from the memory bound (bench_fp8_linear.md: one
// token at 0.50-1.00x of the BF16 GEMM). A decode step reads every weight once, so the kernel
// is a GEMV: one warp per output channel streams its codes 16 bytes per lane and multiplies
// them with up to GEMV_MAX_T tokens at once, so the weight bytes are read once per call.
//
//   y[t, o] = sw[o] * sx[t] * sum_k E4M3(xc[t, k]) * E4M3(w[o, k])  (+ bias[o])   ACT_FP8
//   y[t, o] = sw[o]         * sum_k x[t, k]        * E4M3(w[o, k])  (+ bias[o])   weight-only
//
// The first is the `fp8` layer (activations quantized per token by fp8_quantize.cu), the same
// exact FP8 products as the GEMM; the second the weight-only `fp8-w` layer (activations as
// they come, f32/bf16/f16). Both accumulate in f32 (the CPU reference's sums in another
// order: crates/fp8's tolerance). `fp8_dequant` writes the codes' values unscaled (exact in
// bf16 and f16: E4M3 has 3 mantissa bits and exponents 2^-9..2^8) for the weight-only layer's
// many-token product, a BF16 GEMM whose output the caller scales per channel.
//
// Layouts (crates/fp8/src/cuda.rs): w [out_p][ldw] bytes, ldw a multiple of 16 and zero
// codes in [k, ldw); xc [t_p][ldw] with the same padding; x [t][ldx] elements.
#include <stdint.h>
#include "fused_common.cuh"
#include "mx_codec.cuh"
#if !defined(__HIPCC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_MAX_T = 8;

// Four E4M3 codes (one 32-bit word, lowest byte first) to their values.
static __device__ __forceinline__ void e4m3x4(unsigned w, float* f) {
#if !defined(__HIPCC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // the hardware conversion (Ada, Hopper): exact, E4M3 fits in f16
  const __half2 lo(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFFu), __NV_E4M3));
  const __half2 hi(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = mx_decode((w >> (8 * i)) & 0xFFu, FMT_E4M3);
#endif
}

static __device__ __forceinline__ void e4m3x16(uint4 c, float* f) {
  e4m3x4(c.x, f);
  e4m3x4(c.y, f + 4);
  e4m3x4(c.z, f + 8);
  e4m3x4(c.w, f + 12);
}

// 16 activations x[j .. j+16) of one row as f32; `vec`: the row is 16-byte aligned there and
// holds all 16 (else element loads, those at or past k read as 0).
template <typename XT>
static __device__ __forceinline__ void load16(const XT* __restrict__ x, int64_t j, int64_t k, bool vec, float* f) {
  if (vec) {
    constexpr int PER = 16 / (int)sizeof(XT);  // elements per 16-byte load
#pragma unroll
    for (int v = 0; v < 16 / PER; ++v) {
      const uint4 u = *reinterpret_cast<const uint4*>(x + j + v * PER);
      const XT* e = reinterpret_cast<const XT*>(&u);
#pragma unroll
      for (int i = 0; i < PER; ++i) f[v * PER + i] = Elem<XT>::load(e, i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) f[i] = (j + i < k) ? Elem<XT>::load(x, j + i) : 0.0f;
  }
}

// acc[t] += sum over this lane's 16-code steps of the weight row `wr` times token t's row.
// VEC: 16-byte activation loads (see load16). Unrolled so that several 16-byte loads per lane
// are in flight: the kernel is meant to be bandwidth-bound, and one load at a time per warp
// leaves it latency-bound.
template <int T, typename XT, bool VEC>
static __device__ __forceinline__ void gemv_row(const uint8_t* __restrict__ wr, const XT* __restrict__ x,
                                                int64_t ldx, int64_t k, int lane, float* acc) {
  constexpr bool ACT_FP8 = sizeof(XT) == 1;
#pragma unroll 4
  for (int64_t j = (int64_t)lane * 16; j < k; j += 32 * 16) {
    float wf[16];
    e4m3x16(__ldg(reinterpret_cast<const uint4*>(wr + j)), wf);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xf[16];
      if constexpr (ACT_FP8) {
        e4m3x16(__ldg(reinterpret_cast<const uint4*>(x + t * ldx + j)), xf);
      } else {
        load16<XT>(x + t * ldx, j, k, VEC, xf);
      }
#pragma unroll
      for (int i = 0; i < 16; ++i) acc[t] = fmaf(xf[i], wf[i], acc[t]);
    }
  }
}

// One warp per output channel; T tokens. XT: the activations' type (uint8_t: E4M3 codes
// with per-token scales sx); OT: the output's.
template <int T, typename XT, typename OT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    fp8_gemv_kernel(const uint8_t* __restrict__ w, int64_t ldw, const float* __restrict__ sw,
                    const XT* __restrict__ x, int64_t ldx, const float* __restrict__ sx,
                    const float* __restrict__ bias, OT* __restrict__ y, int64_t out, int64_t k, int vec) {
  constexpr bool ACT_FP8 = sizeof(XT) == 1;
  const int lane = threadIdx.x & 31;
  const int64_t o = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (o >= out) return;
  float acc[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc[t] = 0.0f;
  const uint8_t* wr = w + o * ldw;
  if (ACT_FP8 || vec)
    gemv_row<T, XT, true>(wr, x, ldx, k, lane, acc);
  else
    gemv_row<T, XT, false>(wr, x, ldx, k, lane, acc);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = acc[t];
    for (int m = 16; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    acc[t] = v;
  }
  if (lane != 0) return;
  const float s = sw[o];
  const float b = bias ? bias[o] : 0.0f;
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float v = ACT_FP8 ? acc[t] * s * sx[t] : acc[t] * s;
    Elem<OT>::store(y, t * out + o, v + b);
  }
}

template <int T, typename XT, typename OT>
static void launch_gemv(const uint8_t* w, int64_t ldw, const float* sw, const void* x, int64_t ldx,
                        const float* sx, const float* bias, void* y, int64_t out, int64_t k, int vec,
                        gpuStream_t stream) {
  const unsigned blocks = (unsigned)((out + GEMV_WARPS - 1) / GEMV_WARPS);
  fp8_gemv_kernel<T, XT, OT><<<blocks, GEMV_WARPS * 32, 0, stream>>>(
      w, ldw, sw, (const XT*)x, ldx, sx, bias, (OT*)y, out, k, vec);
}

template <typename XT, typename OT>
static int gemv_t(int64_t t, const uint8_t* w, int64_t ldw, const float* sw, const void* x, int64_t ldx,
                  const float* sx, const float* bias, void* y, int64_t out, int64_t k, int vec, gpuStream_t s) {
  switch (t) {
    case 1: launch_gemv<1, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 2: launch_gemv<2, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 3: launch_gemv<3, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 4: launch_gemv<4, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 5: launch_gemv<5, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 6: launch_gemv<6, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 7: launch_gemv<7, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    case 8: launch_gemv<8, XT, OT>(w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, s); break;
    default: return MXA_ERR_ARGS;
  }
  return mxa_status();
}

// x_dtype: 0 f32, 1 bf16, 2 f16 (activations as they come; sx unused; the output in the same
// dtype, as the layers return it: one instance per dtype, not per pair), 3 E4M3 codes with
// per-token scales sx. out_dtype: 0 f32, 1 bf16, 2 f16. bias: f32 [out] or null.
extern "C" int mxa_fp8_gemv(const uint8_t* w, int64_t ldw, const float* sw, const void* x, int x_dtype, int64_t ldx,
                            const float* sx, const float* bias, void* y, int out_dtype, int64_t t, int64_t out,
                            int64_t k, gpuStream_t stream) {
  if (t <= 0 || out <= 0) return MXA_OK;
  if (t > GEMV_MAX_T || k <= 0 || ldw < k || ldw % 16 != 0 || ((uintptr_t)w & 15) != 0 || ldx < k) return MXA_ERR_ARGS;
  if ((out + GEMV_WARPS - 1) / GEMV_WARPS > 0x7FFFFFFFLL) return MXA_ERR_ARGS;
  if (x_dtype == 3) {
    if (!sx || ldx != ldw || ((uintptr_t)x & 15) != 0) return MXA_ERR_ARGS;
    switch (out_dtype) {
      case FUSED_F32: return gemv_t<uint8_t, float>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, 1, stream);
      case FUSED_BF16: return gemv_t<uint8_t, bf16_t>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, 1, stream);
      case FUSED_F16: return gemv_t<uint8_t, f16_t>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, 1, stream);
      default: return MXA_ERR_ARGS;
    }
  }
  if (out_dtype != x_dtype) return MXA_ERR_ARGS;
  const int esize = x_dtype == 0 ? 4 : 2;
  // 16-byte loads where every row's every 16-element step is aligned and whole
  const int vec = ((uintptr_t)x % 16 == 0) && ((ldx * esize) % 16 == 0) && (k % 16 == 0);
  switch (x_dtype) {
    case FUSED_F32: return gemv_t<float, float>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, stream);
    case FUSED_BF16: return gemv_t<bf16_t, bf16_t>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, stream);
    case FUSED_F16: return gemv_t<f16_t, f16_t>(t, w, ldw, sw, x, ldx, sx, bias, y, out, k, vec, stream);
    default: return MXA_ERR_ARGS;
  }
}

template <typename OT>
__global__ void fp8_dequant_kernel(const uint8_t* __restrict__ w, int64_t ldw, int64_t rows, int64_t k,
                                   OT* __restrict__ dst) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * k) return;
  Elem<OT>::store(dst, i, mx_decode(w[(i / k) * ldw + i % k], FMT_E4M3));
}

// dst [rows][k] (dtype 0 f32, 1 bf16, 2 f16) = the unscaled values of codes w [rows][ldw].
extern "C" int mxa_fp8_dequant(const uint8_t* w, int64_t ldw, int64_t rows, int64_t k, void* dst, int dtype,
                               gpuStream_t stream) {
  if (rows <= 0 || k <= 0) return MXA_OK;
  if (ldw < k) return MXA_ERR_ARGS;
  const int threads = 256;
  const int64_t blocks = (rows * k + threads - 1) / threads;
  if (blocks > 0x7FFFFFFFLL) return MXA_ERR_ARGS;
  switch (dtype) {
    case FUSED_F32: fp8_dequant_kernel<float><<<(unsigned)blocks, threads, 0, stream>>>(w, ldw, rows, k, (float*)dst); break;
    case FUSED_BF16: fp8_dequant_kernel<bf16_t><<<(unsigned)blocks, threads, 0, stream>>>(w, ldw, rows, k, (bf16_t*)dst); break;
    case FUSED_F16: fp8_dequant_kernel<f16_t><<<(unsigned)blocks, threads, 0, stream>>>(w, ldw, rows, k, (f16_t*)dst); break;
    default: return MXA_ERR_ARGS;
  }
  return mxa_status();
}
