// Hopper attention on wgmma (sm_90a), head dims 64 and 128. A CTA holds 128 query rows: two
// consumer warpgroups of 64 rows each and one producer warp. The producer streams K and Vᵀ
// tiles of 128 keys with bulk async copies (the TMA engine, 1-D: the operands are packed in
// global memory already in the 128-byte-swizzled layout wgmma reads) into a ring of
// shared-memory stages guarded by mbarriers; the consumers run S = Q·Kᵀ and O += P·V as
// warpgroup MMAs and release each stage when done, so the two warpgroups drift apart and
// one's softmax overlaps the other's MMAs. Two operand types:
//
// * FP8 E4M3 (Fused-Softmax, exp→E4M3): Q and K arrive as E4M3 codes with a power-of-two
//   scale per query row and per 128-key tile (attention_wgmma_pack.cu); every MX/FP8 value of the
//   quantized operand is re-expressed exactly unless the row's or tile's blocks span more
//   binades than E4M3's subnormals reach (then its lowest bits round). The scales fold into
//   one multiplier per row and tile: A = S_mma·mult + bias is a single FFMA, after which
//   P is produced without exponentials (u8 code: in the common case the same FFMA with
//   saturation on 2^-8-scaled operands, a float add and a byte pick; fp32 bits: the integer
//   cast and one cvt to E4M3). P stays in registers as the A
//   operand of the PV MMA; Vᵀ's keys are permuted within each 32-key group
//   (attention_wgmma_pack.cu) so the accumulator layout of S is the A-fragment layout of P.
// * BF16 (exact softmax): the same loop with exp2 on the MUFU pipe.
//
// L (the row sum) comes out of the PV MMA itself: Vᵀ in shared memory carries an extra
// ones row (N = D + 8: 136, or 72 at D = 64), so L is summed from exactly the P operand that multiplies V. Each
// tile's PV product lands in fresh accumulators and is added to O in f32, so the long
// sums over keys keep f32 accumulation (Hopper's FP8 MMA accumulates internally with
// fewer bits). Scores come from one FP8 MMA per 32 channels, so they carry that internal
// rounding too: ≈1e-5 of the largest products, visible only where scores are huge.
#include <stdint.h>
#include "attention_grid.cuh"
#include "softmax_algos.cuh"

#if defined(__HIPCC__)
// wgmma is NVIDIA Hopper PTX; AMD builds take the portable kernels for every call.
extern "C" int mxa_attention_wgmma_supported(const AttnParams*) { return 0; }
extern "C" int mxa_wgmma_available() { return 0; }
extern "C" int mxa_wgmma_rows_per_cta() { return 128; }
extern "C" int mxa_wgmma_rows_per_warpgroup() { return 64; }
extern "C" int mxa_wgmma_keys_per_tile() { return 128; }
extern "C" int mxa_wgmma_u8_code_check(long long, unsigned, float, float, unsigned long long*, gpuStream_t) {
  return MXA_ERR_ARGS;
}
extern "C" int mxa_attention_wgmma(const AttnParams*, const void*, const float*, const void*, const float*,
                                   const void*, const float*, int, int, void*, unsigned long long*, int*,
                                   gpuStream_t) {
  return MXA_ERR_ARGS;
}
#else
#include <cuda_fp8.h>
#include <type_traits>
#include "wgmma_ops.cuh"
#include "wgmma_layout.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The wgmma helpers below go unused in passes for GPUs without wgmma (the kernel body is
// compiled out there).
#pragma nv_diag_suppress 177
#endif

namespace wg {

constexpr float MAGIC = 12582912.0f;  // 1.5·2^23: x + MAGIC holds rint(x) in its low mantissa bits
constexpr float MAGIC_SAT = 32768.0f;  // 2^15: for y in [0, 1), y + MAGIC_SAT holds rint(256·y) there

// fma(a, b, c) rounded once, then clamped to [0, 1] (NaN to 0): one FFMA.SAT.
static __device__ __forceinline__ float fma_sat(float a, float b, float c) {
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

// The Fused-Softmax u8 code of x = fma(s, mult, bias) − delta, as a float whose low byte is
// the code (pick_bytes): rint(x) for x >= 0, 0 below; x <= THR_U8 (126.5) by the rollback.
static __device__ __forceinline__ float u8_code(float s, float mult, float bias, float delta) {
  float x = fmaf(s, mult, bias);
  if (delta != 0.0f) x -= delta;
  return fmaxf(x + MAGIC, MAGIC);
}
// The same code when delta is 0, from mult·2^-8 and bias·2^-8 (both exact: u8_code_scaled_ok):
// the FMA's result is x·2^-8 exactly (a power-of-two scale moves no rounding while the result
// stays normal; below that x rounds to 0 either way), saturated to [0, 1], and the add of
// 2^15 rounds 256·y to an integer. Two instructions instead of four. The equality of the two
// forms is tested on the GPU (mxa_wgmma_u8_code_check, tests/gpu.rs).
static __device__ __forceinline__ float u8_code_scaled(float s, float mult_s, float bias_s) {
  return fma_sat(s, mult_s, bias_s) + MAGIC_SAT;
}
static __device__ __forceinline__ bool u8_code_scaled_ok(float mult, float bias, float mult_s, float bias_s) {
  return mult_s * 256.0f == mult && bias_s * 256.0f == bias;
}

static __device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
// st.shared writes through the generic proxy; wgmma reads through the async one.
static __device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the async MMA region.
template <int N>
static __device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N, int M>
static __device__ __forceinline__ void fence_regs_u(uint32_t (&r)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int j = 0; j < M; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart.
static __device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}
// The same for 64-byte rows (FP8 Q/K at D = 64): 64-byte swizzle, 8-row atoms 512 bytes apart.
static __device__ __forceinline__ uint64_t desc_sw64(uint32_t saddr) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(512 >> 4) << 32) |
         ((uint64_t)2 << 62);
}
template <int SPAN>
static __device__ __forceinline__ uint64_t desc_sw(uint32_t saddr) {
  if constexpr (SPAN == 64) return desc_sw64(saddr);
  else return desc_sw128(saddr);
}

// Accumulator rows: element 4i + {0,1} is row g, 4i + {2,3} row g + 8.
template <int N>
static __device__ __forceinline__ void scale_rows(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < N; i++) o[i] *= alpha[(i >> 1) & 1];
}

static __device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

static __device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

static __device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
static __device__ __forceinline__ uint32_t e5m2x2(float lo, float hi) {
  return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E5M2);
}

