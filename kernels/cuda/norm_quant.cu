// The ops right before the decode GEMVs, writing the activations those
// GEMVs read: RMSNorm with the residual add folded in (f32, f16 and/or
// int8 out) and SwiGLU into int8. Folding saves a launch and a pass over x
// per op; at decode those small kernels are launch-bound (~2 us each), so
// fewer of them is the point. Both let the next GEMV start early
// (allow_next_kernel, launch_pdl).
#include "cuda/common.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

namespace {

constexpr int kThreads = 256;

// One block per row; thread j handles elements j, j + 256, ... in both
// phases, so x written in phase one is re-read by the thread that wrote it,
// and lanes of a warp hold 32 consecutive elements (one x8 block) in phase
// two. out_f32 may alias add (read in phase one only).
__global__ void rmsnorm_fused_kernel(float* x, const float* add, const float* __restrict__ w, float* out_f32,
                                     __half* out_f16, int8_t* x8q, float2* x8ds, int n_cols, float eps) {
  __shared__ float scratch[kThreads / 32];
  allow_next_kernel();
  const int64_t row = int64_t(blockIdx.x) * n_cols;
  float* xr = x + row;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    float v = xr[i];
    if (add) {
      v += add[row + i];
      xr[i] = v;
    }
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(n_cols) + eps);
  for (int i = threadIdx.x; i < n_cols; i += blockDim.x) {
    const float v = xr[i] * inv * w[i];
    if (out_f32) out_f32[row + i] = v;
    if (out_f16) out_f16[row + i] = __float2half_rn(v);
    if (x8q) warp_quantize_x8(v, x8q + row + i, x8ds + (row + i) / kX8Block);
  }
}

// One thread per value; n is a multiple of 32, so warps are whole.
__global__ void swiglu_x8_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n,
                                 int8_t* __restrict__ q, float2* __restrict__ ds) {
  allow_next_kernel();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  const float r = g / (1.0f + expf(-g)) * up[i];  // as swiglu_kernel (fused_ops.cu)
  warp_quantize_x8(r, q + i, ds + i / kX8Block);
}

}  // namespace

void rmsnorm_fused(float* x, const float* add, const float* w, float* out_f32, uint16_t* out_f16, void* out_x8,
                   int n_rows, int n_cols, float eps, Stream stream) {
  if (n_rows <= 0) return;
  RUNLM_CHECK(n_cols > 0 && (!out_x8 || n_cols % kX8Block == 0),
              "rmsnorm_fused: n_cols=%d (int8 output needs a multiple of 32)", n_cols);
  rmsnorm_fused_kernel<<<n_rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, add, w, out_f32, reinterpret_cast<__half*>(out_f16), out_x8 ? x8_q(out_x8) : nullptr,
      out_x8 ? x8_ds(out_x8, n_rows, n_cols) : nullptr, n_cols, eps);
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
