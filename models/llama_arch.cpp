#include "llama_arch.h"

#include <cmath>
#include <cstdint>

#include "common.h"
#include "gguf.h"

namespace runlm {

namespace {

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
// llama.cpp's LLM_TENSOR_NAMES for the roles of models/arch.h.
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
    {TensorRole::AttnQkv, "attn_qkv.weight", true},
    {TensorRole::AttnQBias, "attn_q.bias", true},
    {TensorRole::AttnKBias, "attn_k.bias", true},
    {TensorRole::AttnVBias, "attn_v.bias", true},
    {TensorRole::AttnQNorm, "attn_q_norm.weight", true},
    {TensorRole::AttnKNorm, "attn_k_norm.weight", true},
    {TensorRole::AttnPostNorm, "post_attention_norm.weight", true},
    {TensorRole::FfnPostNorm, "post_ffw_norm.weight", true},
    {TensorRole::RopeFreqs, "rope_freqs.weight", false},
    {TensorRole::RopeFactorsLong, "rope_factors_long.weight", false},
    {TensorRole::RopeFactorsShort, "rope_factors_short.weight", false},
    {TensorRole::FfnGateInp, "ffn_gate_inp.weight", true},
    {TensorRole::FfnGateInpBias, "ffn_gate_inp.bias", true},
    {TensorRole::FfnGateExps, "ffn_gate_exps.weight", true},
    {TensorRole::FfnUpExps, "ffn_up_exps.weight", true},
    {TensorRole::FfnDownExps, "ffn_down_exps.weight", true},
    {TensorRole::FfnGateExpsBias, "ffn_gate_exps.bias", true},
    {TensorRole::FfnUpExpsBias, "ffn_up_exps.bias", true},
    {TensorRole::FfnDownExpsBias, "ffn_down_exps.bias", true},
    {TensorRole::AttnSinks, "attn_sinks.weight", true},
    {TensorRole::AttnOutBias, "attn_output.bias", true},
};

int positive_int(const GgufFile& g, const std::string& key) {
  const int64_t v = g.get_int(key);
  RUNLM_CHECK(v > 0 && v < (int64_t{1} << 31), "%s: %s = %lld is out of range", g.path().c_str(), key.c_str(),
              static_cast<long long>(v));
  return static_cast<int>(v);
}
// The mixture-of-experts keys (llama.cpp's names): expert_count,
// expert_used_count, expert_feed_forward_length, expert_weights_norm,
// expert_weights_scale; an architecture with experts needs both counts.
void read_moe_config(const GgufFile& g, const ArchDesc& d, const std::string& p, ModelConfig& c) {
  const char* path = g.path().c_str();
  const int64_t n_expert = g.get_int_opt(p + "expert_count").value_or(0);
  RUNLM_CHECK(n_expert >= 0 && n_expert <= 4096, "%s: %sexpert_count = %lld is out of range", path, p.c_str(),
              static_cast<long long>(n_expert));
  RUNLM_CHECK(!d.moe || n_expert > 0, "%s: architecture %s needs %sexpert_count > 0", path, d.gguf_name, p.c_str());
  if (n_expert == 0) return;
  RUNLM_CHECK(d.moe || d.arch == Arch::Llama, "%s: %sexpert_count is set but architecture %s has no experts", path,
              p.c_str(), d.gguf_name);
  c.n_expert = static_cast<int>(n_expert);
  RUNLM_CHECK(g.find(p + "expert_used_count"), "%s: %sexpert_count is %d but %sexpert_used_count is missing", path,
              p.c_str(), c.n_expert, p.c_str());
  c.n_expert_used = positive_int(g, p + "expert_used_count");
  RUNLM_CHECK(c.n_expert_used <= c.n_expert, "%s: %sexpert_used_count %d exceeds expert_count %d", path, p.c_str(),
              c.n_expert_used, c.n_expert);
  if (d.expert_ffn_key == ExpertFfnKey::ExpertFeedForward && g.find(p + "expert_feed_forward_length")) {
    c.expert_hidden_dim = positive_int(g, p + "expert_feed_forward_length");
  } else {
    RUNLM_CHECK(d.arch != Arch::GptOss, "%s: %sexpert_feed_forward_length is missing", path, p.c_str());
    c.expert_hidden_dim = d.expert_ffn_key == ExpertFfnKey::ExpertFeedForward ? c.hidden_dim / c.n_expert_used
                                                                               : c.hidden_dim;
    RUNLM_CHECK(c.expert_hidden_dim > 0, "%s: the expert FFN size is 0 (%sfeed_forward_length %d)", path, p.c_str(),
                c.hidden_dim);
  }
  c.moe_gating = d.moe_gating;
  c.moe_norm_weights = d.moe_norm_weights;
  if (d.moe_norm_weights) {
    if (const GgufValue* v = g.find(p + "expert_weights_norm")) {
      RUNLM_CHECK(v->type == GgufType::BOOL, "%s: %sexpert_weights_norm must be a bool", path, p.c_str());
      c.moe_norm_weights = v->as_bool();
    }
  }
  const double scale = g.get_float_opt(p + "expert_weights_scale").value_or(0.0);
  RUNLM_CHECK(std::isfinite(scale) && scale >= 0, "%s: %sexpert_weights_scale must be >= 0", path, p.c_str());
  c.moe_weights_scale = scale == 0 ? 1.0f : static_cast<float>(scale);  // llama.cpp: 0 = no scaling
  if (const GgufValue* v = g.find(p + "expert_gating_func")) {
    // llama.cpp's codes: 1 softmax, 2 sigmoid; the architecture decides otherwise.
    RUNLM_CHECK(v->is_int() && v->as_int() == 1 && d.moe_gating == MoeGating::SoftmaxThenTopK,
                "%s: %sexpert_gating_func %s is not supported for architecture %s", path, p.c_str(),
                v->is_int() ? std::to_string(v->as_int()).c_str() : "?", d.gguf_name);
  }
  RUNLM_CHECK(!g.find(p + "expert_shared_count") || g.get_int(p + "expert_shared_count") == 0,
              "%s: shared experts (%sexpert_shared_count) are not supported", path, p.c_str());
  c.moe_biases = d.moe_biases;
}

}  // namespace

