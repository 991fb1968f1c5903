// CPU reference for prefill attention: plain loops, float inputs, float64
// accumulation. Same semantics as src/attention.h (varlen, GQA/MQA,
// bottom-right causal, left window, scale, soft-cap, sinks, lse); the GPU backends are tested
// against it.
#pragma once

#include <cstdint>

namespace runlm {

struct AttnRefParams {
  const float* q = nullptr;             // [total_q, n_heads, head_dim]
  const float* k = nullptr;             // [total_k, n_kv_heads, head_dim]
  const float* v = nullptr;             // [total_k, n_kv_heads, head_dim]
  float* out = nullptr;                 // [total_q, n_heads, head_dim]
  float* lse = nullptr;                 // [n_heads, total_q], optional
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1] host
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1] host
  int batch = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  bool causal = false;
  int window_left = -1;
  float scale = 0.0f;
  float softcap = 0.0f;  // > 0: each scaled score becomes softcap * tanh(score / softcap) before the mask
  const float* sinks = nullptr;  // [n_heads] host, attention sink logits (src/attention.h); nullptr = none
};

// Whether query i of a sequence (seqlen_q queries, seqlen_k keys) sees key j.
// The one statement of the mask; the reference and the tests use it.
inline bool attn_key_visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k, bool causal,
                             int window_left) {
  const int64_t pos = seqlen_k - seqlen_q + i;  // absolute position of query i
  if (causal && j > pos) return false;
  if (window_left >= 0 && j < pos - window_left) return false;
  return true;
}

// Computes out (and lse if set) for every sequence. Throws Error on invalid
// parameters (non-monotonic cu_seqlens, n_heads % n_kv_heads != 0).
void attention_ref(const AttnRefParams& p);

// One row (flattened query index) of one head: the benchmark checks a
// sample of rows of large problems with this.
void attention_ref_row(const AttnRefParams& p, int64_t row, int head, float* out_row, float* lse_out);

}  // namespace runlm
