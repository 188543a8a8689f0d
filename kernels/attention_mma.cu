// Fast attention for head dims 64 and 128: FlashAttention-2 on BF16 tensor cores
// (mma.sync m16n8k16), every algorithm of src/attention/softmax in the register tile.
//
// Operands arrive prepared (attention_simple.cu's prep, converted to bf16): MX values,
// FP8 codes and E4M3/MX probabilities all have at most 4 significant bits, so bf16 holds
// them exactly and both GEMMs compute on exactly the quantized operands; only the
// summation order (and CUDA's exp) differs from the CPU reference. FP8 V keeps its codes
// in the GEMM and applies the per-channel scale to O.
//
// CTA: 4 warps × 16 query rows, KV tiles of 128 keys (the algorithms' tile), K and V
// staged through shared memory with cp.async (K of the next tile loads during softmax
// and P·V, V of the next tile during the next S). Shared rows are XOR-swizzled in 16-byte
// chunks so ldmatrix is conflict free.
#include <stdint.h>
#include "attention_grid.cuh"
#include "softmax_algos.cuh"

// f32 → bf16 of n values (prepared operands into the GEMM's input type).
__global__ void to_bf16_kernel(const float* __restrict__ x, bf16_t* __restrict__ y, int64_t n) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = f32_to_bf16(x[i]);
}

extern "C" int mxa_to_bf16(const float* x, void* y, int64_t n, gpuStream_t stream) {
  if (n <= 0) return MXA_OK;
  to_bf16_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, (bf16_t*)y, n);
  return mxa_status();
}

#if defined(__HIPCC__)
// The tensor-core path is written in NVIDIA PTX (mma.sync, ldmatrix, cp.async); AMD builds
// take the portable kernel of attention_simple.cu for every call.
extern "C" int mxa_attention_mma_supported(const AttnParams*) { return 0; }
extern "C" int mxa_attention_mma(const AttnParams*, const void*, const void*, const void*, const float*, void*,
                                 unsigned long long*, int*, gpuStream_t) {
  return MXA_ERR_ARGS;
}
#else

#define BR 64
#define BC 128
#define WARPS 4

static __device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0 bytes read: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

static __device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                   uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                         uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

static __device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const uint32_t l = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo));
  const uint32_t h = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi));
  return l | (h << 16);
}

// Reductions over the 4 lanes that share a row. The mask names only the quad: quads of
// one warp may branch differently (their rows' states differ), the 4 lanes of a quad never.
#if defined(__HIPCC__)
#define QUAD_SHFL_XOR(v, m) __shfl_xor((v), (m), 4)
#else
#define QUAD_SHFL_XOR(v, m) __shfl_xor_sync(0xFu << (threadIdx.x & 28u), (v), (m), 4)
#endif
static __device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, QUAD_SHFL_XOR(v, 1));
  return fmaxf(v, QUAD_SHFL_XOR(v, 2));
}
static __device__ __forceinline__ float quad_sum(float v) {
  v += QUAD_SHFL_XOR(v, 1);
  return v + QUAD_SHFL_XOR(v, 2);
}

// Byte offset of (row, 16-byte chunk) in a swizzled tile whose rows are D bf16 wide.
template <int D>
static __device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return (uint32_t)(row * (D * 2) + ((chunk ^ (row & 7)) * 16));
}

// Copies `rows` rows of D bf16 (global row stride D) into a swizzled tile; rows at or past
// `valid` are zero-filled.
template <int D>
static __device__ __forceinline__ void load_tile(uint8_t* tile, const bf16_t* src, int rows, int valid) {
  constexpr int CH = D / 8;  // 16-byte chunks per row
  const uint32_t base = smem_u32(tile);
  for (int i = threadIdx.x; i < rows * CH; i += WARPS * 32) {
    const int r = i / CH, c = i % CH;
    const bool ok = r < valid;
    const bf16_t* g = src + (int64_t)(ok ? r : 0) * D + c * 8;
    cp_async16(base + swz<D>(r, c), g, ok);
  }
}

