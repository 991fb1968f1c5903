#include "model.h"

#include <map>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

namespace runlm {

namespace {

// Looks a tensor up and checks its shape; shapes are given in GGUF order.
WeightView view(const GgufFile& g, const std::string& name, std::vector<int64_t> want) {
  const GgufTensorInfo* t = g.find_tensor(name);
  RUNLM_CHECK(t, "%s: tensor not found in model: %s", g.path().c_str(), name.c_str());
  std::string got_s, want_s;
  for (auto d : t->ne) got_s += strfmt("%s%lld", got_s.empty() ? "" : ", ", static_cast<long long>(d));
  for (auto d : want) want_s += strfmt("%s%lld", want_s.empty() ? "" : ", ", static_cast<long long>(d));
  RUNLM_CHECK(t->ne == want, "%s: tensor %s has shape [%s], expected [%s]", g.path().c_str(), name.c_str(),
              got_s.c_str(), want_s.c_str());
  RUNLM_CHECK(dtype_info(t->type).can_decode, "%s: tensor %s has type %s, which runlm cannot decode",
              g.path().c_str(), name.c_str(), dtype_name(t->type));
  WeightView v;
  v.name = name;
  v.type = t->type;
  v.ne0 = t->ne[0];
  v.ne1 = t->ne.size() > 1 ? t->ne[1] : 1;
  v.ne2 = t->ne.size() > 2 ? t->ne[2] : 1;
  v.data = g.tensor_data(*t);
  v.row_bytes = dtype_row_bytes(t->type, v.ne0);
  return v;
}

}  // namespace

Model::Model() = default;
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const std::string& tokenizer_path) {
  return from_gguf(GgufFile::open(path), tokenizer_path);
}

