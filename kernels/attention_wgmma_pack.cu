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
extern "C" int mxa_pack_v_direct(const AttnParams*, const void*, int, int, void*, float*, unsigned*, int*,
                                 gpuStream_t) {
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

// N rows of E consecutive elements (E = 4 or 16) from element base[i] (0 where !in[i]);
// vec: the E are aligned 8- or 16-byte loads (bf16/f16: one 8-byte load for E = 4, two
// 16-byte loads for E = 16; f32: E / 4 16-byte loads).
template <int N, int E>
static __device__ __forceinline__ void load_rows(const void* __restrict__ src, int dtype, bool vec,
                                                 const int64_t (&base)[N], const bool (&in)[N], float (&x)[N][E]) {
  static_assert(E == 4 || E == 16, "4 or 16 elements per lane");
  if (vec && (dtype == 1 || dtype == 2)) {
    constexpr int W = E / 2;  // 32-bit words of two elements
    uint32_t u[N][W];
#pragma unroll
    for (int i = 0; i < N; i++) {
      const uint16_t* p = (const uint16_t*)src + base[i];
      if constexpr (E == 4) {
        const uint2 v = in[i] ? *(const uint2*)p : make_uint2(0, 0);
        u[i][0] = v.x;
        u[i][1] = v.y;
      } else {
#pragma unroll
        for (int c = 0; c < E / 8; c++) {
          const uint4 v = in[i] ? ((const uint4*)p)[c] : make_uint4(0, 0, 0, 0);
          u[i][4 * c] = v.x;
          u[i][4 * c + 1] = v.y;
          u[i][4 * c + 2] = v.z;
          u[i][4 * c + 3] = v.w;
        }
      }
    }
    if (dtype == 1) {
#pragma unroll
      for (int i = 0; i < N; i++)
#pragma unroll
        for (int w = 0; w < W; w++) {  // bf16 → f32 is the bits moved up (exact, as bf16_to_f32)
          x[i][2 * w] = __uint_as_float(u[i][w] << 16);
          x[i][2 * w + 1] = __uint_as_float(u[i][w] & 0xffff0000u);
        }
    } else {
#pragma unroll
      for (int i = 0; i < N; i++)
#pragma unroll
        for (int w = 0; w < W; w++) {
          x[i][2 * w] = f16_to_f32(__ushort_as_half((unsigned short)(u[i][w] & 0xffffu)));
          x[i][2 * w + 1] = f16_to_f32(__ushort_as_half((unsigned short)(u[i][w] >> 16)));
        }
    }
  } else if (vec && dtype == 0) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
      for (int c = 0; c < E / 4; c++) {
        const float4 v = in[i] ? ((const float4*)((const float*)src + base[i]))[c] : make_float4(0.f, 0.f, 0.f, 0.f);
        x[i][4 * c] = v.x;
        x[i][4 * c + 1] = v.y;
        x[i][4 * c + 2] = v.z;
        x[i][4 * c + 3] = v.w;
      }
  } else {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
      for (int j = 0; j < E; j++) x[i][j] = in[i] ? load_val(src, base[i] + j, dtype) : 0.0f;
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

// Q or K, TILE rows of one head per CTA of WARPS warps. A row lives on LPR = D/E adjacent
// lanes, lane l holding channels E(l mod LPR)..+E−1, so an MX block of B ≥ E channels lives
// on B/E adjacent lanes and the Hadamard butterfly pairs lanes by XOR; a warp takes
// RPI = 32/LPR rows at once: warp w's rows are RPI·(w + WARPS·i) + l / LPR. Scale per row
// (Q: PER_ROW) or one per tile (K). Same arithmetic as prep_qk_kernel followed by
// pack_rows_kernel. MXE: the MX rounding's element where the compiler can specialise it
// (mx_fast_elem).
// E = 16 (FP8 packing where MX blocks are ≥ 16 channels): a row's per-row work (block and
// row maxima, shared exponents, scales, addresses) runs on 8 lanes instead of 32, and 4 of
// the Hadamard's 7 stages stay inside a lane; E = 4 for MX blocks of 4 or 8 channels and
// for bf16 packing (kernels/NOTES.md v3 item 22). K takes more warps per 128-key tile than Q: its grid is a
// quarter of Q's under GQA, and fewer rows per warp keep the unrolled code small (item 13).
template <int D, int E, int TILE, bool PER_ROW, int MXE, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) pack_qk_direct_kernel(const void* __restrict__ src, int dtype, int rows,
                                                             int vec, float q_scale, int hadamard, float hscale,
                                                             OperandFmt fmt, int fp8, uint8_t* __restrict__ dst,
                                                             float* __restrict__ scales, int* __restrict__ bad) {
  constexpr int LPR = D / E, RPI = 32 / LPR, RPW = TILE / (WARPS * RPI);
  static_assert(LPR <= 32 && RPW >= 1 && RPW * WARPS * RPI == TILE, "tile geometry");
  const int head = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / LPR, cl = lane % LPR;  // row within the warp's RPI, lane within the row
  const int r0 = blockIdx.x * TILE;
  float x[RPW][E];
  {
    int64_t base[RPW];
    bool in[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      const int r = r0 + RPI * (warp + WARPS * i) + sub;
      in[i] = r < rows;
      base[i] = ((int64_t)head * rows + r) * D + E * cl;
    }
    load_rows<RPW, E>(src, dtype, vec != 0, base, in, x);
  }
  // Each step runs over all of the thread's rows before the next (stage outer, rows inner):
  // the rows' shuffles are independent and issue back to back, and the run-time-uniform
  // branches (hadamard, format) are taken once, not once per row (kernels/NOTES.md v3
  // item 17). The arithmetic per element is prep_qk_kernel's, unchanged.
  bool nonfinite = false;
#pragma unroll
  for (int i = 0; i < RPW; i++)
#pragma unroll
    for (int j = 0; j < E; j++) nonfinite |= !isfinite(x[i][j]);
  if (q_scale != 1.0f) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < E; j++) x[i][j] = x[i][j] * q_scale;
  }
  if (hadamard) {
#pragma unroll
    for (int h = 1; h < D; h *= 2) {
      if (h < E) {
#pragma unroll
        for (int i = 0; i < RPW; i++)
#pragma unroll
          for (int j = 0; j < E; j++)
            if (!(j & h)) {
              const float a = x[i][j], b = x[i][j + h];
              x[i][j] = a + b;
              x[i][j + h] = a - b;
            }
      } else {
        // this lane holds the i + h half of its pairs: other − x, else x + other, as one
        // fma(±1, x, other): ±x is exact, so it rounds once like the add (one FFMA instead
        // of FADD and FSEL)
        const float sgn = (cl & (h / E)) ? -1.0f : 1.0f;
#pragma unroll
        for (int i = 0; i < RPW; i++)
#pragma unroll
          for (int j = 0; j < E; j++) {
            const float other = SHFL_XOR(x[i][j], h / E);
            x[i][j] = __fmaf_rn(sgn, x[i][j], other);
          }
      }
    }
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < E; j++) x[i][j] = x[i][j] * hscale;
  }
  if (fmt.kind == OPK_BF16) {
#pragma unroll
    for (int i = 0; i < RPW; i++)
#pragma unroll
      for (int j = 0; j < E; j++) x[i][j] = round_bf16(x[i][j]);
  } else if (fmt.kind == OPK_MX) {
    // MXE ≥ 0 only where the call's element is MXE (mx_fast_elem): its constants then fold.
    // A block's max over the lane's E channels, then across block / E lanes (E = 16 is only
    // launched for blocks ≥ 16, E = 4 for blocks ≥ 4).
    const int elem = MXE >= 0 ? MXE : fmt.elem;
    const unsigned thr = mx_scale_thr(elem, fmt.scale);  // once, not per row (item 19)
    const int emax = fmt_info(elem).emax;
    float amax[RPW];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      amax[i] = fabsf(x[i][0]);
#pragma unroll
      for (int j = 1; j < E; j++) amax[i] = fmaxf(amax[i], fabsf(x[i][j]));
    }