// P of one row's 32 slots rounded to the call's P format (src/attention/softmax
// quantize_probs): MX blocks of 32 keys = slots [8b, 8b+8) of the quad, or FP8 ×2^8.
static __device__ __forceinline__ void quad_quantize_probs(const AttnParams& P, float* x) {
  if (P.p_kind == PROB_MX) {
#pragma unroll
    for (int b = 0; b < 4; b++) {
      float amax = 0.0f;
#pragma unroll
      for (int e = 8 * b; e < 8 * b + 8; e++) amax = fmaxf(amax, x[e]);
      amax = quad_max(amax);
      const int ex = mx_shared_exp(amax, P.p_elem, P.p_scale);
      const float inv = pow2f(-ex), sc = e8m0_decode((unsigned)(ex + 127));
#pragma unroll
      for (int e = 8 * b; e < 8 * b + 8; e++) x[e] = mx_decode(mx_encode(x[e] * inv, P.p_elem), P.p_elem) * sc;
    }
  } else if (P.p_kind == PROB_FP8) {
#pragma unroll
    for (int e = 0; e < 32; e++) x[e] = mx_decode(mx_encode(x[e] * 256.0f, P.p_elem), P.p_elem) / 256.0f;
  }
}

// One row's 32 scores (this thread's slots) through the algorithm; returns α.
// e = 2*ntile + {0,1}; block b of 32 keys = slots [8b, 8b+8).
// ALGO is a template parameter so each kernel carries only its algorithm's code.
template <int ALGO>
static __device__ __forceinline__ float quad_tile(const AttnParams& P, RowState& st, float* x) {
  float tmax = NEG_INF;
#pragma unroll
  for (int e = 0; e < 32; e++) tmax = fmaxf(tmax, x[e]);
  tmax = quad_max(tmax);
  float alpha_fused = 1.0f;
  if (ALGO == ALGO_FUSED && P.fused_kind != FUSED_EXACT_F32) {
    if (!st.started) {
      if (tmax == NEG_INF) {
#pragma unroll
        for (int e = 0; e < 32; e++) x[e] = 0.0f;
        return 1.0f;
      }
      st.m = tmax - 0.125f;
      st.started = 1;
    }
    const float bias = P.fused_off - P.fused_g * st.m;
    float amax = NEG_INF;
#pragma unroll
    for (int e = 0; e < 32; e++) {
      x[e] = P.fused_g * x[e] + bias;
      amax = fmaxf(amax, x[e]);
    }
    amax = quad_max(amax);
    if (amax > P.fused_thr) {
      const float delta = amax - P.fused_off;
#pragma unroll
      for (int e = 0; e < 32; e++) x[e] -= delta;
      st.m += delta / P.fused_g;
      alpha_fused = exp2f(-delta / P.fused_g);
      st.rollbacks++;
    }
#pragma unroll
    for (int e = 0; e < 32; e++) x[e] = fused_prob(P, x[e]);
  } else {
    const float mn = fmaxf(st.m, tmax);
    const bool base2 = ALGO == ALGO_FUSED;  // the fused floor runs in log2 units
    float alpha = 1.0f;
    if (mn != NEG_INF) alpha = base2 ? exp2f(st.m - mn) : __expf(st.m - mn);
    st.m = mn;
    if (mn == NEG_INF) {
#pragma unroll
      for (int e = 0; e < 32; e++) x[e] = 0.0f;
      return alpha;
    }
    if (ALGO == ALGO_EFQ) {
#pragma unroll
      for (int b = 0; b < 4; b++) {
        float mb = NEG_INF;
#pragma unroll
        for (int e = 8 * b; e < 8 * b + 8; e++) {
          x[e] = x[e] - mn;
          mb = fmaxf(mb, x[e]);
        }
        mb = quad_max(mb);
#pragma unroll
        for (int e = 8 * b; e < 8 * b + 8; e++) x[e] = efq_prob(P, x[e], mb);
      }
      return alpha;
    }
#pragma unroll
    for (int e = 0; e < 32; e++) x[e] = base2 ? exp2f(x[e] - mn) : __expf(x[e] - mn);
    if (ALGO == ALGO_EXACT) return alpha;
    quad_quantize_probs(P, x);  // ETQ, and the fused floor with a P format
    return alpha;
  }
  quad_quantize_probs(P, x);  // fused: optional re-quantization of P along keys
  return alpha_fused;
}

