// The decode GEMV over chosen experts (gpu_ops.h expert_gemv_x8 /
// expert_gemv_f32): the row loop, unit stream and per-type dot products of
// the dense decode GEMV (gemv_x8_kernel.cuh, gemv_common.cuh, gpu_codec.cuh)
// with the weight view moved to the expert that a pair's id names.
//
// Grid: (row blocks, pairs, outs). A CTA reads its pair's expert id from
// device memory first (the routing kernel wrote it), so the kernels launch
// as ordinary launches (no programmatic overlap: the weight address is not
// known before the previous kernel ends) and a captured graph replays for
// any routing. Each CTA reads only its expert's rows: with one token, the k
// chosen experts' matrices are read once each; pairs of several tokens that
// chose the same expert read it again (through L2), which at decode batch
// sizes is what the dense GEMV's multi-token reuse would have saved.
#include "cuda/expert_targets.cuh"
#include "cuda/gemv_x8_kernel.cuh"
#include "cuda/moe_ops.h"

namespace runlm::gpu {

namespace {

// The pair's expert, or -1 (no work): valid_expert.
__device__ __forceinline__ int pair_expert(const ExpertTargets& tg, int i, const int32_t* experts, int p) {
  return valid_expert(tg, i, __ldg(experts + p));
}

template <DType kT>
__global__ void __launch_bounds__(kX8Threads)
    expert_gemv_x8_kernel(ExpertTargets tg, X8View x, const int32_t* __restrict__ experts, int x_div) {
  constexpr int kRows = kRowsOf<kT, 1>;
  const int p = blockIdx.y, i = blockIdx.z;
  const int e = pair_expert(tg, i, experts, p);
  if (e < 0) return;
  const WView w = expert_view(tg, i, e);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kX8Warps + warp) * kRows;
  if (row0 >= w.rows) return;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, w.rows - 1);
  const int t = p / x_div;
  const X8View xt{x.q + int64_t(t) * x.cols, x.ds + int64_t(t) * (x.cols / kQBlock), x.cols};
  float acc[kRows][1];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r][0] = 0.0f;
  stream_units<kT, kRows, kUnroll, kPrefetchOf<1>>(
      w, rows, lane, [&](const Step<kT, kRows, kUnroll>& st, int u0) { dot_step<kT, 1>(st, w, xt, u0, acc); });
  float* y = expert_y(tg, i) + int64_t(p) * w.rows;
  reduce_store<1>(acc, w, row0, lane, y);
}

// f32 x: the unit's elements decoded (Codec::decode) and dotted with x in
// fp32, as gemv_q.cu's loop at one token. One row a warp.
template <DType kT>
__global__ void __launch_bounds__(kX8Threads)
    expert_gemv_f32_kernel(ExpertTargets tg, const float* __restrict__ x, const int32_t* __restrict__ experts,
                           int x_div) {
  using C = Codec<kT>;
  constexpr int kGroups = C::kUnit / 4;
  const int p = blockIdx.y, i = blockIdx.z;
  const int e = pair_expert(tg, i, experts, p);
  if (e < 0) return;
  const WView w = expert_view(tg, i, e);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = int64_t(blockIdx.x) * kX8Warps + warp;
  if (row0 >= w.rows) return;
  const int64_t rows[1] = {row0};
  const float* xt = x + int64_t(p / x_div) * w.cols;
  float acc[1][1] = {{0.0f}};
  stream_units<kT, 1, kUnroll, true>(w, rows, lane, [&](const Step<kT, 1, kUnroll>& st, int u0) {
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int u = u0 + 32 * k;
      if (u >= w.units) break;
      float part = 0.0f;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const float4 wv = C::decode(st.raw[k][0], g);
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xt + C::x_off(u, g)));
        part = fmaf(wv.x, xv.x, part);
        part = fmaf(wv.y, xv.y, part);
        part = fmaf(wv.z, xv.z, part);
        part = fmaf(wv.w, xv.w, part);
      }
      acc[0][0] = fmaf(C::scale(st.raw[k][0]), part, acc[0][0]);
    }
  });
  float* y = expert_y(tg, i) + int64_t(p) * w.rows;
  reduce_store<1>(acc, w, row0, lane, y);
}

dim3 expert_grid(const ExpertGemvOut* outs, int n_outs, int n_pairs, int rows_per_cta, const char* who) {
  RUNLM_CHECK(n_pairs >= 1 && n_pairs <= 65535, "%s: %d pairs; supported: 1..65535", who, n_pairs);
  const int64_t blocks = (outs[0].w->rows + rows_per_cta - 1) / rows_per_cta;
  RUNLM_CHECK(blocks <= INT32_MAX, "%s: too many rows", who);
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(n_pairs), static_cast<unsigned>(n_outs));
}

}  // namespace

void expert_gemv_x8(const ExpertGemvOut* outs, int n_outs, const void* x8, int x_rows, const int32_t* experts,
                    int n_pairs, int x_div, Stream stream) {
  const ExpertTargets tg = make_expert_targets(outs, n_outs, "expert_gemv_x8");
  const DType type = outs[0].w->type;
  const int64_t cols = outs[0].w->cols;
  RUNLM_CHECK(gemv_x8_supports(type), "expert_gemv_x8: weight type %s has no int8-x GEMV", dtype_name(type));
  RUNLM_CHECK(cols % kQBlock == 0, "expert_gemv_x8: %lld columns; needs a multiple of 32", static_cast<long long>(cols));
  RUNLM_CHECK(x_div >= 1 && (n_pairs - 1) / x_div < x_rows, "expert_gemv_x8: %d pairs / %d exceed %d rows of x",
              n_pairs, x_div, x_rows);
  const X8View x = x8_view(x8, x_rows, cols);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool ok = RUNLM_GPU_TYPE_SWITCH(type, KT, {
    if constexpr (KT != DType::F32 && KT != DType::F16 && KT != DType::BF16) {
      const dim3 grid = expert_grid(outs, n_outs, n_pairs, kX8Warps * kRowsOf<KT, 1>, "expert_gemv_x8");
      expert_gemv_x8_kernel<KT><<<grid, kX8Threads, 0, s>>>(tg, x, experts, x_div);
    }
  });
  RUNLM_CHECK(ok, "expert_gemv_x8: weight type %s unsupported", dtype_name(type));
  cudaCheckLaunch();
}

bool expert_gemv_f32_supports(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

void expert_gemv_f32(const ExpertGemvOut* outs, int n_outs, const float* x, const int32_t* experts, int n_pairs,
                     int x_div, Stream stream) {
  const ExpertTargets tg = make_expert_targets(outs, n_outs, "expert_gemv_f32");
  const DType type = outs[0].w->type;
  RUNLM_CHECK(x_div >= 1, "expert_gemv_f32: x_div %d", x_div);
  const dim3 grid = expert_grid(outs, n_outs, n_pairs, kX8Warps, "expert_gemv_f32");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DType::F32: expert_gemv_f32_kernel<DType::F32><<<grid, kX8Threads, 0, s>>>(tg, x, experts, x_div); break;
    case DType::F16: expert_gemv_f32_kernel<DType::F16><<<grid, kX8Threads, 0, s>>>(tg, x, experts, x_div); break;
    case DType::BF16: expert_gemv_f32_kernel<DType::BF16><<<grid, kX8Threads, 0, s>>>(tg, x, experts, x_div); break;
    default:
      fail("expert_gemv_f32: weight type %s unsupported; supported: f32, f16, bf16 (the quantized types take "
           "expert_gemv_x8)",
           dtype_name(type));
  }
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