// The P modes (MODE, below) and how P reaches the PV MMA. P ≤ 1.5 in every mode; it is held
// as FP8 bytes of P·SCALE (the same factor in O and in L, so it cancels in O / L):
// * 3, exp→E4M3 P: E4M3 bytes of P·2^8, the CPU's own code (its E4M3 P is P·256 encoded).
// * 4, EFQ: P = C8[c]·2^k, an E2M1 value (one mantissa bit) with k ≤ −2; E5M2 (two mantissa
//   bits, subnormals to 2^−16) holds it exactly at P·2^14 for k ≥ −29, i.e. for every
//   block whose largest P is above ≈2^−27 of the row maximum; E4M3 would stop at k ≥ −14.
// * 5, exp→MX P with E2M1, E3M2 or E5M2 elements (at most two mantissa bits): E5M2 bytes of
//   P·2^14, exact for every P value ≥ 2^−28.
// * 6, exp→MX P with E2M3 or E4M3 elements (three mantissa bits): E4M3 bytes of P·2^8,
//   exact for every P value ≥ 2^−14; smaller values land on E4M3's subnormal grid there
//   (steps of 2^−17 in P: absolute error ≤ 2^−18 per key).
// Values below those ranges round to nearest in the byte format (cvt.rn.satfinite), which
// moves O by at most the rounded mass over L (tests/gpu.rs bounds it).
template <int MODE>
struct PBytes {
  static constexpr bool E5M2 = MODE == 4 || MODE == 5;
  static constexpr float SCALE = E5M2 ? 16384.0f : (MODE == 3 || MODE == 6 ? 256.0f : 1.0f);
};
static_assert(PBytes<3>::SCALE == 256.0f, "exp->E4M3 P adds 8 to the exponent for this factor");
template <int MODE>
static __device__ __forceinline__ uint32_t p_bytes2(float lo, float hi) {
  if constexpr (PBytes<MODE>::E5M2) return e5m2x2(lo, hi);
  else return e4m3x2(lo, hi);
}
// EFQ's P on the E2M1 grid: a 32-key block's values are C8[c]·up for codes
// c = 0..7 and one factor up per block and row. The block's eight P bytes, converted once
// (E5M2 of C8[c]·up, the conversion the per-element route made of the same f32 values), sit
// in two registers, and one PRMT turns four codes into an A-fragment register: no code →
// value → byte work per score (kernels/NOTES.md v3 item 18).
struct CodeBytes {
  uint32_t lo, hi;  // bytes of codes 0..3 and 4..7
};
static __device__ __forceinline__ CodeBytes e2m1_code_bytes(float up) {
  const uint32_t b01 = e5m2x2(0.0f * up, 0.5f * up), b23 = e5m2x2(1.0f * up, 1.5f * up);
  const uint32_t b45 = e5m2x2(2.0f * up, 3.0f * up), b67 = e5m2x2(4.0f * up, 6.0f * up);
  return {b01 | (b23 << 16), b45 | (b67 << 16)};
}
// Four P bytes (byte i: code ci, each 0..7) from the block's table.
static __device__ __forceinline__ uint32_t code_bytes4(const CodeBytes& tb, unsigned c0, unsigned c1, unsigned c2,
                                                       unsigned c3) {
  return __byte_perm(tb.lo, tb.hi, c0 | (c1 << 4) | (c2 << 8) | (c3 << 12));
}
// Low bytes of four (x + MAGIC or y + MAGIC_SAT) floats, packed: the u8 codes.
static __device__ __forceinline__ uint32_t pick_bytes(float a, float b, float c, float d) {
  const uint32_t ab = __byte_perm(__float_as_uint(a), __float_as_uint(b), 0x0040);
  const uint32_t cd = __byte_perm(__float_as_uint(c), __float_as_uint(d), 0x0040);
  return __byte_perm(ab, cd, 0x5410);
}

// ---------------------------------------------------------------- the attention kernel

constexpr int STAGES_FP8 = 3;
constexpr int STAGES_BF16 = 2;
constexpr int CONSUMERS = 2;                    // warpgroups of 64 rows
constexpr int THREADS = (CONSUMERS + 1) * 128;  // + the producer warpgroup (last)
constexpr int ROWS = CONSUMERS * BR;            // query rows per CTA

template <bool FP8, int D>
struct Tile {
  static_assert(head_dim_ok(D), "head dim");
  static constexpr int ES = FP8 ? 1 : 2;      // bytes per element
  static constexpr int BC = BC_ALL;           // keys per KV tile
  static constexpr int STAGES = FP8 ? STAGES_FP8 : STAGES_BF16;
  static constexpr int SPAN = row_span(D * ES);  // swizzle span of a Q/K row: 128 or 64 bytes
  static constexpr int CB = D * ES / SPAN;    // column blocks of a Q/K row
  static constexpr int VCB = BC * ES / 128;   // 128-byte column blocks of a Vᵀ row
  static constexpr int VROWS = vrows(D);
  static constexpr int NACC = VROWS / 2;      // PV accumulators per thread (N = VROWS)
  static constexpr int KSTEPS = D * ES / 32;  // QK k-steps (32 bytes each)
  static constexpr int PSTEPS = BC * ES / 32;  // PV k-steps
  static constexpr int Q_BYTES = ROWS * D * ES;
  static constexpr int K_BYTES = BC * D * ES;
  static constexpr int VT_BYTES = BC * D * ES;          // one packed Vᵀ tile in global
  static constexpr int V_STAGE = VCB * VROWS * 128;      // with the ones/zero rows
  static constexpr int O_OFF = Q_BYTES + STAGES * (K_BYTES + V_STAGE);
  static constexpr int O_BYTES = FP8 ? CONSUMERS * NACC * 128 * 4 : 0;  // FP8: O in f32 (see kernel)
  static constexpr int BAR_OFF = O_OFF + O_BYTES;
  static constexpr int SMEM = BAR_OFF + 8 * (4 * STAGES + 1);
};

static __device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
static __device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
static __device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// 1-D bulk copy global → shared on the TMA engine, completing on `bar`.
static __device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, int bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

template <bool FP8, int D>
static __device__ __forceinline__ void qk_mma(float (&s)[64], uint32_t q_s, uint32_t k_s) {
  using T = Tile<FP8, D>;
  constexpr int SPAN = T::SPAN;
#pragma unroll
  for (int kk = 0; kk < T::KSTEPS; kk++) {
    const int cb = (kk * 32) / SPAN, off = (kk * 32) % SPAN;
    const uint64_t da = desc_sw<SPAN>(q_s + cb * BR * SPAN + off);
    const uint64_t db = desc_sw<SPAN>(k_s + cb * T::BC * SPAN + off);
    if constexpr (FP8) wgmma_ss_m64n128k32_e4m3(s, da, db, kk > 0);
    else wgmma_ss_m64n128k16_bf16(s, da, db, kk > 0);
  }
}

