// Attention for every algorithm and head dim up to 512: operand preparation, then one
// warp per query row running the CPU reference's loop (src/cpu/reference.rs) step for
// step: scores in the same 8-lane dot order, the algorithm's tile step, L summed in key
// order, O updated key by key. Compiled with -fmad=false. The only arithmetic that can
// differ from the CPU is expf/exp2f/logf (CUDA's, within 2 ulp, against the host libm).
// Also the fallback of the fast kernels for shapes they do not take.
#include <stdint.h>
#include "softmax_algos.cuh"
#include "operand_load.cuh"

static __device__ __forceinline__ void store_val(void* p, int64_t i, int dtype, float v) {
  if (dtype == 1) ((bf16_t*)p)[i] = f32_to_bf16(v);
  else if (dtype == 2) ((f16_t*)p)[i] = __float2half_rn(v);
  else ((float*)p)[i] = v;
}

// ---- operand preparation -------------------------------------------------------------

// Q or K rows: × q_scale, Hadamard, then the Q/K format. One warp per row, the row in
// shared memory (d ≤ 512). Flags any non-finite input in *bad.
__global__ void prep_qk_kernel(const void* __restrict__ x, int dtype, int64_t rows, int d, float q_scale,
                               int hadamard, float hscale, OperandFmt fmt, float* __restrict__ out,
                               int* __restrict__ bad) {
  extern __shared__ float sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + warp;
  if (r >= rows) return;
  float* row = sm + warp * d;
  for (int c = lane; c < d; c += 32) {
    float v = load_val(x, r * d + c, dtype);
    if (!isfinite(v)) atomicOr(bad, 1);
    if (q_scale != 1.0f) v = v * q_scale;
    row[c] = v;
  }
  WARP_SYNC();
  if (hadamard) {
    for (int h = 1; h < d; h *= 2) {
      for (int pidx = lane; pidx < d / 2; pidx += 32) {
        const int i = (pidx / h) * 2 * h + (pidx % h);
        const float a = row[i], b = row[i + h];
        row[i] = a + b;
        row[i + h] = a - b;
      }
      WARP_SYNC();
    }
    for (int c = lane; c < d; c += 32) row[c] = row[c] * hscale;
    WARP_SYNC();
  }
  if (fmt.kind == OPK_BF16) {
    for (int c = lane; c < d; c += 32) row[c] = round_bf16(row[c]);
  } else if (fmt.kind == OPK_MX) {
    const int nb = (d + fmt.block - 1) / fmt.block;
    for (int blk = lane; blk < nb; blk += 32) {
      const int j0 = blk * fmt.block;
      const int len = min(fmt.block, d - j0);
      float amax = 0.0f;
      for (int j = 0; j < len; j++) amax = fmaxf(amax, fabsf(row[j0 + j]));
      const int e = mx_shared_exp(amax, fmt.elem, fmt.scale);
      const float inv = pow2f(-e), sc = e8m0_decode((unsigned)(e + 127));
      for (int j = 0; j < len; j++) row[j0 + j] = mx_decode(mx_encode(row[j0 + j] * inv, fmt.elem), fmt.elem) * sc;
    }
  }
  WARP_SYNC();
  for (int c = lane; c < d; c += 32) out[r * d + c] = row[c];
}

// V along the keys, one thread per (block of keys, batch · kv head, channel), channels
// fastest so loads coalesce. A block is fmt.block keys for MX V (each quantized on its
// own) and 32 otherwise. Keys past the batch entry's length are zeroed so they never
// touch a scale. Per-channel V only gathers each channel's amax here (as f32 bits, in
// vscale); prep_v_channel_kernel encodes.
// V columns from key key0 on (the earlier keys were decoded from stored codes into `out`);
// `v` holds keys [key0, sk) of each head. One thread per (head, block of kb keys, channel).
__global__ void prep_v_kernel(const void* __restrict__ v, int dtype, int b, int hkv, int sk, int key0, int d, int kb,
                              const int32_t* __restrict__ kv_lens, OperandFmt fmt, float* __restrict__ out,
                              unsigned* __restrict__ amax_bits, int* __restrict__ bad) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int nblk = (sk - key0 + kb - 1) / kb;
  if (t >= (int64_t)b * hkv * d * nblk) return;
  const int c = (int)(t % d);
  const int jb = (int)((t / d) % nblk);
  const int64_t bh = t / ((int64_t)d * nblk);
  const int bb = (int)(bh / hkv);
  const int len = kv_lens[bb];
  const int64_t base = bh * (int64_t)sk * d + c;
  const int64_t src = bh * (int64_t)(sk - key0) * d + c - (int64_t)key0 * d;
  const int j0 = key0 + jb * kb, j1 = min(sk, j0 + kb);
  float amax = 0.0f;
  for (int j = j0; j < j1; j++) {
    const float x = load_val(v, src + (int64_t)j * d, dtype);
    if (!isfinite(x)) atomicOr(bad, 2);
    float y = j < len ? x : 0.0f;
    if (fmt.kind == OPK_BF16) y = round_bf16(y);
    amax = fmaxf(amax, fabsf(y));
    out[base + (int64_t)j * d] = y;
  }
  if (fmt.kind == OPK_MX && j0 < len) {
    const int n = min(kb, len - j0);
    const int e = mx_shared_exp(amax, fmt.elem, fmt.scale);
    const float inv = pow2f(-e), sc = e8m0_decode((unsigned)(e + 127));
    for (int j = 0; j < n; j++) {
      float* p = out + base + (int64_t)(j0 + j) * d;
      *p = mx_decode(mx_encode(*p * inv, fmt.elem), fmt.elem) * sc;
    }
  } else if (fmt.kind == OPK_PER_CHANNEL) {
    atomicMax(&amax_bits[bh * d + c], __float_as_uint(amax));  // non-negative floats order as integers
  }
}

