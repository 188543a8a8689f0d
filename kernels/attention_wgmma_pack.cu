// Operand packing for the wgmma attention kernel (attention_wgmma.cu): Q, K and Vᵀ into
// the swizzled tile layout it bulk-copies (wgmma_layout.cuh), as E4M3 with power-of-two
// scales or as bf16. Two routes, bit-identical by construction (same value functions,
// same order of operations, compiled with -fmad=false like the preparation):
//
// * direct (the default): one pass from the attention inputs (f32/bf16/f16) to the
//   packed bytes: × q_scale, Hadamard, the Q/K or V format, the row/tile/channel scale and
//   the conversion happen in registers (mxa_pack_qk_direct, mxa_pack_v_direct);
// * staged: the portable preparation (mxa_attention_prep) writes f32 operands first and
//   these are packed in a second pass (mxa_pack_rows, mxa_pack_vt). Still used where the
//   direct route does not apply (MX blocks of Q/K that do not tile 128 channels, MX V
//   blocks other than 32 keys) and kept selectable (GpuPath::WgmmaStaged) as the reference the direct
//   route is tested against.
#include <stdint.h>
#include "softmax_algos.cuh"
#include "operand_load.cuh"

#if defined(__HIPCC__)
// No wgmma kernel on AMD, so nothing to pack for it.
extern "C" int mxa_pack_rows(const float*, int64_t, int, int, int, int, int, int, void*, float*, gpuStream_t) {
  return MXA_ERR_ARGS;
}
extern "C" int mxa_pack_vt(const float*, int64_t, int, int, int, int, const float*, void*, float*, gpuStream_t) {
  return MXA_ERR_ARGS;
}
extern "C" int mxa_pack_direct_supported(const AttnParams*, int) { return 0; }
extern "C" int mxa_pack_qk_direct(const AttnParams*, const void*, int64_t, int, int, int, int, void*, float*, int*,
                                  gpuStream_t) {
  return MXA_ERR_ARGS;
}
extern "C" int mxa_pack_v_direct(const AttnParams*, const void*, int, int, void*, float*, int*, gpuStream_t) {
  return MXA_ERR_ARGS;
}
#else
#include <cuda_fp8.h>
#include <type_traits>
#include "wgmma_layout.cuh"

namespace wg {

// ---------------------------------------------------------------- staged: f32 → packed

// Rows of D f32 → E4M3 with one power-of-two scale per `group` rows (FP8), or → bf16,
// into tiles of `tile` rows (tile a multiple of group). Rows past `rows` (up to rows_pad)
// are zero. One block per (group, head).
template <int D>
__global__ void pack_rows_kernel(const float* __restrict__ src, int rows, int rows_pad, int group, int tile, int fp8,
                                 uint8_t* __restrict__ dst, float* __restrict__ scales) {
  const int head = blockIdx.y;
  const int r0 = blockIdx.x * group;
  const float* s = src + (int64_t)head * rows * D;
  const int es = fp8 ? 1 : 2;
  __shared__ float red[32];
  float inv = 1.0f;
  if (fp8) {
    float amax = 0.0f;
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
      const int r = r0 + i / D;
      if (r < rows) amax = fmaxf(amax, fabsf(s[(int64_t)r * D + i % D]));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
      float a = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
      for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
      if (threadIdx.x == 0) red[0] = a;
    }
    __syncthreads();
    const int e = e4m3_fit_exp(red[0]);
    inv = exp2i(-e);
    if (threadIdx.x == 0) scales[(int64_t)head * (rows_pad / group) + blockIdx.x] = exp2i(e);
  }
  uint8_t* dh = dst + (int64_t)head * rows_pad * D * es;
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int r = r0 + i / D, c = i % D;
    const float x = r < rows ? s[(int64_t)r * D + c] * inv : 0.0f;
    uint8_t* t = dh + (int64_t)(r / tile) * tile * D * es;
    const int64_t o = tile_off(tile, D * es, r % tile, c * es);
    if (fp8) t[o] = (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    else *(bf16_t*)(t + o) = __float2bfloat16_rn(x);
  }
}

