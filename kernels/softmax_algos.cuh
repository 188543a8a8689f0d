// The softmax algorithms of src/attention/softmax/ on one warp: a KV tile of up to 128
// scores of one query row, lane l holding keys l, l+32, l+64, l+96 (so key block i of 32
// is slot i of every lane). Same operations in the same order as the CPU code; files
// that include this are compiled with -fmad=false so no multiply-add is contracted.
#pragma once
#include "attention_params.h"
#include "mx_codec.cuh"

#define TILE_SLOTS 4
#define NEG_INF (__int_as_float(0xff800000))

struct RowState {
  float m;
  int started;
  unsigned rollbacks;
};

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, SHFL_XOR(v, o));
  return v;
}

static __device__ __forceinline__ float tile_max(const float s[TILE_SLOTS]) {
  float m = NEG_INF;
#pragma unroll
  for (int i = 0; i < TILE_SLOTS; i++) m = fmaxf(m, s[i]);
  return warp_max(m);
}

// P of one MX block (slot i across the warp): quantize_block + dequantize_block.
static __device__ __forceinline__ float mx_block_fake_quant(float v, int elem, int mode) {
  const float amax = warp_max(fabsf(v));
  const int e = mx_shared_exp(amax, elem, mode);
  const unsigned c = mx_encode(v * pow2f(-e), elem);
  return mx_decode(c, elem) * e8m0_decode((unsigned)(e + 127));
}

static __device__ __forceinline__ void quantize_probs(const AttnParams& P, float p[TILE_SLOTS]) {
  if (P.p_kind == PROB_MX) {
#pragma unroll
    for (int i = 0; i < TILE_SLOTS; i++) p[i] = mx_block_fake_quant(p[i], P.p_elem, P.p_scale);
  } else if (P.p_kind == PROB_FP8) {
#pragma unroll
    for (int i = 0; i < TILE_SLOTS; i++) p[i] = mx_decode(mx_encode(p[i] * 256.0f, P.p_elem), P.p_elem) / 256.0f;
  }
}

// Running max (softmax/mod.rs update_running_max) in natural-log units.
static __device__ __forceinline__ float running_max(RowState& st, const float s[TILE_SLOTS], float* m_new) {
  const float mn = fmaxf(st.m, tile_max(s));
  const float alpha = (mn == NEG_INF) ? 1.0f : expf(st.m - mn);
  st.m = mn;
  *m_new = mn;
  return alpha;
}

static __device__ float tile_exact_etq(const AttnParams& P, RowState& st, const float s[TILE_SLOTS],
                                       float p[TILE_SLOTS]) {
  float m;
  const float alpha = running_max(st, s, &m);
#pragma unroll
  for (int i = 0; i < TILE_SLOTS; i++) p[i] = (m == NEG_INF) ? 0.0f : expf(s[i] - m);
  if (P.algo == ALGO_ETQ) quantize_probs(P, p);
  return alpha;
}

static __device__ __forceinline__ float fused_prob(const AttnParams& P, float a) {
  switch (P.fused_kind) {
    case FUSED_U8: {
      const float c = fminf(fmaxf(rintf(a), 0.0f), 126.0f);
      return mx_decode((unsigned)c, FMT_E4M3);
    }
    case FUSED_F32BITS: {
      const unsigned bits = a > 0.0f ? (unsigned)a : 0u;
      return mx_decode(mx_encode(__uint_as_float(bits), FMT_E4M3), FMT_E4M3);
    }
    case FUSED_EXACT_E4M3: return mx_decode(mx_encode(exp2f(a), FMT_E4M3), FMT_E4M3);
    default: return exp2f(a);
  }
}

static __device__ float tile_fused(const AttnParams& P, RowState& st, const float s[TILE_SLOTS],
                                   float p[TILE_SLOTS]) {
  if (P.fused_kind == FUSED_EXACT_F32) {
    const float mn = fmaxf(st.m, tile_max(s));
    if (mn == NEG_INF) {
#pragma unroll
      for (int i = 0; i < TILE_SLOTS; i++) p[i] = 0.0f;
      return 1.0f;
    }
    const float alpha = exp2f(st.m - mn);
    st.m = mn;
#pragma unroll
    for (int i = 0; i < TILE_SLOTS; i++) p[i] = exp2f(s[i] - mn);
    quantize_probs(P, p);
    return alpha;
  }
  if (!st.started) {
    const float tmax = tile_max(s);
    if (tmax == NEG_INF) {
#pragma unroll
      for (int i = 0; i < TILE_SLOTS; i++) p[i] = 0.0f;
      return 1.0f;
    }
    st.m = tmax - 0.125f;
    st.started = 1;
  }
  const float bias = P.fused_off - P.fused_g * st.m;
  float a[TILE_SLOTS];
  float amax = NEG_INF;
#pragma unroll
  for (int i = 0; i < TILE_SLOTS; i++) {
    a[i] = P.fused_g * s[i] + bias;
    amax = fmaxf(amax, a[i]);
  }
  amax = warp_max(amax);
  float alpha = 1.0f;
  if (amax > P.fused_thr) {
    const float delta = amax - P.fused_off;
#pragma unroll
    for (int i = 0; i < TILE_SLOTS; i++) a[i] -= delta;
    st.m += delta / P.fused_g;
    alpha = exp2f(-delta / P.fused_g);
    st.rollbacks++;
  }
#pragma unroll
  for (int i = 0; i < TILE_SLOTS; i++) p[i] = fused_prob(P, a[i]);
  quantize_probs(P, p);
  return alpha;
}