// Per-channel FP8 V: codes of v / s with s = amax / max_normal (one thread per element).
__global__ void prep_v_channel_kernel(int b, int hkv, int sk, int d, const int32_t* __restrict__ kv_lens,
                                      OperandFmt fmt, const unsigned* __restrict__ amax_bits,
                                      float* __restrict__ out, float* __restrict__ v_unscaled) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= (int64_t)b * hkv * sk * d) return;
  const int c = (int)(t % d);
  const int j = (int)((t / d) % sk);
  const int64_t bh = t / ((int64_t)d * sk);
  const int len = kv_lens[bh / hkv];
  if (j >= len) return;  // zero already, in both outputs
  const float amax = __uint_as_float(amax_bits[bh * d + c]);
  const float s = amax > 0.0f ? amax / fmt_info(fmt.elem).max_normal : 1.0f;
  const float code = mx_decode(mx_encode(out[t] / s, fmt.elem), fmt.elem);
  if (v_unscaled) v_unscaled[t] = code;
  out[t] = code * s;
}

// amax bits → the scale s, in place (after prep_v_channel_kernel has read them).
__global__ void prep_v_scale_kernel(int n, OperandFmt fmt, float* __restrict__ scale) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float amax = scale[i];
  scale[i] = amax > 0.0f ? amax / fmt_info(fmt.elem).max_normal : 1.0f;
}

// ---- attention -------------------------------------------------------------------------

// src/cpu/dot.rs: 8 interleaved lanes, pairwise combine, then the tail.
static __device__ __forceinline__ float dot8(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int full = n / 8 * 8;
  for (int i = 0; i < full; i += 8) {
#pragma unroll
    for (int l = 0; l < 8; l++) acc[l] = acc[l] + a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (int i = full; i < n; i++) tail = tail + a[i] * b[i];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) + tail;
}

#define MAX_D 512