const char* arch_name(Arch a) { return arch_desc(a).gguf_name; }

std::vector<std::string> ModelConfig::features_beyond_llama() const {
  std::vector<std::string> f;
  if (rope_style != RopeStyle::Adjacent) f.push_back("NeoX RoPE");
  if (n_rot != 0 && n_rot != head_dim) f.push_back("partial RoPE");
  if (rope_factors == RopeFactors::Freqs) f.push_back("rope_freqs (llama3 RoPE scaling)");
  if (rope_factors == RopeFactors::LongShort) f.push_back("longrope RoPE factors");
  if (rope_attn_factor != 1.0f) f.push_back("RoPE attention factor");
  if (local_rope && (rope_theta_local != rope_theta || rope_freq_scale_local != rope_freq_scale))
    f.push_back("a separate RoPE base for local layers");
  if (ffn_act == FfnActivation::GeluTanh) f.push_back("GELU FFN");
  if (fused_qkv) f.push_back("fused attn_qkv");
  if (qkv_bias) f.push_back("q/k/v biases");
  if (qk_norm) f.push_back("q/k RMSNorm");
  if (post_norms) f.push_back("post-attention/post-FFN norms");
  if (fused_gate_up) f.push_back("fused gate+up FFN");
  if (embd_scale != 1.0f) f.push_back("embedding scale");
  if (attn_scale() != 1.0f / std::sqrt(static_cast<float>(head_dim)))
    f.push_back("attention scale other than 1/sqrt(head_dim)");
  if (attn_softcap != 0.0f) f.push_back("attention logit soft-cap");
  if (final_softcap != 0.0f) f.push_back("final logit soft-cap");
  if (rope_yarn) f.push_back("YaRN RoPE");
  if (moe()) f.push_back("mixture of experts");
  if (attn_sinks) f.push_back("attention sinks");
  if (attn_out_bias) f.push_back("attention output bias");
  if (ffn_act == FfnActivation::SwigluOai) f.push_back("clamped SwiGLU (swiglu_oai)");
  return f;
}

std::string tensor_name(TensorRole role, int layer) {
  for (const auto& r : kTensors)
    if (r.role == role) return r.per_layer ? strfmt("blk.%d.%s", layer, r.name) : std::string(r.name);
  fail("unknown tensor role");
}