template <bool FP8, int D, bool P_E5M2>
static __device__ __forceinline__ void pv_mma(float (&o)[Tile<FP8, D>::NACC],
                                              const uint32_t (&a)[Tile<FP8, D>::PSTEPS][4], uint32_t v_s,
                                              bool accumulate) {
  using T = Tile<FP8, D>;
#pragma unroll
  for (int kk = 0; kk < T::PSTEPS; kk++) {
    const int cb = (kk * 32) / 128, off = (kk * 32) % 128;
    const uint64_t db = desc_sw128(v_s + cb * T::VROWS * 128 + off);
    const bool acc = accumulate || kk > 0;
    if constexpr (D == 128) {
      if constexpr (FP8 && P_E5M2) wgmma_rs_m64n136k32_e5m2_e4m3(o, a[kk], db, acc);
      else if constexpr (FP8) wgmma_rs_m64n136k32_e4m3(o, a[kk], db, acc);
      else wgmma_rs_m64n136k16_bf16(o, a[kk], db, acc);
    } else {
      if constexpr (FP8 && P_E5M2) wgmma_rs_m64n72k32_e5m2_e4m3(o, a[kk], db, acc);
      else if constexpr (FP8) wgmma_rs_m64n72k32_e4m3(o, a[kk], db, acc);
      else wgmma_rs_m64n72k16_bf16(o, a[kk], db, acc);
    }
  }
}

// MODE: 0 exact softmax (bf16), 1 Fused-Softmax u8 code, 2 Fused-Softmax fp32 bits,
// 3 exp then E4M3 P, 4 EFQ, 5 exp then MX P in E5M2 bytes, 6 exp then MX P in E4M3 bytes
// (PBytes above). SUB: for MODE 4 the EFQ rule (efq_variant), for MODES 5 and 6 P's element
// format, as compile-time constants (sub_of: one per-element path per instance).
template <bool FP8, int D, int MODE, int SUB>
__global__ void __launch_bounds__(THREADS, 1)
    attention_wgmma_kernel(AttnParams P, const uint8_t* __restrict__ q, const float* __restrict__ qmul,
                           const uint8_t* __restrict__ k, const float* __restrict__ kmul,
                           const uint8_t* __restrict__ vt, const float* __restrict__ vscale, int sq_pad, int sk_pad,
                           void* __restrict__ out, unsigned long long* __restrict__ rollbacks, int* __restrict__ bad) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // This pass targets a GPU without wgmma (sm_80/89, or the portable PTX): the host never
  // launches the kernel there (mxa_attention_wgmma_supported), so an empty body suffices.
  __trap();