__global__ void attention_simple_kernel(AttnParams P, const float* __restrict__ q, const float* __restrict__ k,
                                        const float* __restrict__ v, void* __restrict__ out,
                                        unsigned long long* __restrict__ rollbacks, int* __restrict__ bad) {
  extern __shared__ float sm[];
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * warps + warp;
  const int64_t rows = (int64_t)P.b * P.hq * P.sq;
  if (row >= rows) return;
  const int d = P.d;
  float* qrow = sm + warp * (d + 128);
  float* ps = qrow + d;  // this tile's P, for the key-ordered sums
  const int i = (int)(row % P.sq);
  const int h = (int)((row / P.sq) % P.hq);
  const int bb = (int)(row / ((int64_t)P.sq * P.hq));
  const int kvh = h / (P.hq / P.hkv);
  const int len = P.kv_lens[bb];
  int nvis = len;
  if (P.causal) {
    const int64_t last = (int64_t)i + len - P.sq;
    nvis = (int)max((int64_t)0, min((int64_t)len, last + 1));
  }
  const int64_t out_stride = P.with_lse ? d + 1 : d;
  if (nvis == 0) {
    for (int c = lane; c < d; c += 32) store_val(out, row * out_stride + c, P.out_dtype, 0.0f);
    if (P.with_lse && lane == 0) store_val(out, row * out_stride + d, 0, NEG_INF);
    return;
  }
  for (int c = lane; c < d; c += 32) qrow[c] = q[row * d + c];
  WARP_SYNC();
  const float* kh = k + ((int64_t)bb * P.hkv + kvh) * (int64_t)P.sk * d;
  const float* vh = v + ((int64_t)bb * P.hkv + kvh) * (int64_t)P.sk * d;
  float o[MAX_D / 32];
#pragma unroll
  for (int c = 0; c < MAX_D / 32; c++) o[c] = 0.0f;
  RowState st{NEG_INF, 0, 0u};
  float l = 0.0f;
  for (int t0 = 0; t0 < nvis; t0 += 128) {
    const int tl = min(128, P.sk - t0);
    float s[TILE_SLOTS], p[TILE_SLOTS];
#pragma unroll
    for (int sl = 0; sl < TILE_SLOTS; sl++) {
      const int j = sl * 32 + lane;
      s[sl] = NEG_INF;
      if (j < tl && t0 + j < nvis) {
        s[sl] = dot8(qrow, kh + (int64_t)(t0 + j) * d, d) * P.score_scale;
        if (!isfinite(s[sl])) atomicOr(bad, 4);
      }
    }
    const float alpha = tile_probs(P, st, s, p);
#pragma unroll
    for (int sl = 0; sl < TILE_SLOTS; sl++) ps[sl * 32 + lane] = p[sl];
    WARP_SYNC();
    if (lane == 0) {
      float sum = 0.0f;
      for (int j = 0; j < tl; j++) sum = sum + ps[j];
      l = l * alpha + sum;
    }
    l = SHFL_IDX(l, 0);
    for (int c = lane, ci = 0; c < d; c += 32, ci++) {
      float oc = o[ci];
      if (alpha != 1.0f) oc = oc * alpha;
      for (int j = 0; j < tl; j++) {
        const float pj = ps[j];
        if (pj != 0.0f) oc = oc + pj * vh[(int64_t)(t0 + j) * d + c];
      }
      o[ci] = oc;
    }
    WARP_SYNC();
  }
  for (int c = lane, ci = 0; c < d; c += 32, ci++) {
    const float val = l > 0.0f ? o[ci] / l : 0.0f;
    store_val(out, row * out_stride + c, P.with_lse ? 0 : P.out_dtype, val);
  }
  if (P.with_lse && lane == 0) store_val(out, row * out_stride + d, 0, row_lse(P, st, l));
  if (st.rollbacks && lane == 0) atomicAdd(rollbacks, (unsigned long long)st.rollbacks);
}

// K or V decoded from MX codes as a cache stores them, into the prepared operand: K rows
// along d (codes [rows, packed(d)]), V channels along its first n keys (codes
// [b·hkv·d, packed(n)], written to keys [0, n) of [b·hkv, sk, d]). Each value goes through
// the input dtype as the dequantizing path's tensor would; a non-finite one (an E4M3 NaN
// or E5M2 Inf code, a NaN scale) sets `bad_bit`.
__global__ void prep_stored_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                   int64_t rows, int n, int fmt, int block, int is_v, int sk, int d, int dtype,
                                   float* __restrict__ out, int bad_bit, int* __restrict__ bad) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * n) return;
  const int64_t r = t / n;
  const int j = (int)(t % n);
  const int nb = (n + block - 1) / block;
  const int bits = fmt_info(fmt).bits;
  const unsigned c = get_code(codes + r * packed_len((int64_t)nb * block, bits), j, bits);
  float y = mx_decode(c, fmt) * e8m0_decode(scales[r * nb + j / block]);
  if (dtype == 1) y = round_bf16(y);
  if (!isfinite(y)) atomicOr(bad, bad_bit);
  // V: row r is channel r % d of head r / d, element j its key j
  const int64_t o = is_v ? ((r / d) * sk + j) * (int64_t)d + r % d : t;
  out[o] = y;
}

// Decodes stored K (is_v 0: b·hkv·sk rows of d) or V (is_v 1: the first n keys) into dst.
extern "C" int mxa_attention_prep_stored(const AttnParams* P, int is_v, const uint8_t* codes, const uint8_t* scales,
                                         int fmt, int block, int n, float* dst, int* bad, gpuStream_t stream) {
  if (block <= 0 || (is_v && (n > P->sk || n % block != 0)) || (!is_v && n != P->d)) return MXA_ERR_ARGS;
  if (P->in_dtype == 2) return MXA_ERR_ARGS;  // f16 would round MX values: the op dequantizes those
  const int64_t rows = is_v ? (int64_t)P->b * P->hkv * P->d : (int64_t)P->b * P->hkv * P->sk;
  if (rows == 0 || n == 0) return MXA_OK;
  const int64_t work = rows * n;
  prep_stored_kernel<<<(unsigned)((work + 255) / 256), 256, 0, stream>>>(
      codes, scales, rows, n, fmt, block, is_v, P->sk, P->d, P->in_dtype, dst, is_v ? 2 : 1, bad);
  return mxa_status();
}