template <int D, int ALGO>
__global__ void __launch_bounds__(WARPS * 32, 2)
    attention_mma_kernel(AttnParams P, const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                         const bf16_t* __restrict__ v, const float* __restrict__ vscale, void* __restrict__ out,
                         unsigned long long* __restrict__ rollbacks, int* __restrict__ bad) {
  constexpr int KS = D / 16;  // k-steps of the S GEMM
  constexpr int NT = D / 8;   // n-tiles of O
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* sq = smem;                      // BR × D
  uint8_t* sk = sq + BR * D * 2;           // BC × D
  uint8_t* sv = sk + BC * D * 2;           // BC × D
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int nqb = (P.sq + BR - 1) / BR;
  int qb, bh;
  cta_block(P, nqb, qb, bh);
  const int h = bh % P.hq, bb = bh / P.hq;
  const int kvh = h / (P.hq / P.hkv);
  const int q0 = qb * BR;
  const int len = P.kv_lens[bb];
  const bf16_t* qh = q + ((int64_t)bb * P.hq + h) * P.sq * D;
  const bf16_t* kh = k + ((int64_t)bb * P.hkv + kvh) * P.sk * D;
  const bf16_t* vh = v + ((int64_t)bb * P.hkv + kvh) * P.sk * D;

  // visible keys of this thread's two rows, and of the CTA's last row
  int nvis[2];
  for (int r = 0; r < 2; r++) {
    const int i = q0 + warp * 16 + g + 8 * r;
    int n = len;
    if (P.causal) n = (int)max(0LL, min((long long)len, (long long)i + len - P.sq + 1));
    nvis[r] = i < P.sq ? n : 0;
  }
  int cta_vis = len;
  if (P.causal) {
    const int last = min(P.sq - 1, q0 + BR - 1);
    cta_vis = (int)max(0LL, min((long long)len, (long long)last + len - P.sq + 1));
  }

  load_tile<D>(sq, qh + (int64_t)q0 * D, BR, P.sq - q0);
  if (cta_vis > 0) load_tile<D>(sk, kh, BC, min(BC, P.sk));
  cp_async_commit();
  if (cta_vis > 0) load_tile<D>(sv, vh, BC, min(BC, P.sk));
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // Q fragments of this warp's 16 rows
  uint32_t qa[KS][4];
  {
    const uint32_t base = smem_u32(sq);
    const int r = warp * 16 + (lane % 16);
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      const int chunk = ks * 2 + lane / 16;
      ldmatrix_x4(base + swz<D>(r, chunk), qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
    }
  }

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  RowState st[2] = {{NEG_INF, 0, 0u}, {NEG_INF, 0, 0u}};
  float l[2] = {0.0f, 0.0f};

  for (int t0 = 0; t0 < cta_vis; t0 += BC) {
    // ---- S = Q·Kᵀ (K of this tile is resident)
    float s[16][4];
#pragma unroll
    for (int n = 0; n < 16; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    {
      const uint32_t base = smem_u32(sk);
#pragma unroll
      for (int ks = 0; ks < KS; ks++) {
#pragma unroll
        for (int np = 0; np < 8; np++) {  // pairs of 8-key n-tiles
          const int key = np * 16 + (lane / 16) * 8 + (lane % 8);
          const int chunk = ks * 2 + ((lane / 8) % 2);
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(base + swz<D>(key, chunk), b0, b1, b2, b3);
          mma_bf16(s[2 * np], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
          mma_bf16(s[2 * np + 1], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b2, b3);
        }
      }
    }
    __syncthreads();  // every warp is done reading K
    const int t1 = t0 + BC;
    if (t1 < cta_vis) load_tile<D>(sk, kh + (int64_t)t1 * D, BC, min(BC, P.sk - t1));
    cp_async_commit();

    // ---- scale, mask, the algorithm's probabilities (per row)
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float x[32];
#pragma unroll
      for (int n = 0; n < 16; n++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int key = t0 + n * 8 + 2 * t + c;
          const float val = s[n][2 * r + c] * P.score_scale;
          const bool live = key < nvis[r] && key < P.sk;
          if (live && !isfinite(val)) atomicOr(bad, 4);
          x[2 * n + c] = live ? val : NEG_INF;
        }
      }
      alpha[r] = quad_tile<ALGO>(P, st[r], x);
      // the operand as the GEMM sees it (bf16), and its row sum
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 16; n++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const float pb = __bfloat162float(__float2bfloat16_rn(x[2 * n + c]));
          s[n][2 * r + c] = pb;
          sum += pb;
        }
      }
      sum = quad_sum(sum);
      l[r] = l[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }

    // ---- O += P·V (V of this tile)
    cp_async_wait<1>();
    __syncthreads();
    {
      const uint32_t base = smem_u32(sv);
#pragma unroll
      for (int kk = 0; kk < 8; kk++) {  // 16 keys per k-step
        const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {  // pairs of 8-channel n-tiles
          const int key = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
          const int chunk = np * 2 + lane / 16;
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(base + swz<D>(key, chunk), b0, b1, b2, b3);
          mma_bf16(o[2 * np], a0, a1, a2, a3, b0, b1);
          mma_bf16(o[2 * np + 1], a0, a1, a2, a3, b2, b3);
        }
      }
    }
    __syncthreads();  // every warp is done reading V
    if (t1 < cta_vis) load_tile<D>(sv, vh + (int64_t)t1 * D, BC, min(BC, P.sk - t1));
    cp_async_commit();
    cp_async_wait<1>();  // K of the next tile
    __syncthreads();
  }
  cp_async_wait<0>();

  // ---- epilogue
  const int64_t stride = P.with_lse ? D + 1 : D;
  const int vsbase = (bb * P.hkv + kvh) * D;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = q0 + warp * 16 + g + 8 * r;
    if (i >= P.sq) continue;
    const int64_t row = ((int64_t)bb * P.hq + h) * P.sq + i;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