#else
  using T = Tile<FP8, D>;
  constexpr int BC = T::BC, VROWS = T::VROWS, NACC = T::NACC;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t q_s = smem_u32(smem), k_s = q_s + T::Q_BYTES, v_s = k_s + T::STAGES * T::K_BYTES;
  // mbarriers: K full/empty, V full/empty (one per stage each), Q
  const uint32_t bars = q_s + T::BAR_OFF;
  const uint32_t k_full = bars, k_empty = bars + 8 * T::STAGES;
  const uint32_t v_full = bars + 16 * T::STAGES, v_empty = bars + 24 * T::STAGES;
  const uint32_t q_bar = bars + 32 * T::STAGES;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (q_s & 1023) {  // the swizzle atoms need 1024-byte alignment
    if (tid == 0) atomicOr(bad, 8);
    return;
  }
  const int nqb = sq_pad / ROWS;
  int qb, bh;
  cta_block(P, nqb, qb, bh);
  const int h = bh % P.hq, bb = bh / P.hq;
  const int kvh = h / (P.hq / P.hkv);
  const int q0 = qb * ROWS;
  const int len = P.kv_lens[bb];
  int cta_vis = len;
  if (P.causal) {
    const int last = min(P.sq - 1, q0 + ROWS - 1);
    cta_vis = (int)max(0LL, min((long long)len, (long long)last + len - P.sq + 1));
  }
  const int ntiles = (cta_vis + BC - 1) / BC;

  if (tid == 0) {
    for (int s = 0; s < T::STAGES; s++) {
      mbar_init(k_full + 8 * s, 1);  // full: the producer's arrive + the bytes
      mbar_init(v_full + 8 * s, 1);
      mbar_init(k_empty + 8 * s, CONSUMERS * 128);  // empty: every consumer thread
      mbar_init(v_empty + 8 * s, CONSUMERS * 128);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  // the ones row (L) and zero rows under the D channel rows of every Vᵀ stage and column block
  for (int i = tid; i < T::STAGES * T::VCB * 8 * 32; i += THREADS) {
    const int w = i % 32, r = D + (i / 32) % 8, cbs = i / 256;
    const uint32_t one = FP8 ? 0x38383838u : 0x3F803F80u;
    ((uint32_t*)(smem + T::Q_BYTES + T::STAGES * T::K_BYTES + cbs * VROWS * 128 + r * 128))[w] = r == D ? one : 0u;
  }
  fence_proxy_async();
  __syncthreads();

  if (warp >= CONSUMERS * 4) {
    // ---- producer warpgroup: gives its registers to the consumers; one lane streams Q
    // once, then K/Vᵀ tiles through the ring
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (warp == CONSUMERS * 4 && lane == 0) {
      const uint8_t* qg = q + (((int64_t)bb * P.hq + h) * sq_pad + q0) * D * T::ES;
      mbar_expect_tx(q_bar, T::Q_BYTES);
      bulk_copy(q_s, qg, T::Q_BYTES, q_bar);
      const uint8_t* kg = k + ((int64_t)bb * P.hkv + kvh) * sk_pad * D * T::ES;
      const uint8_t* vg = vt + ((int64_t)bb * P.hkv + kvh) * sk_pad * D * T::ES;
      for (int j = 0; j < ntiles; j++) {
        const int s = j % T::STAGES, use = j / T::STAGES;
        if (use > 0) mbar_wait(k_empty + 8 * s, (use - 1) & 1);
        mbar_expect_tx(k_full + 8 * s, T::K_BYTES);
        bulk_copy(k_s + s * T::K_BYTES, kg + (int64_t)j * T::K_BYTES, T::K_BYTES, k_full + 8 * s);
        if (use > 0) mbar_wait(v_empty + 8 * s, (use - 1) & 1);
        mbar_expect_tx(v_full + 8 * s, T::VT_BYTES);
#pragma unroll
        for (int cb = 0; cb < T::VCB; cb++)
          bulk_copy(v_s + s * T::V_STAGE + cb * VROWS * 128, vg + (int64_t)j * T::VT_BYTES + cb * D * 128, D * 128,
                    v_full + 8 * s);
      }
    }
    return;
  }

  // ---- consumer warpgroups
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  const int wg = warp / 4, wr = warp % 4;  // warpgroup, warp within it
  const int g = lane / 4, t = lane % 4;
  const int row0 = q0 + wg * BR + wr * 16 + g;  // this thread's rows: row0 and row0 + 8
  int nvis[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = row0 + 8 * r;
    int n = len;
    if (P.causal) n = (int)max(0LL, min((long long)len, (long long)i + len - P.sq + 1));
    nvis[r] = i < P.sq ? n : 0;
  }
  const int nvis_min = min(nvis[0], nvis[1]);
  const float* kmul_h = kmul + ((int64_t)bb * P.hkv + kvh) * (sk_pad / BC);
  const uint32_t qw_s = q_s + wg * BR * D * T::ES;

  float m[2] = {NEG_INF, NEG_INF};
  bool started[2] = {false, false};
  unsigned nroll = 0;
  float qm[2] = {1.0f, 1.0f};
  if (FP8) {
#pragma unroll
    for (int r = 0; r < 2; r++) qm[r] = qmul[((int64_t)bb * P.hq + h) * sq_pad + row0 + 8 * r];
  }
  const float G = MODE == 1 || MODE == 2 ? P.fused_g : 1.0f;
  // O: for BF16 in registers (the MMA accumulates in f32). FP8 MMAs sum with fewer bits
  // (relative to the largest addend, the accumulator included), so for FP8 the MMA
  // accumulates runs of at most RUN tiles (16 k-steps) in `acc`, and O, in f32 in shared
  // memory (one of the two layouts below), takes each run.
  constexpr int RUN = 4;
  // Softmax of tile j while PV(j−1) runs needs two P register sets: room for FP8's 16
  // registers each, not for BF16's 32 beside its accumulators.
  constexpr bool OVERLAP = FP8;
  float acc[NACC];
#pragma unroll
  for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
  // Two layouts of O, by measurement (kernels/NOTES.md v3 item 15): a thread's NACC values
  // contiguous, read and written as float4 (NACC is 4 mod 8, so the 8 lanes of one 16-byte
  // phase cover the 32 banks once), made EFQ, exp->MX P and exp->E4M3 up to 9 % faster (one
  // row 0.8 % slower) and Fused-Softmax 0.5-3 % slower, which keeps the scalar one (a
  // thread's values 128 floats apart, also conflict-free).
  constexpr bool O_VEC = !(MODE == 1 || MODE == 2);
  static_assert(NACC % 8 == 4, "the O layout's 16-byte accesses are conflict-free for NACC = 4 mod 8");
  float4* o_sm = (float4*)(smem + T::O_OFF) + (wg * 128 + tid % 128) * (NACC / 4);
  float* o_s1 = (float*)(smem + T::O_OFF) + wg * NACC * 128 + (tid % 128);
  if (FP8 && O_VEC) {
#pragma unroll
    for (int i = 0; i < NACC / 4; i++) o_sm[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  } else if (FP8) {
#pragma unroll
    for (int i = 0; i < NACC; i++) o_s1[i * 128] = 0.0f;
  }
  mbar_wait(q_bar, 0);

  // The scores of one tile into P (the PV MMA's A fragments) and the tile's α.
  // km: tile j's K scale, loaded by the caller before its waits, not at the head of the
  // softmax (timing unchanged, kernels/NOTES.md v3 item 11c)
  auto softmax = [&](int j, float km, float (&s)[64], uint32_t (&a)[T::PSTEPS][4], float (&alpha)[2]) {
    const int key0 = j * BC;
    if (key0 + BC > nvis_min) {  // keys past a row's visible range score −inf
#pragma unroll
      for (int i = 0; i < BC / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = key0 + 8 * i + 2 * t + (e & 1);
          if (key >= nvis[e >> 1]) s[4 * i + e] = NEG_INF;
        }
    }

    alpha[0] = alpha[1] = 1.0f;
    // The two rows' maxima. Fused-Softmax: 4 partial maxima per row (chains of 4, then a tree
    // of 2 levels), the two rows interleaved, then the quad's shuffles for both; the other
    // modes keep one running max per row (two serial chains of 17 dependent FMNMX). Measured
    // both ways (kernels/NOTES.md v3 item 11): the split is 1-2 % faster for Fused u8 and
    // MXFP4, 1-3 % slower for exact BF16 and exp->E4M3. (A full tree over 16 pairs per row
    // went to local memory: 128-byte stack frame, 1.5x slower.)
    float rmax[2];  // Fused-Softmax only
    if constexpr (MODE == 1 || MODE == 2) {
      float v[2][4];
#pragma unroll
      for (int i = 0; i < BC / 8; i++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const float pr = fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
          v[r][i % 4] = i < 4 ? pr : fmaxf(v[r][i % 4], pr);
        }
#pragma unroll
      for (int r = 0; r < 2; r++) rmax[r] = fmaxf(fmaxf(v[r][0], v[r][1]), fmaxf(v[r][2], v[r][3]));
#pragma unroll
      for (int o = 1; o <= 2; o *= 2)
#pragma unroll
        for (int r = 0; r < 2; r++) rmax[r] = fmaxf(rmax[r], __shfl_xor_sync(0xffffffffu, rmax[r], o));
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float smax;
      if constexpr (MODE == 1 || MODE == 2) {
        smax = rmax[r];
      } else {
        smax = NEG_INF;
#pragma unroll
        for (int i = 0; i < BC / 8; i++) smax = fmaxf(smax, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
        smax = quad_max(smax);
      }
      const float unit = qm[r] * km;  // S_true = S_mma · unit (a power of two)
      if (smax != NEG_INF && !(fabsf(smax * unit) < INFINITY)) atomicOr(bad, 4);
      if (MODE == 1 || MODE == 2) {
        const float mult = G * unit;
        if (!started[r] && smax != NEG_INF) {
          m[r] = smax * unit - 0.125f;
          started[r] = true;
        }
        const float bias = started[r] ? P.fused_off - G * m[r] : NEG_INF;
        const float amax = started[r] ? fmaf(smax, mult, bias) : NEG_INF;
        float delta = 0.0f;
        if (amax > P.fused_thr) {
          delta = amax - P.fused_off;
          m[r] += delta / G;
          alpha[r] = exp2f(-delta / G);
          nroll++;
        }
        // u8 code, common case (no rollback in this tile): the scaled form, two instructions
        // per score instead of four (the general form's rollback subtraction is predicated,
        // so it takes an issue slot even when delta is 0; kernels/NOTES.md v3 item 14).
        const float mult_s = mult * (1.0f / 256.0f), bias_s = bias * (1.0f / 256.0f);
        if (MODE == 1 && delta == 0.0f && u8_code_scaled_ok(mult, bias, mult_s, bias_s)) {
#pragma unroll
          for (int i = 0; i < BC / 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) s[4 * i + 2 * r + e] = u8_code_scaled(s[4 * i + 2 * r + e], mult_s, bias_s);
        } else if (MODE == 1) {
#pragma unroll
          for (int i = 0; i < BC / 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) s[4 * i + 2 * r + e] = u8_code(s[4 * i + 2 * r + e], mult, bias, delta);
        } else {
#pragma unroll
          for (int i = 0; i < BC / 8; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              float x = fmaf(s[4 * i + 2 * r + e], mult, bias);
              if (delta != 0.0f) x -= delta;
              s[4 * i + 2 * r + e] = __uint_as_float(x > 0.0f ? (unsigned)x : 0u);
            }
        }
      } else if (MODE == 4) {
        // EFQ: the running max in natural-log units (α = e^(m_old − m_new), as the CPU's
        // FlashAttention loop), then per 32-key block (this row's 8 values in each of the
        // quad's 4 threads) the scale exponent from the block max, once, and each value's
        // code: P = C8[c]·2^k, no exp, held as P·2^14 (PBytes). x = s·mult − m rounded
        // twice as on the CPU: the row max gives exactly 0 (an FMA would leave the product's
        // rounding error there, and the Floor scale's k steps at 0).
        const float mult = P.score_scale * unit;
        const float mn = fmaxf(m[r], smax * mult);
        if (mn != NEG_INF) alpha[r] = expf(m[r] - mn);
        m[r] = mn;
#pragma unroll
        for (int b = 0; b < BC / 32; b++) {
          float x[8];
          float mb = NEG_INF;
#pragma unroll
          for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
              const float v = mn == NEG_INF ? NEG_INF : __fmul_rn(s[4 * (4 * b + i) + 2 * r + e], mult) - mn;
              x[2 * i + e] = v;
              mb = fmaxf(mb, v);
            }
          mb = quad_max(mb);
          const EfqBlock blk = efq_block_t<SUB == EFQV_TABLE ? 1 : 0>(P, mb);
          // P·2^14 (PBytes<4>) as E5M2 bytes, straight into the A fragments: x[0..3] are
          // key chunks 4b and 4b+1 (register r of PV step b), x[4..7] chunks 4b+2 and 4b+3
          // (register 2 + r). A row with no visible key has x = −inf, code 0 in every rule:
          // no per-element guard.
          const CodeBytes tb = e2m1_code_bytes(pow2f(blk.k + 14));
          unsigned c[8];
#pragma unroll
          for (int i = 0; i < 8; i++) c[i] = efq_code_v<SUB>(P, blk, x[i]);
          a[b][r] = code_bytes4(tb, c[0], c[1], c[2], c[3]);
          a[b][2 + r] = code_bytes4(tb, c[4], c[5], c[6], c[7]);
        }
      } else {
        // exact online softmax in log2 units (MODE 0), then E4M3 P (MODE 3) or MX P per
        // 32-key block (MODES 5, 6: the block max over the quad, mx_block_fake_quant's
        // arithmetic)
        const float mult = P.score_scale * P.log2e * unit;
        const float mn = fmaxf(m[r], smax * mult);
        if (mn != NEG_INF) alpha[r] = ex2(m[r] - mn);
        m[r] = mn;
        // −m per row, or −inf for a row with no visible key yet, so that every y is −inf there
        // and ex2 gives 0 without a select per score. E4M3 P's factor 2^8 goes into the
        // exponent (8 − m, rounded once per row; a relative change of P within ex2.approx's
        // own error) instead of a multiply per score.
        const float negm = mn == NEG_INF ? NEG_INF : (MODE == 3 ? 8.0f - mn : -mn);
#pragma unroll
        for (int i = 0; i < BC / 8; i++)
#pragma unroll
          for (int e = 0; e < 2; e++) {
            // MX P: the row max must give exactly 1 (x = 0, not an FMA's rounding error of
            // s·mult, which moves the Floor scale's block exponent); E4M3 P and exact fuse.
            if constexpr (MODE == 0) {
              // exact BF16 keeps the select per score: with the −inf offset it ran 1.5–3 %
              // slower (kernels/NOTES.md v3 item 14)
              const float y = fmaf(s[4 * i + 2 * r + e], mult, -mn);
              const float x = mn == NEG_INF ? 0.0f : ex2(y);
              s[4 * i + 2 * r + e] = x;
            } else {
              const float y = MODE == 5 || MODE == 6 ? __fmul_rn(s[4 * i + 2 * r + e], mult) + negm
                                                     : fmaf(s[4 * i + 2 * r + e], mult, negm);
              s[4 * i + 2 * r + e] = ex2(y);
            }
          }
        if (MODE == 5 || MODE == 6) {
          const int p_emax = fmt_info(SUB).emax;
          const unsigned p_thr = mx_scale_thr(SUB, P.p_scale);  // per call, not per block
#pragma unroll
          for (int b = 0; b < BC / 32; b++) {
            float amax = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) amax = fmaxf(amax, fmaxf(s[4 * (4 * b + i) + 2 * r], s[4 * (4 * b + i) + 2 * r + 1]));
            amax = quad_max(amax);
            const int ex = mx_shared_exp_thr(amax, p_emax, p_thr);
            const float down = pow2f(-ex), up = e8m0_decode((unsigned)(ex + 127)) * PBytes<MODE>::SCALE;
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
              for (int e = 0; e < 2; e++) {
                float& v = s[4 * (4 * b + i) + 2 * r + e];
                // the value times PBytes' factor; E4M3 (6) or E5M2 (5) bytes in pairs at packing
                if constexpr (SUB == FMT_E2M1) v = e2m1_round_nonneg(v * down) * up;
                else if constexpr (SUB == FMT_E4M3 || SUB == FMT_E5M2) v = fp8_round<SUB>(v * down) * up;
                else v = mx_decode(mx_encode(v * down, SUB), SUB) * up;
              }
          }
        }
      }
    }
    // P as the A operand of the PV MMA (EFQ wrote its own above)
    if constexpr (MODE != 4) {
#pragma unroll
      for (int kk = 0; kk < T::PSTEPS; kk++) {
        if constexpr (FP8) {
          const int c0 = 16 * kk;  // s index of key chunk 4kk
          if (MODE == 1) {
            a[kk][0] = pick_bytes(s[c0 + 0], s[c0 + 1], s[c0 + 4], s[c0 + 5]);
            a[kk][1] = pick_bytes(s[c0 + 2], s[c0 + 3], s[c0 + 6], s[c0 + 7]);
            a[kk][2] = pick_bytes(s[c0 + 8], s[c0 + 9], s[c0 + 12], s[c0 + 13]);
            a[kk][3] = pick_bytes(s[c0 + 10], s[c0 + 11], s[c0 + 14], s[c0 + 15]);
          } else {
            a[kk][0] = p_bytes2<MODE>(s[c0 + 0], s[c0 + 1]) | (p_bytes2<MODE>(s[c0 + 4], s[c0 + 5]) << 16);
            a[kk][1] = p_bytes2<MODE>(s[c0 + 2], s[c0 + 3]) | (p_bytes2<MODE>(s[c0 + 6], s[c0 + 7]) << 16);
            a[kk][2] = p_bytes2<MODE>(s[c0 + 8], s[c0 + 9]) | (p_bytes2<MODE>(s[c0 + 12], s[c0 + 13]) << 16);
            a[kk][3] = p_bytes2<MODE>(s[c0 + 10], s[c0 + 11]) | (p_bytes2<MODE>(s[c0 + 14], s[c0 + 15]) << 16);
          }
        } else {
          const int c0 = 8 * kk;
          a[kk][0] = pack_bf16(s[c0 + 0], s[c0 + 1]);
          a[kk][1] = pack_bf16(s[c0 + 2], s[c0 + 3]);
          a[kk][2] = pack_bf16(s[c0 + 4], s[c0 + 5]);
          a[kk][3] = pack_bf16(s[c0 + 6], s[c0 + 7]);
        }
      }
    }
  };
  // O (and the open run) ·= α, per row.
  auto scale_o = [&](const float (&alpha)[2]) {
    if (alpha[0] == 1.0f && alpha[1] == 1.0f) return;
    scale_rows(acc, alpha);
    if (FP8 && O_VEC) {
#pragma unroll
      for (int i = 0; i < NACC / 4; i++) {  // elements 4i, 4i + 1 of row g; 4i + 2, 4i + 3 of row g + 8
        float4 v = o_sm[i];
        v.x *= alpha[0], v.y *= alpha[0], v.z *= alpha[1], v.w *= alpha[1];
        o_sm[i] = v;
      }
    } else if (FP8) {
#pragma unroll
      for (int i = 0; i < NACC; i++) o_s1[i * 128] *= alpha[(i >> 1) & 1];
    }
  };

  // Slot j issues QK of tile j and PV of tile j−1 (in that order, as two commit groups),
  // runs tile j's softmax as soon as its scores land, while PV(j−1) is still on the
  // tensor cores (FP8; BF16 waits for both first), then waits for PV. The two consumer warpgroups also take turns to issue
  // (named barriers 1 and 2, warpgroup 0 first), so one's softmax overlaps the other's
  // MMAs. P of consecutive tiles alternates between two register sets.
  const int my_bar = 1 + wg, other_bar = 2 - wg;
  if (wg == 1) named_bar_arrive(1, CONSUMERS * 128);
  auto run_slot = [&](int j, uint32_t(&a_in)[T::PSTEPS][4], uint32_t(&a_out)[T::PSTEPS][4],
                      float(&al_out)[2], auto has_pv, auto has_qk) {
    constexpr bool HAS_PV = decltype(has_pv)::value, HAS_QK = decltype(has_qk)::value;
    const int jp = j - 1;
    const float km = FP8 && HAS_QK ? kmul_h[j] : 1.0f;
    if (HAS_QK) mbar_wait(k_full + 8 * (j % T::STAGES), (j / T::STAGES) & 1);
    if (HAS_PV) mbar_wait(v_full + 8 * (jp % T::STAGES), (jp / T::STAGES) & 1);
    named_bar_sync(my_bar, CONSUMERS * 128);
    const bool fresh = FP8 && jp % RUN == 0;  // PV starts a new run
    // The closed run joins O here, inside the turn: at the end of the previous slot instead
    // it sat on this warpgroup's own path to its next issue and the FP8 paths ran 2-3 %
    // slower (kernels/NOTES.md v3 item 11).
    if (HAS_PV && fresh && jp > 0) {
      if constexpr (O_VEC) {
#pragma unroll
        for (int i = 0; i < NACC / 4; i++) {
          float4 v = o_sm[i];
          v.x += acc[4 * i], v.y += acc[4 * i + 1], v.z += acc[4 * i + 2], v.w += acc[4 * i + 3];
          o_sm[i] = v;
        }
      } else {
#pragma unroll
        for (int i = 0; i < NACC; i++) o_s1[i * 128] += acc[i];
      }
    }
    float s[64];
    wgmma_fence();
    if constexpr (HAS_QK) {
      qk_mma<FP8, D>(s, qw_s, k_s + (j % T::STAGES) * T::K_BYTES);
      wgmma_commit();
    }
    if constexpr (HAS_PV) {
      pv_mma<FP8, D, PBytes<MODE>::E5M2>(acc, a_in, v_s + (jp % T::STAGES) * T::V_STAGE, !fresh);
      wgmma_commit();
    }
    if (!(wg == 1 && !HAS_QK)) named_bar_arrive(other_bar, CONSUMERS * 128);
    auto pv_done = [&]() {
      wgmma_wait<0>();
      fence_regs(acc);
      fence_regs_u(a_in);
      mbar_arrive(v_empty + 8 * (jp % T::STAGES));  // this thread is done with V(jp)
    };
    if constexpr (HAS_QK) {
      if constexpr (HAS_PV && OVERLAP) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
        if constexpr (HAS_PV) pv_done();
      }
      fence_regs(s);
      mbar_arrive(k_empty + 8 * (j % T::STAGES));  // this thread is done with K(j)
      softmax(j, km, s, a_out, al_out);
    }
    if constexpr (HAS_PV && (OVERLAP || !HAS_QK)) pv_done();
    if constexpr (HAS_QK) scale_o(al_out);  // tile j's α, before PV(j) adds in
  };
  using yes = std::true_type;
  using no = std::false_type;
  uint32_t a0[T::PSTEPS][4], a1[T::PSTEPS][4];
  float al0[2], al1[2];
  if (ntiles > 0 && OVERLAP) {
    run_slot(0, a1, a0, al0, no{}, yes{});
    for (int j = 1; j < ntiles; j += 2) {
      run_slot(j, a0, a1, al1, yes{}, yes{});
      if (j + 1 < ntiles) run_slot(j + 1, a1, a0, al0, yes{}, yes{});
    }
    if ((ntiles - 1) % 2 == 0) run_slot(ntiles, a0, a1, al1, yes{}, no{});
    else run_slot(ntiles, a1, a0, al0, yes{}, no{});
  } else if (ntiles > 0) {  // one P register set: PV(j−1) is done before softmax(j)
    run_slot(0, a0, a0, al0, no{}, yes{});
    for (int j = 1; j < ntiles; j++) run_slot(j, a0, a0, al0, yes{}, yes{});
    run_slot(ntiles, a0, a0, al0, yes{}, no{});
  } else {
    run_slot(0, a0, a1, al0, no{}, no{});  // keeps the turn handshake balanced
  }
  float o[NACC];
#pragma unroll
  for (int i = 0; i < NACC; i++) o[i] = FP8 && !O_VEC ? o_s1[i * 128] + acc[i] : acc[i];
  if (FP8 && O_VEC) {
#pragma unroll
    for (int i = 0; i < NACC / 4; i++) {
      const float4 v = o_sm[i];
      o[4 * i] += v.x, o[4 * i + 1] += v.y, o[4 * i + 2] += v.z, o[4 * i + 3] += v.w;
    }
  }

  // ---- epilogue: O / L (L = column D, held by the quad's lane t = 0)
  // The V channel scales of this thread's channels (n·8 + 2t + c) are loaded together before
  // any output, and the output type is chosen once per row: with a load and a type switch per
  // element, each load waited for the previous element's store (ncu at 4k causal: a fifth of
  // the kernel's stall samples on those multiplies; kernels/NOTES.md v3 item 20).
  const int64_t stride = P.with_lse ? D + 1 : D;
  const bool has_vs = vscale != nullptr;
  float vs[D / 4];
  if (has_vs) {
    const float* vsc = vscale + ((int64_t)bb * P.hkv + kvh) * D;
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) vs[2 * n + c] = vsc[n * 8 + 2 * t + c];
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float l = __shfl_sync(0xffffffffu, o[D / 2 + 2 * r], lane & ~3);
    const int i = row0 + 8 * r;
    if (i >= P.sq) continue;
    const int64_t row = ((int64_t)bb * P.hq + h) * P.sq + i;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    float val[D / 4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
      for (int c = 0; c < 2; c++) {
        float v = o[4 * n + 2 * r + c];
        if (has_vs) v *= vs[2 * n + c];
        val[2 * n + c] = l > 0.0f ? v * inv : 0.0f;
      }
    // A thread's two channels 2t, 2t + 1 are adjacent: without the LSE column the row stride
    // (D) is even and the launcher checks the buffer's alignment, so each pair is one aligned
    // store.
    const int64_t base = row * stride + 2 * t;
    if (P.with_lse) {
#pragma unroll
      for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) ((float*)out)[base + n * 8 + c] = val[2 * n + c];
    } else if (P.out_dtype == 0) {  // 0 f32 (always with the LSE), 1 bf16, 2 f16
#pragma unroll
      for (int n = 0; n < D / 8; n++)
        *(float2*)((float*)out + base + n * 8) = make_float2(val[2 * n], val[2 * n + 1]);
    } else if (P.out_dtype == 1) {
#pragma unroll
      for (int n = 0; n < D / 8; n++)
        *(__nv_bfloat162*)((bf16_t*)out + base + n * 8) =
            __halves2bfloat162(__float2bfloat16_rn(val[2 * n]), __float2bfloat16_rn(val[2 * n + 1]));
    } else {
#pragma unroll
      for (int n = 0; n < D / 8; n++)
        *(__half2*)((f16_t*)out + base + n * 8) =
            __halves2half2(__float2half_rn(val[2 * n]), __float2half_rn(val[2 * n + 1]));
    }
    if (P.with_lse && t == 0) {
      float lse = NEG_INF;
      if (nvis[r] > 0 && l > 0.0f) {
        if (MODE == 4) lse = m[r] + logf(l / PBytes<MODE>::SCALE);  // EFQ: m in natural-log units
        else lse = P.ln2 * (m[r] + log2f(l / PBytes<MODE>::SCALE));
      }
      ((float*)out)[row * stride + D] = lse;
    }
  }
  if (t == 0 && nroll) atomicAdd(rollbacks, (unsigned long long)nroll);
