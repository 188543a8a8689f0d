// FP8 (E4M3) activations for mxattn-fp8's linear layers, its weights quantized at load
// (per channel: the row kernel; blocks and tensor scales: the group kernels below), and the
// epilogue of its fallback GEMM. The quantization is bit-identical to crates/fp8's CPU
// reference (`quantize_activations_grouped`; `Fp8Weight::quantize` for weights): per row and `group`-wide slice along the row (the last
// one may be shorter), amax -> scale = amax / 448 in f32 (1 for an all-zero slice) ->
// code = E4M3(x / scale), the division in f32 (IEEE, nvcc's default -prec-div=true), round
// to nearest even, saturating (mx_codec.cuh's `mx_encode`, checked code for code against
// src/mx/element.rs). Inputs are f32, bf16 or f16, widened to f32 exactly, as the CPU
// reference widens them. Compiled without FMA contraction (build.rs NO_FMA).
//
// Layout the GEMM reads (crates/fp8/src/cuda.rs):
//   codes  [rows_p][ldc] bytes, row r's codes first, zeros in the padded columns [k, ldc)
//          and in the padded rows [rows, rows_p);
//   scales [groups][rows_p] f32, scale of row r's group g at g * rows_p + r (token-major:
//          cuBLASLt's VEC128_32F layout for B, and the OUTER_VEC_32F vector for one group);
//          padded rows get scale 1.
// A non-finite input sets bit 16 of `*flags` (the deferred-check word of src/cuda/
// attention/checks.rs, or a fresh one read at the end of the call); its codes are then
// meaningless (the CPU reference errs instead).
#include <stdint.h>
#include "mx_codec.cuh"

enum Fp8InDtype { FP8_IN_F32 = 0, FP8_IN_BF16 = 1, FP8_IN_F16 = 2 };

#define FP8_FLAG_NONFINITE 16u

static __device__ __forceinline__ float fp8_load(const void* p, int64_t i, int dtype) {
  if (dtype == FP8_IN_BF16) return bf16_to_f32(((const bf16_t*)p)[i]);
  if (dtype == FP8_IN_F16) return f16_to_f32(((const f16_t*)p)[i]);
  return ((const float*)p)[i];
}

// One block per (row, group). blockDim.x is a multiple of 32, at most 1024.
__global__ void fp8_quantize_kernel(const void* __restrict__ x, int dtype, int64_t rows, int64_t rows_p,
                                    int64_t k, int64_t ldc, int64_t group, int64_t groups,
                                    uint8_t* __restrict__ codes, float* __restrict__ scales,
                                    unsigned* __restrict__ flags) {
  __shared__ float warp_max[32];
  __shared__ int warp_bad[32];
  const int64_t r = (int64_t)blockIdx.x / groups;
  const int64_t g = (int64_t)blockIdx.x % groups;
  const int64_t j0 = g * group;
  const int64_t len = (j0 + group <= k) ? group : k - j0;
  // the last group also clears the row's padded columns
  const int64_t end = (g == groups - 1) ? ldc - j0 : len;
  uint8_t* crow = codes + r * ldc + j0;
  if (r >= rows) {
    for (int64_t j = threadIdx.x; j < end; j += blockDim.x) crow[j] = 0;
    if (threadIdx.x == 0) scales[g * rows_p + r] = 1.0f;
    return;
  }
  const int64_t base = r * k + j0;
  float amax = 0.0f;
  int bad = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const float v = fp8_load(x, base + j, dtype);
    bad |= !isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  for (int m = 16; m > 0; m >>= 1) {
    amax = fmaxf(amax, SHFL_XOR(amax, m));
    bad |= SHFL_XOR(bad, m);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = amax;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  const int nwarps = blockDim.x / 32;
  amax = 0.0f;
  bad = 0;
  for (int w = 0; w < nwarps; w++) {
    amax = fmaxf(amax, warp_max[w]);
    bad |= warp_bad[w];
  }
  // src: crates/fp8 `group_scale`
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
    crow[j] = j < len ? (uint8_t)mx_encode(fp8_load(x, base + j, dtype) / s, FMT_E4M3) : (uint8_t)0;
  }
  if (threadIdx.x == 0) {
    scales[g * rows_p + r] = s;
    if (bad && flags) atomicOr(flags, FP8_FLAG_NONFINITE);
  }
}

