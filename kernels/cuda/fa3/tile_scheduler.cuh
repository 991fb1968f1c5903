// fa3 persistent tile scheduler: a grid of about one CTA per SM walks the
// work tiles (query block, head, sequence) with a static stride. Tiles are
// numbered heaviest first: the query block index runs from the last block
// (under causal masking the one that sees the most keys) down to block 0,
// so each CTA takes long tiles first and short ones last, which balances the
// causal triangle (longest-processing-time-first). The producer warp and
// the consumer warpgroups walk the same sequence independently: the schedule
// is a pure function of the tile counter, so they need not talk.
#pragma once

#include <cstdint>

namespace runlm {
namespace fa3 {

struct WorkTile {
  int m_block, head, batch;
};

struct StaticTileScheduler {
  int n_m_blocks;  // ceil(max_seqlen_q / BM)
  int n_heads, batch;
  // false: query block slowest (all heads of the heaviest block first).
  // true: (head, sequence) slowest, heaviest block first inside each, so the
  // resident CTAs share a few heads' K/V in L2 (NOTES.md: the default order
  // re-reads K/V from DRAM at long sequences). RUNLM_FA3_SCHED=head; not yet
  // measured, hence not the default.
  bool head_major;

  __device__ __forceinline__ int num_tiles() const { return n_m_blocks * n_heads * batch; }
  __device__ __forceinline__ int get_initial_work() const { return blockIdx.x; }
  __device__ __forceinline__ int get_next_work(int t) const { return t + gridDim.x; }
  __device__ __forceinline__ bool valid(int t) const { return t < num_tiles(); }
  __device__ __forceinline__ WorkTile tile(int t) const {
    if (head_major) {
      const int hb = t / n_m_blocks;
      return WorkTile{n_m_blocks - 1 - t % n_m_blocks, hb % n_heads, hb / n_heads};
    }
    const int per_block = n_heads * batch;
    const int mb = n_m_blocks - 1 - t / per_block;
    const int rest = t % per_block;
    return WorkTile{mb, rest % n_heads, rest / n_heads};
  }
};

}  // namespace fa3
}  // namespace runlm
