// A loaded model: its GGUF (mmap), hyperparameters, weight views and
// tokenizer. Weights stay in their file type; backends read them as they are.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dtype.h"
#include "llama_arch.h"

namespace runlm {

class GgufFile;
class Tokenizer;

// A 2-D (or 1-D) weight inside the mapped file. GGUF order: ne0 is the row
// length (input features), ne1 the number of rows (output features). The
// experts of a mixture are stored 3-D: ne2 matrices of ne1 rows one after
// the other, matrix e starting at expert(e).
struct WeightView {
  std::string name;
  DType type = DType::F32;
  int64_t ne0 = 0;
  int64_t ne1 = 1;
  int64_t ne2 = 1;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  size_t nbytes() const { return row_bytes * static_cast<size_t>(ne1) * static_cast<size_t>(ne2); }
  const uint8_t* row(int64_t i) const { return data + row_bytes * static_cast<size_t>(i); }
  // Matrix e of a 3-D weight, as a 2-D view.
  WeightView expert(int64_t e) const {
    WeightView v = *this;
    v.ne2 = 1;
    v.data = data + row_bytes * static_cast<size_t>(ne1) * static_cast<size_t>(e);
    return v;
  }
};

// Which of these are set follows the ModelConfig's structure flags; an
// absent one has data == nullptr.
struct LayerWeights {
  WeightView attn_norm;  // [dim]
  WeightView wq;         // [dim] -> [n_heads * head_dim]          (not fused_qkv)
  WeightView wk;         // [dim] -> [n_kv_heads * head_dim]       (not fused_qkv)
  WeightView wv;         // [dim] -> [n_kv_heads * head_dim]       (not fused_qkv)
  WeightView wqkv;       // [dim] -> [q_dim + 2 kv_dim]            (fused_qkv)
  WeightView bq, bk, bv; // [q_dim], [kv_dim], [kv_dim]             (qkv_bias)
  WeightView q_norm;     // [head_dim]                              (qk_norm)
  WeightView k_norm;     // [head_dim]                              (qk_norm)
  WeightView wo;         // [n_heads * head_dim] -> [dim]
  WeightView attn_post_norm;  // [dim]                              (post_norms)
  WeightView ffn_norm;   // [dim]
  WeightView w_gate;     // [dim] -> [hidden]                       (not fused_gate_up)
  WeightView w_up;       // [dim] -> [hidden], or [2 hidden] gate rows then up rows (fused_gate_up)
  WeightView w_down;     // [hidden] -> [dim]
  WeightView ffn_post_norm;   // [dim]                              (post_norms)
  WeightView bo;         // [dim]                                   (attn_out_bias)
  WeightView sinks;      // [n_heads]                               (attn_sinks)
  // Mixture of experts (moe(): these in place of w_gate, w_up, w_down).
  WeightView gate_inp;   // [dim] -> [n_expert]
  WeightView gate_inp_b; // [n_expert]                              (moe_biases)
  WeightView gate_exps;  // n_expert x ([dim] -> [expert_hidden])
  WeightView up_exps;    // n_expert x ([dim] -> [expert_hidden])
  WeightView down_exps;  // n_expert x ([expert_hidden] -> [dim])
  WeightView gate_exps_b, up_exps_b;  // n_expert rows of [expert_hidden] (moe_biases)
  WeightView down_exps_b;             // n_expert rows of [dim]           (moe_biases)
};

struct ModelWeights {
  WeightView tok_embd;     // [n_vocab rows of dim]
  WeightView output_norm;  // [dim]
  WeightView output;       // [dim] -> [n_vocab]; == tok_embd when tied
  // RoPE frequency divisors, [n_rot / 2] each: rope_freqs (RopeFactors::Freqs)
  // in rope_long, or longrope's long and short ones.
  WeightView rope_long, rope_short;
  std::vector<LayerWeights> layers;
};

class Model {
 public:
  // tokenizer_path: a sentencepiece .model to use instead of the GGUF vocab.
  static std::unique_ptr<Model> load(const std::string& path, const std::string& tokenizer_path = "");
  // The same from an already parsed GGUF (e.g. GgufFile::from_memory, used by
  // the fuzzers); the Model takes ownership of it.
  static std::unique_ptr<Model> from_gguf(std::unique_ptr<GgufFile> gguf, const std::string& tokenizer_path = "");
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& gguf() const { return *gguf_; }
  // tokenizer.chat_template (Jinja source) or "" when the file has none.
  const std::string& chat_template_source() const { return chat_template_; }
  // Bytes of all weights and parameter count, for reports.
  size_t weight_bytes() const;
  int64_t n_params() const;
  // "Q4_0", "F16", or "mixed" style summary of the 2-D weight types.
  std::string weight_type_summary() const;

 private:
  Model();
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelConfig config_;
  ModelWeights weights_;
  std::string chat_template_;
};

}  // namespace runlm