ModelConfig read_model_config(const GgufFile& g) {
  ModelConfig c;
  const std::string arch = g.get_string("general.architecture");
  const ArchDesc* desc = find_arch(arch);
  RUNLM_CHECK(desc, "%s: unknown architecture '%s'; supported: %s", g.path().c_str(), arch.c_str(),
              supported_arch_names().c_str());
  const ArchDesc& d = *desc;
  c.arch = d.arch;
  const std::string p = arch + ".";
  const char* path = g.path().c_str();
  c.name = g.get_string_opt("general.name").value_or("");
  c.dim = positive_int(g, p + "embedding_length");
  // A mixture-of-experts model may leave the dense FFN size out (llama.cpp
  // reads it as optional).
  c.hidden_dim = d.moe && !g.find(p + "feed_forward_length") ? 0 : positive_int(g, p + "feed_forward_length");
  c.n_layers = positive_int(g, p + "block_count");
  c.n_heads = positive_int(g, p + "attention.head_count");
  c.n_kv_heads = g.find(p + "attention.head_count_kv") ? positive_int(g, p + "attention.head_count_kv") : c.n_heads;
  c.ctx_train = positive_int(g, p + "context_length");
  c.head_dim = g.find(p + "attention.key_length") ? positive_int(g, p + "attention.key_length") : c.dim / c.n_heads;
  if (g.find(p + "attention.value_length")) {
    const int v = positive_int(g, p + "attention.value_length");
    RUNLM_CHECK(v == c.head_dim, "%s: %sattention.value_length %d differs from the key length %d; not supported", path,
                p.c_str(), v, c.head_dim);
  }
  c.rms_eps = static_cast<float>(g.get_float_opt(p + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  c.rope_theta = static_cast<float>(g.get_float_opt(p + "rope.freq_base").value_or(10000.0));
  // llama.cpp's reading: the type defaults to linear, a factor alone scales linearly.
  const auto scaling_type = g.get_string_opt(p + "rope.scaling.type");
  const auto scaling_factor = g.get_float_opt(p + "rope.scaling.factor");
  // llama.cpp's phi3 converter writes longrope's factor tensors and
  // attn_factor without the type key; its phi3 graph uses them whenever present.
  const bool longrope_tensors = g.find_tensor(tensor_name(TensorRole::RopeFactorsLong)) ||
                                g.find_tensor(tensor_name(TensorRole::RopeFactorsShort));
  const std::string type =
      scaling_type.value_or(d.longrope && longrope_tensors ? "longrope" : scaling_factor ? "linear" : "none");
  if (type == "linear") {
    const double factor = scaling_factor.value_or(0.0);
    RUNLM_CHECK(!scaling_type || scaling_factor, "%s: %srope.scaling.type is linear but rope.scaling.factor is missing",
                path, p.c_str());
    RUNLM_CHECK(factor >= 0, "%s: rope.scaling.factor must be positive", path);
    c.rope_freq_scale = factor == 0 ? 1.0f : static_cast<float>(1.0 / factor);
  } else if (type == "longrope") {
    RUNLM_CHECK(d.longrope, "%s: rope scaling type 'longrope' is not supported for architecture %s", path,
                arch.c_str());
    RUNLM_CHECK(g.find_tensor(tensor_name(TensorRole::RopeFactorsLong)) &&
                    g.find_tensor(tensor_name(TensorRole::RopeFactorsShort)),
                "%s: rope scaling type 'longrope' needs the tensors %s and %s", path,
                tensor_name(TensorRole::RopeFactorsLong).c_str(), tensor_name(TensorRole::RopeFactorsShort).c_str());
    c.rope_factors = RopeFactors::LongShort;
    c.rope_attn_factor = static_cast<float>(g.get_float_opt(p + "rope.scaling.attn_factor").value_or(1.0));
    RUNLM_CHECK(std::isfinite(c.rope_attn_factor) && c.rope_attn_factor > 0,
                "%s: %srope.scaling.attn_factor must be positive", path, p.c_str());
  } else if (type == "yarn") {
    // llama.cpp's generic YaRN: the factor as a linear scale, ext_factor 1,
    // beta fast/slow (defaults 32 and 1) and the original context below.
    const double factor = scaling_factor.value_or(0.0);
    RUNLM_CHECK(std::isfinite(factor) && factor >= 0, "%s: rope.scaling.factor must be positive", path);
    c.rope_freq_scale = factor == 0 ? 1.0f : static_cast<float>(1.0 / factor);
    c.rope_yarn = true;
    c.rope_yarn_beta_fast = static_cast<float>(g.get_float_opt(p + "rope.scaling.yarn_beta_fast").value_or(32.0));
    c.rope_yarn_beta_slow = static_cast<float>(g.get_float_opt(p + "rope.scaling.yarn_beta_slow").value_or(1.0));
    RUNLM_CHECK(std::isfinite(c.rope_yarn_beta_fast) && std::isfinite(c.rope_yarn_beta_slow) &&
                    c.rope_yarn_beta_fast > 0 && c.rope_yarn_beta_slow > 0,
                "%s: %srope.scaling.yarn_beta_fast/slow must be positive", path, p.c_str());
    RUNLM_CHECK(!g.find(p + "rope.scaling.yarn_log_multiplier") &&
                    !g.find(p + "rope.scaling.yarn_ext_factor") && !g.find(p + "rope.scaling.yarn_attn_factor"),
                "%s: YaRN with yarn_log_multiplier, yarn_ext_factor or yarn_attn_factor keys is not supported", path);
    // llama.cpp's yarn_attn_factor: get_mscale(factor) cancelled by the
    // 1 + 0.1 ln(factor) ggml's rope multiplies in again, times
    // rope.scaling.attn_factor; computed in float as llama.cpp does.
    const float f = 1.0f / c.rope_freq_scale;
    float attn = f <= 1.0f ? 1.0f : 0.1f * std::log(f) + 1.0f;
    attn *= 1.0f / (1.0f + 0.1f * std::log(f));
    attn *= static_cast<float>(g.get_float_opt(p + "rope.scaling.attn_factor").value_or(1.0));
    RUNLM_CHECK(std::isfinite(attn) && attn > 0, "%s: %srope.scaling.attn_factor must be positive", path, p.c_str());
    c.rope_attn_factor = attn;
  } else {
    RUNLM_CHECK(type == "none", "%s: rope scaling type '%s' is not supported (supported: none, linear, yarn%s)", path,
                type.c_str(), d.longrope ? ", longrope" : "");
  }
  c.rope_orig_ctx = c.ctx_train;
  if (g.find(p + "rope.scaling.original_context_length"))
    c.rope_orig_ctx = positive_int(g, p + "rope.scaling.original_context_length");
  if (g.find_tensor(tensor_name(TensorRole::RopeFreqs))) {
    RUNLM_CHECK(d.rope_freqs, "%s: tensor %s is not used by architecture %s", path,
                tensor_name(TensorRole::RopeFreqs).c_str(), arch.c_str());
    RUNLM_CHECK(c.rope_factors == RopeFactors::None, "%s: both rope_freqs and longrope factors", path);
    c.rope_factors = RopeFactors::Freqs;
  }

  // Sliding window: the key, else the architecture's default; layers as the
  // pattern key says, else the architecture's pattern.
  int64_t window = d.default_window;
  if (auto w = g.get_int_opt(p + "attention.sliding_window")) window = *w;
  if (window > 0) {
    RUNLM_CHECK(window < (int64_t{1} << 31), "%s: %s = %lld is out of range", path,
                (p + "attention.sliding_window").c_str(), static_cast<long long>(window));
    c.sliding_window = static_cast<int>(window);
    if (const GgufValue* pat = g.find(p + "attention.sliding_window_pattern"))
      c.swa_layers = read_swa_pattern(g, p, *pat, c.n_layers);
    else if (d.swa_pattern > 0)
      c.swa_layers = read_swa_pattern(g, p, GgufValue::make_u32(static_cast<uint32_t>(d.swa_pattern)), c.n_layers);
  } else if (const GgufValue* pat = g.find(p + "attention.sliding_window_pattern")) {
    c.swa_layers = read_swa_pattern(g, p, *pat, c.n_layers);  // validated; no window, so unused
    c.swa_layers.clear();
  }
  c.local_rope = d.local_rope != LocalRope::Global && c.sliding_window > 0;
  c.rope_theta_local = static_cast<float>(g.get_float_opt(p + "rope.freq_base_swa")
                                              .value_or(d.local_rope == LocalRope::SwaKeyUnscaled ? 10000.0 : c.rope_theta));
  c.rope_freq_scale_local = d.local_rope == LocalRope::SwaKeyUnscaled ? 1.0f : c.rope_freq_scale;
  if (!c.local_rope) c.rope_theta_local = c.rope_theta, c.rope_freq_scale_local = c.rope_freq_scale;

  // NaN or non-positive values would silently turn every logit into NaN.
  RUNLM_CHECK(std::isfinite(c.rms_eps) && c.rms_eps > 0, "%s: %sattention.layer_norm_rms_epsilon = %g must be positive",
              path, p.c_str(), static_cast<double>(c.rms_eps));
  RUNLM_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "%s: %srope.freq_base = %g must be positive", path,
              p.c_str(), static_cast<double>(c.rope_theta));
  RUNLM_CHECK(std::isfinite(c.rope_theta_local) && c.rope_theta_local > 0, "%s: %srope.freq_base_swa = %g must be positive",
              path, p.c_str(), static_cast<double>(c.rope_theta_local));
  RUNLM_CHECK(std::isfinite(c.rope_freq_scale) && c.rope_freq_scale > 0, "%s: %srope.scaling.factor gives the scale %g",
              path, p.c_str(), static_cast<double>(c.rope_freq_scale));

  RUNLM_CHECK(c.n_heads % c.n_kv_heads == 0, "%s: head_count %d is not a multiple of head_count_kv %d", path,
              c.n_heads, c.n_kv_heads);
  // dim / n_heads is 0 when there are more heads than dimensions.
  RUNLM_CHECK(c.head_dim > 0, "%s: head dimension is 0 (embedding_length %d < head_count %d)", path, c.dim, c.n_heads);
  RUNLM_CHECK(c.head_dim % 2 == 0, "%s: head dimension %d must be even for RoPE", path, c.head_dim);
  // q_dim() and kv_dim() are ints: n_heads * head_dim must fit (the engines
  // index activations with them).
  RUNLM_CHECK(static_cast<int64_t>(c.n_heads) * c.head_dim <= INT32_MAX,
              "%s: head_count %d x head dimension %d overflows the query width", path, c.n_heads, c.head_dim);
  c.n_rot = c.head_dim;
  if (auto rd = g.get_int_opt(p + "rope.dimension_count")) {
    if (d.rope_dims_full)
      RUNLM_CHECK(*rd == c.head_dim,
                  "%s: partial rotary embedding (rope.dimension_count %lld of head dim %d) is not supported for "
                  "architecture %s",
                  path, static_cast<long long>(*rd), c.head_dim, arch.c_str());
    RUNLM_CHECK(*rd > 0 && *rd <= c.head_dim && *rd % 2 == 0,
                "%s: %srope.dimension_count %lld must be even and within the head dimension %d", path, p.c_str(),
                static_cast<long long>(*rd), c.head_dim);
    c.n_rot = static_cast<int>(*rd);
  }

  // The layer's structure from the description.
  c.rope_style = d.rope_style;
  c.ffn_act = d.ffn_act;
  c.qk_norm = d.qk_norm;
  c.post_norms = d.post_norms;
  c.fused_qkv = g.find_tensor(tensor_name(TensorRole::AttnQkv, 0)) != nullptr;
  c.qkv_bias = d.qkv_bias && g.find_tensor(tensor_name(TensorRole::AttnQBias, 0));
  c.fused_gate_up = d.fused_gate_up && !g.find_tensor(tensor_name(TensorRole::FfnGate, 0));
  if (d.embd_scale_sqrt_dim) c.embd_scale = std::sqrt(static_cast<float>(c.dim));
  c.kq_scale = d.scale_by_dim_per_head_layers == c.n_layers
                     ? 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads))
                     : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  auto softcap = [&](const SoftcapRule& r, const char* key) {
    if (!r.read_key) return 0.0f;
    const float v = static_cast<float>(g.get_float_opt(p + key).value_or(r.default_cap));
    RUNLM_CHECK(std::isfinite(v) && v >= 0, "%s: %s%s = %g must be >= 0", path, p.c_str(), key, static_cast<double>(v));
    return v;
  };
  c.attn_softcap = softcap(d.attn_softcap, "attn_logit_softcapping");
  c.final_softcap = softcap(d.final_softcap, "final_logit_softcapping");
  c.attn_sinks = d.attn_sinks;
  c.attn_out_bias = d.attn_out_bias;
  c.ffn_norm_post_attention = d.ffn_norm_post_attention;

  read_moe_config(g, d, p, c);

  const GgufTensorInfo* embd = g.find_tensor(tensor_name(TensorRole::TokenEmbd));
  RUNLM_CHECK(embd, "%s: tensor not found in model: %s", path, tensor_name(TensorRole::TokenEmbd).c_str());
  RUNLM_CHECK(embd->ne.size() == 2, "%s: token_embd.weight must be 2-D", path);
  RUNLM_CHECK(embd->ne[1] > 0 && embd->ne[1] <= INT32_MAX, "%s: token_embd.weight has %lld rows (the vocabulary size); "
              "expected 1..%d", path, static_cast<long long>(embd->ne[1]), INT32_MAX);
  c.n_vocab = static_cast<int>(embd->ne[1]);
  c.tied_embeddings = !d.output_tensor || g.find_tensor(tensor_name(TensorRole::Output)) == nullptr;
  return c;
}

}  // namespace runlm
