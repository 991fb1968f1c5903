// The paged KV layout shared by the CPU and GPU backends (FlashInfer's
// paged_kv_t idea): one pool of fixed-size pages per layer, and per sequence
// a block table of page indices. Page p holds positions
// [j * block_size, (j + 1) * block_size) of a sequence whose table has p at
// index j. Within a page the layout is NHD:
//   pool[page][offset][kv_head][head_dim]
// so a "slot" (page * block_size + offset) is one row of n_kv_heads *
// head_dim elements, and a contiguous cache is the special case of one
// sequence whose table is 0, 1, 2, ...
//
// Quantized pools (KV types q8_0, q4_0, fp8; a scale per block of L values
// along head_dim, L = kv_quant_block_len(head_dim): 32, or 16 / 8 for head_dims
// that are not a multiple of 32) keep NHD for the quants and put the
// scales at the end of each page, so every quant row stays 16-byte aligned for
// wide loads (the GPU takes L = 32 only):
//   page = quants [block_size][n_kv_heads][head_dim * bits / 8]
//          scales [block_size][n_kv_heads][head_dim / L] f16
// The bytes are those of kernels/cpu/kv_quant's encoding, de-interleaved: a
// slot's quant row is its CPU row's blocks' quants in order, its scale row
// the blocks' scales in order (kv_pool_write_row / kv_pool_read_row).
// Plain types (f32, f16, bf16) have no scale part: slot s is at s * row bytes.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/kv_quant.h"
#include "dtype.h"

#ifdef __CUDACC__
#define RUNLM_HOST_DEVICE __host__ __device__
#else
#define RUNLM_HOST_DEVICE
#endif

namespace runlm {

// Where a slot's bytes live in a pool of one KV type (see above).
struct KvPoolLayout {
  int64_t q_row = 0;     // quant (or element) bytes of one slot
  int64_t s_row = 0;     // scale bytes of one slot (0 for plain types)
  int64_t page = 0;      // bytes of one page: block_size * (q_row + s_row)
  int block_size = 1;

  RUNLM_HOST_DEVICE int64_t quant_offset(int64_t slot) const {
    return (slot / block_size) * page + (slot % block_size) * q_row;
  }
  RUNLM_HOST_DEVICE int64_t scale_offset(int64_t slot) const {
    return (slot / block_size) * page + block_size * q_row + (slot % block_size) * s_row;
  }
};

RUNLM_HOST_DEVICE inline bool kv_type_quantized(KvType t) { return t == KvType::Q8_0 || t == KvType::Q4_0 || t == KvType::FP8; }
// The types the GPU kernels store and read (f32 is the CPU's only;
// check_kv_types in src/kv_types.h says which combinations an engine takes).
RUNLM_HOST_DEVICE inline bool kv_type_on_gpu(KvType t) {
  return t == KvType::F16 || t == KvType::BF16 || kv_type_quantized(t);
}

// Quant bytes per value: q8_0 / fp8 one byte, q4_0 half a byte; plain types
// their element size. One f16 scale per block of kv_quant_block_len(head_dim)
// values (host code checks head_dim with kv_block_len before it gets here).
// Device code sees quantized pools only at head_dim % 32 == 0 (the GPU engine
// and the kernels' launchers refuse others), so it keeps the constant 32 and
// the kernels that compute a layout stay as they were.
RUNLM_HOST_DEVICE inline KvPoolLayout kv_pool_layout(KvType t, int block_size, int n_kv_heads, int head_dim) {
  KvPoolLayout l;
  const int64_t n = int64_t(n_kv_heads) * head_dim;
#ifdef __CUDA_ARCH__
  constexpr int kBlock = 32;
#else
  const int kBlock = kv_type_quantized(t) ? kv_quant_block_len(head_dim) : 1;
#endif
  l.block_size = block_size;
  switch (t) {
    case KvType::F32: l.q_row = 4 * n; break;
    case KvType::F16:
    case KvType::BF16: l.q_row = 2 * n; break;
    case KvType::Q8_0:
    case KvType::FP8: l.q_row = n; l.s_row = n / kBlock * 2; break;
    case KvType::Q4_0: l.q_row = n / 2; l.s_row = n / kBlock * 2; break;
  }
  l.page = int64_t(block_size) * (l.q_row + l.s_row);
  return l;
}

// Copies one slot's row between kernels/cpu/kv_quant's encoding (kv_row_bytes
// of n_kv_heads * head_dim elements; for the quantized types blocks of an f16
// scale then the quants, l's block length) and its place in a pool of layout l.
inline void kv_pool_write_row(KvType t, const KvPoolLayout& l, void* pool, int64_t slot, const void* row) {
  uint8_t* q = static_cast<uint8_t*>(pool) + l.quant_offset(slot);
  const uint8_t* src = static_cast<const uint8_t*>(row);
  if (!kv_type_quantized(t)) {
    std::memcpy(q, src, size_t(l.q_row));
    return;
  }
  uint8_t* s = static_cast<uint8_t*>(pool) + l.scale_offset(slot);
  const int64_t nb = l.s_row / 2, qb = l.q_row / nb;  // blocks, quant bytes per block
  for (int64_t b = 0; b < nb; ++b, src += 2 + qb) {
    std::memcpy(s + 2 * b, src, 2);
    std::memcpy(q + qb * b, src + 2, size_t(qb));
  }
}

inline void kv_pool_read_row(KvType t, const KvPoolLayout& l, const void* pool, int64_t slot, void* row) {
  const uint8_t* q = static_cast<const uint8_t*>(pool) + l.quant_offset(slot);
  uint8_t* dst = static_cast<uint8_t*>(row);
  if (!kv_type_quantized(t)) {
    std::memcpy(dst, q, size_t(l.q_row));
    return;
  }
  const uint8_t* s = static_cast<const uint8_t*>(pool) + l.scale_offset(slot);
  const int64_t nb = l.s_row / 2, qb = l.q_row / nb;
  for (int64_t b = 0; b < nb; ++b, dst += 2 + qb) {
    std::memcpy(dst, s + 2 * b, 2);
    std::memcpy(dst + 2, q + qb * b, size_t(qb));
  }
}

struct PagedKvView {
  const void* k_pool = nullptr;         // [n_pages, block_size, n_kv_heads, head_dim] of one layer (+ scales)
  const void* v_pool = nullptr;         // same
  KvType k_type = KvType::F16;          // element type of k_pool (layout: kv_pool_layout)
  KvType v_type = KvType::F16;          // element type of v_pool
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
// positions [max(0, p - window + 1) (window > 0) or 0, p]. softcap > 0 caps
// each scaled score s at softcap * tanh(s / softcap) before the mask and the
// softmax (Gemma 2's attention logit soft-cap); 0 = none. sinks (gpt-oss;
// nullptr = none): head h's sink logit joins its softmax without a value,
// unscaled and uncapped (src/attention.h).
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
  float softcap = 0;                 // 0 = none
  const float* sinks = nullptr;      // [n_heads] attention sink logits; nullptr = none
  PagedKvView kv;
};

}  // namespace runlm
