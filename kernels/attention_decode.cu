// Split-KV decode attention (few query rows, long KV) reading the KV cache as stored:
// K and V dense (f32 / bf16 / f16), or MX codes with E8M0 scales (K along the head dim,
// V along the keys in blocks of 32, plus the cache's unquantized V tail). Exact softmax on
// exactly the dequantized values, so it computes what the attention op computes on the
// dequantized cache, up to summation order.
//
// Grid (split, b·hkv): one CTA of D = 128 threads per KV head and chunk of keys holds every
// query row of that head group (GQA rows share each K/V load). Phase 1: thread = key,
// scores for all rows (Q in shared memory, broadcast reads). Phase 2: a warp per row takes
// the chunk's max and exp2. Phase 3: thread = channel, O += P·V. Partial (O, m, l) per split
// are merged by a second kernel.
#include <stdint.h>
#include "attention_params.h"
#include "mx_codec.cuh"

#define DEC_D 128
#define DEC_CHUNK 256   // keys per CTA
#define DEC_MAX_ROWS 16 // query rows of one KV head (group × sq)
#define NEG_INF_F (__int_as_float(0xff800000))

enum DecKind { DEC_F32 = 0, DEC_BF16 = 1, DEC_F16 = 2, DEC_MX = 3 };

#include "decode_params.h"

static __device__ __forceinline__ float load_dense(const void* p, int kind, int64_t i) {
  if (kind == DEC_F32) return ((const float*)p)[i];
  if (kind == DEC_BF16) return bf16_to_f32(((const bf16_t*)p)[i]);
  return f16_to_f32(((const f16_t*)p)[i]);
}

static __device__ __forceinline__ int fmt_bits(int fmt) {
  return fmt == FMT_E2M1 ? 4 : (fmt == FMT_E2M3 || fmt == FMT_E3M2) ? 6 : 8;
}

// Code `j` of an LSB-first bit stream of BITS-bit codes held in 32-bit words.
template <int BITS>
static __device__ __forceinline__ unsigned code_at(const uint32_t* w, int j) {
  const int bit = j * BITS, wi = bit >> 5, sh = bit & 31;
  uint32_t x = w[wi] >> sh;
  if (sh + BITS > 32) x |= w[wi + 1] << (32 - sh);
  return x & ((1u << BITS) - 1u);
}

// Scores of one key against every row: acc[r] = q_r · k (q pre-scaled to log2 units).
template <int BITS>
static __device__ __forceinline__ void key_scores_mx(const uint8_t* codes, const uint8_t* sc, const float* lut,
                                                     const float* qs, int rows, float* acc) {
  constexpr int WORDS = DEC_D * BITS / 32;
  uint32_t w[WORDS + 1];
  const uint4* c4 = (const uint4*)codes;
#pragma unroll
  for (int i = 0; i < WORDS / 4; i++) {
    const uint4 x = c4[i];
    w[4 * i] = x.x;
    w[4 * i + 1] = x.y;
    w[4 * i + 2] = x.z;
    w[4 * i + 3] = x.w;
  }
  w[WORDS] = 0;
#pragma unroll
  for (int blk = 0; blk < DEC_D / 32; blk++) {
    const float scale = e8m0_decode(sc[blk]);
#pragma unroll
    for (int e = 0; e < 32; e += 4) {
      float kv[4];
#pragma unroll
      for (int u = 0; u < 4; u++) kv[u] = lut[code_at<BITS>(w, blk * 32 + e + u)] * scale;
#pragma unroll
      for (int r = 0; r < DEC_MAX_ROWS; r++) {
        if (r >= rows) break;
        const float4 qv = *(const float4*)(qs + r * DEC_D + blk * 32 + e);
        acc[r] += kv[0] * qv.x + kv[1] * qv.y + kv[2] * qv.z + kv[3] * qv.w;
      }
    }
  }
}

