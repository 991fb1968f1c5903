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

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// log2(e): the kernels work in base 2 (exp2 is one MUFU instruction).
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace runlm