// Largest |v| per (head, channel), as f32 bits (non-negative floats order like integers).
template <int D>
__global__ void channel_amax_kernel(const float* __restrict__ src, int rows, int chunk, unsigned* __restrict__ amax) {
  const int head = blockIdx.y, c = threadIdx.x;
  const float* s = src + (int64_t)head * rows * D;
  float a = 0.0f;
  const int r1 = min(rows, (int)(blockIdx.x + 1) * chunk);
  for (int r = blockIdx.x * chunk; r < r1; r++) a = fmaxf(a, fabsf(s[(int64_t)r * D + c]));
  atomicMax(&amax[head * D + c], __float_as_uint(a));
}

__global__ void channel_scale_kernel(const unsigned* __restrict__ amax, int n, float* __restrict__ scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) scale[i] = exp2i(e4m3_fit_exp(__uint_as_float(amax[i])));
}

// V [rows, D] f32 → packed Vᵀ tiles: E4M3 codes of v / scale[c] (divide) or of v as given,
// keys permuted per 32-key group (FP8), or bf16 in key order. One block of D threads per
// 32 keys; thread c writes its channel's 32 keys.
template <int D, bool FP8>
__global__ void pack_vt_kernel(const float* __restrict__ src, int rows, int rows_pad, const float* __restrict__ scale,
                               int divide, uint8_t* __restrict__ dst) {
  constexpr int ES = FP8 ? 1 : 2;
  const int head = blockIdx.y, c = threadIdx.x, k0 = blockIdx.x * 32;
  const float* s = src + (int64_t)head * rows * D;
  uint8_t* t = dst + (int64_t)head * rows_pad * D * ES + (int64_t)(k0 / BC_ALL) * BC_ALL * D * ES;
  const int b0 = (k0 % BC_ALL) * ES;  // first byte of this group in the channel's tile row
  uint32_t w[8 * ES];
  if (FP8) {
    const float inv = divide ? 1.0f / scale[head * D + c] : 1.0f;  // a power of two
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = 0;
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const int r = k0 + j;
      const float x = r < rows ? s[(int64_t)r * D + c] * inv : 0.0f;
      const uint32_t b = (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      const int p = perm_pos(j);
      w[p >> 2] |= b << (8 * (p & 3));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 32; j += 2) {
      const float x0 = k0 + j < rows ? s[(int64_t)(k0 + j) * D + c] : 0.0f;
      const float x1 = k0 + j + 1 < rows ? s[(int64_t)(k0 + j + 1) * D + c] : 0.0f;
      w[j / 2] = pack_bf16(x0, x1);
    }
  }
#pragma unroll
  for (int i = 0; i < 2 * ES; i++)  // 16-byte chunks
    *(uint4*)(t + tile_off(D, BC_ALL * ES, c, b0 + 16 * i)) = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
}

// ---------------------------------------------------------------- direct: inputs → packed

// The inputs' values for the direct packing kernels, all of a thread's loads issued before
// any is used. Written as load_val per element inside the per-row work, each row's loads sat
// behind that row's dtype branch and the previous row's shuffles, so a warp waited for DRAM
// once per row (kernels/NOTES.md v3 item 16). The dtype switch is outside the unrolled loops.

