// Shared CUDA helpers: cudaCheck with file:line (errors become runlm::Error,
// so a failing launch is reported like any other runlm failure) and the
// bf16/fp16 element helpers the kernels are templated on.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common.h"

namespace runlm {

inline void cuda_check(cudaError_t e, const char* file, int line) {
  if (e != cudaSuccess) fail("CUDA error at %s:%d: %s (%s)", file, line, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define cudaCheck(call) ::runlm::cuda_check((call), __FILE__, __LINE__)
// After a launch: catches bad configurations (too much shared memory, ...).
#define cudaCheckLaunch() ::runlm::cuda_check(cudaGetLastError(), __FILE__, __LINE__)

// Element type traits: T is __nv_bfloat16 or __half; T2 the packed pair.
template <typename T>
struct ElemTraits;

template <>
struct ElemTraits<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr bool kIsBf16 = true;
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  // Two floats into one 32-bit register, low half = a (mma fragment order).
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

template <>
struct ElemTraits<__half> {
  using T2 = __half2;
  static constexpr bool kIsBf16 = false;
  __device__ __forceinline__ static float to_float(__half x) { return __half2float(x); }
  __device__ __forceinline__ static __half from_float(float x) { return __float2half_rn(x); }
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    __half2 v = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  }
};

// 2^x in one MUFU instruction (ex2.approx, flush-to-zero): exp2f adds
// range fix-ups the softmax does not need (its inputs are <= 0 or -inf,
// and 2^-inf = 0 here too).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90; no-ops elsewhere and for kernels
// launched the ordinary way). A kernel launched with launch_pdl may start
// while the kernel before it still runs: it does only work that depends on
// nothing earlier (loading weights), then wait_for_previous_kernel() blocks
// until that kernel has finished and its writes are visible.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Called by a kernel whose successor is launched with launch_pdl: lets that
// successor's CTAs start now (they still wait for this kernel's results).
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Sum of v over the block (blockDim.x a multiple of 32, scratch holds one
// float per warp); every thread gets the sum. Ends with the barrier that
// makes scratch complete, so a second call needs another barrier first.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < int(blockDim.x / 32); ++i) s += scratch[i];
  return s;
}

// log2(e): the kernels work in base 2 (exp2 is one MUFU instruction).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace runlm