#pragma unroll
    for (int o = 1; o < LPR; o *= 2)
      if (o < fmt.block / E) {
#pragma unroll
        for (int i = 0; i < RPW; i++) amax[i] = fmaxf(amax[i], SHFL_XOR(amax[i], o));
      }
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      const int e = mx_shared_exp_thr(amax[i], emax, thr);
      const float inv = pow2f(-e), sc = e8m0_decode((unsigned)(e + 127));
      if constexpr (MXE == FMT_E4M3) {
        // two elements per conversion each way (the same per-element rounding)
#pragma unroll
        for (int j = 0; j < E; j += 2) {
          const float2 r = fp8x2_round_e4m3(x[i][j] * inv, x[i][j + 1] * inv);
          x[i][j] = r.x * sc;
          x[i][j + 1] = r.y * sc;
        }
      } else {
#pragma unroll
        for (int j = 0; j < E; j++) x[i][j] = mx_round<MXE>(x[i][j] * inv, elem) * sc;
      }
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
      am[i] = fabsf(x[i][0]);
#pragma unroll
      for (int j = 1; j < E; j++) am[i] = fmaxf(am[i], fabsf(x[i][j]));
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
  // a lane's bytes of a row: one 16-byte chunk of the swizzled tile (FP8, E = 16), or 4 or 8
  // bytes of one (E = 4)
  uint8_t* t = dst + ((int64_t)head * gridDim.x + blockIdx.x) * TILE * D * (fp8 ? 1 : 2);
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    const int r = RPI * (warp + WARPS * i) + sub;
    if (fp8) {
      uint32_t w[E / 4];
#pragma unroll
      for (int q = 0; q < E / 4; q++) {
        const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(x[i][4 * q] * inv[i], x[i][4 * q + 1] * inv[i]),
                                                     __NV_SATFINITE, __NV_E4M3);
        const uint32_t hi = __nv_cvt_float2_to_fp8x2(
            make_float2(x[i][4 * q + 2] * inv[i], x[i][4 * q + 3] * inv[i]), __NV_SATFINITE, __NV_E4M3);
        w[q] = lo | (hi << 16);
      }
      if constexpr (E == 4) *(uint32_t*)(t + tile_off(TILE, D, r, 4 * cl)) = w[0];
      else *(uint4*)(t + tile_off(TILE, D, r, 16 * cl)) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (E == 4) {
      *(uint2*)(t + tile_off(TILE, 2 * D, r, 8 * cl)) =
          make_uint2(pack_bf16(x[i][0], x[i][1]), pack_bf16(x[i][2], x[i][3]));
    } else {
      __trap();  // the launcher packs bf16 with E = 4 only
    }
  }
}

