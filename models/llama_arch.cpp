#include "llama_arch.h"

#include <cmath>
#include <cstdint>

#include "common.h"
#include "gguf.h"

namespace runlm {

namespace {
struct ArchRow {
  Arch arch;
  const char* gguf_name;
};
// GGUF's general.architecture values accepted. llama.cpp writes Mistral 7B
// as "llama" with a sliding_window key; "mistral" is accepted as well.
constexpr ArchRow kArchs[] = {{Arch::Llama, "llama"}, {Arch::Mistral, "mistral"}};

// llama.attention.sliding_window_pattern, as llama.cpp reads it: an array
// with one flag a layer (true = the sliding window applies), or an integer n
// meaning "every n-th layer attends to everything": layer l slides when
// n == 0 or l % n < n - 1 (llama_hparams::set_swa_pattern). A pattern that
// leaves every layer sliding is returned empty (the same model).
std::vector<uint8_t> read_swa_pattern(const GgufFile& g, const std::string& p, const GgufValue& v, int n_layers) {
  const std::string key = p + "attention.sliding_window_pattern";
  std::vector<uint8_t> layers(size_t(n_layers), 1);
  if (v.type == GgufType::ARRAY) {
    RUNLM_CHECK(v.arr.size() == size_t(n_layers), "%s: %s has %zu entries for %d layers", g.path().c_str(),
                key.c_str(), v.arr.size(), n_layers);
    for (size_t l = 0; l < v.arr.size(); ++l) {
      const GgufValue& e = v.arr[l];
      RUNLM_CHECK(e.type == GgufType::BOOL || (e.is_int() && (e.as_int() == 0 || e.as_int() == 1)),
                  "%s: %s[%zu] must be a bool (or 0/1), got %s", g.path().c_str(), key.c_str(), l,
                  gguf_type_name(e.type));
      layers[l] = e.as_bool() ? 1 : 0;
    }
  } else {
    RUNLM_CHECK(v.is_int() && v.as_int() >= 0 && v.as_int() < (int64_t{1} << 31),
                "%s: %s must be a non-negative integer or an array of bools, got %s", g.path().c_str(), key.c_str(),
                gguf_type_name(v.type));
    const int64_t n = v.as_int();
    for (int l = 0; l < n_layers; ++l) layers[size_t(l)] = n == 0 || l % n < n - 1;
  }
  for (uint8_t x : layers)
    if (!x) return layers;
  return {};
}

struct TensorRow {
  TensorRole role;
  const char* name;  // per-layer names get the "blk.N." prefix
  bool per_layer;
};
constexpr TensorRow kTensors[] = {
    {TensorRole::TokenEmbd, "token_embd.weight", false},
    {TensorRole::OutputNorm, "output_norm.weight", false},
    {TensorRole::Output, "output.weight", false},
    {TensorRole::AttnNorm, "attn_norm.weight", true},
    {TensorRole::AttnQ, "attn_q.weight", true},
    {TensorRole::AttnK, "attn_k.weight", true},
    {TensorRole::AttnV, "attn_v.weight", true},
    {TensorRole::AttnOut, "attn_output.weight", true},
    {TensorRole::FfnNorm, "ffn_norm.weight", true},
    {TensorRole::FfnGate, "ffn_gate.weight", true},
    {TensorRole::FfnUp, "ffn_up.weight", true},
    {TensorRole::FfnDown, "ffn_down.weight", true},
};

int positive_int(const GgufFile& g, const std::string& key) {
  const int64_t v = g.get_int(key);
  RUNLM_CHECK(v > 0 && v < (int64_t{1} << 31), "%s: %s = %lld is out of range", g.path().c_str(), key.c_str(),
              static_cast<long long>(v));
  return static_cast<int>(v);
}
}  // namespace

const char* arch_name(Arch a) {
  for (const auto& r : kArchs)
    if (r.arch == a) return r.gguf_name;
  return "?";
}

std::string tensor_name(TensorRole role, int layer) {
  for (const auto& r : kTensors)
    if (r.role == role) return r.per_layer ? strfmt("blk.%d.%s", layer, r.name) : std::string(r.name);
  fail("unknown tensor role");
}

ModelConfig read_model_config(const GgufFile& g) {
  ModelConfig c;
  const std::string arch = g.get_string("general.architecture");
  const ArchRow* row = nullptr;
  for (const auto& r : kArchs)
    if (arch == r.gguf_name) row = &r;
  RUNLM_CHECK(row, "%s: unknown architecture '%s'; supported: llama, mistral", g.path().c_str(), arch.c_str());
  c.arch = row->arch;
  const std::string p = arch + ".";
  c.name = g.get_string_opt("general.name").value_or("");
  c.dim = positive_int(g, p + "embedding_length");
  c.hidden_dim = positive_int(g, p + "feed_forward_length");
  c.n_layers = positive_int(g, p + "block_count");
  c.n_heads = positive_int(g, p + "attention.head_count");
  c.n_kv_heads = g.find(p + "attention.head_count_kv") ? positive_int(g, p + "attention.head_count_kv") : c.n_heads;
  c.ctx_train = positive_int(g, p + "context_length");
  c.head_dim = g.find(p + "attention.key_length") ? positive_int(g, p + "attention.key_length") : c.dim / c.n_heads;
  c.rms_eps = static_cast<float>(g.get_float_opt(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(g.get_float_opt(p + "rope.freq_base").value_or(10000.0));
  if (auto type = g.get_string_opt(p + "rope.scaling.type"); type && *type != "none") {
    RUNLM_CHECK(*type == "linear", "%s: rope scaling type '%s' is not supported (supported: linear)",
                g.path().c_str(), type->c_str());
    const double factor = g.get_float(p + "rope.scaling.factor");
    RUNLM_CHECK(factor > 0, "%s: rope.scaling.factor must be positive", g.path().c_str());
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  }
  if (auto w = g.get_int_opt(p + "attention.sliding_window"); w && *w > 0) {
    RUNLM_CHECK(*w < (int64_t{1} << 31), "%s: %s = %lld is out of range", g.path().c_str(),
                (p + "attention.sliding_window").c_str(), static_cast<long long>(*w));
    c.sliding_window = static_cast<int>(*w);
  }
  if (const GgufValue* pat = g.find(p + "attention.sliding_window_pattern"))
    c.swa_layers = read_swa_pattern(g, p, *pat, c.n_layers);
  // NaN or non-positive values would silently turn every logit into NaN.
  RUNLM_CHECK(std::isfinite(c.rms_eps) && c.rms_eps > 0, "%s: %sattention.layer_norm_rms_epsilon = %g must be positive",
              g.path().c_str(), p.c_str(), static_cast<double>(c.rms_eps));
  RUNLM_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "%s: %srope.freq_base = %g must be positive",
              g.path().c_str(), p.c_str(), static_cast<double>(c.rope_theta));
  RUNLM_CHECK(std::isfinite(c.rope_freq_scale) && c.rope_freq_scale > 0, "%s: %srope.scaling.factor gives the scale %g",
              g.path().c_str(), p.c_str(), static_cast<double>(c.rope_freq_scale));

  RUNLM_CHECK(c.n_heads % c.n_kv_heads == 0, "%s: head_count %d is not a multiple of head_count_kv %d",
              g.path().c_str(), c.n_heads, c.n_kv_heads);
  // dim / n_heads is 0 when there are more heads than dimensions.
  RUNLM_CHECK(c.head_dim > 0, "%s: head dimension is 0 (embedding_length %d < head_count %d)", g.path().c_str(), c.dim,
              c.n_heads);
  RUNLM_CHECK(c.head_dim % 2 == 0, "%s: head dimension %d must be even for RoPE", g.path().c_str(), c.head_dim);
  // q_dim() and kv_dim() are ints: n_heads * head_dim must fit (the engines
  // index activations with them).
  RUNLM_CHECK(static_cast<int64_t>(c.n_heads) * c.head_dim <= INT32_MAX,
              "%s: head_count %d x head dimension %d overflows the query width", g.path().c_str(), c.n_heads,
              c.head_dim);
  if (auto rd = g.get_int_opt(p + "rope.dimension_count"))
    RUNLM_CHECK(*rd == c.head_dim, "%s: partial rotary embedding (rope.dimension_count %lld of head dim %d) is not supported",
                g.path().c_str(), static_cast<long long>(*rd), c.head_dim);

  const GgufTensorInfo* embd = g.find_tensor(tensor_name(TensorRole::TokenEmbd));
  RUNLM_CHECK(embd, "%s: tensor not found in model: %s", g.path().c_str(), tensor_name(TensorRole::TokenEmbd).c_str());
  RUNLM_CHECK(embd->ne.size() == 2, "%s: token_embd.weight must be 2-D", g.path().c_str());
  RUNLM_CHECK(embd->ne[1] > 0 && embd->ne[1] <= INT32_MAX, "%s: token_embd.weight has %lld rows (the vocabulary size); "
              "expected 1..%d", g.path().c_str(), static_cast<long long>(embd->ne[1]), INT32_MAX);
  c.n_vocab = static_cast<int>(embd->ne[1]);
  c.tied_embeddings = g.find_tensor(tensor_name(TensorRole::Output)) == nullptr;
  return c;
}

}  // namespace runlm