// Eight consecutive K values of a dense row (16-byte loads for 16-bit types).
static __device__ __forceinline__ void load8(const void* k, int kind, int64_t i, float* kv) {
  if (kind == DEC_F32) {
    const float4 a = *(const float4*)((const float*)k + i), b = *(const float4*)((const float*)k + i + 4);
    kv[0] = a.x, kv[1] = a.y, kv[2] = a.z, kv[3] = a.w, kv[4] = b.x, kv[5] = b.y, kv[6] = b.z, kv[7] = b.w;
    return;
  }
  const uint4 x = *(const uint4*)((const uint16_t*)k + i);
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int u = 0; u < 8; u++) {
    const uint16_t h = (uint16_t)(w[u / 2] >> (16 * (u % 2)));
    kv[u] = kind == DEC_BF16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
  }
}

static __device__ __forceinline__ void key_scores_dense(const void* k, int kind, int64_t row, const float* qs,
                                                        int rows, float* acc) {
#pragma unroll 4
  for (int c = 0; c < DEC_D; c += 8) {
    float kv[8];
    load8(k, kind, row * DEC_D + c, kv);
#pragma unroll
    for (int r = 0; r < DEC_MAX_ROWS; r++) {
      if (r >= rows) break;
      const float4 qa = *(const float4*)(qs + r * DEC_D + c), qb = *(const float4*)(qs + r * DEC_D + c + 4);
      acc[r] += kv[0] * qa.x + kv[1] * qa.y + kv[2] * qa.z + kv[3] * qa.w + kv[4] * qb.x + kv[5] * qb.y +
                kv[6] * qb.z + kv[7] * qb.w;
    }
  }
}

// V of one channel for 32 consecutive quantized keys starting at key k (a multiple of 32).
template <int BITS>
static __device__ __forceinline__ void v_block_mx(const uint8_t* row, int k, float scale, const float* lut,
                                                  float* vv) {
  constexpr int WORDS = BITS;  // 32 codes · BITS bits = BITS words
  uint32_t w[WORDS + 1];
  const uint32_t* src = (const uint32_t*)(row + (k / 32) * 4 * BITS);
#pragma unroll
  for (int i = 0; i < WORDS; i++) w[i] = src[i];
  w[WORDS] = 0;
#pragma unroll
  for (int j = 0; j < 32; j++) vv[j] = lut[code_at<BITS>(w, j)] * scale;
}

// acc[r] += Σ_k P[r][k] V[k][c] over the quantized keys [k, kend) of channel row `row`, four
// 32-key blocks per round with all their code words and scales loaded first: one block per
// round left the loop waiting on one load at a time (latency-bound, measured with ncu).
// Returns the first key not done (kend rounded down to a block).
template <int BITS>
static __device__ __forceinline__ int pv_mx(const uint8_t* row, const uint8_t* sc, int k, int kend, int k0,
                                            const float* lut, const float (*ps)[DEC_CHUNK], int rows, float* acc) {
  constexpr int G = 4;
  for (; k + 32 * G <= kend; k += 32 * G) {
    uint32_t w[G][BITS];
    uint8_t s8[G];
    const uint32_t* src = (const uint32_t*)(row + (k / 32) * 4 * BITS);
#pragma unroll
    for (int g = 0; g < G; g++) {
      s8[g] = sc[k / 32 + g];
#pragma unroll
      for (int i = 0; i < BITS; i++) w[g][i] = src[g * BITS + i];
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      uint32_t ww[BITS + 1];
#pragma unroll
      for (int i = 0; i < BITS; i++) ww[i] = w[g][i];
      ww[BITS] = 0;
      const float scale = e8m0_decode(s8[g]);
      float vv[32];
#pragma unroll
      for (int j = 0; j < 32; j++) vv[j] = lut[code_at<BITS>(ww, j)] * scale;
      const int kk = k + 32 * g - k0;
#pragma unroll
      for (int r = 0; r < DEC_MAX_ROWS; r++) {
        if (r >= rows) break;
        float a = acc[r];
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
          const float4 p = *(const float4*)&ps[r][kk + j];
          a += p.x * vv[j] + p.y * vv[j + 1] + p.z * vv[j + 2] + p.w * vv[j + 3];
        }
        acc[r] = a;
      }
    }
  }
  for (; k + 32 <= kend; k += 32) {
    float vv[32];
    v_block_mx<BITS>(row, k, e8m0_decode(sc[k / 32]), lut, vv);
#pragma unroll
    for (int r = 0; r < DEC_MAX_ROWS; r++) {
      if (r >= rows) break;
      float a = acc[r];
#pragma unroll
      for (int j = 0; j < 32; j += 4) {
        const float4 p = *(const float4*)&ps[r][k - k0 + j];
        a += p.x * vv[j] + p.y * vv[j + 1] + p.z * vv[j + 2] + p.w * vv[j + 3];
      }
      acc[r] = a;
    }
  }
  return k;
}

