// The int8 activations that gemv_x8 reads (kernels/cuda/gemv_x8.cu) and
// the per-warp quantizer every producer of them uses (quantize_x8, the
// fused RMSNorm and SwiGLU of norm_quant.cu, the gate/up GEMV's SwiGLU
// epilogue), so all of them round alike.
//
// Layout of n rows of cols values (cols % 32 == 0), one allocation:
//   q  int8 [n][cols]                 q = round(x / d)
//   ds float2 [n][cols / 32]          (d, d * sum(q)) per 32 values,
//                                     d = amax / 127; at offset
//                                     x8_q_bytes(n, cols) (16-byte aligned)
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/gpu_codec.cuh"  // align_up

namespace runlm::gpu {

constexpr int kX8Block = 32;  // values per scale

struct X8View {
  const int8_t* q;
  const float2* ds;
  int64_t cols;
};

inline size_t x8_q_bytes(int n, int64_t cols) {
  return align_up(static_cast<size_t>(n) * static_cast<size_t>(cols), 16);
}
inline X8View x8_view(const void* x8, int n, int64_t cols) {
  const auto* base = static_cast<const uint8_t*>(x8);
  return X8View{reinterpret_cast<const int8_t*>(base), reinterpret_cast<const float2*>(base + x8_q_bytes(n, cols)),
                cols};
}
inline int8_t* x8_q(void* x8) { return static_cast<int8_t*>(x8); }
inline float2* x8_ds(void* x8, int n, int64_t cols) {
  return reinterpret_cast<float2*>(static_cast<uint8_t*>(x8) + x8_q_bytes(n, cols));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// SwiGLU of one value, silu(g) * u: every kernel that quantizes it for
// gemv_x8 (swiglu_x8, the fused gate/up GEMV) calls this one function, so
// their int8 x is bit-equal (the same expf and IEEE division).
__device__ __forceinline__ float swiglu_value(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// A full warp holds 32 consecutive values of one 32-value block, lane l
// value l: writes its int8 to *q and lane 0 the block's (d, d sum q) to *ds.
// The same float operations as quantize_x8_kernel and the tests' host copy.
__device__ __forceinline__ void warp_quantize_x8(float v, int8_t* q, float2* ds) {
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  const int qi = __float2int_rn(v * id);
  const int sum = warp_sum(qi);
  *q = static_cast<int8_t>(qi);
  if ((threadIdx.x & 31) == 0) *ds = make_float2(d, d * static_cast<float>(sum));
}

// The same for 4 consecutive values a lane (v), 8 aligned lanes per
// 32-value block: this lane's 4 int8 go to *q (4-byte aligned), the group's
// first lane writes (d, d sum q) to *ds. Every lane of the warp must call it
// (shuffles); lanes with valid == false (past the row) take part with
// v = 0 and write nothing; a block is all valid or all not.
__device__ __forceinline__ void quantize_x8_quad(float4 v, bool valid, int8_t* q, float2* ds) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  const int a = __float2int_rn(v.x * id), b = __float2int_rn(v.y * id);
  const int c = __float2int_rn(v.z * id), e = __float2int_rn(v.w * id);
  int sum = a + b + c + e;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (!valid) return;
  *reinterpret_cast<uint32_t*>(q) =
      (uint32_t(a) & 0xFF) | (uint32_t(b) & 0xFF) << 8 | (uint32_t(c) & 0xFF) << 16 | uint32_t(e) << 24;
  if ((threadIdx.x & 7) == 0) *ds = make_float2(d, d * static_cast<float>(sum));
}

}  // namespace runlm::gpu
