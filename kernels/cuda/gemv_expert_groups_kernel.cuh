// The grouped expert GEMV kernel (moe_ops.h grouped_expert_gemv_x8, the
// design in gemv_expert_groups.cu) and its launcher, a template that
// gemv_expert_groups.cu, gemv_expert_groups_kquant.cu and
// gemv_expert_groups_unit32.cu instantiate for their types.
#pragma once

#include "cuda/expert_targets.cuh"
#include "cuda/gemv_x8_kernel.cuh"
#include "cuda/moe_ops.h"

namespace runlm::gpu {

// Rows a warp takes: one. The row block is the grid's, the same for every
// chunk, while a chunk's pair count is known only on the device; one row is
// what gemv_x8 takes at 9..16 tokens (kRowsOf), the full chunks that carry
// most pairs of a long step.
constexpr int kGroupRows = 1;
constexpr int kGroupRowsPerCta = kX8Warps * kGroupRows;

// One warp's row of the chunk's expert against its kTok x rows: gemv_x8's
// inner loop (stream_units, dot_step, reduce_store) at kTok tokens, x and y
// already moved to the chunk's first grouped row. A pair's sum is taken in
// the same order as the per-pair expert GEMV's (gemv_experts.cu).
template <DType kT, int kTok>
__device__ __forceinline__ void chunk_row(const WView& w, int64_t row, int lane, const X8View& x, float* y) {
  const int64_t rows[kGroupRows] = {row};
  float acc[kGroupRows][kTok];
#pragma unroll
  for (int t = 0; t < kTok; ++t) acc[0][t] = 0.0f;
  stream_units<kT, kGroupRows, kUnroll, kPrefetchOf<kTok>>(
      w, rows, lane,
      [&](const Step<kT, kGroupRows, kUnroll>& st, int u0) { dot_step<kT, kTok>(st, w, x, u0, acc); });
  reduce_store<kTok>(acc, w, row, lane, y);
}

// chunk_row at the chunk's pair count n (1..kTok), a compile-time count.
template <DType kT, int kTok>
__device__ __forceinline__ void chunk_row_n(int n, const WView& w, int64_t row, int lane, const X8View& x, float* y) {
  if constexpr (kTok > 1) {
    if (n < kTok) {
      chunk_row_n<kT, kTok - 1>(n, w, row, lane, x, y);
      return;
    }
  }
  chunk_row<kT, kTok>(w, row, lane, x, y);
}

// Grid: (chunks, row blocks, outs). Chunks vary fastest, so the CTAs in
// flight at once are the chunks of every expert at the same rows: the
// chunks of one expert (adjacent in the list) read the same weight rows
// together, from DRAM once and from L2 after.
template <DType kT>
__global__ void __launch_bounds__(kX8Threads)
    expert_groups_x8_kernel(ExpertTargets tg, X8View x, const MoeChunk* __restrict__ chunks,
                            const int32_t* __restrict__ n_chunks) {
  const int c = blockIdx.x, i = blockIdx.z;
  if (c >= __ldg(n_chunks)) return;
  const MoeChunk ch = chunks[c];
  const int e = valid_expert(tg, i, ch.expert);
  if (e < 0) return;
  const WView w = expert_view(tg, i, e);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.y) * kGroupRowsPerCta + warp;
  if (row >= w.rows) return;
  const X8View xc{x.q + int64_t(ch.row) * x.cols, x.ds + int64_t(ch.row) * (x.cols / kQBlock), x.cols};
  float* y = expert_y(tg, i) + int64_t(ch.row) * w.rows;
  chunk_row_n<kT, kMaxChunkPairs>(ch.n, w, row, lane, xc, y);
}

// An ordinary launch (no programmatic overlap): the weight address is the
// chunk's expert, known only once moe_group has run.
template <DType kT>
void launch_expert_groups_x8(const ExpertTargets& tg, const X8View& x, const MoeChunk* chunks,
                             const int32_t* n_chunks, dim3 grid, cudaStream_t s) {
  expert_groups_x8_kernel<kT><<<grid, kX8Threads, 0, s>>>(tg, x, chunks, n_chunks);
}

}  // namespace runlm::gpu
