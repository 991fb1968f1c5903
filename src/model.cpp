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
  w.tok_embd = view(g, tensor_name(TensorRole::TokenEmbd), {c.dim, c.n_vocab});
  w.output_norm = view(g, tensor_name(TensorRole::OutputNorm), {c.dim});
  w.output = c.tied_embeddings ? w.tok_embd : view(g, tensor_name(TensorRole::Output), {c.dim, c.n_vocab});
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = view(g, tensor_name(TensorRole::AttnNorm, l), {c.dim});
    lw.wq = view(g, tensor_name(TensorRole::AttnQ, l), {c.dim, c.q_dim()});
    lw.wk = view(g, tensor_name(TensorRole::AttnK, l), {c.dim, c.kv_dim()});
    lw.wv = view(g, tensor_name(TensorRole::AttnV, l), {c.dim, c.kv_dim()});
    lw.wo = view(g, tensor_name(TensorRole::AttnOut, l), {c.q_dim(), c.dim});
    lw.ffn_norm = view(g, tensor_name(TensorRole::FfnNorm, l), {c.dim});
    lw.w_gate = view(g, tensor_name(TensorRole::FfnGate, l), {c.dim, c.hidden_dim});
    lw.w_up = view(g, tensor_name(TensorRole::FfnUp, l), {c.dim, c.hidden_dim});
    lw.w_down = view(g, tensor_name(TensorRole::FfnDown, l), {c.hidden_dim, c.dim});
    w.layers.push_back(std::move(lw));
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