// N rows of 4 consecutive elements from element base[i] (0 where !in[i]); vec: the 4 are
// one aligned 8-byte (bf16/f16) or 16-byte (f32) load.
template <int N>
static __device__ __forceinline__ void load_rows4(const void* __restrict__ src, int dtype, bool vec,
                                                  const int64_t (&base)[N], const bool (&in)[N], float (&x)[N][4]) {
  if (vec && dtype == 1) {
    uint2 u[N];
#pragma unroll
    for (int i = 0; i < N; i++) u[i] = in[i] ? *(const uint2*)((const bf16_t*)src + base[i]) : make_uint2(0, 0);
#pragma unroll
    for (int i = 0; i < N; i++) {  // bf16 → f32 is the bits moved up (exact, as bf16_to_f32)
      x[i][0] = __uint_as_float(u[i].x << 16);
      x[i][1] = __uint_as_float(u[i].x & 0xffff0000u);
      x[i][2] = __uint_as_float(u[i].y << 16);
      x[i][3] = __uint_as_float(u[i].y & 0xffff0000u);
    }
  } else if (vec && dtype == 2) {
    uint2 u[N];
#pragma unroll
    for (int i = 0; i < N; i++) u[i] = in[i] ? *(const uint2*)((const f16_t*)src + base[i]) : make_uint2(0, 0);
#pragma unroll
    for (int i = 0; i < N; i++) {
      x[i][0] = f16_to_f32(__ushort_as_half((unsigned short)(u[i].x & 0xffffu)));
      x[i][1] = f16_to_f32(__ushort_as_half((unsigned short)(u[i].x >> 16)));
      x[i][2] = f16_to_f32(__ushort_as_half((unsigned short)(u[i].y & 0xffffu)));
      x[i][3] = f16_to_f32(__ushort_as_half((unsigned short)(u[i].y >> 16)));
    }
  } else if (vec && dtype == 0) {
#pragma unroll
    for (int i = 0; i < N; i++) {
      const float4 v = in[i] ? *(const float4*)((const float*)src + base[i]) : make_float4(0.f, 0.f, 0.f, 0.f);
      x[i][0] = v.x;
      x[i][1] = v.y;
      x[i][2] = v.z;
      x[i][3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) x[i][j] = in[i] ? load_val(src, base[i] + j, dtype) : 0.0f;
  }
}

// N elements base + j·stride, j < n (0 past n).
template <int N>
static __device__ __forceinline__ void load_strided(const void* __restrict__ src, int dtype, int64_t base,
                                                    int64_t stride, int n, float (&x)[N]) {
  if (dtype == 1) {
    const bf16_t* p = (const bf16_t*)src + base;
#pragma unroll
    for (int j = 0; j < N; j++) x[j] = j < n ? bf16_to_f32(p[j * stride]) : 0.0f;
  } else if (dtype == 2) {
    const f16_t* p = (const f16_t*)src + base;
#pragma unroll
    for (int j = 0; j < N; j++) x[j] = j < n ? f16_to_f32(p[j * stride]) : 0.0f;
  } else {
    const float* p = (const float*)src + base;
#pragma unroll
    for (int j = 0; j < N; j++) x[j] = j < n ? p[j * stride] : 0.0f;
  }
}

// Q or K, TILE rows of one head per CTA of WARPS warps. A row lives on LPR = D/4 adjacent lanes,
// lane l holding channels 4(l mod LPR)..+3, so an MX block of B channels lives on B/4
// adjacent lanes and the Hadamard butterfly pairs lanes by XOR; a warp takes RPI = 32/LPR
// rows at once (D = 128: one; D = 64: two, one per half-warp): warp w's rows are
// RPI·(w + WARPS·i) + l / LPR. Scale per row (Q: PER_ROW) or one per tile (K). Same
// arithmetic as prep_qk_kernel followed by pack_rows_kernel. MXE: the MX rounding's element
// where the compiler can specialise it (mx_fast_elem). K takes 32 warps per 128-key tile: its
// grid is a quarter of Q's under GQA, and fewer rows per warp keep the unrolled code small
// (kernels/NOTES.md v3 item 13).
template <int D, int TILE, bool PER_ROW, int MXE, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) pack_qk_direct_kernel(const void* __restrict__ src, int dtype, int rows,
                                                             int vec, float q_scale, int hadamard, float hscale,
                                                             OperandFmt fmt, int fp8, uint8_t* __restrict__ dst,
                                                             float* __restrict__ scales, int* __restrict__ bad) {
  constexpr int LPR = D / 4, RPI = 32 / LPR, RPW = TILE / (WARPS * RPI);
  const int head = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / LPR, cl = lane % LPR;  // row within the warp's RPI, lane within the row
  const int r0 = blockIdx.x * TILE;
  float x[RPW][4];
  {
    int64_t base[RPW];
    bool in[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      const int r = r0 + RPI * (warp + WARPS * i) + sub;
      in[i] = r < rows;
      base[i] = ((int64_t)head * rows + r) * D + 4 * cl;
    }
    load_rows4<RPW>(src, dtype, vec != 0, base, in, x);
  }
  // Each step runs over all of the thread's rows before the next (stage outer, rows inner):
  // the rows' shuffles are independent and issue back to back, and the run-time-uniform
  // branches (hadamard, format) are taken once, not once per row (kernels/NOTES.md v3
  // item 17). The arithmetic per element is prep_qk_kernel's, unchanged.
  bool nonfinite = false;
#pragma unroll
  for (int i = 0; i < RPW; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) nonfinite |= !isfinite(x[i][j]);
  if (q_scale != 1.0f) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) x[i][j] = x[i][j] * q_scale;
  }
  if (hadamard) {
#pragma unroll
    for (int h = 1; h < D; h *= 2) {
      if (h < 4) {
#pragma unroll
        for (int i = 0; i < RPW; i++)
#pragma unroll
          for (int j = 0; j < 4; j++)
            if (!(j & h)) {
              const float a = x[i][j], b = x[i][j + h];
              x[i][j] = a + b;
              x[i][j + h] = a - b;
            }
      } else {
        const bool upper = cl & (h / 4);  // this lane holds the i + h half of its pairs
#pragma unroll
        for (int i = 0; i < RPW; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) {
            const float other = SHFL_XOR(x[i][j], h / 4);
            x[i][j] = upper ? other - x[i][j] : x[i][j] + other;
          }
      }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) x[i][j] = x[i][j] * hscale;
  }
  if (fmt.kind == OPK_BF16) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) x[i][j] = round_bf16(x[i][j]);
  } else if (fmt.kind == OPK_MX) {
    // MXE ≥ 0 only where the call's element is MXE (mx_fast_elem): its constants then fold
    const int elem = MXE >= 0 ? MXE : fmt.elem;
    const unsigned thr = mx_scale_thr(elem, fmt.scale);  // once, not per row (item 19)
    const int emax = fmt_info(elem).emax;
    float amax[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++)
      amax[i] = fmaxf(fmaxf(fabsf(x[i][0]), fabsf(x[i][1])), fmaxf(fabsf(x[i][2]), fabsf(x[i][3])));
#pragma unroll
    for (int o = 1; o < LPR; o *= 2)
      if (o < fmt.block / 4) {
#pragma unroll
        for (int i = 0; i < RPW; i++) amax[i] = fmaxf(amax[i], SHFL_XOR(amax[i], o));
      }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      const int e = mx_shared_exp_thr(amax[i], emax, thr);
      const float inv = pow2f(-e), sc = e8m0_decode((unsigned)(e + 127));
#pragma unroll
      for (int j = 0; j < 4; j++) x[i][j] = mx_round<MXE>(x[i][j] * inv, elem) * sc;
    }
  }
  if (__any_sync(0xffffffffu, nonfinite) && lane == 0) atomicOr(bad, 1);

  float inv[RPW];