// Weights with one scale per `brows` x `bcols` group (mxattn-fp8's 128 x 128 blocks; the
// whole matrix for a tensor scale), quantized at load on the device (crates/fp8/src/cuda.rs)
// bit for bit as the CPU's `Fp8Weight::quantize`: the group's amax -> scale = amax / 448 in
// f32 (1 for an all-zero group) -> code = E4M3(w / scale). A group spans many rows, so two
// passes: the amax of each (row, column group) slice, combined across the group's rows with
// an integer atomicMax (non-negative floats order as their bits), then the codes.
// Layout: codes as above ([rows_p][ldc], zero padding); scales [ceil(rows / brows)][lds],
// group (rb, cb) at rb * lds + cb, 1 in the padded columns [groups_c, lds).

// One block per (row, column group), rows < `rows` only. amax_bits zeroed by the caller.
__global__ void fp8_group_amax_kernel(const void* __restrict__ x, int dtype, int64_t rows, int64_t k,
                                      int64_t brows, int64_t bcols, int64_t groups_c,
                                      unsigned* __restrict__ amax_bits, unsigned* __restrict__ flags) {
  __shared__ float warp_max[32];
  __shared__ int warp_bad[32];
  const int64_t r = (int64_t)blockIdx.x / groups_c;
  const int64_t g = (int64_t)blockIdx.x % groups_c;
  const int64_t j0 = g * bcols;
  const int64_t len = (j0 + bcols <= k) ? bcols : k - j0;
  const int64_t base = r * k + j0;
  float amax = 0.0f;
  int bad = 0;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const float v = fp8_load(x, base + j, dtype);
    bad |= !isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  for (int m = 16; m > 0; m >>= 1) {
    amax = fmaxf(amax, SHFL_XOR(amax, m));
    bad |= SHFL_XOR(bad, m);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = amax;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nwarps = blockDim.x / 32;
    amax = 0.0f;
    bad = 0;
    for (int w = 0; w < nwarps; w++) {
      amax = fmaxf(amax, warp_max[w]);
      bad |= warp_bad[w];
    }
    atomicMax(&amax_bits[(r / brows) * groups_c + g], __float_as_uint(amax));
    if (bad && flags) atomicOr(flags, FP8_FLAG_NONFINITE);
  }
}

// One block per (row, column group), rows < rows_p (the padded rows get zero codes).
__global__ void fp8_group_encode_kernel(const void* __restrict__ x, int dtype, int64_t rows, int64_t k,
                                        int64_t ldc, int64_t brows, int64_t bcols, int64_t groups_c,
                                        const unsigned* __restrict__ amax_bits, int64_t lds,
                                        uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int64_t r = (int64_t)blockIdx.x / groups_c;
  const int64_t g = (int64_t)blockIdx.x % groups_c;
  const int64_t j0 = g * bcols;
  const int64_t len = (j0 + bcols <= k) ? bcols : k - j0;
  // the last group also clears the row's padded columns
  const int64_t end = (g == groups_c - 1) ? ldc - j0 : len;
  uint8_t* crow = codes + r * ldc + j0;
  if (r >= rows) {
    for (int64_t j = threadIdx.x; j < end; j += blockDim.x) crow[j] = 0;
    return;
  }
  const int64_t rb = r / brows;
  const float amax = __uint_as_float(amax_bits[rb * groups_c + g]);
  // src: crates/fp8 `group_scale`
  const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
  const int64_t base = r * k + j0;
  for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
    crow[j] = j < len ? (uint8_t)mx_encode(fp8_load(x, base + j, dtype) / s, FMT_E4M3) : (uint8_t)0;
  }
  // the group's first row writes its scale (and the last group the row's scale padding)
  if (r % brows == 0) {
    if (threadIdx.x == 0) scales[rb * lds + g] = s;
    if (g == groups_c - 1)
      for (int64_t c = groups_c + threadIdx.x; c < lds; c += blockDim.x) scales[rb * lds + c] = 1.0f;
  }
}