__global__ void __launch_bounds__(DEC_D) decode_partial_kernel(DecodeParams P) {
  __shared__ __align__(16) float qs[DEC_MAX_ROWS * DEC_D];
  __shared__ __align__(16) float ps[DEC_MAX_ROWS][DEC_CHUNK];
  __shared__ float lut_k[256], lut_v[256];
  __shared__ float row_m[DEC_MAX_ROWS], row_l[DEC_MAX_ROWS];
  const int split = blockIdx.x, bh = blockIdx.y;
  const int bb = bh / P.hkv, kvh = bh % P.hkv;
  const int group = P.hq / P.hkv, rows = group * P.sq;
  const int tid = threadIdx.x;
  const int k0 = split * DEC_CHUNK, k1 = min(P.n, k0 + DEC_CHUNK);
  // rows r = (head kvh·group + r / sq, query r % sq)
  for (int i = tid; i < rows * DEC_D; i += DEC_D) {
    const int r = i / DEC_D, c = i % DEC_D;
    const int h = kvh * group + r / P.sq, qi = r % P.sq;
    qs[i] = load_dense(P.q, P.q_dtype, (((int64_t)bb * P.hq + h) * P.sq + qi) * DEC_D + c) * P.scale_log2;
  }
  if (P.k_kind == DEC_MX) lut_k[tid] = mx_decode(tid, P.k_fmt), lut_k[tid + 128] = mx_decode(tid + 128, P.k_fmt);
  if (P.v_kind == DEC_MX) lut_v[tid] = mx_decode(tid, P.v_fmt), lut_v[tid + 128] = mx_decode(tid + 128, P.v_fmt);
  __syncthreads();

  // ---- phase 1: scores, thread = key
  for (int k = k0 + tid; k < k0 + DEC_CHUNK; k += DEC_D) {
    float acc[DEC_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < DEC_MAX_ROWS; r++) acc[r] = 0.0f;
    if (k < k1) {
      const int64_t krow = ((int64_t)bb * P.hkv + kvh) * P.n + k;
      if (P.k_kind == DEC_MX) {
        const int bits = fmt_bits(P.k_fmt);
        const uint8_t* codes = (const uint8_t*)P.k + krow * (DEC_D * bits / 8);
        const uint8_t* sc = P.k_sc + krow * (DEC_D / 32);
        if (bits == 4) key_scores_mx<4>(codes, sc, lut_k, qs, rows, acc);
        else if (bits == 6) key_scores_mx<6>(codes, sc, lut_k, qs, rows, acc);
        else key_scores_mx<8>(codes, sc, lut_k, qs, rows, acc);
      } else {
        key_scores_dense(P.k, P.k_kind, krow, qs, rows, acc);
      }
    }
#pragma unroll
    for (int r = 0; r < DEC_MAX_ROWS; r++) {
      if (r >= rows) break;
      const int qi = r % P.sq;
      const int vis = P.causal ? P.n - P.sq + 1 + qi : P.n;
      ps[r][k - k0] = (k < k1 && k < vis) ? acc[r] : NEG_INF_F;
    }
  }
  __syncthreads();

  // ---- phase 2: per row max and exp2, a warp per row
  const int warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < rows; r += DEC_D / 32) {
    float m = NEG_INF_F;
    for (int i = lane; i < DEC_CHUNK; i += 32) m = fmaxf(m, ps[r][i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, SHFL_XOR(m, o));
    float l = 0.0f;
    for (int i = lane; i < DEC_CHUNK; i += 32) {
      const float p = m == NEG_INF_F ? 0.0f : exp2f(ps[r][i] - m);
      ps[r][i] = p;
      l += p;
    }
    for (int o = 16; o > 0; o >>= 1) l += SHFL_XOR(l, o);
    if (lane == 0) row_m[r] = m, row_l[r] = l;
  }
  __syncthreads();

  // ---- phase 3: O = P·V, thread = channel
  const int c = tid;
  float acc[DEC_MAX_ROWS];
#pragma unroll
  for (int r = 0; r < DEC_MAX_ROWS; r++) acc[r] = 0.0f;
  const int64_t hbase = (int64_t)bb * P.hkv + kvh;
  int k = k0;
  if (P.v_kind == DEC_MX) {
    const int bits = fmt_bits(P.v_fmt);
    const uint8_t* row = (const uint8_t*)P.v + (hbase * DEC_D + c) * P.v_row_bytes;
    const uint8_t* sc = P.v_sc + (hbase * DEC_D + c) * (P.v_full / 32);
    const int kq = min(k1, P.v_full);  // quantized blocks end (k0 is a multiple of 32)
    if (bits == 4) k = pv_mx<4>(row, sc, k, kq, k0, lut_v, ps, rows, acc);
    else if (bits == 6) k = pv_mx<6>(row, sc, k, kq, k0, lut_v, ps, rows, acc);
    else k = pv_mx<8>(row, sc, k, kq, k0, lut_v, ps, rows, acc);
    for (; k < k1; k++) {  // the unquantized tail
      const float vv = load_dense(P.v_tail, P.v_tail_kind, (hbase * (P.n - P.v_full) + (k - P.v_full)) * DEC_D + c);
#pragma unroll
      for (int r = 0; r < DEC_MAX_ROWS; r++)
        if (r < rows) acc[r] += ps[r][k - k0] * vv;
    }
  } else {
    // 32 keys at a time with every load issued before the first use: the loop is bound
    // by memory latency otherwise
    for (; k + 32 <= k1; k += 32) {
      float vv[32];
#pragma unroll
      for (int j = 0; j < 32; j++) vv[j] = load_dense(P.v, P.v_kind, (hbase * P.n + k + j) * DEC_D + c);
#pragma unroll
      for (int r = 0; r < DEC_MAX_ROWS; r++) {
        if (r >= rows) break;
        float a = acc[r];
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
          const float4 p = *(const float4*)&ps[r][k - k0 + j];
          a += p.x * vv[j] + p.y * vv[j + 1] + p.z * vv[j + 2] + p.w * vv[j + 3];
        }
        acc[r] = a;
      }
    }
    for (; k < k1; k++) {
      const float vv = load_dense(P.v, P.v_kind, (hbase * P.n + k) * DEC_D + c);
#pragma unroll
      for (int r = 0; r < DEC_MAX_ROWS; r++)
        if (r < rows) acc[r] += ps[r][k - k0] * vv;
    }
  }
  const int64_t nrows = (int64_t)P.b * P.hq * P.sq;