std::unique_ptr<Model> Model::from_gguf(std::unique_ptr<GgufFile> gguf, const std::string& tokenizer_path) {
  RUNLM_CHECK(gguf != nullptr, "Model::from_gguf: no GGUF");
  std::unique_ptr<Model> m(new Model());
  m->gguf_ = std::move(gguf);
  const GgufFile& g = *m->gguf_;
  const std::string& path = g.path();
  m->config_ = read_model_config(g);
  const ModelConfig& c = m->config_;

  ModelWeights& w = m->weights_;
  std::map<std::string, bool> used;
  auto get = [&](TensorRole role, int layer, std::vector<int64_t> shape) {
    WeightView v = view(g, tensor_name(role, layer), std::move(shape));
    used[v.name] = true;
    return v;
  };
  const int64_t dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  w.tok_embd = get(TensorRole::TokenEmbd, -1, {dim, c.n_vocab});
  w.output_norm = get(TensorRole::OutputNorm, -1, {dim});
  w.output = c.tied_embeddings ? w.tok_embd : get(TensorRole::Output, -1, {dim, c.n_vocab});
  if (c.rope_factors == RopeFactors::Freqs) w.rope_long = get(TensorRole::RopeFreqs, -1, {c.n_rot / 2});
  if (c.rope_factors == RopeFactors::LongShort) {
    w.rope_long = get(TensorRole::RopeFactorsLong, -1, {c.n_rot / 2});
    w.rope_short = get(TensorRole::RopeFactorsShort, -1, {c.n_rot / 2});
  }
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = get(TensorRole::AttnNorm, l, {dim});
    if (c.fused_qkv) {
      lw.wqkv = get(TensorRole::AttnQkv, l, {dim, q_dim + 2 * kv_dim});
    } else {
      lw.wq = get(TensorRole::AttnQ, l, {dim, q_dim});
      lw.wk = get(TensorRole::AttnK, l, {dim, kv_dim});
      lw.wv = get(TensorRole::AttnV, l, {dim, kv_dim});
    }
    if (c.qkv_bias) {
      lw.bq = get(TensorRole::AttnQBias, l, {q_dim});
      lw.bk = get(TensorRole::AttnKBias, l, {kv_dim});
      lw.bv = get(TensorRole::AttnVBias, l, {kv_dim});
    }
    if (c.qk_norm) {
      lw.q_norm = get(TensorRole::AttnQNorm, l, {c.head_dim});
      lw.k_norm = get(TensorRole::AttnKNorm, l, {c.head_dim});
    }
    lw.wo = get(TensorRole::AttnOut, l, {q_dim, dim});
    if (c.attn_out_bias) lw.bo = get(TensorRole::AttnOutBias, l, {dim});
    if (c.attn_sinks) lw.sinks = get(TensorRole::AttnSinks, l, {c.n_heads});
    if (c.post_norms) lw.attn_post_norm = get(TensorRole::AttnPostNorm, l, {dim});
    lw.ffn_norm = get(c.ffn_norm_post_attention ? TensorRole::AttnPostNorm : TensorRole::FfnNorm, l, {dim});
    if (c.moe()) {
      const int64_t ne = c.n_expert, eh = c.expert_hidden_dim;
      lw.gate_inp = get(TensorRole::FfnGateInp, l, {dim, ne});
      lw.gate_exps = get(TensorRole::FfnGateExps, l, {dim, eh, ne});
      lw.up_exps = get(TensorRole::FfnUpExps, l, {dim, eh, ne});
      lw.down_exps = get(TensorRole::FfnDownExps, l, {eh, dim, ne});
      if (c.moe_biases) {
        lw.gate_inp_b = get(TensorRole::FfnGateInpBias, l, {ne});
        lw.gate_exps_b = get(TensorRole::FfnGateExpsBias, l, {eh, ne});
        lw.up_exps_b = get(TensorRole::FfnUpExpsBias, l, {eh, ne});
        lw.down_exps_b = get(TensorRole::FfnDownExpsBias, l, {dim, ne});
      }
    } else if (c.fused_gate_up) {
      lw.w_up = get(TensorRole::FfnUp, l, {dim, 2 * hidden});
    } else {
      lw.w_gate = get(TensorRole::FfnGate, l, {dim, hidden});
      lw.w_up = get(TensorRole::FfnUp, l, {dim, hidden});
    }
    if (!c.moe()) lw.w_down = get(TensorRole::FfnDown, l, {hidden, dim});
    if (c.post_norms) lw.ffn_post_norm = get(TensorRole::FfnPostNorm, l, {dim});
    w.layers.push_back(std::move(lw));
  }
  // A tensor the graph does not read (a bias, an extra norm) would silently
  // change the model: refuse the file instead.
  for (const auto& t : g.tensors()) {
    if (used.count(t.name)) continue;
    // gemma2 keeps no output.weight of its own; llama.cpp ignores one if present.
    RUNLM_CHECK(c.arch == Arch::Gemma2 && t.name == tensor_name(TensorRole::Output),
                "%s: tensor %s is not used by the %s graph runlm runs", path.c_str(), t.name.c_str(),
                arch_name(c.arch));
  }

  m->tokenizer_ = tokenizer_path.empty() ? Tokenizer::from_gguf(g) : Tokenizer::from_model_file(tokenizer_path);
  RUNLM_CHECK(m->tokenizer_->n_vocab() == c.n_vocab,
              "%s: tokenizer has %d tokens but the model's embedding has %d rows", path.c_str(),
              m->tokenizer_->n_vocab(), c.n_vocab);
  m->chat_template_ = g.get_string_opt("tokenizer.chat_template").value_or("");
  return m;
}

size_t Model::weight_bytes() const {
  size_t total = 0;
  for (const auto& t : gguf_->tensors()) total += t.nbytes;
  return total;
}

int64_t Model::n_params() const {
  int64_t total = 0;
  for (const auto& t : gguf_->tensors()) total += t.n_elements();
  return total;
}

std::string Model::weight_type_summary() const {
  std::map<std::string, int64_t> by_type;  // elements per type, 2-D weights only
  for (const auto& t : gguf_->tensors())
    if (t.ne.size() == 2) by_type[dtype_name(t.type)] += t.n_elements();
  std::string best;
  int64_t best_n = -1;
  for (const auto& [name, n] : by_type)
    if (n > best_n) best = name, best_n = n;
  for (auto& ch : best) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return by_type.size() > 1 ? best + " (mixed)" : best;
}

}  // namespace runlm