#pragma unroll
      for (int c = 0; c < 2; c++) {
        const int ch = n * 8 + 2 * t + c;
        float val = o[n][2 * r + c];
        if (vscale) val *= vscale[vsbase + ch];
        val = l[r] > 0.0f ? val * inv : 0.0f;
        const int64_t idx = row * stride + ch;
        if (P.with_lse || P.out_dtype == 0) ((float*)out)[idx] = val;
        else if (P.out_dtype == 1) ((bf16_t*)out)[idx] = __float2bfloat16_rn(val);
        else ((f16_t*)out)[idx] = __float2half_rn(val);
      }
    }
    if (P.with_lse && t == 0) ((float*)out)[row * stride + D] = nvis[r] == 0 ? NEG_INF : row_lse(P, st[r], l[r]);
  }
  const unsigned rb = (t == 0) ? st[0].rollbacks + st[1].rollbacks : 0u;
  if (rb) atomicAdd(rollbacks, (unsigned long long)rb);
}

// Whether the fast kernel takes this call (else the caller uses attention_simple).
extern "C" int mxa_attention_mma_supported(const AttnParams* P) {
  return (P->d == 64 || P->d == 128) && (P->algo != ALGO_EFQ || P->efq_block == 32) &&
         (P->p_kind != PROB_MX || P->p_block == 32);
}

template <int D, int ALGO>
static int launch_one(const AttnParams* P, const void* q, const void* k, const void* v, const float* vscale,
                      void* out, unsigned long long* rollbacks, int* bad, int64_t grid, size_t smem,
                      gpuStream_t stream) {
  auto kern = attention_mma_kernel<D, ALGO>;
  if (gpuFuncSetMaxDynamicSmem(kern, (int)smem) != GPU_SUCCESS) return MXA_ERR_SMEM;
  kern<<<(unsigned)grid, WARPS * 32, smem, stream>>>(*P, (const bf16_t*)q, (const bf16_t*)k, (const bf16_t*)v, vscale,
                                                     out, rollbacks, bad);
  return mxa_status();
}

template <int ALGO>
static int launch_algo(const AttnParams* P, const void* q, const void* k, const void* v, const float* vscale,
                       void* out, unsigned long long* rollbacks, int* bad, int64_t grid, size_t smem,
                       gpuStream_t stream) {
  if (P->d == 128) return launch_one<128, ALGO>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
  return launch_one<64, ALGO>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
}

extern "C" int mxa_attention_mma(const AttnParams* P, const void* q, const void* k, const void* v,
                                 const float* vscale, void* out, unsigned long long* rollbacks, int* bad,
                                 gpuStream_t stream) {
  if (!mxa_attention_mma_supported(P)) return MXA_ERR_ARGS;
  const int nqb = (P->sq + BR - 1) / BR;
  const int64_t grid = (int64_t)nqb * P->hq * P->b;
  if (grid == 0) return MXA_OK;
  const size_t smem = (size_t)(BR + 2 * BC) * P->d * 2;
  switch (P->algo) {
    case ALGO_EXACT: return launch_algo<ALGO_EXACT>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
    case ALGO_ETQ: return launch_algo<ALGO_ETQ>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
    case ALGO_FUSED: return launch_algo<ALGO_FUSED>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
    default: return launch_algo<ALGO_EFQ>(P, q, k, v, vscale, out, rollbacks, bad, grid, smem, stream);
  }
}
#endif  // !__HIPCC__