#endif  // wgmma available in this pass
}

static int mode_of(const AttnParams* P) {
  if (P->algo == ALGO_EXACT) return 0;
  if (P->algo == ALGO_FUSED) return P->fused_kind == FUSED_U8 ? 1 : 2;
  if (P->algo == ALGO_EFQ) return 4;
  if (P->p_kind == PROB_MX) return P->p_elem == FMT_E2M3 || P->p_elem == FMT_E4M3 ? 6 : 5;
  return 3;
}

static bool fp8_operand(const OperandFmt& f) {
  // MX elements (any format) and E4M3 per-channel codes have at most 4 significant bits.
  return f.kind == OPK_MX || (f.kind == OPK_PER_CHANNEL && f.elem == FMT_E4M3);
}

template <bool FP8, int D, int MODE, int SUB = 0>
static int launch(const AttnParams* P, const void* q, const float* qmul, const void* k, const float* kmul,
                  const void* vt, const float* vscale, int sq_pad, int sk_pad, void* out,
                  unsigned long long* rollbacks, int* bad, gpuStream_t stream) {
  auto kern = attention_wgmma_kernel<FP8, D, MODE, SUB>;
  const int smem = Tile<FP8, D>::SMEM;
  if (gpuFuncSetMaxDynamicSmem(kern, smem) != GPU_SUCCESS) return MXA_ERR_SMEM;
  const int64_t grid = (int64_t)(sq_pad / ROWS) * P->hq * P->b;
  kern<<<(unsigned)grid, THREADS, smem, stream>>>(*P, (const uint8_t*)q, qmul, (const uint8_t*)k, kmul,
                                                 (const uint8_t*)vt, vscale, sq_pad, sk_pad, out, rollbacks, bad);
  return mxa_status();
}

}  // namespace wg