// E2M1 value of code c (0, 0.5, 1, 1.5, 2, 3, 4, 6) from its bits, and the LUT rule's
// 16 bins → codes as nibbles: no table in constant memory, where a warp's different
// indices would serialize.
static __device__ __forceinline__ float efq_c8(unsigned c) {
  // twice the values, one nibble each: 0 1 2 3 4 6 8 12
  return 0.5f * (float)((0xC8643210u >> (4 * c)) & 15u);
}
static __device__ __forceinline__ unsigned efq_c16(int j) {
  return (unsigned)(0x7765543322111110ULL >> (4 * j)) & 15u;
}

// The number of entries t[0..n) with t[i] <= x (t ascending), from a guess near it, in a load or two
// where the guess is off by at most one, not a binary search's chain of dependent loads.
static __device__ __forceinline__ int count_le_near(const float* t, int n, float x, float guess) {
  int i = (int)fminf(fmaxf(guess, 0.0f), (float)n);
  while (i < n && t[i] <= x) i++;
  while (i > 0 && t[i - 1] > x) i--;
  return i;
}

// EFQ in two steps (efq.rs block_codes), so a kernel can do a block's part once per block:
// the scale exponent k from the block max mb and what the code rule needs of it, then each
// element's code. Products that are then added are __fmul_rn: the CPU rounds the product
// before the sum, and nvcc would fuse the two into one FMA (only some sources build with
// -fmad=false), moving a code at a boundary.
struct EfqBlock {
  int k;
  float kf;
  float shift;  // k·ln 2 + ln 6 (the affine and LUT rules)
  float t[7];   // the exact-threshold rule's boundaries at this k (Floor / RCEIL scales)
};

static __host__ __device__ __forceinline__ bool efq_table(const AttnParams& P) {
  return P.efq_kind == EFQ_EXACT && P.efq_scale != EFQS_EFQ;
}

// TABLE: 1 for the exact rule's table form, 0 for the others, −1 read from P.
template <int TABLE>
static __device__ __forceinline__ EfqBlock efq_block_t(const AttnParams& P, float mb) {
  EfqBlock b;
  if (TABLE == 1 || (TABLE < 0 && efq_table(P))) {
    int k;
    if (P.efq_scale == EFQS_FLOOR) {
      // thr_pow2[i]: where e^x reaches 2^(i−149), so n − 150 = ⌊log2 e^mb⌋
      const int n = count_le_near(P.thr_pow2, 150, mb, floorf(mb * P.log2e) + 150.0f);
      k = n == 0 ? -127 : (n - 1 - 149) - 2;
    } else {
      // thr_six: n − 127 = ⌈log2 e^mb − log2 6⌉
      const int n = count_le_near(P.thr_six, 128, mb, ceilf(mb * P.log2e - P.log2_6) + 127.0f);
      k = -127 + n;
    }
    k = min(max(k, -127), 0);
    b.k = k;
    b.kf = (float)k;
    b.shift = 0.0f;
    const float* t = P.thr_code + (k + 127) * 7;
#pragma unroll
    for (int i = 0; i < 7; i++) b.t[i] = t[i];
    return b;
  }
  float kf;
  if (mb == NEG_INF) {
    kf = -127.0f;
  } else {
    if (P.efq_scale == EFQS_EFQ) kf = floorf((mb + P.ln_2_over_9) / P.ln2);
    else if (P.efq_scale == EFQS_FLOOR) kf = floorf(__fmul_rn(mb, P.log2e)) - 2.0f;
    else kf = ceilf(__fmul_rn(mb, P.log2e) - P.log2_6);
    kf = fminf(fmaxf(kf, -127.0f), 127.0f);
  }
  b.k = (int)kf;
  b.kf = (float)b.k;
  b.shift = __fmul_rn(b.kf, P.ln2) + P.ln6;
#pragma unroll
  for (int i = 0; i < 7; i++) b.t[i] = 0.0f;
  return b;
}

static __device__ __forceinline__ EfqBlock efq_block(const AttnParams& P, float mb) {
  return efq_block_t<-1>(P, mb);
}