#pragma unroll
  for (int i = 0; i < RPW; i++) inv[i] = 1.0f;
  if (fp8) {
    float am[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      am[i] = fmaxf(fmaxf(fabsf(x[i][0]), fabsf(x[i][1])), fmaxf(fabsf(x[i][2]), fabsf(x[i][3])));
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) am[i] = fmaxf(am[i], SHFL_XOR(am[i], o));
    }
    if (PER_ROW) {
#pragma unroll
      for (int i = 0; i < RPW; i++) {
        const int e = e4m3_fit_exp(am[i]);
        inv[i] = exp2i(-e);
        if (cl == 0) scales[(int64_t)head * gridDim.x * TILE + r0 + RPI * (warp + WARPS * i) + sub] = exp2i(e);
      }
    } else {
      __shared__ float red[WARPS];
      float a = 0.0f;
#pragma unroll
      for (int i = 0; i < RPW; i++) a = fmaxf(a, am[i]);
#pragma unroll
      for (int o = LPR; o < 32; o *= 2) a = fmaxf(a, SHFL_XOR(a, o));  // the warp's other rows
      if (lane == 0) red[warp] = a;
      __syncthreads();
      a = red[0];
#pragma unroll
      for (int w = 1; w < WARPS; w++) a = fmaxf(a, red[w]);
      const int e = e4m3_fit_exp(a);
#pragma unroll
      for (int i = 0; i < RPW; i++) inv[i] = exp2i(-e);
      if (threadIdx.x == 0) scales[(int64_t)head * gridDim.x + blockIdx.x] = exp2i(e);
    }
  }
  uint8_t* t = dst + ((int64_t)head * gridDim.x + blockIdx.x) * TILE * D * (fp8 ? 1 : 2);
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    const int r = RPI * (warp + WARPS * i) + sub;
    if (fp8) {
      uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < 4; j++)
        w |= (uint32_t)__nv_cvt_float_to_fp8(x[i][j] * inv[i], __NV_SATFINITE, __NV_E4M3) << (8 * j);
      *(uint32_t*)(t + tile_off(TILE, D, r, 4 * cl)) = w;
    } else {
      *(uint2*)(t + tile_off(TILE, 2 * D, r, 8 * cl)) =
          make_uint2(pack_bf16(x[i][0], x[i][1]), pack_bf16(x[i][2], x[i][3]));
    }
  }
}