// V, one thread per (32-key group, channel) of one head as pack_vt_kernel: the group's
// values as prep_v_kernel makes them (zero past the entry's length, bf16 rounding, or
// one MX block of 32 keys). AMAX: only gather each channel's largest |value| (as f32 bits,
// into amax, zeroed by the caller) for the channel scale; else (FP8) take the channel's scale
// from those bits (channel_scale_kernel's formula for MX V, prep_v_scale_kernel's for
// per-channel V; the blocks of the first 32 keys write it to `scale` for the attention
// kernel), and write the packed Vᵀ bytes (keys permuted: MX V as v / scale[c] with the power-of-two scale; per-channel FP8 V
// as its codes of v / scale[c], prep_v_channel_kernel's arithmetic, the scale applied after
// PV). The scale is derived in this pass, not by a kernel of its own between the two: one
// stream step less at short shapes (kernels/NOTES.md v3 item 22). MXE as
// pack_qk_direct_kernel's.
template <int D, bool FP8, bool AMAX, int MXE>
__global__ void pack_v_direct_kernel(const void* __restrict__ src, int dtype, int rows, int hkv,
                                     const int32_t* __restrict__ kv_lens, OperandFmt fmt, unsigned* __restrict__ amax,
                                     float* __restrict__ scale, uint8_t* __restrict__ dst, int* __restrict__ bad) {
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
  float s = 1.0f;
  if (FP8) {
    const float a = __uint_as_float(amax[head * D + c]);
    s = fmt.kind == OPK_PER_CHANNEL ? (a > 0.0f ? a / fmt_info(fmt.elem).max_normal : 1.0f)
                                    : exp2i(e4m3_fit_exp(a));
    if (blockIdx.x == 0) scale[head * D + c] = s;
  }
  if (fmt.kind == OPK_PER_CHANNEL) {
#pragma unroll
    for (int j = 0; j < 32; j++) x[j] = mx_round<MXE>(x[j] / s, fmt.elem);
  }
  const int64_t rows_pad = (int64_t)gridDim.x * 32;
  uint8_t* t = dst + (int64_t)head * rows_pad * D * ES + (int64_t)(k0 / BC_ALL) * BC_ALL * D * ES;
  const int b0 = (k0 % BC_ALL) * ES;
  uint32_t w[8 * ES];
  if (FP8) {
    // MX: a power of two; per-channel codes are on the E4M3 grid already
    const float inv = fmt.kind == OPK_PER_CHANNEL ? 1.0f : 1.0f / s;
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
  // 16 channels per lane for the FP8 kernel unless MX blocks are narrower
  // (pack_qk_direct_kernel's E); 4 for bf16 packing, which has no per-row scale work to
  // share and which the 16-channel layout made slower (measured, not profiled: kernels/NOTES.md
  // v3 item 22)
  const bool wide = fp8 && (P->qk.kind != OPK_MX || P->qk.block >= 16);
  // A row's elements per lane as whole loads where the input allows (rows start at multiples
  // of D elements, so the base pointer's alignment decides): 16 bytes for 16 channels, one
  // lane's 4 channels otherwise.
  const int esize = P->in_dtype == 0 ? 4 : 2;
  const int vec = ((uintptr_t)src % (wide ? 16 : 4 * esize)) == 0;
  return with_head_dim(P->d, [&](auto dc) {
    constexpr int D = decltype(dc)::value;
    return with_mx_elem(P->qk, [&](auto ec) {
      constexpr int MXE = decltype(ec)::value;
      constexpr int KW = D / 4;  // K's warps with 16 channels per lane: one row each
#define QK_ARGS src, P->in_dtype, rows, vec, qs, P->hadamard, P->hadamard_scale, P->qk, fp8, (uint8_t*)dst, scales, bad
      if (is_q && wide)
        wg::pack_qk_direct_kernel<D, 16, wg::BR, true, MXE, 8><<<grid, 256, 0, stream>>>(QK_ARGS);
      else if (is_q)
        wg::pack_qk_direct_kernel<D, 4, wg::BR, true, MXE, 8><<<grid, 256, 0, stream>>>(QK_ARGS);
      else if (wide)
        wg::pack_qk_direct_kernel<D, 16, wg::BC_ALL, false, MXE, KW><<<grid, KW * 32, 0, stream>>>(QK_ARGS);
      else
        wg::pack_qk_direct_kernel<D, 4, wg::BC_ALL, false, MXE, 32><<<grid, 1024, 0, stream>>>(QK_ARGS);
#undef QK_ARGS
      return mxa_status();
    });
  });
}

// V of b · hkv heads of sk keys (P's geometry) into packed Vᵀ of rows_pad keys per head;
// vscale receives the per-channel scales (FP8: powers of two for MX V, per-channel FP8 V's
// own scales otherwise). amax (FP8; null for bf16): b · hkv · d words the caller has zeroed
// (they come with the call's one host-to-device copy: no memset of their own). Flags
// non-finite inputs in bit 1 of *bad.
extern "C" int mxa_pack_v_direct(const AttnParams* P, const void* src, int rows_pad, int fp8, void* dst,
                                 float* vscale, unsigned* amax, int* bad, gpuStream_t stream) {
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
    if (!amax) return MXA_ERR_ARGS;
    return with_mx_elem(P->v, [&](auto ec) {
      constexpr int MXE = decltype(ec)::value;
      wg::pack_v_direct_kernel<D, true, true, MXE><<<grid, D, 0, stream>>>(src, P->in_dtype, P->sk, P->hkv, P->kv_lens,
                                                                      P->v, amax, nullptr, nullptr, bad);
      wg::pack_v_direct_kernel<D, true, false, MXE><<<grid, D, 0, stream>>>(src, P->in_dtype, P->sk, P->hkv, P->kv_lens,
                                                                       P->v, amax, vscale, (uint8_t*)dst, bad);
      return mxa_status();
    });
  });
}
#endif  // !__HIPCC__
