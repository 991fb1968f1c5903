// What every runlm tool that writes a model GGUF shares (convert, quantize,
// make_random_model): the hyperparameter keys, the tokenizer.ggml.* keys
// taken from a sentencepiece tokenizer.model, the list of tensors with their
// shapes, the general.file_type codes, and the stderr progress line. The
// conventions are llama.cpp's, so its tools read our files and ours read its.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtype.h"
#include "llama_arch.h"

namespace runlm {

class GgufWriter;

struct LlamaHParams {
  std::string name;              // general.name
  int64_t context_length = 0;
  int64_t dim = 0;               // embedding_length
  int64_t hidden_dim = 0;        // feed_forward_length
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;          // rope.dimension_count
  int64_t vocab_size = 0;
  float rms_eps = 1e-5f;
  float rope_theta = 10000.0f;
  std::string rope_scaling_type;  // "" or "linear"
  float rope_scaling_factor = 1.0f;
  int64_t rope_scaling_original_context = 0;  // 0: not written
  std::optional<int64_t> sliding_window;      // Mistral
  std::vector<uint8_t> swa_layers;            // per layer 1 = sliding, 0 = full; empty = every layer
  bool tied_embeddings = false;               // no output.weight: logits use token_embd

  // The architecture and its layer's parts (models/arch.h); the defaults are
  // the Llama layer. Mistral is written as "llama", as llama.cpp does.
  Arch arch = Arch::Llama;
  int64_t n_rot = 0;             // rope.dimension_count; 0: head_dim
  bool qkv_bias = false;         // attn_q/k/v.bias
  bool qk_norm = false;          // attn_q_norm, attn_k_norm
  bool post_norms = false;       // post_attention_norm, post_ffw_norm
  bool fused_qkv = false;        // attn_qkv in place of attn_q/k/v
  bool fused_gate_up = false;    // ffn_up of 2 x hidden rows in place of ffn_gate + ffn_up
  std::vector<float> rope_freqs;              // llama3 RoPE scaling: rope_freqs.weight, n_rot/2 values
  std::vector<float> rope_long, rope_short;   // longrope (rope_scaling_type "longrope")
  float rope_attn_factor = 1.0f;              // longrope's rope.scaling.attn_factor
  std::optional<float> attn_softcap;          // ARCH.attn_logit_softcapping
  std::optional<float> final_softcap;         // ARCH.final_logit_softcapping
  std::optional<float> rope_freq_base_swa;    // ARCH.rope.freq_base_swa
  // YaRN (rope_scaling_type "yarn"): rope_scaling_factor,
  // rope_scaling_original_context and these betas (0: not written).
  float yarn_beta_fast = 0, yarn_beta_slow = 0;

  // Mixture of experts (n_expert > 0): ARCH.expert_count, expert_used_count,
  // expert_feed_forward_length (written where the family's converter does:
  // qwen3moe, gpt-oss), and the router and expert tensors in place of the
  // FFN (with biases, attention sinks and output bias for gpt-oss).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t expert_hidden_dim = 0;
  std::optional<bool> expert_weights_norm;    // ARCH.expert_weights_norm
};
using ModelHParams = LlamaHParams;

// Llama 3.1's RoPE scaling as llama.cpp's converter writes it into
// rope_freqs.weight: per pair of the head_dim/2 frequencies, 1 for short
// wavelengths, `factor` for long ones and a smooth blend between
// (rope_scaling rope_type "llama3": factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings).
std::vector<float> llama3_rope_freqs(float theta, int64_t head_dim, double factor, double low_freq_factor,
                                     double high_freq_factor, double original_context);

// Positive sizes, heads a multiple of kv heads, even head_dim; an Error
// naming `source` and the value otherwise.
void validate_llama_hparams(const LlamaHParams& hp, const std::string& source);

// general.architecture (hp.arch; Mistral as "llama"), general.name,
// general.file_type and the ARCH.* hyperparameter keys llama.cpp reads.
void write_llama_hparams(GgufWriter& w, const LlamaHParams& hp, uint32_t file_type);

// llama_ftype codes for general.file_type.
constexpr uint32_t kFtypeAllF32 = 0;
constexpr uint32_t kFtypeQ4_K_M = 15;
// The "mostly TYPE" code of a plain or quantized weight type (F32 0, F16 1,
// Q4_0 2, Q8_0 7, Q4_K 14 (Q4_K_S), Q6_K 18, BF16 32); Error for others.
uint32_t llama_ftype_for(DType t);

// Normalizer flags of a sentencepiece model (NormalizerSpec fields 3 and 4,
// both true when absent, as in sentencepiece_model.proto).
struct SpmNormalizerFlags {
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};
// Minimal protobuf walk of a serialised ModelProto; Error on malformed bytes.
SpmNormalizerFlags parse_spm_normalizer_flags(const uint8_t* data, size_t size, const std::string& source);
SpmNormalizerFlags read_spm_normalizer_flags(const std::string& model_path);

// Writes tokenizer.ggml.* (model "llama", tokens, scores, token_type, bos,
// eos, unknown ids, add_bos/add_eos, add_space_prefix,
// remove_extra_whitespaces) from a sentencepiece tokenizer.model, plus
// tokenizer.chat_template when `chat_template` is not empty. A tokenizer with
// fewer pieces than n_vocab is an Error unless pad_to_vocab, in which case it
// is padded with "[PAD<i>]" unused tokens as llama.cpp's converter does (and
// said so on stderr); one with more pieces is always an Error.
void write_llama_tokenizer(GgufWriter& w, const std::string& model_path, int64_t n_vocab,
                           const std::string& chat_template = "", bool pad_to_vocab = false);

// One tensor of a Llama model: GGUF name, role, layer (-1 for global) and
// shape in GGUF order (ne[0] is the input dimension).
struct LlamaTensorSpec {
  std::string name;
  TensorRole role;
  int layer = -1;
  std::vector<int64_t> ne;
};
// Every tensor in file order: token_embd, the RoPE factor tensors, then per
// layer attn_norm, attn_q, attn_k, attn_v (or attn_qkv), their biases, the q/k
// norms, attn_output, post_attention_norm, ffn_norm, ffn_gate, ffn_up (or the
// fused ffn_up), ffn_down, post_ffw_norm (each only where hp has it), then
// output_norm and output (omitted when tied). A mixture of experts has
// ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps (3-D) in place of
// the FFN; gpt-oss adds attn_output.bias, attn_sinks, the router and expert
// biases, and its FFN norm is post_attention_norm.
std::vector<LlamaTensorSpec> llama_tensor_specs(const LlamaHParams& hp);

// A GgufWriter progress callback printing "LABEL: tensor i/N" on stderr, or
// nullptr when stderr is not a terminal (logs and tests stay clean).
std::function<void(size_t, size_t)> stderr_progress(const std::string& label);

}  // namespace runlm