// V, one thread per (32-key group, channel) of one head as pack_vt_kernel: the group's
// values as prep_v_kernel makes them (zero past the entry's length, bf16 rounding, or
// one MX block of 32 keys). AMAX: only gather each channel's largest |value| (as f32 bits)
// for the channel scale; else write the packed Vᵀ bytes (FP8, keys permuted: MX V as
// v / scale[c] with the power-of-two scale; per-channel FP8 V as its codes of v / scale[c],
// prep_v_channel_kernel's arithmetic, the scale applied after PV). MXE as pack_qk_direct_kernel's.
template <int D, bool FP8, bool AMAX, int MXE>
__global__ void pack_v_direct_kernel(const void* __restrict__ src, int dtype, int rows, int hkv,
                                     const int32_t* __restrict__ kv_lens, OperandFmt fmt, unsigned* __restrict__ amax,
                                     const float* __restrict__ scale, uint8_t* __restrict__ dst,
                                     int* __restrict__ bad) {
  constexpr int ES = FP8 ? 1 : 2;
  const int head = blockIdx.y, c = threadIdx.x, k0 = blockIdx.x * 32;
  const int len = kv_lens[head / hkv];
  float x[32];
  load_strided<32>(src, dtype, ((int64_t)head * rows + k0) * D + c, D, rows - k0, x);
  float m = 0.0f;
  bool nonfinite = false;
#pragma unroll
  for (int j = 0; j < 32; j++) {
    const int r = k0 + j;
    const float v = x[j];
    nonfinite |= !isfinite(v);
    float y = r < len ? v : 0.0f;
    if (fmt.kind == OPK_BF16) y = round_bf16(y);
    m = fmaxf(m, fabsf(y));
    x[j] = y;
  }
  if (fmt.kind == OPK_MX && k0 < len) {
    const int e = mx_shared_exp(m, fmt.elem, fmt.scale);
    const float inv = pow2f(-e), sc = e8m0_decode((unsigned)(e + 127));
    m = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; j++) {
      x[j] = mx_round<MXE>(x[j] * inv, fmt.elem) * sc;
      m = fmaxf(m, fabsf(x[j]));
    }
  }
  if (AMAX) {
    atomicMax(&amax[head * D + c], __float_as_uint(m));  // non-negative floats order as integers
    return;
  }
  if (__any_sync(0xffffffffu, nonfinite) && (c & 31) == 0) atomicOr(bad, 2);
  if (fmt.kind == OPK_PER_CHANNEL) {
    const float s = scale[head * D + c];
#pragma unroll
    for (int j = 0; j < 32; j++) x[j] = mx_round<MXE>(x[j] / s, fmt.elem);
  }
  const int64_t rows_pad = (int64_t)gridDim.x * 32;
  uint8_t* t = dst + (int64_t)head * rows_pad * D * ES + (int64_t)(k0 / BC_ALL) * BC_ALL * D * ES;
  const int b0 = (k0 % BC_ALL) * ES;
  uint32_t w[8 * ES];
  if (FP8) {
    // MX: a power of two; per-channel codes are on the E4M3 grid already
    const float inv = fmt.kind == OPK_PER_CHANNEL ? 1.0f : 1.0f / scale[head * D + c];
#pragma unroll
    for (int i = 0; i < 8; i++) w[i] = 0;
#pragma unroll
    for (int j = 0; j < 32; j++) {
      const uint32_t b = (uint32_t)__nv_cvt_float_to_fp8(x[j] * inv, __NV_SATFINITE, __NV_E4M3);
      const int p = perm_pos(j);
      w[p >> 2] |= b << (8 * (p & 3));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 32; j += 2) w[j / 2] = pack_bf16(x[j], x[j + 1]);
  }
