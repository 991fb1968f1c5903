// What every paged decode kernel shares (kernels/cuda/paged_attention.cu
// launches them): the launch constants, the sequence and CTA geometry
// (SeqRange, DecodeCta, DecodeRow: which keys and query rows a CTA owns,
// windows, -1 pages, NaN rows for broken lengths) and the cross-warp merge
// and store (merge_warps_and_store), so every kernel splits, masks and
// writes its rows the same way.
#pragma once

#include <cfloat>
#include <cstdint>

#include "cuda/attn_softcap.cuh"
#include "cuda/attn_state.h"
#include "cuda/common.cuh"
#include "cuda/kv_codec.cuh"
#include "paged_kv.h"

namespace runlm {
namespace paged {

constexpr int kThreads = 128;       // 4 warps per partition CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 8;         // query rows (tokens x heads of a group) per CTA
constexpr int kMinPartition = 256;   // smallest split: >= the largest page
constexpr int kLongPartition = 1024; // preferred split when it still fills the device (make_plan)
// The split never makes more than this many partitions per sequence over
// all (KV head, chunk) CTAs together; this bounds the workspace without
// knowing n_kv_heads (see parts_bound).
constexpr int kMaxSplitCtasPerBatch = 2048;
constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kMaxHeadDim = 256;


// ------------------------------------------------------------ soft-cap

// Attention logit soft-cap (Gemma 2) on a score the kernels hold in base 2:
// every kernel folds scale * log2(e) into q, so its score is x = s * scale *
// log2(e), and cap * tanh(s * scale / cap) * log2(e) = c * tanh(x / c) with c
// = cap * log2(e): the same order (scale, cap, then log2(e)) without
// unfolding the scale (softcap_apply, attn_softcap.cuh: its error, and why
// not tanhf). Applied before the mask: tanh(-inf) would turn a masked key
// into -c.
__device__ __forceinline__ float softcap_log2(float x, float c, float inv_c) { return softcap_apply(x, c, inv_c); }

// The two constants of softcap_log2 for PagedDecodeParams::softcap (> 0).
struct SoftcapLog2 {
  float c = 0.0f, inv_c = 0.0f;
  __device__ __forceinline__ explicit SoftcapLog2(float softcap) {
    if (softcap > 0.0f) {
      c = softcap * kLog2e;
      inv_c = 1.0f / c;
    }
  }
};

// ------------------------------------------------------------ sinks

// PagedDecodeParams::sinks join a row where its output is written, once:
// the no-split stores and the combine (split rows), never the partial
// states. A runtime switch rather than a template one: it runs after the
// main loop. merge_warps_and_store makes the sink the first state of its
// merge ((logit * log2 e, 1), no value: the merge takes it into the max and
// the denominator); the combine and rows8_store_warp join it to the final
// state with row_output. Each form was the one that kept the kernels'
// registers (ptxas -v, nvcc 13.0): all but one SIMT instance (+1, under
// its bound).

// One output element of a row from its final state (M, D, O) in base 2:
// O / D, with a sink joined to the state first (attn_state_add_sink).
__device__ __forceinline__ float row_output(const PagedDecodeParams& p, int head, float M, float D, float O) {
  if (!p.sinks) return O / D;  // D > 0: a valid row attends at least to its own position
  const float scale = attn_state_add_sink(M, D, p.sinks[head] * kLog2e);
  return O * scale / D;
}

// ------------------------------------------------------------ shared geometry

// What both kernels derive from a sequence's device-side lengths: the same
// function, so the partition kernel writes exactly the states the combine
// kernel reads.
struct SeqRange {
  int q0 = 0, n_q = 0, len = 0;
  int first = 0;    // first key any query of the sequence attends to
  int start = 0;    // first page-aligned position of the split grid
  int n_parts = 1;  // partitions with keys (1 when not split)
  bool ok = false;  // lengths within the host bounds
};

__device__ __forceinline__ SeqRange seq_range(const PagedDecodeParams& p, int s, int partition_size) {
  SeqRange r;
  r.q0 = p.cu_q[s];
  r.n_q = p.cu_q[s + 1] - r.q0;
  r.len = p.kv.seq_lens[s];
  r.ok = r.n_q >= 1 && r.n_q <= p.max_q_per_seq && r.q0 >= 0 && r.q0 + r.n_q <= p.total_q && r.len >= r.n_q &&
         r.len <= p.max_seq_len;
  if (!r.ok) return r;
  r.first = p.window > 0 ? max(0, r.len - r.n_q - p.window + 1) : 0;
  r.start = r.first & ~(p.kv.block_size - 1);  // whole pages before the window are skipped
  r.n_parts = partition_size > 0 ? (r.len - r.start + partition_size - 1) / partition_size : 1;
  return r;
}

// Writes NaN to every output row of a sequence whose lengths break the
// bounds, within [0, total_q) (the rows that exist). Done by one CTA.
__device__ inline void write_nan_rows(const PagedDecodeParams& p, int s) {
  const int q0 = p.cu_q[s], q1 = p.cu_q[s + 1];
  const int lo = max(q0, 0), hi = min(q1, p.total_q);
  const int64_t hd = p.kv.head_dim;
  for (int64_t i = int64_t(lo) * p.n_heads * hd + threadIdx.x; i < int64_t(hi) * p.n_heads * hd; i += blockDim.x)
    p.out[i] = NAN;
}

// ------------------------------------------------------------ CTA prologue

// What a partition CTA works on (every paged decode kernel has the same grid:
// x = partition * n_chunks + chunk, y = KV head, z = sequence).
struct DecodeCta {
  int chunk = 0, part = 0;  // R-row chunk of the sequence's rows, KV partition
  int kvh = 0, s = 0;       // KV head, sequence
  int warp = 0, lane = 0;   // this thread's
  int group = 1;            // query heads per KV head
  int rows = 0;             // the sequence's rows: tokens x heads of the group
  int k_begin = 0, k_end = 0;  // this CTA's keys: its partition, clipped to what its rows attend to
  SeqRange sr;
};

// Fills c for this CTA (R query rows a CTA); false when the CTA has nothing
// to do: a sequence whose lengths break the bounds (its NaN rows written
// here), an empty chunk or an empty partition. The caller returns then.
template <int R>
__device__ __forceinline__ bool decode_cta_begin(const PagedDecodeParams& p, int partition_size, int n_chunks,
                                                 DecodeCta& c) {
  c.chunk = blockIdx.x % n_chunks, c.part = blockIdx.x / n_chunks;
  c.kvh = blockIdx.y, c.s = blockIdx.z;
  c.warp = threadIdx.x >> 5, c.lane = threadIdx.x & 31;
  c.group = p.n_heads / p.kv.n_kv_heads;
  c.sr = seq_range(p, c.s, partition_size);
  if (!c.sr.ok) {
    if (partition_size == 0 && c.chunk == 0 && c.kvh == 0) write_nan_rows(p, c.s);  // split: the combine writes them
    return false;
  }
  c.rows = c.sr.n_q * c.group;
  if (c.chunk * R >= c.rows || c.part >= c.sr.n_parts) return false;
  c.k_begin = c.sr.first, c.k_end = c.sr.len;
  if (partition_size > 0) {
    c.k_begin = max(c.k_begin, c.sr.start + c.part * partition_size);
    c.k_end = min(c.k_end, c.sr.start + (c.part + 1) * partition_size);
  }
  return true;
}

// Query row rho = chunk * R + r of a CTA: token i = rho / group, head
// kvh * group + rho % group. Rows past the sequence's (padding of the last
// chunk) read token 0's q and mask every key.
struct DecodeRow {
  bool valid = false;
  int pos = -1;                // the token's position; -1: every key masked
  int lo = 0;                  // first key of its sliding window (0 without one)
  int key_lo = 0, key_hi = 0;  // its keys in this CTA: [key_lo, key_hi)
  const float* q = nullptr;    // its q row [HD]
};

template <int R, int HD>
__device__ __forceinline__ DecodeRow decode_row(const PagedDecodeParams& p, const DecodeCta& c, int r) {
  DecodeRow w;
  const int rho = c.chunk * R + r;
  w.valid = rho < c.rows;
  const int i = w.valid ? rho / c.group : 0;
  const int h = c.kvh * c.group + (w.valid ? rho % c.group : 0);
  w.pos = w.valid ? c.sr.len - c.sr.n_q + i : -1;
  w.lo = p.window > 0 ? max(0, w.pos - p.window + 1) : 0;
  w.key_lo = max(c.k_begin, w.lo), w.key_hi = min(c.k_end, w.pos + 1);
  w.q = p.q + (int64_t(c.sr.q0 + i) * p.n_heads + h) * HD;
  return w;
}

// ------------------------------------------------------------ CTA epilogue

// Merges the warps' states of the CTA's rows (in shared memory: s_o
// [kWarps][R][HD], s_m and s_d [kWarps][R]) and writes row by row either the
// output (no split) or the partition's state for the combine kernel (ws_o
// [total_q * n_heads][ws_parts][HD], ws_md [..][ws_parts][2]: m, d).
template <int R, int HD>
__device__ __forceinline__ void merge_warps_and_store(const PagedDecodeParams& p, const DecodeCta& c,
                                                      int partition_size, float* __restrict__ ws_o,
                                                      float* __restrict__ ws_md, int ws_parts, const float (*s_o)[R][HD],
                                                      const float (*s_m)[R], const float (*s_d)[R]) {
  __syncthreads();  // every warp's state is in shared memory before the cross-warp merge

  const int n_rows = min(R, c.rows - c.chunk * R);
  for (int idx = threadIdx.x; idx < n_rows * HD; idx += kThreads) {
    const int r = idx / HD, e = idx % HD;
    // Row r's global index, recomputed (a kernel's register arrays need a constant index).
    const int rho = c.chunk * R + r;
    float M = -INFINITY, D = 0.0f, O = 0.0f;
    if (p.sinks && partition_size == 0) {  // the sink as the first state (see row_output)
      M = p.sinks[c.kvh * c.group + rho % c.group] * kLog2e;
      D = 1.0f;
    }
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      float sa, sb;
      attn_state_merge(M, D, s_m[w][r], s_d[w][r], sa, sb);
      O = O * sa + s_o[w][r][e] * sb;
    }
    const int64_t rid = int64_t(c.sr.q0 + rho / c.group) * p.n_heads + c.kvh * c.group + rho % c.group;
    if (partition_size == 0) {
      p.out[rid * HD + e] = O / D;  // D > 0: a valid row attends at least to its own position
    } else {
      const int64_t at = rid * ws_parts + c.part;
      ws_o[at * HD + e] = O;
      if (e == 0) {
        ws_md[at * 2] = M;
        ws_md[at * 2 + 1] = D;
      }
    }
  }
}

using KernelFn = void (*)(const PagedDecodeParams, int, int, int, float*, float*, int);

}  // namespace paged
}  // namespace runlm