// The EFQ rule as a compile-time choice (the wgmma kernel is instantiated per rule, so each
// holds one per-element path: several behind runtime branches made its main loop ~5x larger
// than the instruction cache): the four EfqKinds, and the exact rule's table form.
constexpr int EFQV_TABLE = 4;
static __host__ __device__ __forceinline__ int efq_variant(const AttnParams& P) {
  return efq_table(P) ? EFQV_TABLE : P.efq_kind;
}

// How many of 7 non-decreasing thresholds x passes: x ≥ t[i], or with STRICT_EVEN x > t[i]
// at even i. Each test implies the one before it, so the count is found by a three-level
// binary search: 3 compares and 3 selects, not 7 of each (kernels/NOTES.md v3 item 18).
template <bool STRICT_EVEN>
static __device__ __forceinline__ unsigned count7(float x, const float (&t)[7]) {
  const bool p4 = x >= t[3];
  const bool p2 = x >= (p4 ? t[5] : t[1]);
  const float tb = p4 ? (p2 ? t[6] : t[4]) : (p2 ? t[2] : t[0]);
  const bool p1 = STRICT_EVEN ? x > tb : x >= tb;
  return 4u * p4 + 2u * p2 + (unsigned)p1;
}

// The E2M1 code of one shifted score x (natural log, ≤ 0) of a block, rule V.
template <int V>
static __device__ __forceinline__ unsigned efq_code_v(const AttnParams& P, const EfqBlock& b, float x) {
  unsigned c = 0;
  if constexpr (V == EFQV_TABLE) {
    c = count7<false>(x, b.t);  // b.t ascends (log_thresholds.rs, tested there)
  } else if constexpr (V == EFQ_LUT) {
    const float z = x - b.shift;
    c = efq_c16(min(max(__float2int_rd((z - P.lut_tau) * P.lut_h), -1), 14) + 1);  // as the affine rule's
  } else if constexpr (V == EFQ_TWO_PIECE) {
    const float w = __fmul_rn(x, P.log2e) - b.kf;
    const unsigned hi = (unsigned)(min(max(__float2int_rd(2.0f * (w - P.log2_125)), -1), 4) + 3);
    const unsigned lo = (w > -2.0f) ? 1u : 0u;
    c = w >= P.log2_075 ? hi : lo;
  } else if constexpr (V == EFQ_EXACT) {
    const float w = __fmul_rn(x, P.log2e) - b.kf;
    // midpoints 0.25 .75 1.25 1.75 2.5 3.5 5 (ascending): strict at even positions
    c = count7<true>(w, P.log2_mid);
  } else {
    // ⌊(z − τ)·h⌋ + 1 clamped to 0..7, the floor and conversion in one instruction (the
    // same code for every non-NaN z; x is never NaN here, non-finite inputs are rejected)
    const float z = x - b.shift;
    c = (unsigned)(min(max(__float2int_rd((z - P.efq_tau) * P.efq_h), -1), 6) + 1);
  }
  return c;
}

// The same with the rule read from P (the CUDA-core kernels).
static __device__ __forceinline__ unsigned efq_code(const AttnParams& P, const EfqBlock& b, float x) {
  switch (efq_variant(P)) {
    case EFQV_TABLE: return efq_code_v<EFQV_TABLE>(P, b, x);
    case EFQ_LUT: return efq_code_v<EFQ_LUT>(P, b, x);
    case EFQ_TWO_PIECE: return efq_code_v<EFQ_TWO_PIECE>(P, b, x);
    case EFQ_EXACT: return efq_code_v<EFQ_EXACT>(P, b, x);
    default: return efq_code_v<EFQ_AFFINE>(P, b, x);
  }
}

// P of one element of a block: C8[c]·2^k.
static __device__ __forceinline__ float efq_prob(const AttnParams& P, float x, float mb) {
  const EfqBlock b = efq_block(P, mb);
  return efq_c8(efq_code(P, b, x)) * pow2f(b.k);
}

static __device__ float tile_efq(const AttnParams& P, RowState& st, const float s[TILE_SLOTS],
                                 float p[TILE_SLOTS]) {
  float m;
  const float alpha = running_max(st, s, &m);
#pragma unroll
  for (int i = 0; i < TILE_SLOTS; i++) {
    if (m == NEG_INF) {
      p[i] = 0.0f;
      continue;
    }
    const float x = s[i] - m;
    const float mb = warp_max(x);
    p[i] = efq_prob(P, x, mb);
  }
  return alpha;
}

static __device__ __forceinline__ float tile_probs(const AttnParams& P, RowState& st, const float s[TILE_SLOTS],
                                                   float p[TILE_SLOTS]) {
  switch (P.algo) {
    case ALGO_FUSED: return tile_fused(P, st, s, p);
    case ALGO_EFQ: return tile_efq(P, st, s, p);
    default: return tile_exact_etq(P, st, s, p);
  }
}

static __device__ __forceinline__ float row_lse(const AttnParams& P, const RowState& st, float l) {
  if (P.algo == ALGO_FUSED) return P.ln2 * (st.m + log2f(l));
  return st.m + logf(l);
}