#pragma unroll
  for (int i = 0; i < 2 * ES; i++)
    *(uint4*)(t + tile_off(D, BC_ALL * ES, c, b0 + 16 * i)) = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
}

// Per-channel FP8 V's scales from the amax bits, in place: amax / max_normal, or 1 for an
// all-zero channel (prep_v_scale_kernel's formula).
__global__ void per_channel_scale_kernel(int n, int elem, float* __restrict__ scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float amax = scale[i];
  scale[i] = amax > 0.0f ? amax / fmt_info(elem).max_normal : 1.0f;
}

}  // namespace wg

// The head dims the kernels are instantiated for (wg::head_dim_ok): calls f with D as a
// compile-time constant.
template <typename F>
static int with_head_dim(int d, F f) {
  if (d == 64) return f(std::integral_constant<int, 64>{});
  if (d == 128) return f(std::integral_constant<int, 128>{});
  return MXA_ERR_ARGS;
}

// The MX rounding the packing kernels are specialised for (wg::mx_fast_elem): calls f with
// MXE as a compile-time constant.
template <typename F>
static int with_mx_elem(const OperandFmt& f, F fn) {
  switch (wg::mx_fast_elem(f.kind, f.elem)) {
    case FMT_E4M3: return fn(std::integral_constant<int, FMT_E4M3>{});
    case FMT_E2M1: return fn(std::integral_constant<int, FMT_E2M1>{});
    default: return fn(std::integral_constant<int, -1>{});
  }
}

// group: rows per FP8 scale (1 for Q, keys per tile for K); tile: rows per packed tile
// (one warpgroup's query rows for Q, keys per tile for K); d: the head dim.
extern "C" int mxa_pack_rows(const float* src, int64_t heads, int rows, int rows_pad, int group, int tile, int fp8,
                             int d, void* dst, float* scales, gpuStream_t stream) {
  if (heads <= 0 || rows_pad <= 0) return MXA_OK;
  if (rows_pad % tile != 0 || tile % group != 0 || heads > 65535) return MXA_ERR_ARGS;
  dim3 grid((unsigned)(rows_pad / group), (unsigned)heads);
  return with_head_dim(d, [&](auto dc) {
    wg::pack_rows_kernel<decltype(dc)::value><<<grid, group == 1 ? 128 : 256, 0, stream>>>(
        src, rows, rows_pad, group, tile, fp8, (uint8_t*)dst, scales);
    return mxa_status();
  });
}

