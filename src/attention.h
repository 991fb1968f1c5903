// Prefill attention: the backend enum, one table row per backend, and
// attention_dispatch(), the only code that chooses and launches a backend.
// Every GPU caller (the forward pass, bench-attn, the tests) goes through it.
//
// Semantics shared by every backend and by the CPU reference
// (kernels/cpu/attention_ref.h):
//   - varlen batch: sequence b owns query rows cu_seqlens_q[b]..cu_seqlens_q[b+1]
//     and key rows cu_seqlens_k[b]..cu_seqlens_k[b+1].
//   - GQA/MQA: query head h reads kv head h / (n_heads / n_kv_heads).
//   - causal is bottom-right aligned: query i of a sequence sits at absolute
//     position p = seqlen_k - seqlen_q + i and sees keys at positions <= p, so
//     chunked prefill and later chat turns reuse the keys already cached.
//   - window_left = W >= 0 hides keys at positions < p - W (a window of N
//     tokens is window_left = N-1); -1 means no window.
//   - softcap = c > 0 (Gemma 2's attention logit soft-cap): each scaled score
//     s = scale * q.k becomes c * tanh(s / c) before the mask and the
//     softmax; 0 = none. Every backend takes it (AttnBackendInfo::softcap).
//   - sinks (gpt-oss's learned attention sinks; nullptr = none): one logit
//     s_h per query head that joins head h's softmax without a value,
//     unscaled and never soft-capped: p_j = exp(s_j - m) / (sum_k exp(s_k -
//     m) + exp(s_h - m)), m the max over the visible scores and s_h
//     (ggml_soft_max_ext with sinks). Every backend takes it
//     (AttnBackendInfo::sinks).
//   - a query row that sees no key at all gets out = 0 and lse = -inf (with
//     sinks: lse = s_h, the sink alone).
//   - lse (optional) is the natural-log sum of exp(s) per row over its visible
//     keys, s the (soft-capped) scaled score, and the sink's exp(s_h).
//
// Paged K/V (optional, block_tables != nullptr): k and v point to one layer's
// f16/bf16 pools of src/paged_kv.h instead of contiguous rows. The pools hold
// num_pages * block_size slots; slot s = page * block_size + offset is one row
// of [n_kv_heads, head_dim] elements, rows back to back. Sequence b's key j
// (0 <= j < its key count) lives at slot
//   block_tables[b * max_blocks_per_seq + j / block_size] * block_size + j % block_size
// cu_seqlens_k keeps its meaning (prefix sums of the key counts; total_k =
// cu_seqlens_k[batch]) but no longer addresses rows. Every mask rule above is
// unchanged. Table entries past a sequence's ceil(keys / block_size) pages
// are never read. An entry may be -1 for a page wholly before the window of
// the sequence's first query (the sliding window's released pages): no query
// sees its keys. Slots past the last key (the tail of the last page) may hold
// anything, NaN included: no backend lets them reach the output. Backends
// that cannot read a given paged layout (block_size) refuse it through
// attn_unsupported_reason, never by falling back to another path.
//
// Typed pools (paged only): k_type / v_type, when set to a type
// other than the dtype's, say that pool holds that KV type in src/paged_kv.h's
// layout (bf16 rows, or for q8_0 / q4_0 / fp8 a page's quants then its f16
// scales, one per 32 values). K and V are independent. Backends whose table
// row has kv_types (naive, fa2) read such pools in place and decode each value
// to the f16 the attention runs in (dtype f16 only), bit for bit the value
// gather_kv writes; the others refuse them (fa3: its TMA loads copy raw
// tiles into the wgmma layout), and the caller gathers to f16 first.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpu/kv_quant.h"
#include "dtype.h"

