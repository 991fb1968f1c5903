// The ops right before the decode GEMVs, writing the activations those
// GEMVs read: RMSNorm with the residual add folded in (f32, f16 and/or
// int8 out) and SwiGLU / GeGLU into int8. Folding saves a launch and a pass over x
// per op; at decode those small kernels are launch-bound (~2 us each), so
// fewer of them is the point. Both let the next GEMV start early
// (allow_next_kernel, launch_pdl).
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

namespace {

constexpr int kThreads = 256;

// One block per row, a float4 of the row per thread and step, kVec steps,
// every value held in registers between the two phases: all loads of a row
// go out at once. (A loop over the row with 256 threads would
// re-read it; at one row, decode's case, that was a chain of ~16 dependent
// DRAM round trips, 22 us per call measured by ncu, more than a GEMV.)
// out_f32 may alias x or add: every value is read before any is written.
template <int kVec>
__global__ void __launch_bounds__(1024) rmsnorm_fused_kernel(float* x, const float* add, const float* w,
                                                             float* out_f32, __half* out_f16, int8_t* x8q,
                                                             float2* x8ds, int n_cols, float eps) {
  __shared__ float scratch[32];
  allow_next_kernel();
  const int64_t row = int64_t(blockIdx.x) * n_cols;
  const int n4 = n_cols / 4;
  float4 v[kVec], wv[kVec];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    v[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    wv[k] = v[k];
    if (j < n4) {
      v[k] = reinterpret_cast<const float4*>(x + row)[j];
      wv[k] = reinterpret_cast<const float4*>(w)[j];
      if (add) {
        const float4 a = reinterpret_cast<const float4*>(add + row)[j];
        v[k] = make_float4(v[k].x + a.x, v[k].y + a.y, v[k].z + a.z, v[k].w + a.w);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (add && j < n4) reinterpret_cast<float4*>(x + row)[j] = v[k];
    ss = fmaf(v[k].x, v[k].x, ss);
    ss = fmaf(v[k].y, v[k].y, ss);
    ss = fmaf(v[k].z, v[k].z, ss);
    ss = fmaf(v[k].w, v[k].w, ss);
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(n_cols) + eps);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    const bool valid = j < n4;
    const float4 y = make_float4(v[k].x * inv * wv[k].x, v[k].y * inv * wv[k].y, v[k].z * inv * wv[k].z,
                                 v[k].w * inv * wv[k].w);
    if (valid && out_f32) reinterpret_cast<float4*>(out_f32 + row)[j] = y;
    if (valid && out_f16) {
      __half2* h = reinterpret_cast<__half2*>(out_f16 + row + 4 * int64_t(j));
      h[0] = __floats2half2_rn(y.x, y.y);
      h[1] = __floats2half2_rn(y.z, y.w);
    }
    if (x8q) quantize_x8_quad(y, valid, x8q + row + 4 * j, x8ds + (row + 4 * j) / kX8Block);
  }
}

// One thread per value; n is a multiple of 32, so warps are whole.
__global__ void swiglu_x8_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                 int8_t* __restrict__ q, float2* __restrict__ ds) {
  allow_next_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  // swiglu_value: as swiglu_kernel (fused_ops.cu) and gemv_x8_swiglu's epilogue
  warp_quantize_x8(swiglu_value(gate[i], up[i]), q + i, ds + i / kX8Block);
}

// geglu's value (fused_ops.cu, kernels/cpu/ops.h), quantized for gemv_x8.
__global__ void geglu_x8_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                int8_t* __restrict__ q, float2* __restrict__ ds) {
  allow_next_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCoef = 0.044715f;
  const float g = gate[i];
  warp_quantize_x8(0.5f * g * (1.0f + tanhf(kSqrt2OverPi * g * (1.0f + kCoef * g * g))) * up[i], q + i,
                   ds + i / kX8Block);
}

}  // namespace

void rmsnorm_fused(float* x, const float* add, const float* w, float* out_f32, uint16_t* out_f16, void* out_x8,
                   int n_rows, int n_cols, float eps, Stream stream) {
  if (n_rows <= 0) return;
  constexpr int kMaxThreads = 1024, kMaxVec = 4;
  RUNLM_CHECK(n_cols > 0 && n_cols % 4 == 0 && n_cols <= 4 * kMaxThreads * kMaxVec,
              "rmsnorm: n_cols=%d unsupported; supported: multiples of 4 up to %d", n_cols,
              4 * kMaxThreads * kMaxVec);
  RUNLM_CHECK(!out_x8 || n_cols % kX8Block == 0, "rmsnorm_fused: int8 output needs n_cols %% 32 == 0 (n_cols=%d)",
              n_cols);
  const int n4 = n_cols / 4;
  const int vec = n4 <= kMaxThreads ? 1 : n4 <= 2 * kMaxThreads ? 2 : 4;
  const int threads = std::min(kMaxThreads, (ceil_div(n4, vec) + 31) / 32 * 32);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int8_t* q = out_x8 ? x8_q(out_x8) : nullptr;
  float2* ds = out_x8 ? x8_ds(out_x8, n_rows, n_cols) : nullptr;
  __half* h = reinterpret_cast<__half*>(out_f16);
  if (vec == 1) rmsnorm_fused_kernel<1><<<n_rows, threads, 0, s>>>(x, add, w, out_f32, h, q, ds, n_cols, eps);
  else if (vec == 2) rmsnorm_fused_kernel<2><<<n_rows, threads, 0, s>>>(x, add, w, out_f32, h, q, ds, n_cols, eps);
  else rmsnorm_fused_kernel<4><<<n_rows, threads, 0, s>>>(x, add, w, out_f32, h, q, ds, n_cols, eps);
  cudaCheckLaunch();
}

void swiglu_x8(const float* gate, const float* up, void* out_x8, int n_rows, int64_t n_cols, Stream stream) {
  if (n_rows <= 0) return;
  RUNLM_CHECK(n_cols > 0 && n_cols % kX8Block == 0, "swiglu_x8: n_cols=%lld; needs a multiple of 32",
              static_cast<long long>(n_cols));
  const int64_t n = int64_t(n_rows) * n_cols;
  swiglu_x8_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(gate, up, n, x8_q(out_x8), x8_ds(out_x8, n_rows, n_cols));
  cudaCheckLaunch();
}

}  // namespace runlm::gpu

namespace runlm::gpu {

void geglu_x8(const float* gate, const float* up, void* out_x8, int n_rows, int64_t n_cols, Stream stream) {
  if (n_rows <= 0) return;
  RUNLM_CHECK(n_cols > 0 && n_cols % kX8Block == 0, "geglu_x8: n_cols=%lld; needs a multiple of 32",
              static_cast<long long>(n_cols));
  const int64_t n = int64_t(n_rows) * n_cols;
  geglu_x8_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0,
                    static_cast<cudaStream_t>(stream)>>>(gate, up, n, x8_q(out_x8), x8_ds(out_x8, n_rows, n_cols));
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