// Whether this build has sm_90a code (build.rs defines MXA_HAVE_SM90A when 90a is among the
// architectures) and the current device runs it (compute capability 9.0: H100, H200).
static bool wgmma_runs_here() {
#if defined(MXA_HAVE_SM90A)
  return mxa_device_cc() == 90;
#else
  return false;
#endif
}

extern "C" int mxa_wgmma_available() { return wgmma_runs_here() ? 1 : 0; }

// 0: not taken; 1: BF16 operands (exact softmax); 2: FP8 E4M3 operands.
extern "C" int mxa_attention_wgmma_supported(const AttnParams* P) {
  if (!wgmma_runs_here()) return 0;
  if (!wg::head_dim_ok(P->d) || P->hkv <= 0 || P->hq % P->hkv != 0) return 0;
  const bool native = (P->qk.kind == OPK_NATIVE || P->qk.kind == OPK_BF16) &&
                      (P->v.kind == OPK_NATIVE || P->v.kind == OPK_BF16);
  if (P->algo == ALGO_EXACT && P->p_kind == PROB_F32 && native) return 1;
  const bool fp8_ops = wg::fp8_operand(P->qk) && wg::fp8_operand(P->v);
  if (!fp8_ops) return 0;
  if (P->algo == ALGO_FUSED && P->p_kind == PROB_F32 &&
      (P->fused_kind == FUSED_U8 || P->fused_kind == FUSED_F32BITS))
    return 2;
  if (P->algo == ALGO_ETQ && P->p_kind == PROB_FP8 && P->p_elem == FMT_E4M3) return 2;
  // P in 32-key blocks: one block is 8 keys of each of a quad's 4 threads (see softmax)
  if (P->algo == ALGO_ETQ && P->p_kind == PROB_MX && P->p_block == 32) return 2;
  if (P->algo == ALGO_EFQ && P->p_kind == PROB_F32 && P->efq_block == 32) return 2;
  return 0;
}