namespace runlm {

enum class AttnBackend { Naive, Fa2, Fa3, Auto };

struct AttnParams {
  const void* q = nullptr;      // [total_q, n_heads, head_dim]     bf16 or f16, contiguous, device
  const void* k = nullptr;      // [total_k, n_kv_heads, head_dim]  same dtype (paged: [num_pages * block_size, ...])
  const void* v = nullptr;      // [total_k, n_kv_heads, head_dim]  same dtype (paged: [num_pages * block_size, ...])
  void* out = nullptr;          // [total_q, n_heads, head_dim]     same dtype
  float* lse = nullptr;         // [n_heads, total_q] f32, optional (nullptr = not written)
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1] device, prefix sums of query lengths
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1] device, prefix sums of key lengths
  int batch = 0;
  int total_q = 0;              // cu_seqlens_q[batch]
  int total_k = 0;              // cu_seqlens_k[batch]
  int max_seqlen_q = 0;         // upper bound on any sequence's query length
  int max_seqlen_k = 0;         // upper bound on any sequence's key length
  int n_heads = 0;
  int n_kv_heads = 0;           // n_heads % n_kv_heads == 0
  int head_dim = 0;
  DType dtype = DType::BF16;    // BF16 or F16
  bool causal = false;
  int window_left = -1;         // -1 = no window
  float scale = 0.0f;           // softmax scale, usually 1/sqrt(head_dim)
  float softcap = 0;            // attention logit soft-cap c: s -> c * tanh(s / c); 0 = none
  void* stream = nullptr;       // cudaStream_t
  const float* sinks = nullptr; // [n_heads] f32 device, attention sink logits (see above); nullptr = none
  // Paged K/V (see the top of this file); block_tables == nullptr: contiguous.
  const int32_t* block_tables = nullptr;  // [batch, max_blocks_per_seq] page indices, device
  int max_blocks_per_seq = 0;   // row stride of block_tables
  int block_size = 0;           // keys per page
  int num_pages = 0;            // pages in each pool: k and v hold num_pages * block_size slots
  // Typed pools (paged only; see the top of this file): unset = the dtype.
  std::optional<KvType> k_type = std::nullopt, v_type = std::nullopt;
};

// The KV type of K (v = false) or V (v = true): k_type / v_type, or the
// dtype's own (f16 or bf16) when unset.
KvType attn_kv_type(const AttnParams& p, bool v);
// True when K or V is a typed pool (a type other than the dtype's).
bool attn_kv_typed(const AttnParams& p);

using AttnLaunchFn = void (*)(const AttnParams&);

struct AttnBackendInfo {
  AttnBackend backend;
  const char* name;              // as --attn spells it
  std::vector<int> head_dims;    // empty = any head_dim in 1..max_head_dim
  int max_head_dim;
  bool bf16, fp16;
  bool causal, window;
  bool softcap;                  // takes AttnParams::softcap > 0
  int min_sm;                    // compute capability * 10, e.g. 80, 90
  int max_sm;                    // highest compute capability it runs on (sm_90a code runs on 9.0 only)
  AttnLaunchFn launch;           // nullptr when built without CUDA
  std::vector<int> block_sizes;  // paged K/V: the block_size values it reads; empty = any >= 1
  bool kv_types;                 // reads typed pools (bf16, q8_0, q4_0, fp8 K/V with dtype f16) in place
  bool sinks;                    // takes AttnParams::sinks
};

// The table, one row per concrete backend (Auto excluded), fastest last.
const std::vector<AttnBackendInfo>& attn_backends();
const AttnBackendInfo& attn_backend_info(AttnBackend b);

// "naive" | "fa2" | "fa3" | "auto"; throws Error listing the accepted names.
AttnBackend attn_backend_from_name(const std::string& name);
const char* attn_backend_name(AttnBackend b);

// Empty when backend b can run p on a device of compute capability sm;
// otherwise why not, in the form
// "fa3: head_dim=96 unsupported; supported: head_dim {64,128,256}".
std::string attn_unsupported_reason(AttnBackend b, const AttnParams& p, int sm);

// The concrete backend that Auto (or b itself) resolves to for p on the
// current device; throws Error when none can run it.
AttnBackend attn_resolve(AttnBackend b, const AttnParams& p);

// Validates p, resolves the backend (Auto logs its choice once on stderr) and
// launches it on p.stream. Throws Error for invalid parameters, an unsupported
// combination (never a silent fallback) or a build without CUDA.
void attention_dispatch(AttnBackend b, const AttnParams& p);

}  // namespace runlm
