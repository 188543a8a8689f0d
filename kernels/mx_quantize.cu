// MX quantize / dequantize of contiguous rows (the quantized dim last), bit-identical to
// src/mx/block.rs + src/mx/pack.rs. One thread per block of `block` elements.
#include <stdint.h>
#include "mx_codec.cuh"

enum InDtype { IN_F32 = 0, IN_BF16 = 1, IN_F16 = 2 };

static __device__ __forceinline__ float load_in(const void* p, int64_t i, int dtype) {
  if (dtype == IN_BF16) return bf16_to_f32(((const bf16_t*)p)[i]);
  if (dtype == IN_F16) return f16_to_f32(((const f16_t*)p)[i]);
  return ((const float*)p)[i];
}

// Packs code `c` (low `bits` bits) as element `i` of a row (FP4 low nibble first, FP6
// LSB-first 4-in-3, FP8 bytes). Each thread owns whole bytes of its block, so plain
// read-modify-write stays race free.
static __device__ __forceinline__ void put_code(uint8_t* row, int64_t i, unsigned c, int bits) {
  if (bits == 8) {
    row[i] = (uint8_t)c;
  } else if (bits == 4) {
    uint8_t* b = row + (i >> 1);
    *b = (i & 1) ? (uint8_t)((*b & 0x0F) | (c << 4)) : (uint8_t)((*b & 0xF0) | c);
  } else {
    const int64_t bit = 6 * i;
    uint8_t* b = row + (bit >> 3);
    const int off = (int)(bit & 7);
    // bits [off, off+6) of the little-endian pair b[0..2]; b[1] only when they spill over
    const unsigned w = (unsigned)b[0] | (off > 2 ? ((unsigned)b[1] << 8) : 0u);
    const unsigned mask = 0x3Fu << off;
    const unsigned nw = (w & ~mask) | (c << off);
    b[0] = (uint8_t)nw;
    if (off > 2) b[1] = (uint8_t)(nw >> 8);
  }
}

__global__ void mx_quantize_kernel(const void* __restrict__ x, int dtype, int64_t rows, int64_t n, int fmt,
                                   int mode, int block, uint8_t* __restrict__ codes, int64_t code_stride,
                                   uint8_t* __restrict__ scales, int64_t scale_stride) {
  const int64_t nb = (n + block - 1) / block;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * nb) return;
  const int64_t r = t / nb, b = t % nb;
  const int bits = fmt_info(fmt).bits;
  uint8_t* crow = codes + r * code_stride;
  const int64_t j0 = b * block;
  const int64_t len = (j0 + block <= n) ? block : n - j0;
  float amax = 0.0f;
  bool finite = true;
  for (int64_t j = 0; j < len; j++) {
    const float v = load_in(x, r * n + j0 + j, dtype);
    finite = finite && isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
  unsigned sbyte;
  float inv = 1.0f;
  if (!finite) {
    sbyte = 0xFFu;
  } else {
    const int e = mx_shared_exp(amax, fmt, mode);
    sbyte = (unsigned)(e + 127);
    inv = pow2f(-e);
  }
  for (int64_t j = 0; j < block; j++) {
    unsigned c = 0;
    if (j < len) {
      const float v = load_in(x, r * n + j0 + j, dtype);
      c = mx_encode(finite ? v * inv : v, fmt);
    }
    put_code(crow, j0 + j, c, bits);
  }
  scales[r * scale_stride + b] = (uint8_t)sbyte;
}

__global__ void mx_dequantize_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                     int64_t rows, int64_t n, int fmt, int block, float* __restrict__ out) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows * n) return;
  const int64_t r = t / n, j = t % n;
  const int64_t nb = (n + block - 1) / block;
  const int bits = fmt_info(fmt).bits;
  const int64_t row_bytes = packed_len(nb * block, bits);
  const unsigned c = get_code(codes + r * row_bytes, j, bits);
  out[t] = mx_decode(c, fmt) * e8m0_decode(scales[r * nb + j / block]);
}

// codes row r at codes + r*code_stride, scales row r at scales + r*scale_stride (one
// buffer can hold both: [codes | scales] per row).
extern "C" int mxa_mx_quantize(const void* x, int dtype, int64_t rows, int64_t n, int fmt, int mode, int block,
                               uint8_t* codes, int64_t code_stride, uint8_t* scales, int64_t scale_stride,
                               gpuStream_t stream) {
  if (rows <= 0 || n <= 0) return MXA_OK;
  if (block <= 0) return MXA_ERR_ARGS;
  const int64_t nb = (n + block - 1) / block;
  const int64_t work = rows * nb;
  const int threads = 128;
  mx_quantize_kernel<<<(unsigned)((work + threads - 1) / threads), threads, 0, stream>>>(x, dtype, rows, n, fmt, mode,
                                                                                        block, codes, code_stride, scales, scale_stride);
  return mxa_status();
}

extern "C" int mxa_mx_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t n, int fmt,
                                 int block, float* out, gpuStream_t stream) {
  if (rows <= 0 || n <= 0) return MXA_OK;
  if (block <= 0) return MXA_ERR_ARGS;
  const int64_t work = rows * n;
  const int threads = 256;
  mx_dequantize_kernel<<<(unsigned)((work + threads - 1) / threads), threads, 0, stream>>>(codes, scales, rows, n,
                                                                                          fmt, block, out);
  return mxa_status();
}
