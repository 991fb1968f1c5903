// fa3 persistent tile scheduler: a grid of about one CTA per SM walks the
// work tiles (query block, head, sequence) with a static stride. Tiles are
// numbered heaviest first: the query block index runs from the last block
// (under causal masking the one that sees the most keys) down to block 0,
// so each CTA takes long tiles first and short ones last, which balances the
// causal triangle (longest-processing-time-first). The rounds of the
// stride run in alternate directions (snake): with a plain stride CTA 0 took
// the heaviest tile of every round and CTA gridDim-1 the lightest, a bias
// that adds up over the ~16 rounds of a causal 8k problem; alternating
// cancels it round by round. The producer warp and
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
  // (head, sequence) pairs per group, >= 1. Groups run one after another;
  // inside a group the query block is slowest, heaviest first. One group
  // of all pairs is plain heaviest-first (LPT) order, which balances the
  // causal triangle best but has every resident CTA on a different head,
  // so at long sequences their K/V (32 heads x 4 MB at 8k, d128) overflow
  // the 50 MB L2 and are re-read from DRAM (docs/kernels.md: DRAM 51% busy for a
  // 268 MB problem). Groups sized so their K/V fit in part of L2 keep the
  // reuse and still balance inside each group (choose_heads_per_group).
  int heads_per_group;
  bool snake;  // alternate the direction of every other round

  __device__ __forceinline__ int num_tiles() const { return n_m_blocks * n_heads * batch; }
  __device__ __forceinline__ int get_initial_work() const { return blockIdx.x; }
  // With snake, CTA i takes tiles i, 2G - 1 - i, 2G + i, 4G - 1 - i, ... (G
  // = gridDim.x): tile r G + i on even rounds, r G + G - 1 - i on odd ones,
  // a bijection on every round (the last one's valid tiles go to the CTAs at
  // one end). An even round is one where t % G == i.
  __device__ __forceinline__ int get_next_work(int t) const {
    const int g = gridDim.x, i = blockIdx.x;
    if (!snake) return t + g;
    return t % g == i ? t + 2 * (g - i) - 1 : t + 2 * i + 1;
  }
  __device__ __forceinline__ bool valid(int t) const { return t < num_tiles(); }
  __device__ __forceinline__ WorkTile tile(int t) const {
    const int n_hb = n_heads * batch;
    const int per_group = heads_per_group * n_m_blocks;
    const int g = t / per_group;
    const int first_hb = g * heads_per_group;
    const int size = min(heads_per_group, n_hb - first_hb);
    const int r = t - g * per_group;
    const int hb = first_hb + r % size;
    return WorkTile{n_m_blocks - 1 - r / size, hb % n_heads, hb / n_heads};
  }
};

}  // namespace fa3
}  // namespace runlm
