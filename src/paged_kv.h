// The paged KV layout shared by the CPU and GPU backends (FlashInfer's
// paged_kv_t idea): one pool of fixed-size pages per layer, and per sequence
// a block table of page indices. Page p holds positions
// [j * block_size, (j + 1) * block_size) of a sequence whose table has p at
// index j. Within a page the layout is NHD:
//   pool[page][offset][kv_head][head_dim]
// so a "slot" (page * block_size + offset) is one row of n_kv_heads *
// head_dim elements, and a contiguous cache is the special case of one
// sequence whose table is 0, 1, 2, ...
#pragma once

#include <cstdint>

#include "dtype.h"

namespace runlm {

struct PagedKvView {
  const void* k_pool = nullptr;         // [n_pages, block_size, n_kv_heads, head_dim] of one layer
  const void* v_pool = nullptr;         // same
  DType kv_type = DType::F16;           // element type of the pools
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks_per_seq] page indices
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;    // [n_seqs] keys per sequence (new tokens included)
  int block_size = 16;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// Decode attention over a paged cache: each sequence s has n_q(s) query
// tokens (1 for plain decode, a few for chunked-prefill tails or speculative
// decoding), the last n_q(s) of its seq_lens[s] positions; query i of s sits
// at position seq_lens[s] - n_q(s) + i and attends causally to keys at
// positions [max(0, p - window + 1) (window > 0) or 0, p].
struct PagedDecodeParams {
  const float* q = nullptr;          // [total_q, n_heads, head_dim] f32, rotated
  float* out = nullptr;              // [total_q, n_heads, head_dim] f32
  const int32_t* cu_q = nullptr;     // [n_seqs + 1] prefix sums of query tokens per sequence
  int n_seqs = 0;
  int total_q = 0;
  int max_q_per_seq = 1;             // upper bound on n_q(s)
  int max_seq_len = 0;               // upper bound on seq_lens (sizes the split grid)
  int n_heads = 0;
  int window = 0;                    // 0 = full attention
  float scale = 0;
  PagedKvView kv;
};

}  // namespace runlm
