// OCP MX element codecs and E8M0 scale rules on the device: the same arithmetic as
// src/mx/element.rs (f32 bit path) and src/mx/scale.rs, so codes and scales are
// bit-identical to the CPU reference. Format ids follow the Rust enum order.
#pragma once
#include "gpu_compat.h"

enum MxFormat { FMT_E4M3 = 0, FMT_E5M2 = 1, FMT_E2M3 = 2, FMT_E3M2 = 3, FMT_E2M1 = 4 };
enum MxScaleMode { SCALE_FLOOR = 0, SCALE_CEIL = 1, SCALE_EVEN = 2, SCALE_RCEIL = 3, SCALE_ROUNDUP = 4 };

struct FmtInfo {
  int ebits, mbits, bias, emin, emax, bits;
  float max_normal;
  unsigned max_code;
};

static __host__ __device__ __forceinline__ FmtInfo fmt_info(int fmt) {
  switch (fmt) {
    case FMT_E4M3: return FmtInfo{4, 3, 7, -6, 8, 8, 448.0f, 0x7Eu};
    case FMT_E5M2: return FmtInfo{5, 2, 15, -14, 15, 8, 57344.0f, 0x7Bu};
    case FMT_E2M3: return FmtInfo{2, 3, 1, 0, 2, 6, 7.5f, 0x1Fu};
    case FMT_E3M2: return FmtInfo{3, 2, 3, -2, 4, 6, 28.0f, 0x1Fu};
    default:       return FmtInfo{2, 1, 1, 0, 2, 4, 6.0f, 0x7u};
  }
}

// 2^e as f32 for e in [-149, 127], exact (subnormals included).
static __device__ __forceinline__ float pow2f(int e) {
  if (e >= -126) return __int_as_float((e + 127) << 23);
  return __int_as_float(1 << (e + 149));
}

// RNE, saturating element encode of an f32 (src/mx/element.rs `encode`).
static __device__ __forceinline__ unsigned mx_encode(float x, int fmt) {
  const FmtInfo f = fmt_info(fmt);
  const unsigned sign = (__float_as_uint(x) >> 31) ? (1u << (f.bits - 1)) : 0u;
  const float a = fabsf(x);
  if (isnan(a)) {
    if (fmt == FMT_E4M3) return sign | 0x7Fu;
    if (fmt == FMT_E5M2) return sign | 0x7Eu;
    return 0u;
  }
  if (isinf(a)) {
    if (fmt == FMT_E4M3) return sign | 0x7Fu;
    if (fmt == FMT_E5M2) return sign | 0x7Cu;
    return sign | f.max_code;
  }
  if (a >= f.max_normal) return sign | f.max_code;
  const unsigned b = __float_as_uint(a);
  const int e = (int)(b >> 23) - 127;
  if (e < f.emin) {
    const float q = rintf(a * pow2f(f.mbits - f.emin));
    return sign | (unsigned)q;
  }
  const int shift = 23 - f.mbits;
  const unsigned keep = (b & 0x7FFFFFu) >> shift;
  const unsigned rem = b & ((1u << shift) - 1u);
  const unsigned half = 1u << (shift - 1);
  const unsigned up = (rem > half || (rem == half && (keep & 1u))) ? 1u : 0u;
  unsigned code = ((((unsigned)(e - f.emin + 1)) << f.mbits) | keep) + up;
  if (code > f.max_code) code = f.max_code;
  return sign | code;
}

// Value of a code (src/mx/element.rs `decode_bits`).
static __device__ __forceinline__ float mx_decode(unsigned code, int fmt) {
  const FmtInfo f = fmt_info(fmt);
  code &= (1u << f.bits) - 1u;
  const bool neg = (code >> (f.bits - 1)) & 1u;
  const unsigned mag = code & ((1u << (f.bits - 1)) - 1u);
  const int efield = (int)(mag >> f.mbits);
  const int mant = (int)(mag & ((1u << f.mbits) - 1u));
  float v;
  if (fmt == FMT_E4M3 && mag == 0x7Fu) {
    v = __int_as_float(0x7FC00000);
  } else if (fmt == FMT_E5M2 && efield == 31) {
    v = mant == 0 ? __int_as_float(0x7F800000) : __int_as_float(0x7FC00000);
  } else if (efield == 0) {
    v = (float)mant * pow2f(f.emin - f.mbits);
  } else {
    v = (float)((1 << f.mbits) + mant) * pow2f(efield - f.bias - f.mbits);
  }
  return neg ? -v : v;
}

