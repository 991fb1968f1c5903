// Decode GEMV for every supported weight type and 1..16 tokens:
// y[t, r] = sum_c W[r, c] x[t, c], fp32 accumulation.
//
// Version 1 (this): a warp owns kRows rows; lane l decodes units l, l + 32,
// ... of each (16-byte streaming loads, kUnroll units in flight before the
// first use) and dots every 4-element group with all kTok tokens' x, read as
// float4 through L1 (x is small and shared by the block's 8 warps). A decoded
// group is reused for kRows rows x kTok tokens, so x traffic through L1 is
// (unit bytes of x) / kRows per weight load. Each weight byte is read once
// for all tokens. Per-lane sums are reduced with shuffles at the end.
// At 1-2 tokens the kernel is bound by DRAM bandwidth; from ~4 tokens on the
// fp32 FMAs (kTok per weight) dominate, which is the price of fp32 x.
#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <DType kT, int kTok, int kRows>
__global__ void __launch_bounds__(kThreads) gemv_kernel(WView w, const float* __restrict__ x, float* __restrict__ y) {
  using C = Codec<kT>;
  constexpr int kGroups = C::kUnit / 4;
  constexpr int kUnroll = kTok <= 2 ? 2 : 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= w.rows) return;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, w.rows - 1);  // the tail re-reads a valid row

  float acc[kRows][kTok];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;

  const int nu = w.units;
  for (int u0 = lane; u0 < nu; u0 += 32 * kUnroll) {
    typename C::Raw raw[kUnroll][kRows];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (u0 + 32 * k < nu)
#pragma unroll
        for (int r = 0; r < kRows; ++r) raw[k][r] = C::load(w, rows[r], u0 + 32 * k);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int u = u0 + 32 * k;
      if (u >= nu) break;
      float part[kRows][kTok];
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTok; ++t) part[r][t] = C::kUnitScale ? 0.0f : acc[r][t];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        float4 wv[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) wv[r] = C::decode(raw[k][r], g);
        const float* xg = x + C::x_off(u, g);
#pragma unroll
        for (int t = 0; t < kTok; ++t) {
          const float4 xv = __ldg(reinterpret_cast<const float4*>(xg + int64_t(t) * w.cols));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float s = part[r][t];
            s = fmaf(wv[r].x, xv.x, s);
            s = fmaf(wv[r].y, xv.y, s);
            s = fmaf(wv[r].z, xv.z, s);
            s = fmaf(wv[r].w, xv.w, s);
            part[r][t] = s;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sc = C::scale(raw[k][r]);
#pragma unroll
        for (int t = 0; t < kTok; ++t) acc[r][t] = C::kUnitScale ? fmaf(sc, part[r][t], acc[r][t]) : part[r][t];
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[r][t] = s;
    }
  // Lane t writes token t's sums (lanes 16..31 idle): one store per value.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= w.rows) break;
#pragma unroll
    for (int t = 0; t < kTok; ++t)
      if (lane == t) y[int64_t(t) * w.rows + row0 + r] = acc[r][t];
  }
}

template <DType kT, int kTok>
void launch_gemv(const WView& v, const float* x, float* y, cudaStream_t s) {
  constexpr int kRows = 2;
  const int64_t blocks = (v.rows + kWarps * kRows - 1) / (kWarps * kRows);
  gemv_kernel<kT, kTok, kRows><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(v, x, y);
  cudaCheckLaunch();
}

template <DType kT>
void gemv_typed(const WView& v, const float* x, float* y, int n, cudaStream_t s) {
  switch (n) {
#define RUNLM_GEMV_CASE(N) \
  case N: launch_gemv<kT, N>(v, x, y, s); break;
    RUNLM_GEMV_CASE(1) RUNLM_GEMV_CASE(2) RUNLM_GEMV_CASE(3) RUNLM_GEMV_CASE(4)
    RUNLM_GEMV_CASE(5) RUNLM_GEMV_CASE(6) RUNLM_GEMV_CASE(7) RUNLM_GEMV_CASE(8)
    RUNLM_GEMV_CASE(9) RUNLM_GEMV_CASE(10) RUNLM_GEMV_CASE(11) RUNLM_GEMV_CASE(12)
    RUNLM_GEMV_CASE(13) RUNLM_GEMV_CASE(14) RUNLM_GEMV_CASE(15) RUNLM_GEMV_CASE(16)
#undef RUNLM_GEMV_CASE
    default: fail("gemv: n_tokens=%d unsupported; supported: 1..16", n);
  }
}

}  // namespace

void gemv(const GpuMatrix& w, const float* x, float* y, int n_tokens, Stream stream) {
  RUNLM_CHECK(w.data != nullptr, "gemv: matrix not uploaded");
  RUNLM_CHECK(n_tokens >= 1 && n_tokens <= 16, "gemv: n_tokens=%d unsupported; supported: 1..16", n_tokens);
  const WView v = make_view(w);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool ok = RUNLM_GPU_TYPE_SWITCH(w.type, KT, gemv_typed<KT>(v, x, y, n_tokens, s));
  RUNLM_CHECK(ok, "gemv: weight type %s unsupported; supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k",
              dtype_name(w.type));
}

}  // namespace runlm::gpu