// Fallback epilogue, one GEMM (of one group's slice of k) at a time:
//   v = P[t, o] * sw[(o / sw_ob) * sw_ostride] * sx[t]  (+ acc[t, o] unless `first`)
// then either acc[t, o] = v, or (`last`) out[t, o] = v (+ bias[o]) in the output dtype.
// P is the GEMM's f32 output, row t at P + t * ldp; acc and out are [rows][cols] tight.
// sw and sx point at this group's scales already.
__global__ void fp8_epilogue_kernel(const float* __restrict__ p, int64_t ldp, int64_t rows, int64_t cols,
                                    const float* __restrict__ sw, int64_t sw_ob, int64_t sw_ostride,
                                    const float* __restrict__ sx, float* __restrict__ acc, int first, int last,
                                    const float* __restrict__ bias, void* __restrict__ out, int out_dtype) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t t = i / cols, o = i % cols;
  float v = p[t * ldp + o] * sw[(o / sw_ob) * sw_ostride] * sx[t];
  if (!first) v = acc[i] + v;
  if (!last) {
    acc[i] = v;
    return;
  }
  if (bias) v = v + bias[o];
  if (out_dtype == FP8_IN_BF16)
    ((bf16_t*)out)[i] = f32_to_bf16(v);
  else if (out_dtype == FP8_IN_F16)
    ((f16_t*)out)[i] = __float2half_rn(v);
  else
    ((float*)out)[i] = v;
}

extern "C" int mxa_fp8_quantize(const void* x, int dtype, int64_t rows, int64_t rows_p, int64_t k, int64_t ldc,
                                int64_t group, uint8_t* codes, float* scales, unsigned* flags, gpuStream_t stream) {
  if (rows_p <= 0 || k <= 0) return MXA_OK;
  if (group <= 0 || rows > rows_p || ldc < k || dtype < 0 || dtype > 2) return MXA_ERR_ARGS;
  const int64_t groups = (k + group - 1) / group;
  const int64_t blocks = rows_p * groups;
  if (blocks > 0x7FFFFFFFLL) return MXA_ERR_ARGS;
  const int threads = group <= 128 ? 128 : 256;
  fp8_quantize_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, dtype, rows, rows_p, k, ldc, group, groups, codes,
                                                                 scales, flags);
  return mxa_status();
}

extern "C" int mxa_fp8_quantize_groups(const void* x, int dtype, int64_t rows, int64_t rows_p, int64_t k,
                                       int64_t ldc, int64_t brows, int64_t bcols, int64_t lds, unsigned* amax_bits,
                                       uint8_t* codes, float* scales, unsigned* flags, gpuStream_t stream) {
  if (rows_p <= 0 || k <= 0) return MXA_OK;
  if (brows <= 0 || bcols <= 0 || rows > rows_p || ldc < k || dtype < 0 || dtype > 2) return MXA_ERR_ARGS;
  const int64_t groups_c = (k + bcols - 1) / bcols;
  if (lds < groups_c) return MXA_ERR_ARGS;
  if (rows * groups_c > 0x7FFFFFFFLL || rows_p * groups_c > 0x7FFFFFFFLL) return MXA_ERR_ARGS;
  const int threads = bcols <= 128 ? 128 : 256;
  if (rows > 0) {
    fp8_group_amax_kernel<<<(unsigned)(rows * groups_c), threads, 0, stream>>>(x, dtype, rows, k, brows, bcols,
                                                                                 groups_c, amax_bits, flags);
    const int st = mxa_status();
    if (st != MXA_OK) return st;
  }
  fp8_group_encode_kernel<<<(unsigned)(rows_p * groups_c), threads, 0, stream>>>(
      x, dtype, rows, k, ldc, brows, bcols, groups_c, amax_bits, lds, codes, scales);
  return mxa_status();
}

extern "C" int mxa_fp8_epilogue(const float* p, int64_t ldp, int64_t rows, int64_t cols, const float* sw,
                                int64_t sw_ob, int64_t sw_ostride, const float* sx, float* acc, int first, int last,
                                const float* bias, void* out, int out_dtype, gpuStream_t stream) {
  if (rows <= 0 || cols <= 0) return MXA_OK;
  if (sw_ob <= 0 || ldp < cols || (!last && !acc) || (!first && !acc) || (last && !out)) return MXA_ERR_ARGS;
  const int64_t work = rows * cols;
  const int threads = 256;
  const int64_t blocks = (work + threads - 1) / threads;
  if (blocks > 0x7FFFFFFFLL) return MXA_ERR_ARGS;
  fp8_epilogue_kernel<<<(unsigned)blocks, threads, 0, stream>>>(p, ldp, rows, cols, sw, sw_ob, sw_ostride, sx, acc,
                                                                 first, last, bias, out, out_dtype);
  return mxa_status();
}
