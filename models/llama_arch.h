// Llama-family architectures as data: the GGUF architecture names runlm
// accepts, the hyperparameter keys, and the tensor-name table. Mistral is a
// Llama with a sliding window (llama.attention.sliding_window); TinyLlama and
// Llama 1/2 differ only in shape, so all share this graph.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace runlm {

class GgufFile;

enum class Arch { Llama, Mistral };
const char* arch_name(Arch a);

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

  bool layer_uses_window(int layer) const { return swa_layers.empty() || swa_layers[size_t(layer)] != 0; }
  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  // The softmax scale of attention, 1 / sqrt(head_dim): every engine's.
  float attn_scale() const { return 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

// Reads and validates the hyperparameters; an unknown architecture or a
// missing key is an Error naming it and the file.
ModelConfig read_model_config(const GgufFile& gguf);

enum class TensorRole {
  TokenEmbd, OutputNorm, Output,
  AttnNorm, AttnQ, AttnK, AttnV, AttnOut, FfnNorm, FfnGate, FfnUp, FfnDown,
};
// GGUF name of a tensor: "token_embd.weight", "blk.3.attn_q.weight"...
std::string tensor_name(TensorRole role, int layer = -1);

}  // namespace runlm
