// fa3 main loop: the producer's TMA loads and the consumers' wgmma GEMMs and
// softmax over the K/V tiles of one query block.
//
// Pipeline: kStages slots, each with a K and a V buffer and four mbarriers.
// *_full completes when the TMA bytes have landed (expect_tx by the producer,
// complete_tx by the copy engine); *_empty completes when all 8 consumer
// warps have arrived (lane 0 of each, after the warp's wgmma wait, which is
// warp-synchronous, so the whole warp's reads of the buffer are finished). K and V have
// separate barriers so QK^T starts before V has landed and K's slot is
// released while the softmax runs. Slot and phase come from one running
// tile counter that producer and consumers advance identically.
//
// Paged K/V (attention.h) changes the producer (producer_load_block_paged:
// a tile is assembled from TMA boxes, one per page run) and adds one step
// before the last tile's P V (zero_v_tail); the GEMMs and the softmax are
// the same code.
#pragma once

#include "cuda/attn_softcap.cuh"
#include "cuda/fa3/kernel_traits.cuh"
#include "cuda/sm90.cuh"
#include "cuda/fa3/softmax.cuh"
#include "cuda/fa3/wgmma.cuh"

namespace runlm {
namespace fa3 {

using namespace sm90;

struct PipeState {
  int count = 0;  // K/V tiles handed through the ring so far
  template <int kStages>
  __device__ __forceinline__ int slot() const {
    return count % kStages;
  }
  template <int kStages>
  __device__ __forceinline__ uint32_t phase() const {
    return (count / kStages) & 1;
  }
};

// Producer (one thread): Q once per query block, then K and V tile by tile.
template <int D, int BN>
__device__ __forceinline__ void producer_load_block(uint32_t base, const void* tmQ, const void* tmK, const void* tmV,
                                                    const TileRange& r, int head, int kv_head, int q_iter,
                                                    PipeState& pipe) {
  using L = Layout<D, BN>;
  constexpr int kBlocks = D / 64;  // 64-element column blocks (one 128-byte swizzle row each)
  // The previous block's Q is free once every consumer has finished its last QK^T.
  mbar_wait(L::q_empty(base), (q_iter & 1) ^ 1);
  mbar_arrive_expect_tx(L::q_full(base), L::kQBytes);
#pragma unroll
  for (int c = 0; c < kBlocks; ++c)
    tma_load_3d(base + L::kQ + c * L::BM * 128, tmQ, L::q_full(base), c * 64, head, r.q_start + r.m0);
  for (int t = r.t_lo; t < r.t_hi; ++t, ++pipe.count) {
    const int s = pipe.slot<L::kStages>();
    const uint32_t ph = pipe.phase<L::kStages>();
    const int row = r.k_start + t * L::BN;
    mbar_wait(L::k_empty(base, s), ph ^ 1);
    mbar_arrive_expect_tx(L::k_full(base, s), L::kKVBytes);
#pragma unroll
    for (int c = 0; c < kBlocks; ++c)
      tma_load_3d(base + L::kK + s * L::kKVBytes + c * L::BN * 128, tmK, L::k_full(base, s), c * 64, kv_head, row);
    mbar_wait(L::v_empty(base, s), ph ^ 1);
    mbar_arrive_expect_tx(L::v_full(base, s), L::kKVBytes);
#pragma unroll
    for (int c = 0; c < kBlocks; ++c)
      tma_load_3d(base + L::kV + s * L::kKVBytes + c * L::BN * 128, tmV, L::v_full(base, s), c * 64, kv_head, row);
  }
}

// Producer for paged K/V: warp 0 of warpgroup 0, all 32 lanes. Q as above
// (lane 0). The K/V tensor maps span the whole pool (rows = slots, box rows
// box = a.box_rows). Box i of tile t holds keys n0 + i*box .. n0 + (i+1)*box - 1
// (n0 = t*BN); box divides both block_size and BN, so these keys lie in one
// page and box i's first row is the slot of key n0 + i*box, read from the
// block table. Lane i looks up and issues box i (BN/box <= 22 boxes), so the
// table reads of a tile overlap one another and the wait for the empty slot.
//
// Layout: box i lands at row i*box of each 64-column block. box >= 8 and
// the blocks are 1024-byte aligned, so every box starts on a 1024-byte
// boundary. The 128-byte swizzle permutes the 16-byte chunks of a 128-byte
// row by the row's index within its 8-row (1024-byte) atom, taken from the
// shared-memory address; a box of whole atoms starting on an atom boundary
// therefore writes exactly the bytes that one BN-row box would write there,
// and the consumers' wgmma descriptors read the tile unchanged.
//
// Boxes that start at or past the sequence's last key are not issued (their
// table entries may not exist); expect_tx announces exactly the bytes of the
// boxes that are. Their rows keep stale shared memory, and rows of the last
// page past the last key hold whatever the pool has there: the consumers mask
// those scores (K) and zero those rows (V, zero_v_tail). A box in a page
// released by the sliding window (entry -1, only before the block's first
// visible key) re-reads the tile's last box instead.
template <int D, int BN>
__device__ __forceinline__ void producer_load_block_paged(uint32_t base, const void* tmQ, const void* tmK,
                                                          const void* tmV, const Args& a, const TileRange& r,
                                                          int batch, int head, int q_iter, PipeState& pipe) {
  using L = Layout<D, BN>;
  constexpr int kBlocks = D / 64;
  static_assert(BN / 8 <= 32, "one lane per box of >= 8 rows");
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    mbar_wait(L::q_empty(base), (q_iter & 1) ^ 1);
    mbar_arrive_expect_tx(L::q_full(base), L::kQBytes);
#pragma unroll
    for (int c = 0; c < kBlocks; ++c)
      tma_load_3d(base + L::kQ + c * L::BM * 128, tmQ, L::q_full(base), c * 64, head, r.q_start + r.m0);
  }
  const int32_t* table = a.block_tables + int64_t(batch) * a.max_blocks_per_seq;
  const int kv_head = head / a.group;
  for (int t = r.t_lo; t < r.t_hi; ++t, ++pipe.count) {
    const int s = pipe.slot<L::kStages>();
    const uint32_t ph = pipe.phase<L::kStages>();
    const int box = a.box_rows;
    const int j = t * BN + lane * box;  // first key of this lane's box
    const bool mine = lane * box < BN && j < r.sk;
    int page = 0;
    if (mine) page = __ldg(table + (j >> a.log2_bs));
    int row = (page << a.log2_bs) | (j & ((1 << a.log2_bs) - 1));  // the pool slot of key j
    // The boxes that hold a key < sk (at least the first): one per issuing lane.
    const int n_boxes = __popc(__ballot_sync(0xffffffffu, mine));
    // A page released by the sliding window (-1) holds keys no query of the
    // block sees; its box loads the last box's page instead (finite data:
    // that box holds a visible key, so its page is not released), which the
    // mask then hides (K) and P = 0 multiplies (V).
    const int last_row = __shfl_sync(0xffffffffu, row, n_boxes - 1);
    if (page < 0) row = last_row;
    const uint32_t bytes = uint32_t(n_boxes * box) * 128u * kBlocks;
    const uint32_t dst = base + L::kK + s * L::kKVBytes + uint32_t(lane * box) * 128u;  // K; V is at + (kV - kK)
    mbar_wait(L::k_empty(base, s), ph ^ 1);
    if (lane == 0) mbar_arrive_expect_tx(L::k_full(base, s), bytes);
    __syncwarp();  // the transaction count is raised before any lane's box is issued
    if (mine) {
#pragma unroll
      for (int c = 0; c < kBlocks; ++c) tma_load_3d(dst + c * BN * 128, tmK, L::k_full(base, s), c * 64, kv_head, row);
    }
    mbar_wait(L::v_empty(base, s), ph ^ 1);
    if (lane == 0) mbar_arrive_expect_tx(L::v_full(base, s), bytes);
    __syncwarp();
    if (mine) {
#pragma unroll
      for (int c = 0; c < kBlocks; ++c)
        tma_load_3d(dst + (L::kV - L::kK) + c * BN * 128, tmV, L::v_full(base, s), c * 64, kv_head, row);
    }
  }
}

// Named barrier of the two consumer warpgroups in zero_v_tail (0 is
// __syncthreads).
constexpr int kZeroVBar = 3;

// Paged K/V only, before the last tile's P V: rows [valid, BN) of that V
// tile (valid = sk - n0, keys past the sequence's end) hold the tail of its
// last page (anything, NaN included) or stale shared memory (boxes not
// issued). P is exactly 0 there, but 0 * NaN = NaN in the GEMM, so the 256
// consumer threads zero those rows (all 16-byte chunks of each 128-byte row,
// so the swizzle does not matter), fence the writes for the async proxy
// (this GEMM's reads, the next TMA fill of the slot) and meet at a named
// barrier before either warpgroup issues the GEMM. Only the last tile of a
// block can reach past the sequence's end, and both warpgroups see the same
// valid (the range is per block), so both return or both reach the barrier.
template <int D, int BN>
__device__ __forceinline__ void zero_v_tail(uint32_t v_stage, int valid) {
  if (valid >= BN) return;
  constexpr int kChunksPerRow = D / 64 * 8;  // 16-byte chunks: 8 per 64-column block
  const int n = (BN - valid) * kChunksPerRow;
  for (int i = int(threadIdx.x) - 128; i < n; i += kConsumerThreads) {
    const int row = valid + i / kChunksPerRow, c = i % kChunksPerRow;
    st_shared_zero16(v_stage + (c / 8) * BN * 128 + row * 128 + (c % 8) * 16);
  }
  fence_proxy_async_shared();
  named_bar_sync(kZeroVBar, kConsumerThreads);
}

// Masks scores outside the causal diagonal, the window or the sequence.
// row0: this thread's first row within the sequence (second is row0 + 8).
template <int BN>
__device__ __forceinline__ void apply_mask(float (&s)[BN / 2], const Args& a, const TileRange& r, int n0, int row0,
                                           int t4) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int pos = row0 + 8 * hr + r.offset;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int j = n0 + 8 * nt + 2 * t4 + c;
        const bool vis = j < r.sk && (!a.causal || j <= pos) && (a.window_left < 0 || j >= pos - a.window_left);
        if (!vis) s[4 * nt + 2 * hr + c] = -INFINITY;
      }
  }
}