// Row and key padding the packed operands need, and Q's packed block (one warpgroup's rows).
extern "C" int mxa_wgmma_rows_per_cta() { return wg::ROWS; }
extern "C" int mxa_wgmma_rows_per_warpgroup() { return wg::BR; }
extern "C" int mxa_wgmma_keys_per_tile() { return wg::BC_ALL; }

namespace wg {
static __device__ __forceinline__ uint32_t mix32(uint32_t x) {  // a 32-bit integer hash
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
// Test hook: u8_code against u8_code_scaled over n generated inputs as the kernel meets them
// (delta 0, x <= thr, the scaled operands exact): scores across 40 binades, 1 in 8 zero (x is
// then bias itself, halves included: the rounding ties) and 1 in 64 masked (−inf); mult = g·2^k
// for k in [−140, 11] (the smallest fail u8_code_scaled_ok and are skipped, as in the kernel);
// x spread over [−400, 128) and a bias of −inf (a row not started) 1 in 64.
// counts[0] += inputs compared, counts[1] += codes that differ.
__global__ void u8_code_check_kernel(long long n, uint32_t seed, float g, float thr, unsigned long long* counts) {
  unsigned long long compared = 0, differ = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const uint32_t h0 = mix32((uint32_t)i ^ seed), h1 = mix32(h0 ^ 0x9e3779b9u), h2 = mix32(h1 ^ 0x85ebca6bu);
    float s = __uint_as_float((h0 & 0x807fffffu) | ((uint32_t)(107 + h1 % 40) << 23));  // ±[2^-20, 2^20)
    if ((h2 & 7) == 0) s = 0.0f;
    if ((h2 & 63) == 1) s = NEG_INF;
    const float mult = ldexpf(g, -140 + (int)((h1 >> 8) % 152));
    // steps of 33/256: 1 in 256 targets is a half (with s = 0, a rounding tie)
    const float target = -400.0f + (float)((h2 >> 6) % 4096) * (528.0f / 4096.0f);
    float bias = target - s * mult;
    if (!(fabsf(bias) < INFINITY)) bias = target;
    if ((h2 >> 24) % 64 == 2) bias = NEG_INF;
    const float x = fmaf(s, mult, bias);
    if (x > thr) continue;  // the rollback keeps every tile's x at most thr
    const float mult_s = mult * (1.0f / 256.0f), bias_s = bias * (1.0f / 256.0f);
    if (!u8_code_scaled_ok(mult, bias, mult_s, bias_s)) continue;
    compared++;
    const uint32_t a = __float_as_uint(u8_code(s, mult, bias, 0.0f)) & 0xffu;
    const uint32_t b = __float_as_uint(u8_code_scaled(s, mult_s, bias_s)) & 0xffu;
    differ += a != b;
  }
  atomicAdd(counts, compared);
  atomicAdd(counts + 1, differ);
}
}  // namespace wg

