// A model's layer described as data: for every architecture runlm runs, the
// GGUF architecture name, which tensors a layer has (and which may be fused
// or absent), and the layer's structure (RoPE style and scaling, attention
// scale and soft-cap, post norms, FFN activation, embedding scale, sliding
// window pattern). The names and defaults are those of llama.cpp's
// src/llama-arch.cpp, src/llama-model.cpp and src/models/*.cpp, so a GGUF
// its converter wrote means the same thing here.
//
// One forward (src/cpu_engine.cpp) reads the resolved ModelConfig
// (models/llama_arch.h); a new family is a new row in models/arch_table.cpp plus
// whatever op it lacks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace runlm {

enum class Arch { Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Phi3, Qwen3Moe, GptOss };

// Which elements RoPE rotates together: "norm" adjacent pairs (x[2i],
// x[2i+1]), the GGUF llama layout; or NeoX halves (x[i], x[i + n_rot/2]),
// Hugging Face's rotate_half layout kept as is by llama.cpp's converter.
enum class RopeStyle { Adjacent, NeoX };
// The gated FFN's activation: silu(gate) * up, gelu_tanh(gate) * up, or
// gpt-oss's clamped SwiGLU (ggml's swiglu_oai: g = min(gate, 7), u =
// clamp(up, -7, 7), g * sigmoid(1.702 g) * (u + 1)).
enum class FfnActivation { SiLU, GeluTanh, SwigluOai };

// How a mixture-of-experts router turns its logits into expert weights
// (llama.cpp's llama_expert_gating_func_type): softmax over every expert,
// then the top k (Mixtral, Qwen3-MoE); or the top k logits, then a softmax
// over those k (gpt-oss, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT).
enum class MoeGating { SoftmaxThenTopK, TopKThenSoftmax };

// Which key sizes an expert's FFN: feed_forward_length (Mixtral, written as
// llama), or expert_feed_forward_length (qwen3moe: else feed_forward_length
// / expert_used_count, as llama.cpp falls back; gpt-oss).
enum class ExpertFfnKey { FeedForward, ExpertFeedForward };

// Every tensor role any architecture has. GGUF names (llama.cpp's
// LLM_TENSOR_NAMES) are in tensor_name() (models/llama_arch.h).
enum class TensorRole {
  TokenEmbd, OutputNorm, Output,
  AttnNorm, AttnQ, AttnK, AttnV, AttnOut, FfnNorm, FfnGate, FfnUp, FfnDown,
  AttnQkv,                            // fused q, k, v rows (phi3)
  AttnQBias, AttnKBias, AttnVBias,    // qwen2
  AttnQNorm, AttnKNorm,               // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
  AttnPostNorm, FfnPostNorm,          // RMSNorm of the block's output before the residual add (gemma2, gemma3)
  RopeFreqs,                          // per-pair frequency divisors (llama 3.1's "llama3" rope scaling)
  RopeFactorsLong, RopeFactorsShort,  // phi3 "longrope" divisors, chosen by the context size
  // Mixture of experts: the router [dim -> n_expert] and its bias (gpt-oss),
  // the experts' matrices stored 3-D as [n_expert] x [in -> out], and their
  // biases [n_expert] x [out] (gpt-oss).
  FfnGateInp, FfnGateInpBias, FfnGateExps, FfnUpExps, FfnDownExps,
  FfnGateExpsBias, FfnUpExpsBias, FfnDownExpsBias,
  AttnSinks,                          // per-head sink logit in the attention softmax (gpt-oss)
  AttnOutBias,                        // attn_output.bias (gpt-oss)
};

// A soft-cap, value = cap * tanh(value / cap), read from a GGUF key.
struct SoftcapRule {
  bool read_key = false;   // the architecture reads ARCH.<key>
  float default_cap = 0;   // when the key is absent; 0 = none
};

