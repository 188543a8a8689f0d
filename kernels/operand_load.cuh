// Reading attention inputs (f32, bf16 or f16, by the AttnParams dtype id) as f32, shared
// by the portable preparation (attention_simple.cu) and the wgmma packing
// (attention_wgmma_pack.cu), so both see the same values.
#pragma once
#include <stdint.h>
#include "gpu_compat.h"

static __device__ __forceinline__ float load_val(const void* p, int64_t i, int dtype) {
  if (dtype == 1) return bf16_to_f32(((const bf16_t*)p)[i]);
  if (dtype == 2) return f16_to_f32(((const f16_t*)p)[i]);
  return ((const float*)p)[i];
}

// The value an f32 takes through bf16 (round to nearest even).
static __device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
