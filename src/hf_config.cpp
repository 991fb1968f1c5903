// Parses a Hugging Face config.json into HfConfig (see hf_config.h).
#include "hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common.h"
#include "json_brief.h"

namespace runlm {

namespace {

using nlohmann::json;

// MistralConfig's default window, used when a Mistral config omits the key.
constexpr int64_t kMistralDefaultWindow = 4096;
// GptOssConfig's defaults: the window, the RoPE base, and the clamped
// SwiGLU's limit and gain (the ones ggml's swiglu_oai has built in).
constexpr int64_t kGptOssDefaultWindow = 128;
constexpr double kGptOssDefaultTheta = 150000.0;
constexpr double kGptOssSwigluLimit = 7.0;
constexpr double kGptOssSwigluAlpha = 1.702;
// Mixtral is the llama layer with experts: no row of its own in models/arch.h.
constexpr const char* kMixtralClass = "MixtralForCausalLM";
// Gemma 3 as released at 4B, 12B and 27B: a vision tower beside the text
// model, whose configuration is text_config. That is saved holding only what
// differs from Gemma3TextConfig's defaults, so they are filled in first.
constexpr const char* kGemma3MultimodalClass = "Gemma3ForConditionalGeneration";
const char* const kGemma3TextDefaults = R"({
  "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "rope_theta": 1000000.0,
  "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_local_base_freq": 10000.0,
  "sliding_window_pattern": 6})";