// One arrival per consumer warp (the barriers count warps, not threads).
__device__ __forceinline__ void consumer_release(uint32_t bar) {
  if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

template <int N>
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

// Consumer warpgroup wgc (0 or 1): 64 rows of the block. Accumulates the
// unnormalised O in o and the softmax state in sm.
//
// Intra-warpgroup overlap (FA3 section 3.2): tile t's S = Q K_t^T is issued
// together with tile t-1's O += P V_{t-1}; the softmax of S_t then runs on
// the CUDA cores while the tensor cores finish P V_{t-1}. P's registers are
// read by the asynchronous wgmma, so they are pinned (fence_regs_u32) until
// its wait.
//
// O is rescaled in FlashAttention-3's order (RescaleOBeforeGemm): by tile
// t-1's factor, after S_t's GEMM is issued and before P V_{t-1} is:
// O = corr_{t-1} * O + P_{t-1} V_{t-1}. At that point P V_{t-2} has retired
// (previous iteration's wait<0>) and P V_{t-1} is not issued, so no wgmma
// reads or writes O and the FMULs run while the tensor cores compute S_t
// (rescaling after P V_{t-1} completes would put them on the critical path
// between the GEMM's wait and the next issue). corr is carried to the next
// iteration (and to the loop's epilogue, which rescales before the last
// P V). The prologue's factor (exp2(-inf) = 0, never NaN) multiplies the
// all-zero O.
//
// Ping-pong between the consumer warpgroups (FA3 section 3.1) measured
// slower than intra-warpgroup overlap alone on H100 (d128 16k: 585 vs 623
// TFLOP/s non-causal; 2-6% at d128 8k-16k with this loop) and is not used.
template <typename T, int D, int BN, bool kPaged, bool kSoftcap>
__device__ __forceinline__ void consumer_mma_block(uint32_t base, const Args& a, const TileRange& r, int wgc, int q_iter,
                                                   PipeState& pipe, float (&o)[D / 2], OnlineSoftmax<BN>& sm) {
  using L = Layout<D, BN>;
  constexpr int BM = L::BM;
  constexpr bool kBf16 = ElemTraits<T>::kIsBf16;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int m0w = r.m0 + wgc * 64;        // this warpgroup's first row
  const int row0 = m0w + warp * 16 + g;   // this thread's first row (second: + 8)

  // Descriptors: Q (A, K-major) for this warpgroup's 64 rows; K (B, K-major);
  // V (B, N-major: LBO = bytes between 64-dim column blocks).
  const uint64_t dq = make_desc(base + L::kQ + wgc * 64 * 128, 16, 1024);
  float sacc[BN / 2];
  uint32_t p[BN / 16][4];

  auto issue_qk = [&](int s) {
    const uint64_t dk = make_desc(base + L::kK + s * L::kKVBytes, 16, 1024);
    // No zeroing: the first k-step overwrites (scale_d = 0).
    fence_regs(sacc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // k-step kk: column block kk/4, 32 bytes per 16 elements inside it.
      const uint32_t offq = ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4;
      const uint32_t offk = ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4;
      Wgmma<BN, kBf16>::ss(sacc, dq + offq, dk + offk, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {
    const uint64_t dv = make_desc(base + L::kV + s * L::kKVBytes, BN * 128, 1024);
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) Wgmma<D, kBf16>::rs(o, p[kk], dv + ((kk * 16 * 128) >> 4), 1);
    wgmma_commit();
  };
  // Mask (only tiles that straddle the sequence end, the diagonal or the
  // window edge for this warpgroup's rows), softmax; returns O's factors.
  auto softmax_tile = [&](int t, float (&corr)[2]) {
    // Soft-cap before the mask (tanh(-inf) would unmask a key): s * scale ->
    // cap * tanh(. / cap) -> * log2(e) as two multiplies around the tanh
    // (softcap_tanh, attn_softcap.cuh); a.scale_log2 is then 1.
    if constexpr (kSoftcap) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) sacc[i] = a.cap_out * softcap_tanh(sacc[i] * a.cap_in);
    }
    const int n0 = t * BN;
    const bool need_mask = n0 + BN > r.sk || (a.causal && n0 + BN - 1 > m0w + r.offset) ||
                           (a.window_left >= 0 && n0 < m0w + 63 + r.offset - a.window_left);
    if (need_mask) apply_mask<BN>(sacc, a, r, n0, row0, t4);
    sm.step(sacc, a.scale_log2, corr);
  };
  // The accumulator layout of two adjacent n8 column groups is the A
  // register layout of one k16 step of P V.
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      p[kk][0] = ElemTraits<T>::pack2(sacc[8 * kk + 0], sacc[8 * kk + 1]);
      p[kk][1] = ElemTraits<T>::pack2(sacc[8 * kk + 2], sacc[8 * kk + 3]);
      p[kk][2] = ElemTraits<T>::pack2(sacc[8 * kk + 4], sacc[8 * kk + 5]);
      p[kk][3] = ElemTraits<T>::pack2(sacc[8 * kk + 6], sacc[8 * kk + 7]);
    }
  };
  auto rescale_o = [&](const float (&corr)[2]) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[4 * dt + 0] *= corr[0];
      o[4 * dt + 1] *= corr[0];
      o[4 * dt + 2] *= corr[1];
      o[4 * dt + 3] *= corr[1];
    }
  };

  mbar_wait(L::q_full(base), q_iter & 1);

  // Prologue: S and P of the first tile (O is still zero: no rescale needed).
  int prev = pipe.slot<L::kStages>();
  uint32_t prev_ph = pipe.phase<L::kStages>();
  mbar_wait(L::k_full(base, prev), prev_ph);
  issue_qk(prev);
  wgmma_wait<0>();
  fence_regs(sacc);
  consumer_release(L::k_empty(base, prev));  // this thread's wgmma reads of K are done
  float corr[2];                             // the factor of the last softmax, not yet applied
  softmax_tile(r.t_lo, corr);
  pack_p();
  ++pipe.count;

  for (int t = r.t_lo + 1; t < r.t_hi; ++t, ++pipe.count) {
    const int s = pipe.slot<L::kStages>();
    const uint32_t ph = pipe.phase<L::kStages>();
    mbar_wait(L::k_full(base, s), ph);
    issue_qk(s);                           // S_t = Q K_t^T
    fence_regs(o);                         // the FMULs come after S_t's issue (they overlap it)...
    rescale_o(corr);                       // ...O by tile t-1's factor; no wgmma touches O now
    mbar_wait(L::v_full(base, prev), prev_ph);
    issue_pv(prev);                        // O += P_{t-1} V_{t-1} (its fence orders the FMULs first)
    wgmma_wait<1>();                       // groups retire in order: S_t is ready
    fence_regs(sacc);
    consumer_release(L::k_empty(base, s));
    softmax_tile(t, corr);                 // overlaps the P V GEMM
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs_u32(p);                     // P was read by that GEMM until here
    consumer_release(L::v_empty(base, prev));
    pack_p();
    prev = s;
    prev_ph = ph;
  }

  // Epilogue of the loop: the last tile's P V.
  rescale_o(corr);  // P V_{t_hi-2} has retired: O to the last tile's max
  mbar_wait(L::v_full(base, prev), prev_ph);
  if constexpr (kPaged) zero_v_tail<D, BN>(base + L::kV + prev * L::kKVBytes, r.sk - (r.t_hi - 1) * BN);
  issue_pv(prev);
  wgmma_wait<0>();
  fence_regs(o);
  fence_regs_u32(p);
  consumer_release(L::v_empty(base, prev));
  consumer_release(L::q_empty(base));  // done with this block's Q
}

}  // namespace fa3
}  // namespace runlm
