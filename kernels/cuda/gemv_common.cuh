// Pieces shared by the two decode GEMV families (gemv_q.cu: f32
// activations, every type; gemv_x8.cu: int8 activations, Q4_0/Q8_0):
// the list of matrices one launch covers, the register step of raw weight
// units, and the final warp reduction.
#pragma once

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

// Up to kMaxGemvOuts matrices of one type and width that read the same x
// (q/k/v, gate/up), done in one launch: CTAs [end[i-1], end[i]) work on
// matrix i. One launch instead of three saves the launch gap and the tail
// of each small matrix (a 4096 x 4096 Q4_0 matrix is ~3 us of DRAM time).
struct GemvTargets {
  WView w[kMaxGemvOuts];
  float* y[kMaxGemvOuts];
  int end[kMaxGemvOuts];  // cumulative CTA counts
  int count;
};

// Checks that the outs can share a launch and lays out the CTAs, rows_per_cta
// rows of each matrix per CTA.
inline GemvTargets make_targets(const GemvOut* outs, int n_outs, int rows_per_cta, const char* who) {
  RUNLM_CHECK(n_outs >= 1 && n_outs <= kMaxGemvOuts, "%s: %d matrices; supported: 1..%d", who, n_outs, kMaxGemvOuts);
  GemvTargets t{};
  t.count = n_outs;
  int64_t ctas = 0;
  for (int i = 0; i < n_outs; ++i) {
    const GpuMatrix& m = *outs[i].w;
    RUNLM_CHECK(m.data != nullptr, "%s: matrix not uploaded", who);
    RUNLM_CHECK(m.type == outs[0].w->type && m.cols == outs[0].w->cols,
                "%s: matrices of one launch must share type and width (%s x %lld vs %s x %lld)", who,
                dtype_name(m.type), static_cast<long long>(m.cols), dtype_name(outs[0].w->type),
                static_cast<long long>(outs[0].w->cols));
    t.w[i] = make_view(m);
    t.y[i] = outs[i].y;
    ctas += (m.rows + rows_per_cta - 1) / rows_per_cta;
    RUNLM_CHECK(ctas <= INT32_MAX, "%s: too many rows", who);
    t.end[i] = static_cast<int>(ctas);
  }
  return t;
}

// The matrix CTA `blk` works on; blk becomes the CTA's index inside it.
// Selects rather than an indexed parameter array (which could go to local
// memory).
__device__ __forceinline__ int target_of(const GemvTargets& t, int& blk) {
  int i = 0;
  if (t.count > 1 && blk >= t.end[0]) i = 1;
  if (t.count > 2 && blk >= t.end[1]) i = 2;
  if (i > 0) blk -= t.end[i - 1];
  return i;
}
__device__ __forceinline__ WView view_of(const GemvTargets& t, int i) {
  return i == 0 ? t.w[0] : i == 1 ? t.w[1] : t.w[2];
}
__device__ __forceinline__ float* y_of(const GemvTargets& t, int i) {
  return i == 0 ? t.y[0] : i == 1 ? t.y[1] : t.y[2];
}

// kUnroll units (32 apart) of kRows rows, as loaded.
template <DType kT, int kRows, int kUnroll>
struct Step {
  typename Codec<kT>::Raw raw[kUnroll][kRows];
};

// Issues the 16-byte loads of units u0, u0 + 32, ... (those inside the row).
template <DType kT, int kRows, int kUnroll>
__device__ __forceinline__ void load_step(Step<kT, kRows, kUnroll>& st, const WView& w, const int64_t* rows, int u0) {
#pragma unroll
  for (int k = 0; k < kUnroll; ++k)
    if (u0 + 32 * k < w.units)
#pragma unroll
      for (int r = 0; r < kRows; ++r) st.raw[k][r] = Codec<kT>::load(w, rows[r], u0 + 32 * k);
}

// A warp's pass over its rows: units lane, lane + 32 kUnroll, ... in steps
// of kUnroll units, dot(step, u0) for each. With kPrefetch the next step's
// loads are issued before this step's dot (register double buffer). The
// first loads go out before waiting for the previous kernel (launch_pdl):
// weights never depend on it, x does.
template <DType kT, int kRows, int kUnroll, bool kPrefetch, typename Dot>
__device__ __forceinline__ void stream_units(const WView& w, const int64_t* rows, int lane, Dot&& dot) {
  constexpr int kStep = 32 * kUnroll;
  if constexpr (kPrefetch) {
    Step<kT, kRows, kUnroll> cur;
    load_step(cur, w, rows, lane);
    wait_for_previous_kernel();
    for (int u0 = lane; u0 < w.units; u0 += kStep) {
      Step<kT, kRows, kUnroll> next;
      load_step(next, w, rows, u0 + kStep);
      dot(cur, u0);
      cur = next;
    }
  } else {
    wait_for_previous_kernel();
    for (int u0 = lane; u0 < w.units; u0 += kStep) {
      Step<kT, kRows, kUnroll> cur;
      load_step(cur, w, rows, u0);
      dot(cur, u0);
    }
  }
}

// Sums each accumulator over the warp; lane t writes token t's sums (lanes
// 16..31 idle): one store per value.
template <int kTok, int kRows>
__device__ __forceinline__ void reduce_store(float (&acc)[kRows][kTok], const WView& w, int64_t row0, int lane,
                                             float* __restrict__ y) {
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[r][t] = s;
    }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= w.rows) break;
#pragma unroll
    for (int t = 0; t < kTok; ++t)
      if (lane == t) y[int64_t(t) * w.rows + row0 + r] = acc[r][t];
  }
}

// Runs `...` with a compile-time constant N equal to the run-time token
// count n (1..16).
#define RUNLM_GEMV_TOKEN_SWITCH(n, N, ...)                                      \
  [&] {                                                                         \
    switch (n) {                                                                \
      case 1: { constexpr int N = 1; __VA_ARGS__; break; }                     \
      case 2: { constexpr int N = 2; __VA_ARGS__; break; }                     \
      case 3: { constexpr int N = 3; __VA_ARGS__; break; }                     \
      case 4: { constexpr int N = 4; __VA_ARGS__; break; }                     \
      case 5: { constexpr int N = 5; __VA_ARGS__; break; }                     \
      case 6: { constexpr int N = 6; __VA_ARGS__; break; }                     \
      case 7: { constexpr int N = 7; __VA_ARGS__; break; }                     \
      case 8: { constexpr int N = 8; __VA_ARGS__; break; }                     \
      case 9: { constexpr int N = 9; __VA_ARGS__; break; }                     \
      case 10: { constexpr int N = 10; __VA_ARGS__; break; }                   \
      case 11: { constexpr int N = 11; __VA_ARGS__; break; }                   \
      case 12: { constexpr int N = 12; __VA_ARGS__; break; }                   \
      case 13: { constexpr int N = 13; __VA_ARGS__; break; }                   \
      case 14: { constexpr int N = 14; __VA_ARGS__; break; }                   \
      case 15: { constexpr int N = 15; __VA_ARGS__; break; }                   \
      case 16: { constexpr int N = 16; __VA_ARGS__; break; }                   \
      default: fail("gemv: n_tokens=%d unsupported; supported: 1..16", n);      \
    }                                                                           \
  }()

}  // namespace runlm::gpu