// floor(log2 x) of a finite x > 0, exact; *pow2 tells whether x is a power of two.
static __device__ __forceinline__ int floor_log2f(float x, bool* pow2) {
  const unsigned b = __float_as_uint(x) & 0x7FFFFFFFu;
  const int ef = (int)(b >> 23);
  const unsigned m = b & 0x7FFFFFu;
  if (ef == 0) {
    const int top = 31 - __clz(m);
    *pow2 = (m & (m - 1)) == 0;
    return top - 149;
  }
  *pow2 = m == 0;
  return ef - 127;
}

static __device__ __forceinline__ unsigned mantissa_fraction_bits(float x) {
  const unsigned b = __float_as_uint(x) & 0x7FFFFFFFu;
  if ((b >> 23) == 0) {
    const unsigned m = b & 0x7FFFFFu;
    const int top = 31 - __clz(m);
    return (m << (23 - top)) & 0x7FFFFFu;
  }
  return b & 0x7FFFFFu;
}

// Shared exponent of a block with absolute maximum amax (src/mx/scale.rs `shared_exp`):
// ⌊log2 amax⌋ − emax, plus one where amax's fraction bits reach the scale mode's threshold
// (mx_scale_thr), so every mode is one compare: no per-block switch over the mode, and a
// caller with a uniform format and mode computes the threshold once
// (kernels/NOTES.md v3 item 19).
//   Floor: never (2^23, above every fraction). Ceil: amax not a power of two (≥ 1).
//   Even: the fraction rounds up past mbits mantissa bits, ties up. Rceil: the
//   significand exceeds max_normal's. OCP default: fraction ≥ 0.75.
static __device__ __forceinline__ unsigned mx_scale_thr(int fmt, int mode) {
  const FmtInfo f = fmt_info(fmt);
  switch (mode) {
    case SCALE_FLOOR: return 1u << 23;
    case SCALE_CEIL: return 1u;
    case SCALE_EVEN: return (1u << 23) - (1u << (22 - f.mbits));
    case SCALE_RCEIL: return (__float_as_uint(f.max_normal) & 0x7FFFFFu) + 1u;
    default: return 3u << 21;
  }
}
static __device__ __forceinline__ int mx_shared_exp_thr(float amax, int emax, unsigned thr) {
  if (amax == 0.0f) return -127;
  bool pow2;  // unused here: the threshold compare covers the power-of-two case
  const int e = floor_log2f(amax, &pow2) - emax + (mantissa_fraction_bits(amax) >= thr ? 1 : 0);
  return e < -127 ? -127 : (e > 127 ? 127 : e);
}
static __device__ __forceinline__ int mx_shared_exp(float amax, int fmt, int mode) {
  return mx_shared_exp_thr(amax, fmt_info(fmt).emax, mx_scale_thr(fmt, mode));
}

static __device__ __forceinline__ float e8m0_decode(unsigned byte) {
  if (byte == 0xFFu) return __int_as_float(0x7FC00000);
  return pow2f((int)byte - 127);
}

// Element i of a packed code row (FP4 low nibble first, FP6 LSB-first 4-in-3, FP8 bytes)
// and the bytes of n packed codes: src/mx/pack.rs.
static __device__ __forceinline__ unsigned get_code(const uint8_t* row, int64_t i, int bits) {
  if (bits == 8) return row[i];
  if (bits == 4) return (row[i >> 1] >> ((i & 1) * 4)) & 0xF;
  const int64_t bit = 6 * i;
  const uint8_t* b = row + (bit >> 3);
  const int off = (int)(bit & 7);
  const unsigned w = (unsigned)b[0] | (off > 2 ? ((unsigned)b[1] << 8) : 0u);
  return (w >> off) & 0x3F;
}

static __device__ __forceinline__ int64_t packed_len(int64_t n, int bits) {
  return bits == 8 ? n : (bits == 4 ? n / 2 : n / 4 * 3);
}