// RoPE of the sliding-window layers.
enum class LocalRope {
  Global,     // the same base and scale as every layer
  SwaKey,     // base from ARCH.rope.freq_base_swa (default: the global base), the global scale (gemma2)
  SwaKeyUnscaled,  // base from ARCH.rope.freq_base_swa (default 10000), no scaling (gemma3)
};

struct ArchDesc {
  Arch arch;
  const char* gguf_name;     // general.architecture
  const char* hf_class;      // transformers' class convert reads ("" = none)
  RopeStyle rope_style;
  FfnActivation ffn_act;
  bool qkv_bias;             // attn_q/k/v.bias read when present
  bool qk_norm;              // attn_q_norm and attn_k_norm required
  bool post_norms;           // post_attention_norm and post_ffw_norm required
  // llama.cpp's converter writes attn_qkv.weight in place of q, k, v
  // (phi3). A fused attn_qkv is read for every architecture, as llama.cpp's
  // create_tensor_qkv does.
  bool fused_qkv;
  bool fused_gate_up;        // ffn_up of 2 x feed_forward_length rows in place of ffn_gate + ffn_up
  bool output_tensor;        // output.weight read when present (false: logits always use token_embd)
  bool embd_scale_sqrt_dim;  // embeddings times sqrt(embedding_length)
  bool rope_freqs;           // rope_freqs.weight read when present
  bool longrope;             // rope.scaling.type longrope with rope_factors_long/short
  bool rope_dims_full;       // rope.dimension_count must equal the head size (llama.cpp's check for llama)
  SoftcapRule attn_softcap;  // ARCH.attn_logit_softcapping
  SoftcapRule final_softcap; // ARCH.final_logit_softcapping
  int64_t default_window;    // sliding window when the key is absent (gemma2: 4096), 0 = none
  int swa_pattern;           // default ARCH.attention.sliding_window_pattern (0: every layer slides)
  LocalRope local_rope;
  // llama.cpp's gemma attention scale: 1/sqrt(embedding_length / head_count)
  // for the model with this many layers (the 27B, whose query_pre_attn_scalar
  // is that), else 1/sqrt(head size). 0: always 1/sqrt(head size).
  int scale_by_dim_per_head_layers;
  // Mixture of experts (trailing, so the dense rows above leave them out).
  // moe: the layer's FFN is always a mixture of experts (qwen3moe, gpt-oss);
  // llama has one when expert_count > 0 (Mixtral).
  bool moe = false;
  MoeGating moe_gating = MoeGating::SoftmaxThenTopK;
  // The chosen experts' weights divided by their sum (llama.cpp's norm_w:
  // true for llama and qwen3moe, whose ARCH.expert_weights_norm may turn it
  // off; false for gpt-oss).
  bool moe_norm_weights = true;
  ExpertFfnKey expert_ffn_key = ExpertFfnKey::FeedForward;
  bool moe_biases = false;       // ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias required (gpt-oss)
  bool attn_sinks = false;       // attn_sinks.weight required (gpt-oss)
  bool attn_out_bias = false;    // attn_output.bias required (gpt-oss)
  // The FFN's input norm is post_attention_norm.weight in place of
  // ffn_norm.weight (gpt-oss: llama.cpp's converter maps HF's
  // post_attention_layernorm there).
  bool ffn_norm_post_attention = false;
};

// The row of an architecture, or nullptr for a name runlm does not run.
const ArchDesc* find_arch(const std::string& gguf_name);
const ArchDesc& arch_desc(Arch a);
// "llama, mistral, qwen2, ..." for error messages.
std::string supported_arch_names();
// The row whose transformers class is `hf_class`, or nullptr
// (MixtralForCausalLM, the llama row with experts, is not a row's class).
const ArchDesc* find_arch_by_hf_class(const std::string& hf_class);
// Every class `runlm convert` reads, MixtralForCausalLM included, for messages.
std::string supported_hf_classes();

}  // namespace runlm