const json* member(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t positive(const json& j, const char* key, const std::string& src, std::optional<int64_t> dflt = {}) {
  const json* v = member(j, key);
  if (!v) {
    RUNLM_CHECK(dflt, "%s: missing %s", src.c_str(), key);
    return *dflt;
  }
  RUNLM_CHECK(v->is_number_integer() && v->get<int64_t>() > 0 && v->get<int64_t>() < (int64_t{1} << 31),
              "%s: %s must be a positive integer, got %s", src.c_str(), key, json_brief(*v).c_str());
  return v->get<int64_t>();
}

double number(const json& j, const char* key, const std::string& src, double dflt) {
  const json* v = member(j, key);
  if (!v) return dflt;
  RUNLM_CHECK(v->is_number() && std::isfinite(v->get<double>()), "%s: %s must be a finite number, got %s", src.c_str(),
              key, json_brief(*v).c_str());
  return v->get<double>();
}

bool flag(const json& j, const char* key, const std::string& src, bool dflt) {
  const json* v = member(j, key);
  if (!v) return dflt;
  RUNLM_CHECK(v->is_boolean(), "%s: %s must be true or false, got %s", src.c_str(), key, json_brief(*v).c_str());
  return v->get<bool>();
}

// rope_scaling (older) and rope_parameters (newer) share one shape: a type
// under "rope_type" or "type", a "factor", and optionally the original
// context length.
void read_rope_scaling(const json& s, const char* key, const std::string& src, HfConfig& c) {
  RUNLM_CHECK(s.is_object(), "%s: %s must be an object, got %s", src.c_str(), key, json_brief(s).c_str());
  std::string type;
  if (const json* t = member(s, "rope_type")) type = t->is_string() ? t->get<std::string>() : json_brief(*t);
  else if (const json* t2 = member(s, "type")) type = t2->is_string() ? t2->get<std::string>() : json_brief(*t2);
  if (type.empty() || type == "default") return;
  if (type == "su") type = "longrope";
  const bool llama3 = type == "llama3" && (c.arch == Arch::Llama || c.arch == Arch::Mistral);
  const bool longrope = type == "longrope" && c.arch == Arch::Phi3;
  const bool yarn = type == "yarn" && c.arch == Arch::GptOss;
  RUNLM_CHECK(type == "linear" || llama3 || longrope || yarn, "%s: %s type '%s' is not supported for %s (supported: "
              "default, linear%s)", src.c_str(), key, type.c_str(), c.architecture.c_str(),
              c.arch == Arch::Llama || c.arch == Arch::Mistral ? ", llama3"
              : c.arch == Arch::Phi3                           ? ", longrope"
              : c.arch == Arch::GptOss                         ? ", yarn"
                                                               : "");
  c.rope_scaling_type = type;
  if (member(s, "original_max_position_embeddings"))
    c.rope_scaling_original_context = positive(s, "original_max_position_embeddings", src);
  if (yarn) {
    // transformers takes the factor as max_position_embeddings / the original
    // context when both are given, llama.cpp's converter the factor key:
    // they must agree. Its attention factor keys replace get_mscale(factor),
    // which llama.cpp's GGUF cannot say.
    RUNLM_CHECK(c.rope_scaling_original_context > 0, "%s: %s: yarn needs original_max_position_embeddings",
                src.c_str(), key);
    c.rope_scaling_factor = number(s, "factor", src, 0.0);
    const double implied = double(c.max_position_embeddings) / double(c.rope_scaling_original_context);
    RUNLM_CHECK(c.rope_scaling_factor > 0 && std::abs(c.rope_scaling_factor - implied) <= 1e-6 * implied,
                "%s: %s: yarn factor %g differs from max_position_embeddings / original_max_position_embeddings = "
                "%lld / %lld; not supported", src.c_str(), key, c.rope_scaling_factor,
                static_cast<long long>(c.max_position_embeddings),
                static_cast<long long>(c.rope_scaling_original_context));
    for (const char* k : {"attention_factor", "mscale", "mscale_all_dim"})
      RUNLM_CHECK(!member(s, k), "%s: %s: yarn %s is not supported", src.c_str(), key, k);
    c.yarn_beta_fast = number(s, "beta_fast", src, 32.0);
    c.yarn_beta_slow = number(s, "beta_slow", src, 1.0);
    RUNLM_CHECK(c.yarn_beta_fast > 0 && c.yarn_beta_slow > 0, "%s: %s: yarn beta_fast and beta_slow must be positive",
                src.c_str(), key);
    c.yarn_truncate = flag(s, "truncate", src, true);
    return;
  }
  if (longrope) {
    auto factors = [&](const char* k) {
      const json* f = member(s, k);
      RUNLM_CHECK(f && f->is_array(), "%s: %s: longrope needs %s", src.c_str(), key, k);
      std::vector<float> v;
      for (const json& e : *f) {
        RUNLM_CHECK(e.is_number() && e.get<double>() > 0, "%s: %s.%s has %s", src.c_str(), key, k, json_brief(e).c_str());
        v.push_back(static_cast<float>(e.get<double>()));
      }
      return v;
    };
    c.longrope_long = factors("long_factor");
    c.longrope_short = factors("short_factor");
    RUNLM_CHECK(c.rope_scaling_original_context > 0, "%s: %s: longrope needs original_max_position_embeddings",
                src.c_str(), key);
    return;
  }
  c.rope_scaling_factor = number(s, "factor", src, llama3 ? 8.0 : 0.0);
  RUNLM_CHECK(c.rope_scaling_factor > 0, "%s: %s: %s scaling needs a positive factor", src.c_str(), key, type.c_str());
  if (llama3) {
    c.llama3_low_freq_factor = number(s, "low_freq_factor", src, 1.0);
    c.llama3_high_freq_factor = number(s, "high_freq_factor", src, 4.0);
    RUNLM_CHECK(c.llama3_high_freq_factor != c.llama3_low_freq_factor, "%s: %s: low and high freq factors are equal",
                src.c_str(), key);
    if (c.rope_scaling_original_context == 0) c.rope_scaling_original_context = 8192;
  }
}

// The experts of a mixture-of-experts config, with transformers' defaults
// (MixtralConfig 8 experts, 2 used; Qwen3MoeConfig 128, 8, 768 wide;
// GptOssConfig 128, 4). Options runlm's layer does not have are errors.
void read_experts(const json& j, const std::string& src, HfConfig& c) {
  const bool qwen = c.arch == Arch::Qwen3Moe, oss = c.arch == Arch::GptOss;
  const int64_t dflt_experts = qwen || oss ? 128 : 8, dflt_used = qwen ? 8 : oss ? 4 : 2;
  c.n_expert = positive(j, member(j, "num_experts") && !member(j, "num_local_experts") ? "num_experts"
                                                                                       : "num_local_experts",
                        src, dflt_experts);
  c.n_expert_used = positive(j, member(j, "experts_per_token") && !member(j, "num_experts_per_tok")
                                    ? "experts_per_token" : "num_experts_per_tok",
                             src, dflt_used);
  RUNLM_CHECK(c.n_expert_used <= c.n_expert, "%s: num_experts_per_tok %lld exceeds the %lld experts", src.c_str(),
              static_cast<long long>(c.n_expert_used), static_cast<long long>(c.n_expert));
  c.expert_intermediate_size = qwen ? positive(j, "moe_intermediate_size", src, 768) : c.intermediate_size;
  if (qwen) {
    c.norm_topk_prob = flag(j, "norm_topk_prob", src, false);
    // Every layer must be a mixture of experts: runlm's qwen3moe has no dense FFN layers.
    RUNLM_CHECK(positive(j, "decoder_sparse_step", src, 1) == 1, "%s: decoder_sparse_step other than 1 (dense "
                "layers among the expert layers) is not supported", src.c_str());
    const json* dense = member(j, "mlp_only_layers");
    RUNLM_CHECK(!dense || (dense->is_array() && dense->empty()), "%s: mlp_only_layers %s (dense layers among the "
                "expert layers) is not supported", src.c_str(), dense ? json_brief(*dense).c_str() : "");
    RUNLM_CHECK(!member(j, "shared_expert_intermediate_size"), "%s: shared_expert_intermediate_size (a shared "
                "expert) is not part of Qwen3MoeForCausalLM", src.c_str());
  }
  if (oss) {
    RUNLM_CHECK(number(j, "swiglu_limit", src, kGptOssSwigluLimit) == kGptOssSwigluLimit,
                "%s: swiglu_limit %g is not supported (runlm's, as llama.cpp's, is %g)", src.c_str(),
                number(j, "swiglu_limit", src, 0), kGptOssSwigluLimit);
    RUNLM_CHECK(number(j, "swiglu_alpha", src, kGptOssSwigluAlpha) == kGptOssSwigluAlpha,
                "%s: swiglu_alpha %g is not supported (runlm's, as llama.cpp's, is %g)", src.c_str(),
                number(j, "swiglu_alpha", src, 0), kGptOssSwigluAlpha);
  }
}

}  // namespace

