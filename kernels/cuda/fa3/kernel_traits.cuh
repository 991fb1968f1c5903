// fa3 tile shapes, shared-memory layout and kernel arguments.
//
// CTA = 3 warpgroups: warpgroup 0 is the producer (one thread issues TMA
// loads), warpgroups 1 and 2 are consumers with 64 query rows each (BM =
// 128). Shared memory holds Q [BM x D] and kStages K and V tiles [BN x D],
// each stored as D/64 column blocks of [rows x 64] elements with the
// 128-byte swizzle, which is what both TMA (SWIZZLE_128B) writes and wgmma's
// descriptors read. Every block starts on a 1024-byte boundary.
#pragma once

#include <cstdint>

namespace runlm {
namespace fa3 {

constexpr int kConsumerWGs = 2;
constexpr int kThreads = 128 * (1 + kConsumerWGs);
constexpr int kConsumerThreads = 128 * kConsumerWGs;
constexpr int kConsumerWarps = kConsumerThreads / 32;  // arrivals on each *_empty barrier
constexpr int kProducerRegs = 24;   // setmaxnreg: the producer needs few registers...
constexpr int kConsumerRegs = 240;  // ...so consumers get 240: 24*128 + 240*256 <= 64K
// Paged K/V: the producer warp's block-table lookups (a lane per TMA box)
// spilled 4-20 bytes at 24 registers; 32 fit, and the consumers fit in 232
// without spills (ptxas -v, all four tile shapes): 32*128 + 232*256 <= 64K.
constexpr int kProducerRegsPaged = 32;
constexpr int kConsumerRegsPaged = 232;

// Key-tile width per head dim. d128: 176 (FA3's choice for non-causal;
// measured on H100 with the FA3-order rescale: +2-5% over 128 at 2k-16k,
// causal from 4k too; 2 K/V stages fit), except causal problems of < 4096
// keys (launch_fa3_paged).
template <int D>
struct DefaultBN;
template <>
struct DefaultBN<64> {
  static constexpr int value = 128;
};
template <>
struct DefaultBN<128> {
  static constexpr int value = 176;
};
template <>
struct DefaultBN<256> {
  static constexpr int value = 64;
};

template <int D, int BN_>
struct Layout {
  static constexpr int BM = 128, BN = BN_;
  // As many K/V stages as fit next to Q (at most 4, at least 2).
  static constexpr int kStagesFit = int((227 * 1024 - 2048 - BM * D * 2) / (2 * BN * D * 2));
  static constexpr int kStages = kStagesFit > 4 ? 4 : kStagesFit;
  static_assert(kStages >= 2, "fewer than 2 K/V stages fit in shared memory");
  static constexpr uint32_t kQBytes = BM * D * 2;
  static constexpr uint32_t kKVBytes = BN * D * 2;  // one K (or V) stage
  static constexpr uint32_t kQ = 0;
  static constexpr uint32_t kK = kQ + kQBytes;
  static constexpr uint32_t kV = kK + kStages * kKVBytes;
  static constexpr uint32_t kBars = kV + kStages * kKVBytes;
  // Barriers: q_full, q_empty, then per stage k_full, k_empty, v_full, v_empty.
  static constexpr int kNumBars = 2 + 4 * kStages;
  static constexpr uint32_t kBytes = kBars + kNumBars * 8;
  static constexpr uint32_t kAlloc = kBytes + 1024;  // slack to align the base to 1024
  static_assert(kQBytes % 1024 == 0 && kKVBytes % 1024 == 0, "tiles must keep 1024-byte alignment");
  static_assert(kAlloc <= 227 * 1024, "shared memory over the sm_90 limit");

  __device__ static uint32_t q_full(uint32_t base) { return base + kBars; }
  __device__ static uint32_t q_empty(uint32_t base) { return base + kBars + 8; }
  __device__ static uint32_t k_full(uint32_t base, int s) { return base + kBars + 16 + 32 * s; }
  __device__ static uint32_t k_empty(uint32_t base, int s) { return base + kBars + 16 + 32 * s + 8; }
  __device__ static uint32_t v_full(uint32_t base, int s) { return base + kBars + 16 + 32 * s + 16; }
  __device__ static uint32_t v_empty(uint32_t base, int s) { return base + kBars + 16 + 32 * s + 24; }
};

struct Args {
  void* out;            // [total_q, n_heads, D]
  float* lse;           // [n_heads, total_q] or nullptr
  const int32_t* cu_q;  // [batch + 1]
  const int32_t* cu_k;  // [batch + 1]
  int total_q, n_heads, group;  // group = n_heads / n_kv_heads
  int window_left;
  bool causal;
  float scale_log2;      // softmax scale * log2(e); 1 under soft-cap (the capped scores are in base 2)
  float cap_in, cap_out;  // soft-cap only: s -> cap_out * tanh(s * cap_in), scale / cap and cap * log2(e)
  const float* sinks;     // kSinks only: [n_heads] sink logits
  int n_m_blocks, batch;
  int heads_per_group;  // see StaticTileScheduler
  bool snake;           // see StaticTileScheduler
  // Paged K/V only (the K/V tensor maps then span the whole pool):
  const int32_t* block_tables;  // [batch, max_blocks_per_seq] page indices
  int max_blocks_per_seq;
  int log2_bs;                  // log2(block_size)
  int box_rows;                 // rows per K/V TMA box: min(block_size, BN) (gcd for BN = 176)
};

// The keys a query block can see, as a range of BN-key tiles [t_lo, t_hi).
struct TileRange {
  int q_start, sq, k_start, sk, offset, m0, t_lo, t_hi;
  bool valid;  // false when the block starts past its sequence's end
};

template <int BM, int BN>
__device__ __forceinline__ TileRange tile_range(const Args& a, int m_block, int batch) {
  TileRange r;
  r.q_start = a.cu_q[batch];
  r.sq = a.cu_q[batch + 1] - r.q_start;
  r.m0 = m_block * BM;
  r.valid = r.m0 < r.sq;
  r.k_start = a.cu_k[batch];
  r.sk = a.cu_k[batch + 1] - r.k_start;
  r.offset = r.sk - r.sq;
  int n_hi = r.sk, n_lo = 0;
  if (a.causal) n_hi = min(r.sk, r.m0 + BM + r.offset);
  if (a.window_left >= 0) n_lo = max(0, r.m0 + r.offset - a.window_left);
  r.t_lo = n_lo / BN;
  r.t_hi = n_hi > n_lo ? (n_hi + BN - 1) / BN : r.t_lo;
  return r;
}

}  // namespace fa3
}  // namespace runlm