extern "C" int mxa_wgmma_u8_code_check(long long n, unsigned seed, float g, float thr, unsigned long long* counts,
                                       gpuStream_t stream) {
  if (n <= 0) return MXA_ERR_ARGS;
  wg::u8_code_check_kernel<<<264, 256, 0, stream>>>(n, seed, g, thr, counts);
  return mxa_status();
}

extern "C" int mxa_attention_wgmma(const AttnParams* P, const void* q, const float* qmul, const void* k,
                                   const float* kmul, const void* vt, const float* vscale, int sq_pad, int sk_pad,
                                   void* out, unsigned long long* rollbacks, int* bad, gpuStream_t stream) {
  const int kind = mxa_attention_wgmma_supported(P);
  if (kind == 0 || sq_pad % wg::ROWS != 0 || sk_pad % wg::BC_ALL != 0) return MXA_ERR_ARGS;
  // without the LSE the epilogue stores two adjacent outputs at once (8 bytes for f32, 4 for
  // bf16/f16); with it, single f32s
  const int align = P->with_lse ? 4 : (P->out_dtype == 0 ? 8 : 4);
  if ((uintptr_t)out % align != 0) return MXA_ERR_ARGS;
  if ((int64_t)(sq_pad / wg::ROWS) * P->hq * P->b == 0) return MXA_OK;
  // the kernel's head dims (wg::head_dim_ok), D as a compile-time constant
  auto run = [&](auto dc) -> int {
    constexpr int D = decltype(dc)::value;
#define ARGS P, q, qmul, k, kmul, vt, vscale, sq_pad, sk_pad, out, rollbacks, bad, stream
    switch (wg::mode_of(P)) {
      case 0: return wg::launch<false, D, 0>(ARGS);
      case 1: return wg::launch<true, D, 1>(ARGS);
      case 2: return wg::launch<true, D, 2>(ARGS);
      case 3: return wg::launch<true, D, 3>(ARGS);
      case 4:
        switch (efq_variant(*P)) {
          case EFQV_TABLE: return wg::launch<true, D, 4, EFQV_TABLE>(ARGS);
          case EFQ_LUT: return wg::launch<true, D, 4, EFQ_LUT>(ARGS);
          case EFQ_TWO_PIECE: return wg::launch<true, D, 4, EFQ_TWO_PIECE>(ARGS);
          case EFQ_EXACT: return wg::launch<true, D, 4, EFQ_EXACT>(ARGS);
          default: return wg::launch<true, D, 4, EFQ_AFFINE>(ARGS);
        }
      case 5:
        switch (P->p_elem) {
          case FMT_E2M1: return wg::launch<true, D, 5, FMT_E2M1>(ARGS);
          case FMT_E3M2: return wg::launch<true, D, 5, FMT_E3M2>(ARGS);
          default: return wg::launch<true, D, 5, FMT_E5M2>(ARGS);
        }
      default:
        if (P->p_elem == FMT_E2M3)
          return wg::launch<true, D, 6, FMT_E2M3>(ARGS);
        return wg::launch<true, D, 6, FMT_E4M3>(ARGS);
    }
#undef ARGS
  };
  return P->d == 64 ? run(std::integral_constant<int, 64>{}) : run(std::integral_constant<int, 128>{});
}
#endif  // !__HIPCC__