#pragma unroll
  for (int r = 0; r < DEC_MAX_ROWS; r++) {
    if (r >= rows) break;
    const int h = kvh * group + r / P.sq, qi = r % P.sq;
    const int64_t grow = ((int64_t)bb * P.hq + h) * P.sq + qi;
    P.part_o[((int64_t)split * nrows + grow) * DEC_D + c] = acc[r];
    if (c == 0) {
      P.part_ml[((int64_t)split * nrows + grow) * 2] = row_m[r];
      P.part_ml[((int64_t)split * nrows + grow) * 2 + 1] = row_l[r];
    }
  }
}

// Merges the splits of one row: O = Σ 2^(m_s − M) O_s / Σ 2^(m_s − M) l_s. The split
// weights are computed once per row in parallel (thread = split) and the O sum issues
// eight independent loads at a time: a serial loop over 128 splits was latency-bound
// (≈ 35 µs at 32k context, measured).
#define MERGE_MAX_SPLITS 2048
__global__ void __launch_bounds__(DEC_D) decode_merge_kernel(DecodeParams P) {
  __shared__ float wsh[MERGE_MAX_SPLITS];
  __shared__ float red[DEC_D / 32];
  const int64_t grow = blockIdx.x, nrows = (int64_t)P.b * P.hq * P.sq;
  const int c = threadIdx.x, warp = c / 32, lane = c % 32;
  const int S = P.splits;
  // M = max over splits
  float m = NEG_INF_F;
  for (int s = c; s < S; s += DEC_D) m = fmaxf(m, P.part_ml[((int64_t)s * nrows + grow) * 2]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, SHFL_XOR(m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  float M = red[0];
  for (int w = 1; w < DEC_D / 32; w++) M = fmaxf(M, red[w]);
  __syncthreads();
  // weights and l
  float l = 0.0f;
  for (int s = c; s < S; s += DEC_D) {
    const float ms = P.part_ml[((int64_t)s * nrows + grow) * 2];
    const float w = (M == NEG_INF_F || ms == NEG_INF_F) ? 0.0f : exp2f(ms - M);
    wsh[s] = w;
    l += w * P.part_ml[((int64_t)s * nrows + grow) * 2 + 1];
  }
  for (int o = 16; o > 0; o >>= 1) l += SHFL_XOR(l, o);
  if (lane == 0) red[warp] = l;
  __syncthreads();
  float L = 0.0f;
  for (int w = 0; w < DEC_D / 32; w++) L += red[w];
  // O, eight splits per round so their loads are in flight together
  float o = 0.0f;
  const float* po = P.part_o + grow * DEC_D + c;
  const int64_t stride = nrows * DEC_D;
  int s = 0;
  for (; s + 8 <= S; s += 8) {
    float x[8];
#pragma unroll
    for (int u = 0; u < 8; u++) x[u] = po[(int64_t)(s + u) * stride];
#pragma unroll
    for (int u = 0; u < 8; u++) o += wsh[s + u] * x[u];
  }
  for (; s < S; s++) o += wsh[s] * po[(int64_t)s * stride];
  const float val = L > 0.0f ? o / L : 0.0f;
  const int64_t idx = grow * DEC_D + c;
  if (P.out_dtype == DEC_F32) ((float*)P.out)[idx] = val;
  else if (P.out_dtype == DEC_BF16) ((bf16_t*)P.out)[idx] = f32_to_bf16(val);
  else ((f16_t*)P.out)[idx] = __float2half_rn(val);
}

extern "C" int mxa_decode_splits(int n) { return n <= 0 ? 1 : (n + DEC_CHUNK - 1) / DEC_CHUNK; }

extern "C" int mxa_decode_supported(int d, int hq, int hkv, int sq) {
  return d == DEC_D && hkv > 0 && hq % hkv == 0 && (hq / hkv) * sq <= DEC_MAX_ROWS;
}

extern "C" int mxa_attention_decode(const DecodeParams* P, gpuStream_t stream) {
  if (!mxa_decode_supported(DEC_D, P->hq, P->hkv, P->sq) || P->splits != mxa_decode_splits(P->n)) return MXA_ERR_ARGS;
  if (P->splits > MERGE_MAX_SPLITS) return MXA_ERR_ARGS;
  if (P->v_kind == DEC_MX && (P->v_full % 32 != 0 || P->v_full > P->n)) return MXA_ERR_ARGS;
  const int64_t nrows = (int64_t)P->b * P->hq * P->sq;
  if (nrows == 0) return MXA_OK;
  decode_partial_kernel<<<dim3((unsigned)P->splits, (unsigned)(P->b * P->hkv)), DEC_D, 0, stream>>>(*P);
  decode_merge_kernel<<<(unsigned)nrows, DEC_D, 0, stream>>>(*P);
  return mxa_status();
}
