// Hugging Face config.json of the checkpoints runlm converts (the classes of
// models/arch.h: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
// Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM,
// the mixtures of experts Qwen3MoeForCausalLM and GptOssForCausalLM,
// MixtralForCausalLM, a Llama with experts, and the text model of
// Gemma3ForConditionalGeneration), in both the older form
// (top-level rope_theta and rope_scaling) and the newer one
// (rope_parameters). Anything runlm cannot run the same way (other
// architectures, a rope scaling the family does not have, unexpected biases,
// other activations, quantized checkpoints, dense layers among expert ones)
// is an Error naming it rather than a silent mismatch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arch.h"

namespace runlm {

struct HfConfig {
  std::string architecture;  // the accepted entry of "architectures"
  std::string model_type;    // "llama", "mistral"...
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;       // transformers' LlamaConfig default
  double rope_theta = 10000.0;
  Arch arch = Arch::Llama;          // the architecture row of `architecture`
  std::string rope_scaling_type;    // "" (none), "linear", "llama3", "longrope" or "yarn"
  double rope_scaling_factor = 1.0;
  int64_t rope_scaling_original_context = 0;  // 0 when the config does not say
  double llama3_low_freq_factor = 1.0, llama3_high_freq_factor = 4.0;  // rope_type "llama3"
  std::vector<float> longrope_long, longrope_short;                     // rope_type "longrope" (phi3)
  double partial_rotary_factor = 1.0;  // phi3: the rotated fraction of each head
  std::optional<double> rope_local_theta;  // gemma3: rope_local_base_freq (sliding layers)
  std::optional<double> attn_softcap, final_softcap;  // gemma
  std::optional<double> query_pre_attn_scalar;        // gemma
  std::optional<int64_t> sliding_window;       // Mistral; absent or null = full attention
  // layer_types (transformers' per-layer attention kinds): 1 a
  // "sliding_attention" layer, 0 a "full_attention" one; empty when absent.
  std::vector<uint8_t> swa_layers;
  bool tie_word_embeddings = false;
  std::string torch_dtype;          // "bfloat16", "float16", "float32" or ""

  // Mixture of experts (n_expert > 0): num_local_experts (or num_experts),
  // num_experts_per_tok, each expert's hidden size (Mixtral and gpt-oss:
  // intermediate_size; Qwen3-MoE: moe_intermediate_size), and Qwen3-MoE's
  // norm_topk_prob (transformers' default: false).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t expert_intermediate_size = 0;
  std::optional<bool> norm_topk_prob;
  // gpt-oss as released: its experts in MXFP4 (quantization_config
  // quant_method "mxfp4"; *_blocks and *_scales tensors), the rest unquantized.
  bool mxfp4_experts = false;
  // Gemma3ForConditionalGeneration: the text model of a multimodal
  // checkpoint (text_config; tensors under language_model.), the vision
  // tower left out.
  bool text_of_multimodal = false;
  // YaRN (rope_scaling_type "yarn", gpt-oss): rope_scaling_factor and
  // rope_scaling_original_context above, plus these. truncate false is
  // transformers' unrounded correction range, which llama.cpp's GGUF cannot say.
  double yarn_beta_fast = 32.0, yarn_beta_slow = 1.0;
  bool yarn_truncate = true;
};

// Parses config.json text; `source` names it in errors.
HfConfig parse_hf_config(const std::string& json_text, const std::string& source);
// Reads and parses the file at `path`.
HfConfig read_hf_config(const std::string& path);

}  // namespace runlm
