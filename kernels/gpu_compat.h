// One source for CUDA (nvcc) and HIP (hipcc): the few names that differ.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_bfloat16.h>
#include <hip/hip_fp16.h>
typedef hip_bfloat16 bf16_t;
typedef __half f16_t;
typedef hipStream_t gpuStream_t;
typedef hipError_t gpuError_t;
#define GPU_SUCCESS hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuMemsetAsync hipMemsetAsync
#define gpuFuncSetMaxDynamicSmem(f, bytes) \
  hipFuncSetAttribute((const void*)(f), hipFuncAttributeMaxDynamicSharedMemorySize, (bytes))
// Our "warps" are 32 lanes; on CDNA a wavefront is 64, so shuffles stay within 32.
#define SHFL_XOR(v, m) __shfl_xor((v), (m), 32)
#define SHFL_IDX(v, src) __shfl((v), (src), 32)
#define WARP_SYNC() __builtin_amdgcn_wave_barrier()
#define WARP_SIZE warpSize
static __device__ __forceinline__ float bf16_to_f32(bf16_t x) { return static_cast<float>(x); }
static __device__ __forceinline__ bf16_t f32_to_bf16(float x) { return bf16_t(x); }
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
typedef __nv_bfloat16 bf16_t;
typedef __half f16_t;
typedef cudaStream_t gpuStream_t;
typedef cudaError_t gpuError_t;
#define GPU_SUCCESS cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuMemsetAsync cudaMemsetAsync
#define gpuFuncSetMaxDynamicSmem(f, bytes) \
  cudaFuncSetAttribute((f), cudaFuncAttributeMaxDynamicSharedMemorySize, (bytes))
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define SHFL_IDX(v, src) __shfl_sync(0xffffffffu, (v), (src))
#define WARP_SYNC() __syncwarp()
#define WARP_SIZE 32
static __device__ __forceinline__ float bf16_to_f32(bf16_t x) { return __bfloat162float(x); }
static __device__ __forceinline__ bf16_t f32_to_bf16(float x) { return __float2bfloat16_rn(x); }
#endif

static __device__ __forceinline__ float f16_to_f32(f16_t x) { return __half2float(x); }

// Launch status codes shared with the Rust side (src/cuda/ffi.rs).
#define MXA_OK 0
#define MXA_ERR_LAUNCH 1
#define MXA_ERR_ARGS 2
#define MXA_ERR_SMEM 3

static inline int mxa_status() { return gpuGetLastError() == GPU_SUCCESS ? MXA_OK : MXA_ERR_LAUNCH; }

#if !defined(__HIPCC__)
// The current device's compute capability as 10 * major + minor (0 when it cannot be read).
// Cached per device: the attribute query is cheap, but this runs on every attention call.
static inline int mxa_device_cc() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 0;
  if (dev < 64 && cache[dev]) return cache[dev];
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return 0;
  const int cc = 10 * major + minor;
  if (dev < 64) cache[dev] = cc;
  return cc;
}
#endif