// v_unscaled and vscale (may be null): for per-channel FP8 V, the decoded codes and the
// per-(batch, kv head, channel) scales.
// qp, kp or vp null: that operand is not prepared here (packed straight from the input,
// or decoded from stored codes). v_key0 > 0: V's first keys were decoded from stored codes
// into vp already (whole MX blocks); v holds the rest, keys [v_key0, sk) of each head.
extern "C" int mxa_attention_prep(const AttnParams* P, const void* q, const void* k, const void* v, float* qp,
                                  float* kp, float* vp, int v_key0, float* v_unscaled, float* vscale, int* bad,
                                  gpuStream_t stream) {
  if (P->d > MAX_D) return MXA_ERR_ARGS;
  const int warps = 4;
  const size_t smem = (size_t)warps * P->d * sizeof(float);
  const int64_t qrows = (int64_t)P->b * P->hq * P->sq, krows = (int64_t)P->b * P->hkv * P->sk;
  if (qrows > 0 && qp)
    prep_qk_kernel<<<(unsigned)((qrows + warps - 1) / warps), warps * 32, smem, stream>>>(
        q, P->in_dtype, qrows, P->d, P->q_scale, P->hadamard, P->hadamard_scale, P->qk, qp, bad);
  if (krows > 0 && kp)
    prep_qk_kernel<<<(unsigned)((krows + warps - 1) / warps), warps * 32, smem, stream>>>(
        k, P->in_dtype, krows, P->d, 1.0f, P->hadamard, P->hadamard_scale, P->qk, kp, bad);
  if (!vp) return mxa_status();
  const int64_t vt = (int64_t)P->b * P->hkv * P->d;
  const bool per_channel = P->v.kind == OPK_PER_CHANNEL;
  if (per_channel && !vscale) return MXA_ERR_ARGS;  // its amax gathers there
  const int kb = P->v.kind == OPK_MX ? P->v.block : 32;
  // stored keys: whole blocks of an MX V or any count of a native one; never per channel
  if (v_key0 < 0 || v_key0 > P->sk || (v_key0 > 0 && (per_channel || (P->v.kind == OPK_MX && v_key0 % kb != 0))))
    return MXA_ERR_ARGS;
  if (vt > 0 && P->sk > v_key0) {
    const int64_t n = vt * ((P->sk - v_key0 + kb - 1) / kb);
    if (per_channel && gpuMemsetAsync(vscale, 0, vt * sizeof(float), stream) != GPU_SUCCESS) return MXA_ERR_LAUNCH;
    prep_v_kernel<<<(unsigned)((n + 127) / 128), 128, 0, stream>>>(v, P->in_dtype, P->b, P->hkv, P->sk, v_key0, P->d,
                                                                  kb, P->kv_lens, P->v, vp, (unsigned*)vscale, bad);
    if (per_channel) {
      const int64_t ne = vt * P->sk;
      prep_v_channel_kernel<<<(unsigned)((ne + 255) / 256), 256, 0, stream>>>(
          P->b, P->hkv, P->sk, P->d, P->kv_lens, P->v, (const unsigned*)vscale, vp, v_unscaled);
      prep_v_scale_kernel<<<(unsigned)((vt + 255) / 256), 256, 0, stream>>>((int)vt, P->v, vscale);
    }
  } else if (per_channel && vt > 0) {  // no keys: scale 1
    if (gpuMemsetAsync(vscale, 0, vt * sizeof(float), stream) != GPU_SUCCESS) return MXA_ERR_LAUNCH;
    prep_v_scale_kernel<<<(unsigned)((vt + 255) / 256), 256, 0, stream>>>((int)vt, P->v, vscale);
  }
  return mxa_status();
}

// *rollbacks (zeroed by the caller) receives the number of rollbacks of all rows.
extern "C" int mxa_attention_simple(const AttnParams* P, const float* qp, const float* kp, const float* vp, void* out,
                                    unsigned long long* rollbacks, int* bad, gpuStream_t stream) {
  if (P->d > MAX_D) return MXA_ERR_ARGS;
  const int warps = 4;
  const size_t smem = (size_t)warps * (P->d + 128) * sizeof(float);
  const int64_t rows = (int64_t)P->b * P->hq * P->sq;
  if (rows == 0) return MXA_OK;
  attention_simple_kernel<<<(unsigned)((rows + warps - 1) / warps), warps * 32, smem, stream>>>(
      *P, qp, kp, vp, out, rollbacks, bad);
  return mxa_status();
}
