// A model's hyperparameters and layer structure, read from a GGUF through
// its architecture's description (models/arch.h): the keys, the tensor-name
// table, and ModelConfig, the resolved description the forward passes read.
// Llama 1/2/3, TinyLlama, Mistral, Qwen2, Qwen3, Gemma 2/3 and Phi-3 all run
// the one graph this describes.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "arch.h"

namespace runlm {

class GgufFile;

const char* arch_name(Arch a);

// Per-pair RoPE frequency divisors a model carries as tensors.
enum class RopeFactors { None, Freqs, LongShort };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string name;       // general.name, for display
  int n_vocab = 0;
  int dim = 0;            // embedding_length
  int hidden_dim = 0;     // feed_forward_length
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;       // dim / n_heads unless the file says otherwise
  int ctx_train = 0;      // context_length
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  float rope_freq_scale = 1.0f;  // linear rope scaling: position * freq_scale
  int sliding_window = 0;        // 0 = full attention
  // Which layers the window applies to, one flag a layer (1 = sliding, 0 =
  // full attention), for models that alternate local and global layers
  // (llama.attention.sliding_window_pattern); empty = every layer.
  std::vector<uint8_t> swa_layers;
  bool tied_embeddings = false;  // output.weight absent: logits use token_embd

  // The layer's structure (models/arch.h), resolved from the architecture's
  // description and the file. The defaults are the Llama graph.
  RopeStyle rope_style = RopeStyle::Adjacent;
  int n_rot = 0;                       // rotated dimensions of each head (rope.dimension_count)
  float rope_theta_local = 10000.0f;   // base and scale of the sliding-window layers,
  float rope_freq_scale_local = 1.0f;  // used when local_rope
  bool local_rope = false;
  RopeFactors rope_factors = RopeFactors::None;
  float rope_attn_factor = 1.0f;       // cos and sin times this (longrope's rope.scaling.attn_factor)
  int rope_orig_ctx = 0;               // longrope: a context above this uses the long factors
  FfnActivation ffn_act = FfnActivation::SiLU;
  bool fused_qkv = false;              // attn_qkv.weight: q, k, v rows in one matrix
  bool qkv_bias = false;               // attn_q/k/v.bias
  bool qk_norm = false;                // attn_q_norm, attn_k_norm: RMSNorm of each head before RoPE
  bool post_norms = false;             // post_attention_norm, post_ffw_norm
  bool fused_gate_up = false;          // ffn_up holds the gate rows then the up rows
  float embd_scale = 1.0f;             // embeddings are multiplied by this (gemma: sqrt(dim))
  float kq_scale = 0.0f;               // q.k multiplier where the architecture sets one; 0: 1/sqrt(head_dim)
  float attn_softcap = 0.0f;           // attention logits cap * tanh(s / cap); 0 = none
  float final_softcap = 0.0f;          // output logits likewise

  // YaRN RoPE (rope.scaling.type yarn), as ggml_rope_ext computes it with
  // llama.cpp's context parameters: ext_factor 1, the correction dimensions
  // from rope_orig_ctx and beta fast/slow, rope_attn_factor as llama.cpp
  // sets yarn_attn_factor.
  bool rope_yarn = false;
  float rope_yarn_beta_fast = 32.0f;
  float rope_yarn_beta_slow = 1.0f;

  // Mixture of experts (n_expert > 0): the FFN is a router ffn_gate_inp and
  // n_expert gated FFNs of expert_hidden_dim; each token runs the
  // n_expert_used best and sums their outputs times the gating weights.
  int n_expert = 0;
  int n_expert_used = 0;
  int expert_hidden_dim = 0;
  MoeGating moe_gating = MoeGating::SoftmaxThenTopK;
  bool moe_norm_weights = false;       // the chosen weights divided by their sum
  float moe_weights_scale = 1.0f;      // then multiplied by this (ARCH.expert_weights_scale)
  bool moe_biases = false;             // router and expert biases (gpt-oss)
  bool attn_sinks = false;             // attn_sinks.weight: one extra logit per head in the softmax
  bool attn_out_bias = false;          // attn_output.bias
  bool ffn_norm_post_attention = false;  // the FFN norm is post_attention_norm.weight (gpt-oss)
  bool moe() const { return n_expert > 0; }

  // Whether anything differs from the plain Llama layer: the names of the
  // parts that do, empty if none (what each engine lacks of them:
  // src/engine_support.h).
  std::vector<std::string> features_beyond_llama() const;

  bool layer_uses_window(int layer) const { return swa_layers.empty() || swa_layers[size_t(layer)] != 0; }
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // The softmax scale of attention (kq_scale, else 1 / sqrt(head_dim)): every engine's.
  float attn_scale() const { return kq_scale != 0.0f ? kq_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

// Reads and validates the hyperparameters; an unknown architecture or a
// missing key is an Error naming it and the file.
ModelConfig read_model_config(const GgufFile& gguf);

// GGUF name of a tensor: "token_embd.weight", "blk.3.attn_q.weight"...
std::string tensor_name(TensorRole role, int layer = -1);

}  // namespace runlm
