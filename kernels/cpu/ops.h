// CPU reference ops for the transformer forward pass: plain loops in fp32
// (accumulation in fp32 or wider). The GPU kernels are tested against these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"
#include "kv_quant.h"

namespace runlm {

class ThreadPool;

// y = x * w / sqrt(mean(x^2) + eps), over n elements.
void rmsnorm(float* y, const float* x, const float* w, int64_t n, float eps);

// A weight matrix in any decodable type: rows rows of cols elements each
// (GGUF ne0 = cols, ne1 = rows), row r at data + r * row_bytes.
struct QMatrix {
  DType type;
  const uint8_t* data;
  size_t row_bytes;
  int64_t cols;
  int64_t rows;
};

// Y[t, r] = dot(W[r, :], X[t, :]) for t < n_tokens, with X [n_tokens, cols]
// and Y [n_tokens, rows]. Each weight row is decoded once per call and reused
// for all tokens; rows are split across the pool's threads.
void matmul(const QMatrix& w, const float* x, float* y, int64_t n_tokens, ThreadPool& pool);

// Decodes row r of w (an embedding lookup).
void get_row(const QMatrix& w, int64_t r, float* out);

// Rotary embedding on adjacent pairs (x[2i], x[2i+1]) of each head, as
// llama2.c and GGUF's llama architecture define it: the angle of pair i is
// pos * freq_scale * theta^(-2i/head_dim).
void rope(float* x, int n_heads, int head_dim, int pos, float theta, float freq_scale);

// The general rotary embedding of models/arch.h, as ggml_rope_ext computes
// it: pair i of the first n_rot dimensions of each head turns by
// pos * freq_scale * theta^(-2i/n_rot) / factors[i] (factors nullptr: 1),
// cos and sin multiplied by attn_factor. Pairs are adjacent (x[2i], x[2i+1])
// or NeoX halves (x[i], x[i + n_rot/2]); dimensions past n_rot are kept.
// With ext_factor != 0 (YaRN), ggml's rope_yarn: the angle blends the
// interpolated (times freq_scale) and extrapolated (unscaled) ones by
// ramp(i) * ext_factor, ramp(i) = 1 - clamp((i - corr_lo) / max(0.001,
// corr_hi - corr_lo), 0, 1), and cos and sin are further multiplied by
// 1 + 0.1 ln(1 / freq_scale).
struct RopeSpec {
  bool neox = false;
  int n_rot = 0;
  float theta = 10000.0f;
  float freq_scale = 1.0f;
  const float* factors = nullptr;  // [n_rot / 2]
  float attn_factor = 1.0f;
  float ext_factor = 0.0f;         // YaRN: 1; 0 = none
  float corr_dims[2] = {0, 0};     // YaRN correction dimensions (rope_yarn_corr_dims)
};
void rope_ext(float* x, int n_heads, int head_dim, int pos, const RopeSpec& spec);

// ggml_rope_yarn_corr_dims: the first and last pair index the YaRN ramp
// spans, floor and ceil of n_rot * ln(orig_ctx / (beta * 2 pi)) / (2 ln
// base) for beta_fast and beta_slow, clamped to [0, n_rot - 1]; in float as ggml.
void rope_yarn_corr_dims(int n_rot, int orig_ctx, float theta, float beta_fast, float beta_slow, float dims[2]);

// value = cap * tanh(value / cap) for n values (the Gemma soft-cap).
void softcap(float* x, int64_t n, float cap);

// In place, numerically stable (max subtracted).
void softmax(float* x, int64_t n);

// gate = silu(gate) * up.
void swiglu(float* gate, const float* up, int64_t n);
// gate = gelu(gate) * up with the tanh approximation (gelu_pytorch_tanh).
void geglu(float* gate, const float* up, int64_t n);
// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): g = min(gate, limit), u =
// clamp(up, -limit, limit), gate = g * sigmoid(alpha g) * (u + 1).
void swiglu_oai(float* gate, const float* up, int64_t n, float alpha = 1.702f, float limit = 7.0f);

// softmax with a sink: x[i] = exp(x[i] - m) / (sum_j exp(x[j] - m) + exp(sink
// - m)), m the max over x and the sink (ggml_soft_max_ext with sinks): the
// sink takes a share of the probability and is then dropped.
void softmax_with_sink(float* x, int64_t n, float sink);

// One layer of a KV cache on the CPU: rows ("slots") of n_kv_heads *
// head_dim elements, K and V each encoded in its own KvType
// (kernels/cpu/kv_quant.h). Position t of a sequence lives in slot t, or,
// with a block table (src/paged_kv.h), in slot table[t / block_size] *
// block_size + t % block_size.
struct KvLayerView {
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  KvType type_k = KvType::F32;
  KvType type_v = KvType::F32;
  size_t row_bytes_k = 0;
  size_t row_bytes_v = 0;
  const int32_t* block_table = nullptr;  // nullptr: slot = position
  int block_size = 0;
};

// Attention of one query token at position `pos` over keys/values at
// positions [first, pos], first = pos - window + 1 with a window (> 0), else
// 0. q and out are [n_heads * head_dim]. Each K and V row is decoded once and
// used by every head. scratch holds n_heads * (pos + 1) + 2 * n_kv_heads *
// head_dim floats. softcap > 0 caps each scaled score at softcap *
// tanh(score / softcap) before the softmax (Gemma 2). sinks (nullptr: none)
// holds one logit per head that joins that head's softmax (gpt-oss).
void attention_one_token(float* out, const float* q, const KvLayerView& kv, int pos, int n_heads, int n_kv_heads,
                         int head_dim, int window, float scale, float* scratch, float softcap = 0.0f,
                         const float* sinks = nullptr);

// Vectorisable f32 dot product (8 partial sums). matmul uses it for every
// token count, so a token's result does not depend on what it is batched with.
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace runlm

namespace runlm {
struct PagedKvView;
struct PagedDecodeParams;
// CPU reference of paged decode attention (src/paged_kv.h) over pools of
// any KV type (K and V each its own; quantized pools in the page layout of
// src/paged_kv.h, decoded by kernels/cpu/kv_quant), plain loops with fp32
// accumulation; p.softcap > 0 caps each scaled score and p.sinks (host)
// joins each head's softmax as attention_one_token does.
void paged_decode_attention_ref(const PagedDecodeParams& p);
}  // namespace runlm