// chscale: the per-channel scales of FP8 per-channel V (its values are already on the E4M3
// grid), or null to derive a power-of-two scale per channel from the values.
extern "C" int mxa_pack_vt(const float* src, int64_t heads, int rows, int rows_pad, int fp8, int d,
                           const float* chscale, void* dst, float* vscale, gpuStream_t stream) {
  if (heads <= 0 || rows_pad <= 0) return MXA_OK;
  if (rows_pad % wg::BC_ALL != 0 || heads > 65535) return MXA_ERR_ARGS;
  return with_head_dim(d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    const int n = (int)heads * D;
    dim3 grid((unsigned)(rows_pad / 32), (unsigned)heads);
    if (fp8) {
      if (chscale) {
        if (cudaMemcpyAsync(vscale, chscale, n * sizeof(float), cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
          return MXA_ERR_LAUNCH;
      } else {
        unsigned* amax = (unsigned*)vscale;  // reused in place: bits first, then scales
        if (cudaMemsetAsync(amax, 0, n * sizeof(float), stream) != cudaSuccess) return MXA_ERR_LAUNCH;
        const int chunk = 512;
        dim3 g1((unsigned)((rows + chunk - 1) / chunk), (unsigned)heads);
        if (rows > 0) wg::channel_amax_kernel<D><<<g1, D, 0, stream>>>(src, rows, chunk, amax);
        wg::channel_scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(amax, n, vscale);
      }
      wg::pack_vt_kernel<D, true><<<grid, D, 0, stream>>>(src, rows, rows_pad, vscale, chscale == nullptr,
                                                          (uint8_t*)dst);
    } else {
      wg::pack_vt_kernel<D, false><<<grid, D, 0, stream>>>(src, rows, rows_pad, nullptr, 0, (uint8_t*)dst);
    }
    return mxa_status();
  });
}

// Bit 1: Q and K can be packed directly; bit 2: V can. Needs a head dim of the kernel's,
// MX blocks of Q/K that tile a row on whole lanes, and V native or bf16 (BF16 kernel), or
// MX in blocks of 32 keys or per-channel E4M3 (FP8 kernel).
extern "C" int mxa_pack_direct_supported(const AttnParams* P, int fp8) {
  if (!wg::head_dim_ok(P->d)) return 0;
  int r = 0;
  const OperandFmt& f = P->qk;
  if (f.kind != OPK_MX || (f.block >= 4 && f.block <= P->d && (f.block & (f.block - 1)) == 0)) r |= 1;
  const OperandFmt& v = P->v;
  const bool fp8_v = (v.kind == OPK_MX && v.block == 32) || (v.kind == OPK_PER_CHANNEL && v.elem == FMT_E4M3);
  if (fp8 ? fp8_v : (v.kind == OPK_NATIVE || v.kind == OPK_BF16)) r |= 2;
  return r;
}

// Q (is_q: × q_scale, one scale per row, blocks of one warpgroup's rows) or K (one scale
// per tile of keys) of `heads` heads of `rows` rows, from the attention input `src`
// (P->in_dtype) into rows_pad padded rows. Flags non-finite inputs in bit 0 of *bad.
extern "C" int mxa_pack_qk_direct(const AttnParams* P, const void* src, int64_t heads, int rows, int rows_pad,
                                  int is_q, int fp8, void* dst, float* scales, int* bad, gpuStream_t stream) {
  if (heads <= 0 || rows_pad <= 0) return MXA_OK;
  if (!(mxa_pack_direct_supported(P, fp8) & 1) || heads > 65535) return MXA_ERR_ARGS;
  const int tile = is_q ? wg::BR : wg::BC_ALL;
  if (rows_pad % tile != 0) return MXA_ERR_ARGS;
  dim3 grid((unsigned)(rows_pad / tile), (unsigned)heads);
  const float qs = is_q ? P->q_scale : 1.0f;
  // A row's 4 elements per lane as one load where the input allows (rows start at multiples
  // of D elements, so the base pointer's alignment decides).
  const int esize = P->in_dtype == 0 ? 4 : 2;
  const int vec = ((uintptr_t)src % (4 * esize)) == 0;
  return with_head_dim(P->d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    return with_mx_elem(P->qk, [&](auto ec) {
      constexpr int MXE = decltype(ec)::value;
      if (is_q)
        wg::pack_qk_direct_kernel<D, wg::BR, true, MXE, 8><<<grid, 256, 0, stream>>>(
            src, P->in_dtype, rows, vec, qs, P->hadamard, P->hadamard_scale, P->qk, fp8, (uint8_t*)dst, scales, bad);
      else
        wg::pack_qk_direct_kernel<D, wg::BC_ALL, false, MXE, 32><<<grid, 1024, 0, stream>>>(
            src, P->in_dtype, rows, vec, qs, P->hadamard, P->hadamard_scale, P->qk, fp8, (uint8_t*)dst, scales, bad);
      return mxa_status();
    });
  });
}