HfConfig parse_hf_config(const std::string& text, const std::string& src) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("%s: bad JSON: %s", src.c_str(), e.what());
  }
  RUNLM_CHECK(j.is_object(), "%s: not a JSON object", src.c_str());
  HfConfig c;

  const json* archs = member(j, "architectures");
  if (archs && archs->is_array() && archs->size() == 1 && (*archs)[0] == kGemma3MultimodalClass) {
    // The text model alone, as llama.cpp's converter writes it (the vision
    // tower goes to its separate mmproj file).
    const json* text = member(j, "text_config");
    RUNLM_CHECK(text && text->is_object(), "%s: %s without a text_config object", src.c_str(), kGemma3MultimodalClass);
    json t = json::parse(kGemma3TextDefaults);
    for (auto it = text->begin(); it != text->end(); ++it) t[it.key()] = it.value();
    for (const char* key : {"torch_dtype", "quantization_config"})
      if (!t.contains(key) && j.contains(key)) t[key] = j[key];
    t["architectures"] = {"Gemma3ForCausalLM"};
    j = std::move(t);
    archs = member(j, "architectures");
    c.text_of_multimodal = true;
  }
  RUNLM_CHECK(archs && archs->is_array(), "%s: missing architectures (supported: %s)", src.c_str(),
              supported_hf_classes().c_str());
  for (const json& a : *archs) {
    if (!a.is_string() || !c.architecture.empty()) continue;
    if (a.get<std::string>() == kMixtralClass) {
      c.architecture = kMixtralClass;
      c.arch = Arch::Llama;
    } else if (const ArchDesc* d = find_arch_by_hf_class(a.get<std::string>())) {
      c.architecture = d->hf_class;
      c.arch = d->arch;
    }
  }
  RUNLM_CHECK(!c.architecture.empty(), "%s: architectures %s not supported (supported: %s, %s (its text model))",
              src.c_str(), json_brief(*archs).c_str(), supported_hf_classes().c_str(), kGemma3MultimodalClass);
  if (c.text_of_multimodal) c.architecture = kGemma3MultimodalClass;
  // Packed weights are read in one case: gpt-oss's MXFP4 experts, copied as
  // GGUF MXFP4 blocks (as llama.cpp's converter does). Others (GPTQ, AWQ,
  // fp8...) are refused: the unquantized (bf16/f16/f32) checkpoint converts.
  if (const json* q = member(j, "quantization_config")) {
    const json* method = q->is_object() ? member(*q, "quant_method") : nullptr;
    c.mxfp4_experts = c.arch == Arch::GptOss && method && method->is_string() && method->get<std::string>() == "mxfp4";
    RUNLM_CHECK(c.mxfp4_experts,
                "%s: quantized checkpoint (quantization_config quant_method %s) is not supported%s; convert the "
                "unquantized (bf16, f16 or f32) checkpoint",
                src.c_str(), method ? json_brief(*method).c_str() : json_brief(*q).c_str(),
                c.arch == Arch::GptOss ? " (gpt-oss: mxfp4 only)" : " (only gpt-oss's mxfp4 experts are read)");
  }
  const bool mixtral = c.architecture == kMixtralClass;
  const bool mistral = c.architecture == "MistralForCausalLM";
  const bool gemma = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
  if (const json* mt = member(j, "model_type"); mt && mt->is_string()) c.model_type = mt->get<std::string>();

  c.hidden_size = positive(j, "hidden_size", src);
  c.intermediate_size = positive(j, "intermediate_size", src);
  c.num_hidden_layers = positive(j, "num_hidden_layers", src);
  c.num_attention_heads = positive(j, "num_attention_heads", src);
  c.num_key_value_heads = positive(j, "num_key_value_heads", src, c.num_attention_heads);
  c.vocab_size = positive(j, "vocab_size", src);
  if (mixtral || arch_desc(c.arch).moe) read_experts(j, src, c);
  RUNLM_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
              "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", src.c_str(),
              static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads));
  if (member(j, "head_dim")) {
    c.head_dim = positive(j, "head_dim", src);
  } else if (gemma) {
    c.head_dim = 256;  // Gemma2Config / Gemma3TextConfig default
  } else {
    RUNLM_CHECK(c.hidden_size % c.num_attention_heads == 0,
                "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and head_dim is not given",
                src.c_str(), static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // Adjacent-pair RoPE rotates pairs, so the head dimension must be even.
  RUNLM_CHECK(c.head_dim % 2 == 0, "%s: head_dim %lld must be even", src.c_str(), static_cast<long long>(c.head_dim));
  // transformers' defaults: LlamaConfig 2048 positions, MistralConfig and MixtralConfig 4096*32,
  // GptOssConfig 131072, Qwen3MoeConfig 32768.
  c.max_position_embeddings = positive(j, "max_position_embeddings", src,
                                       mistral || mixtral              ? 4096 * 32
                                       : c.arch == Arch::GptOss        ? 131072
                                       : c.arch == Arch::Qwen3Moe      ? 32768
                                                                       : 2048);
  c.rms_norm_eps = number(j, "rms_norm_eps", src, 1e-6);
  RUNLM_CHECK(c.rms_norm_eps > 0, "%s: rms_norm_eps must be positive", src.c_str());
  // transformers' defaults: the Gemma configs tie, the others do not.
  c.tie_word_embeddings = flag(j, "tie_word_embeddings", src, gemma);
  RUNLM_CHECK(c.arch != Arch::Gemma2 || c.tie_word_embeddings,
              "%s: Gemma2 with tie_word_embeddings=false is not supported (llama.cpp's gemma2 always ties)", src.c_str());

  // Rope theta: top level (older form) or inside rope_parameters (newer form).
  c.rope_theta = number(j, "rope_theta", src, c.arch == Arch::GptOss ? kGptOssDefaultTheta : 10000.0);
  if (const json* rp = member(j, "rope_parameters")) {
    RUNLM_CHECK(rp->is_object(), "%s: rope_parameters must be an object", src.c_str());
    // Per layer kind (gemma3): the global layers' parameters, and the local base.
    const json* global = member(*rp, "full_attention");
    if (const json* local = member(*rp, "sliding_attention"); local && local->is_object())
      c.rope_local_theta = number(*local, "rope_theta", src, 10000.0);
    const json& g = global && global->is_object() ? *global : *rp;
    c.rope_theta = number(g, "rope_theta", src, c.rope_theta);
    read_rope_scaling(g, "rope_parameters", src, c);
  }
  if (const json* rs = member(j, "rope_scaling")) read_rope_scaling(*rs, "rope_scaling", src, c);
  RUNLM_CHECK(c.rope_theta > 0, "%s: rope_theta must be positive", src.c_str());
  if (c.arch == Arch::GptOss && !member(j, "rope_scaling") && !member(j, "rope_parameters")) {
    // GptOssConfig's default RoPE: YaRN, factor 32 over 4096 positions, untruncated.
    c.rope_scaling_type = "yarn";
    c.rope_scaling_factor = 32.0;
    c.rope_scaling_original_context = 4096;
    c.yarn_truncate = false;
  }

  if (c.arch == Arch::Gemma3 && member(j, "rope_local_base_freq"))
    c.rope_local_theta = number(j, "rope_local_base_freq", src, 10000.0);
  if (c.arch == Arch::Phi3) {
    c.partial_rotary_factor = number(j, "partial_rotary_factor", src, 1.0);
    RUNLM_CHECK(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1, "%s: partial_rotary_factor %g out of (0, 1]",
                src.c_str(), c.partial_rotary_factor);
  }
  if (gemma) {
    if (member(j, "attn_logit_softcapping")) {
      RUNLM_CHECK(c.arch == Arch::Gemma2, "%s: attn_logit_softcapping is not part of Gemma3", src.c_str());
      c.attn_softcap = number(j, "attn_logit_softcapping", src, 0.0);
    }
    RUNLM_CHECK(c.arch != Arch::Gemma2 || c.attn_softcap, "%s: Gemma2 without attn_logit_softcapping is not supported "
                "(llama.cpp's gemma2 always caps, default 50)", src.c_str());
    if (member(j, "final_logit_softcapping")) c.final_softcap = number(j, "final_logit_softcapping", src, 0.0);
    RUNLM_CHECK(c.arch != Arch::Gemma2 || c.final_softcap, "%s: Gemma2 without final_logit_softcapping is not "
                "supported (llama.cpp's gemma2 always caps, default 30)", src.c_str());
    if (member(j, "query_pre_attn_scalar")) c.query_pre_attn_scalar = number(j, "query_pre_attn_scalar", src, 0.0);
  }

  if (mistral) {
    auto it = j.find("sliding_window");
    if (it == j.end()) c.sliding_window = kMistralDefaultWindow;
    else if (!it->is_null()) c.sliding_window = positive(j, "sliding_window", src);
  } else if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3 || c.arch == Arch::Qwen3Moe) {
    // Qwen keeps a sliding_window value that applies only with use_sliding_window.
    RUNLM_CHECK(!flag(j, "use_sliding_window", src, false), "%s: use_sliding_window=true is not supported for %s",
                src.c_str(), c.architecture.c_str());
  } else if (c.arch == Arch::Gemma2) {
    c.sliding_window = positive(j, "sliding_window", src, 4096);
  } else if (c.arch == Arch::GptOss) {
    RUNLM_CHECK(!j.contains("sliding_window") || !j["sliding_window"].is_null(),
                "%s: GptOssForCausalLM with sliding_window null is not supported", src.c_str());
    c.sliding_window = positive(j, "sliding_window", src, kGptOssDefaultWindow);
  } else if (member(j, "sliding_window")) {
    c.sliding_window = positive(j, "sliding_window", src);
  }
  // Gemma's local/global layers: layer_types (below), else the older
  // integer pattern (every n-th layer global), else the family's default
  // (gemma2 every other layer, gemma3 5 local to 1 global).
  if (gemma && c.sliding_window && !member(j, "layer_types")) {
    const int64_t n = positive(j, "sliding_window_pattern", src, c.arch == Arch::Gemma2 ? 2 : 6);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) c.swa_layers.push_back(l % n < n - 1 ? 1 : 0);
  }
  if (const json* lt = member(j, "layer_types")) {
    RUNLM_CHECK(lt->is_array() && lt->size() == size_t(c.num_hidden_layers),
                "%s: layer_types must be a list of %lld entries, got %s", src.c_str(),
                static_cast<long long>(c.num_hidden_layers), json_brief(*lt).c_str());
    for (const json& e : *lt) {
      const bool sliding = e.is_string() && e.get<std::string>() == "sliding_attention";
      RUNLM_CHECK(sliding || (e.is_string() && e.get<std::string>() == "full_attention"),
                  "%s: layer_types entry %s is not supported (supported: sliding_attention, full_attention)",
                  src.c_str(), json_brief(e).c_str());
      c.swa_layers.push_back(sliding ? 1 : 0);
    }
    const bool any_sliding = std::find(c.swa_layers.begin(), c.swa_layers.end(), 1) != c.swa_layers.end();
    RUNLM_CHECK(!any_sliding || c.sliding_window, "%s: layer_types has sliding_attention layers but no sliding_window",
                src.c_str());
  }
  if (c.arch == Arch::GptOss) {
    // llama.cpp's gpt-oss always alternates, layer 0 sliding, and its
    // converter writes no pattern: any other layer_types would run otherwise there.
    for (size_t l = 0; l < c.swa_layers.size(); ++l)
      RUNLM_CHECK(c.swa_layers[l] == (l % 2 == 0 ? 1 : 0), "%s: layer_types must alternate sliding_attention and "
                  "full_attention from layer 0 for GptOssForCausalLM (layer %zu is not)", src.c_str(), l);
    c.swa_layers.clear();
  }

  // Features the family's layer does not have: refuse rather than drop them.
  // (Qwen2 always has q/k/v biases; the converter checks the tensors.)
  if (c.arch == Arch::GptOss) {
    RUNLM_CHECK(flag(j, "attention_bias", src, true), "%s: attention_bias=false is not supported for %s (its layer "
                "has q/k/v/o biases)", src.c_str(), c.architecture.c_str());
  } else {
    RUNLM_CHECK(c.arch == Arch::Qwen2 || !flag(j, "attention_bias", src, false),
                "%s: attention_bias=true is not supported for %s", src.c_str(), c.architecture.c_str());
  }
  RUNLM_CHECK(!flag(j, "mlp_bias", src, false), "%s: mlp_bias=true is not supported", src.c_str());
  const char* want_act = gemma ? "gelu_pytorch_tanh" : "silu";
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    const json* act = member(j, key);
    if (!act) continue;
    const std::string a = act->is_string() ? act->get<std::string>() : "";
    RUNLM_CHECK(a == want_act || (gemma && a == "gelu_tanh"), "%s: %s %s is not supported for %s (supported: %s)",
                src.c_str(), key, json_brief(*act).c_str(), c.architecture.c_str(), want_act);
  }
  for (const char* key : {"torch_dtype", "dtype"})
    if (const json* d = member(j, key); d && d->is_string()) c.torch_dtype = d->get<std::string>();
  return c;
}

HfConfig read_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RUNLM_CHECK(in, "%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hf_config(ss.str(), path);
}

}  // namespace runlm