// V of b · hkv heads of sk keys (P's geometry) into packed Vᵀ of rows_pad keys per head;
// vscale receives the per-channel scales (FP8: powers of two for MX V, per-channel FP8 V's
// own scales otherwise). Flags non-finite inputs in bit 1 of *bad.
extern "C" int mxa_pack_v_direct(const AttnParams* P, const void* src, int rows_pad, int fp8, void* dst,
                                 float* vscale, int* bad, gpuStream_t stream) {
  const int64_t heads = (int64_t)P->b * P->hkv;
  if (heads <= 0 || rows_pad <= 0) return MXA_OK;
  if (!(mxa_pack_direct_supported(P, fp8) & 2) || rows_pad % wg::BC_ALL != 0 || heads > 65535) return MXA_ERR_ARGS;
  dim3 grid((unsigned)(rows_pad / 32), (unsigned)heads);
  return with_head_dim(P->d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    if (!fp8) {
      wg::pack_v_direct_kernel<D, false, false, -1><<<grid, D, 0, stream>>>(src, P->in_dtype, P->sk, P->hkv, P->kv_lens,
                                                                        P->v, nullptr, nullptr, (uint8_t*)dst, bad);
      return mxa_status();
    }
    return with_mx_elem(P->v, [&](auto ec) {
      constexpr int MXE = decltype(ec)::value;
      const int n = (int)heads * D;
      unsigned* amax = (unsigned*)vscale;  // reused in place: bits first, then scales
      if (cudaMemsetAsync(amax, 0, n * sizeof(float), stream) != cudaSuccess) return MXA_ERR_LAUNCH;
      wg::pack_v_direct_kernel<D, true, true, MXE><<<grid, D, 0, stream>>>(src, P->in_dtype, P->sk, P->hkv, P->kv_lens,
                                                                      P->v, amax, nullptr, nullptr, bad);
      if (P->v.kind == OPK_PER_CHANNEL)
        wg::per_channel_scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(n, P->v.elem, vscale);
      else
        wg::channel_scale_kernel<<<(n + 255) / 256, 256, 0, stream>>>(amax, n, vscale);
      wg::pack_v_direct_kernel<D, true, false, MXE><<<grid, D, 0, stream>>>(src, P->in_dtype, P->sk, P->hkv, P->kv_lens,
                                                                       P->v, nullptr, vscale, (uint8_t*)dst, bad);
      return mxa_status();
    });
  });
}
#endif  // !__HIPCC__
