// llama2.c and Hugging Face checkpoints to GGUF (see convert.h). Both build
// the tensor list from llama_tensor_specs() and map each GGUF tensor to its
// source rows; the rows are converted in parallel while the writer streams
// one tensor at a time, so memory stays at one tensor whatever the model.
#include "convert.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common.h"
#include "gguf.h"
#include "hf_bpe_vocab.h"
#include "hf_config.h"
#include "hf_moe_tensors.h"
#include "mapped_file.h"
#include "quantize.h"
#include "safetensors.h"

namespace runlm {

namespace {

constexpr int kLlama2cHeaderInts = 7;
constexpr size_t kLlama2cHeaderBytes = kLlama2cHeaderInts * sizeof(int32_t);
// llama2.c's newer "version 1+" export starts with this magic ("ak42").
constexpr uint32_t kLlama2cV1Magic = 0x616b3432;
constexpr float kLlama2cRopeTheta = 10000.0f;
constexpr float kLlama2cRmsEps = 1e-5f;

DType output_type(std::optional<DType> type, DType dflt) {
  const DType t = type.value_or(dflt);
  RUNLM_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16,
              "convert writes f32, f16 or bf16, not %s; run `runlm quantize` on the result for %s", dtype_name(t),
              dtype_name(t));
  return t;
}

std::string path_stem(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  const size_t slash = s.rfind('/');
  if (slash != std::string::npos) s = s.substr(slash + 1);
  const size_t dot = s.rfind('.');
  if (dot != std::string::npos && dot > 0) s = s.substr(0, dot);
  return s;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RUNLM_CHECK(in, "%s: cannot open", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Running total of float counts for the llama2.c layout, overflow-checked.
class SectionLayout {
 public:
  explicit SectionLayout(const std::string& path) : path_(path) {}
  // Adds a section of a*b*c floats; returns its start (in floats).
  uint64_t add(const char* what, uint64_t a, uint64_t b, uint64_t c = 1) {
    uint64_t n = 0;
    RUNLM_CHECK(!mul_overflows(a, b, &n) && !mul_overflows(n, c, &n) && !add_overflows(total_, n, &n),
                "%s: size of %s overflows; the header is corrupt", path_.c_str(), what);
    const uint64_t start = total_;
    total_ = n;
    return start;
  }
  uint64_t total() const { return total_; }

 private:
  const std::string& path_;
  uint64_t total_ = 0;
};

// The tensors a writer produces from a spec list: each spec gets a row source
// and is encoded to its chosen type (norms f32, the rest `type`).
struct Emitter {
  GgufWriter& w;
  DType type;
  ConvertResult& result;

  // Rows of ne[0] values: every dimension after the first.
  static int64_t n_rows_of(const LlamaTensorSpec& spec) {
    int64_t n = 1;
    for (size_t i = 1; i < spec.ne.size(); ++i) n *= spec.ne[i];
    return n;
  }

  void add(const LlamaTensorSpec& spec, RowSource rows) {
    const DType t = choose_tensor_type(quant_target_for_type(type), spec.name, spec.ne, QuantModelInfo{}, true).type;
    const int64_t n_cols = spec.ne[0], n_rows = n_rows_of(spec);
    w.add_tensor(spec.name, t, spec.ne, [t, n_cols, n_rows, rows = std::move(rows)](uint8_t* dst) {
      encode_rows_parallel(t, n_cols, n_rows, rows, dst);
    });
    result.n_params += n_cols * n_rows;
    ++result.n_tensors;
  }

  // A tensor copied in its packed type (t), row by row, whatever the output type.
  void add_packed(const LlamaTensorSpec& spec, DType t, ByteRowSource rows) {
    const int64_t n_cols = spec.ne[0], n_rows = n_rows_of(spec);
    const size_t row_bytes = dtype_row_bytes(t, n_cols);
    w.add_tensor(spec.name, t, spec.ne, [n_rows, row_bytes, rows = std::move(rows)](uint8_t* dst) {
      for (int64_t r = 0; r < n_rows; ++r) rows(r, dst + static_cast<size_t>(r) * row_bytes);
    });
    result.n_params += n_cols * n_rows;
    ++result.n_tensors;
  }
};

}  // namespace

int64_t rope_unpermute_source_row(int64_t row, int64_t n_rows, int64_t n_head) {
  const int64_t head_dim = n_rows / n_head;
  const int64_t h = row / head_dim, i = row % head_dim;
  return h * head_dim + (i % 2) * (head_dim / 2) + i / 2;
}

// ---- llama2.c ---------------------------------------------------------------

ConvertResult convert_llama2c(const std::string& bin_path, const std::string& tokenizer_model,
                              const std::string& out_path, std::optional<DType> type) {
  ConvertResult result;
  result.type = output_type(type, DType::F32);
  RUNLM_CHECK(!tokenizer_model.empty(), "%s: a llama2.c checkpoint has no vocabulary; a tokenizer.model is required",
              bin_path.c_str());
  const MappedFile file(bin_path);
  const char* p = bin_path.c_str();
  RUNLM_CHECK(file.size() >= kLlama2cHeaderBytes, "%s: %zu bytes is too small for the llama2.c header", p, file.size());
  int32_t h[kLlama2cHeaderInts];
  std::memcpy(h, file.data(), sizeof(h));
  RUNLM_CHECK(static_cast<uint32_t>(h[0]) != kLlama2cV1Magic,
              "%s: llama2.c version-1 export (magic 'ak42') is not supported; export with the legacy format", p);
  const int32_t dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4], vocab_raw = h[5],
                seq_len = h[6];
  RUNLM_CHECK(dim > 0 && hidden > 0 && n_layers > 0 && n_heads > 0 && n_kv > 0 && vocab_raw != 0 &&
                  vocab_raw != INT32_MIN && seq_len > 0,
              "%s: bad llama2.c header (dim=%d hidden_dim=%d n_layers=%d n_heads=%d n_kv_heads=%d vocab_size=%d "
              "seq_len=%d)",
              p, dim, hidden, n_layers, n_heads, n_kv, vocab_raw, seq_len);
  RUNLM_CHECK(dim % n_heads == 0 && n_heads % n_kv == 0 && (dim / n_heads) % 2 == 0,
              "%s: bad llama2.c header: dim=%d, n_heads=%d, n_kv_heads=%d do not give an even head size shared by "
              "the kv heads",
              p, dim, n_heads, n_kv);
  const bool tied = vocab_raw > 0;
  const uint64_t vocab = static_cast<uint64_t>(tied ? vocab_raw : -static_cast<int64_t>(vocab_raw));
  const uint64_t head_size = static_cast<uint64_t>(dim / n_heads);
  const uint64_t kv_dim = head_size * static_cast<uint64_t>(n_kv);
  const uint64_t D = static_cast<uint64_t>(dim), H = static_cast<uint64_t>(hidden), L = static_cast<uint64_t>(n_layers);

  SectionLayout lay(bin_path);
  std::map<TensorRole, uint64_t> start;  // float offset of each array
  start[TensorRole::TokenEmbd] = lay.add("token_embedding", vocab, D);
  start[TensorRole::AttnNorm] = lay.add("rms_att", L, D);
  start[TensorRole::AttnQ] = lay.add("wq", L, D, D);
  start[TensorRole::AttnK] = lay.add("wk", L, kv_dim, D);
  start[TensorRole::AttnV] = lay.add("wv", L, kv_dim, D);
  start[TensorRole::AttnOut] = lay.add("wo", L, D, D);
  start[TensorRole::FfnNorm] = lay.add("rms_ffn", L, D);
  start[TensorRole::FfnGate] = lay.add("w1", L, H, D);
  start[TensorRole::FfnDown] = lay.add("w2", L, D, H);
  start[TensorRole::FfnUp] = lay.add("w3", L, H, D);
  start[TensorRole::OutputNorm] = lay.add("rms_final", D, 1);
  lay.add("freq_cis", static_cast<uint64_t>(seq_len), head_size);  // real + imag, head_size/2 each: unused
  if (!tied) start[TensorRole::Output] = lay.add("wcls", vocab, D);
  uint64_t expect = 0;
  RUNLM_CHECK(!mul_overflows(lay.total(), sizeof(float), &expect) &&
                  !add_overflows(expect, kLlama2cHeaderBytes, &expect),
              "%s: header sizes overflow", p);
  RUNLM_CHECK(file.size() == expect,
              "%s: file is %zu bytes but the header (dim=%d hidden_dim=%d n_layers=%d n_heads=%d n_kv_heads=%d "
              "vocab_size=%d seq_len=%d) implies %llu",
              p, file.size(), dim, hidden, n_layers, n_heads, n_kv, vocab_raw, seq_len,
              static_cast<unsigned long long>(expect));

  LlamaHParams& hp = result.hparams;
  hp.name = path_stem(bin_path);
  hp.context_length = seq_len;
  hp.dim = dim;
  hp.hidden_dim = hidden;
  hp.n_layers = n_layers;
  hp.n_heads = n_heads;
  hp.n_kv_heads = n_kv;
  hp.head_dim = static_cast<int64_t>(head_size);
  hp.vocab_size = static_cast<int64_t>(vocab);
  hp.rms_eps = kLlama2cRmsEps;
  hp.rope_theta = kLlama2cRopeTheta;
  hp.tied_embeddings = tied;

  GgufWriter w;
  write_llama_hparams(w, hp, llama_ftype_for(result.type));
  write_llama_tokenizer(w, tokenizer_model, hp.vocab_size);

  // Header then floats: 28 bytes in, so every array is 4-byte aligned in the mapping.
  const uint8_t* weights = file.data() + kLlama2cHeaderBytes;
  Emitter emit{w, result.type, result};
  for (const LlamaTensorSpec& spec : llama_tensor_specs(hp)) {
    const int64_t n_cols = spec.ne[0];
    int64_t per_layer = 1;
    for (int64_t d : spec.ne) per_layer *= d;
    const uint64_t first = start.at(spec.role) + (spec.layer >= 0 ? static_cast<uint64_t>(spec.layer * per_layer) : 0);
    const uint8_t* base = weights + first * sizeof(float);
    emit.add(spec, [base, n_cols](int64_t r, float* buf) {
      std::memcpy(buf, base + static_cast<size_t>(r * n_cols) * sizeof(float), static_cast<size_t>(n_cols) * sizeof(float));
    });
  }
  w.write(out_path, stderr_progress("convert"));
  return result;
}

// ---- Hugging Face ---------------------------------------------------------

namespace {

// HF name of a GGUF tensor, the head count whose rotate_half layout must
// be undone (0: none), and what to add to every value (Gemma's RMSNorm
// weights are stored as w - 1 and applied as 1 + w; llama.cpp's converter
// stores 1 + w).
struct HfSource {
  std::string name;
  int64_t permute_heads = 0;
  float add = 0.0f;
};

HfSource hf_source(const LlamaTensorSpec& s, const LlamaHParams& hp) {
  const std::string layer = strfmt("model.layers.%d.", s.layer);
  const bool gemma = hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3;
  // Only the adjacent-pair layout needs q and k rows reordered.
  const bool adjacent = arch_desc(hp.arch).rope_style == RopeStyle::Adjacent;
  const float norm_add = gemma ? 1.0f : 0.0f;
  switch (s.role) {
    case TensorRole::TokenEmbd: return {"model.embed_tokens.weight"};
    case TensorRole::OutputNorm: return {"model.norm.weight", 0, norm_add};
    case TensorRole::Output: return {"lm_head.weight"};
    case TensorRole::AttnNorm: return {layer + "input_layernorm.weight", 0, norm_add};
    case TensorRole::AttnQ: return {layer + "self_attn.q_proj.weight", adjacent ? hp.n_heads : 0};
    case TensorRole::AttnK: return {layer + "self_attn.k_proj.weight", adjacent ? hp.n_kv_heads : 0};
    case TensorRole::AttnV: return {layer + "self_attn.v_proj.weight"};
    case TensorRole::AttnOut: return {layer + "self_attn.o_proj.weight"};
    case TensorRole::AttnOutBias: return {layer + "self_attn.o_proj.bias"};
    case TensorRole::AttnSinks: return {layer + "self_attn.sinks"};
    case TensorRole::AttnQkv: return {layer + "self_attn.qkv_proj.weight"};
    case TensorRole::AttnQBias: return {layer + "self_attn.q_proj.bias"};
    case TensorRole::AttnKBias: return {layer + "self_attn.k_proj.bias"};
    case TensorRole::AttnVBias: return {layer + "self_attn.v_proj.bias"};
    case TensorRole::AttnQNorm: return {layer + "self_attn.q_norm.weight", 0, norm_add};
    case TensorRole::AttnKNorm: return {layer + "self_attn.k_norm.weight", 0, norm_add};
    case TensorRole::AttnPostNorm: return {layer + "post_attention_layernorm.weight", 0, norm_add};
    case TensorRole::FfnNorm:
      return {layer + (gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"), 0, norm_add};
    case TensorRole::FfnPostNorm: return {layer + "post_feedforward_layernorm.weight", 0, norm_add};
    case TensorRole::FfnGate: return {layer + "mlp.gate_proj.weight"};
    case TensorRole::FfnUp: return {layer + (hp.fused_gate_up ? "mlp.gate_up_proj.weight" : "mlp.up_proj.weight")};
    case TensorRole::FfnDown: return {layer + "mlp.down_proj.weight"};
    case TensorRole::RopeFreqs:
    case TensorRole::RopeFactorsLong:
    case TensorRole::RopeFactorsShort: return {""};  // computed from config.json
    default: break;  // the mixture-of-experts roles: hf_moe_rows
  }
  fail("unknown tensor role for %s", s.name.c_str());
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The chat template as llama.cpp's converter finds it (gguf-py's
// SpecialVocab): tokenizer_config.json's chat_template (a string, or the
// entry named "default" of a list), else chat_template.jinja, else
// chat_template.json's chat_template (processor-based checkpoints).
std::string read_chat_template(const std::string& dir) {
  auto parse = [](const std::string& path) {
    try {
      return nlohmann::json::parse(read_text(path));
    } catch (const nlohmann::json::exception& e) {
      fail("%s: bad JSON: %s", path.c_str(), e.what());
    }
  };
  const std::string config = dir + "/tokenizer_config.json";
  if (is_regular_file(config)) {
    const nlohmann::json j = parse(config);
    const auto ct = j.is_object() ? j.find("chat_template") : j.end();
    if (ct != j.end() && ct->is_string()) return ct->get<std::string>();
    if (ct != j.end() && ct->is_array())
      for (const auto& e : *ct)
        // value() would throw nlohmann's type_error on a non-string name.
        if (e.is_object() && e.contains("name") && e["name"].is_string() && e["name"].get<std::string>() == "default" &&
            e.contains("template") && e["template"].is_string())
          return e["template"].get<std::string>();
  }
  if (is_regular_file(dir + "/chat_template.jinja")) return read_text(dir + "/chat_template.jinja");
  if (is_regular_file(dir + "/chat_template.json")) {
    const nlohmann::json j = parse(dir + "/chat_template.json");
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      return j["chat_template"].get<std::string>();
  }
  return "";
}

// A Gemma3ForConditionalGeneration tensor's name in the text model's
// naming: the language model's tensors under language_model.model. (as
// released) or model.language_model. (as transformers saves it since 4.52)
// become model.; the vision tower's and the projector's are dropped (nullopt);
// any other stays as it is, to be refused as unconvertible if unknown.
std::optional<std::string> multimodal_text_name(const std::string& name) {
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
    if (starts(p)) return std::nullopt;
  if (starts("language_model.model.")) return "model." + name.substr(21);
  if (starts("language_model.lm_head.")) return name.substr(15);
  if (starts("model.language_model.")) return "model." + name.substr(21);
  return name;
}

}  // namespace

ConvertResult convert_hf(const std::string& dir, const std::string& out_path, std::optional<DType> type,
                         const std::string& tokenizer_model) {
  const HfConfig cfg = read_hf_config(dir + "/config.json");
  const auto st = SafetensorsModel::open_dir(dir);
  if (cfg.text_of_multimodal) {
    const size_t n_vision = st->rename(multimodal_text_name);
    std::fprintf(stderr, "%s: %s: the text model; the vision tower and projector (%zu tensors) are left out\n",
                 dir.c_str(), cfg.architecture.c_str(), n_vision);
  }
  const SafetensorsTensor& embed = st->get("model.embed_tokens.weight");

  ConvertResult result;
  result.type = output_type(type, embed.dtype);
  LlamaHParams& hp = result.hparams;
  hp.name = path_stem(dir);
  hp.context_length = cfg.max_position_embeddings;
  hp.dim = cfg.hidden_size;
  hp.hidden_dim = cfg.intermediate_size;
  hp.n_layers = cfg.num_hidden_layers;
  hp.n_heads = cfg.num_attention_heads;
  hp.n_kv_heads = cfg.num_key_value_heads;
  hp.head_dim = cfg.head_dim;
  hp.vocab_size = cfg.vocab_size;
  hp.rms_eps = static_cast<float>(cfg.rms_norm_eps);
  hp.rope_theta = static_cast<float>(cfg.rope_theta);
  hp.rope_scaling_type = cfg.rope_scaling_type;
  hp.rope_scaling_factor = static_cast<float>(cfg.rope_scaling_factor);
  hp.rope_scaling_original_context = cfg.rope_scaling_original_context;
  hp.sliding_window = cfg.sliding_window;
  hp.swa_layers = cfg.swa_layers;
  hp.tied_embeddings = cfg.tie_word_embeddings;
  // The family's layer (models/arch.h), as llama.cpp's converter writes it.
  hp.arch = cfg.arch;
  const ArchDesc& desc = arch_desc(cfg.arch);
  hp.qkv_bias = desc.qkv_bias;
  hp.qk_norm = desc.qk_norm;
  hp.post_norms = desc.post_norms;
  hp.fused_qkv = desc.fused_qkv;
  hp.fused_gate_up = desc.fused_gate_up;
  hp.n_expert = cfg.n_expert;
  hp.n_expert_used = cfg.n_expert_used;
  hp.expert_hidden_dim = cfg.expert_intermediate_size;
  // transformers' Qwen3-MoE renormalises the chosen experts' weights only
  // with norm_topk_prob; llama.cpp's default is to renormalise.
  if (cfg.norm_topk_prob) hp.expert_weights_norm = *cfg.norm_topk_prob;
  if (cfg.rope_scaling_type == "yarn") {
    // llama.cpp's defaults (32, 1) are not written, as its converter does not.
    if (cfg.yarn_beta_fast != 32.0) hp.yarn_beta_fast = static_cast<float>(cfg.yarn_beta_fast);
    if (cfg.yarn_beta_slow != 1.0) hp.yarn_beta_slow = static_cast<float>(cfg.yarn_beta_slow);
    // ggml rounds the correction range down and up; transformers with
    // truncate false does not. llama.cpp's GGUF has no key for it, so the
    // file runs as llama.cpp runs it, a little off transformers' angles.
    if (!cfg.yarn_truncate)
      std::fprintf(stderr, "%s: rope_scaling truncate=false: runlm and llama.cpp round the YaRN correction range "
                   "(truncate=true); the rotation angles differ slightly from transformers'\n", dir.c_str());
  }
  if (cfg.rope_scaling_type == "llama3") {
    hp.rope_scaling_type.clear();  // carried by rope_freqs.weight alone
    hp.rope_freqs = llama3_rope_freqs(hp.rope_theta, hp.head_dim, cfg.rope_scaling_factor, cfg.llama3_low_freq_factor,
                                      cfg.llama3_high_freq_factor, static_cast<double>(cfg.rope_scaling_original_context));
  }
  if (cfg.arch == Arch::Phi3) {
    // As llama.cpp's converter: int(partial_rotary_factor * hidden_size) // heads.
    hp.n_rot = static_cast<int64_t>(cfg.partial_rotary_factor * static_cast<double>(cfg.hidden_size)) /
               cfg.num_attention_heads;
    if (cfg.rope_scaling_type == "longrope") {
      hp.rope_long = cfg.longrope_long;
      hp.rope_short = cfg.longrope_short;
      const double scale = static_cast<double>(cfg.max_position_embeddings) / cfg.rope_scaling_original_context;
      // llama.cpp's converter: sqrt(1 + ln(scale) / ln(original context)) when scale > 1.
      const double orig = static_cast<double>(cfg.rope_scaling_original_context);
      hp.rope_attn_factor = scale > 1.0 ? static_cast<float>(std::sqrt(1 + std::log(scale) / std::log(orig))) : 1.0f;
      RUNLM_CHECK(int64_t(hp.rope_long.size()) == hp.n_rot / 2 && int64_t(hp.rope_short.size()) == hp.n_rot / 2,
                  "%s: longrope factors have %zu and %zu values, expected %lld", dir.c_str(), hp.rope_long.size(),
                  hp.rope_short.size(), static_cast<long long>(hp.n_rot / 2));
    }
  }
  if (cfg.arch == Arch::Gemma2) hp.attn_softcap = static_cast<float>(*cfg.attn_softcap);
  if (cfg.final_softcap) hp.final_softcap = static_cast<float>(*cfg.final_softcap);
  if (cfg.arch == Arch::Gemma3) hp.rope_freq_base_swa = static_cast<float>(cfg.rope_local_theta.value_or(10000.0));
  if (cfg.query_pre_attn_scalar) {
    // llama.cpp derives the scale from the shape (models/arch.h); a checkpoint
    // whose scalar says otherwise would run differently there and here.
    const double implied = desc.scale_by_dim_per_head_layers == cfg.num_hidden_layers
                               ? static_cast<double>(cfg.hidden_size / cfg.num_attention_heads)
                               : static_cast<double>(cfg.head_dim);
    RUNLM_CHECK(*cfg.query_pre_attn_scalar == implied,
                "%s: query_pre_attn_scalar %g differs from the %g the GGUF's shape implies; not supported",
                dir.c_str(), *cfg.query_pre_attn_scalar, implied);
  }
  RUNLM_CHECK(hp.tied_embeddings || st->find("lm_head.weight"),
              "%s: tie_word_embeddings is false but tensor 'lm_head.weight' is missing", dir.c_str());
  // config.json sizes are checked against the tensors before anything is
  // built from them: a vocab_size of 2e9 would otherwise pad the vocabulary
  // to 2e9 entries, and num_hidden_layers of 2e9 list 2e9 layers of tensors.
  RUNLM_CHECK(embed.shape == std::vector<int64_t>({cfg.vocab_size, cfg.hidden_size}),
              "%s: tensor 'model.embed_tokens.weight' has shape %s, expected [%lld, %lld] (vocab_size, hidden_size "
              "in config.json)",
              embed.file.c_str(), shape_str(embed.shape).c_str(), static_cast<long long>(cfg.vocab_size),
              static_cast<long long>(cfg.hidden_size));
  const std::string last_layer = strfmt("model.layers.%lld.input_layernorm.weight",
                                        static_cast<long long>(cfg.num_hidden_layers - 1));
  RUNLM_CHECK(st->find(last_layer), "%s: config.json has num_hidden_layers=%lld but tensor '%s' is missing",
              dir.c_str(), static_cast<long long>(cfg.num_hidden_layers), last_layer.c_str());
  // Every layer has its input_layernorm: at least that many tensors, then
  // each one present (the count first bounds the loop by the file).
  const int64_t n_tensors = static_cast<int64_t>(st->names().size());
  RUNLM_CHECK(n_tensors >= cfg.num_hidden_layers,
              "%s: config.json has num_hidden_layers=%lld but the checkpoint holds only %lld tensors", dir.c_str(),
              static_cast<long long>(cfg.num_hidden_layers), static_cast<long long>(n_tensors));
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string norm = strfmt("model.layers.%lld.input_layernorm.weight", static_cast<long long>(l));
    RUNLM_CHECK(st->find(norm), "%s: config.json has num_hidden_layers=%lld but tensor '%s' is missing", dir.c_str(),
                static_cast<long long>(cfg.num_hidden_layers), norm.c_str());
  }

  // The vocabulary: a sentencepiece tokenizer.model, else a byte-level BPE
  // tokenizer.json (src/hf_bpe_vocab.h).
  const std::string tok_path = tokenizer_model.empty() ? dir + "/tokenizer.model" : tokenizer_model;
  const bool spm = is_regular_file(tok_path);
  RUNLM_CHECK(spm || (tokenizer_model.empty() && is_regular_file(dir + "/tokenizer.json")),
              "%s: tokenizer '%s' not found (nor tokenizer.json); pass --tokenizer PATH/tokenizer.model", dir.c_str(),
              tok_path.c_str());

  GgufWriter w;
  write_llama_hparams(w, hp, llama_ftype_for(result.type));
  if (spm) {
    write_llama_tokenizer(w, tok_path, hp.vocab_size, read_chat_template(dir), /*pad_to_vocab=*/true);
    // llama.cpp's gemma converters: no dummy-prefix space.
    if (hp.arch == Arch::Gemma2 || hp.arch == Arch::Gemma3) w.set_bool("tokenizer.ggml.add_space_prefix", false);
  } else {
    write_bpe_vocab(w, dir, cfg, hp.vocab_size, read_chat_template(dir));
  }

  std::map<std::string, bool> used;
  Emitter emit{w, result.type, result};
  for (const LlamaTensorSpec& spec : llama_tensor_specs(hp)) {
    if (is_moe_role(spec.role)) {
      std::vector<std::string> read;
      if (is_mxfp4_expert_role(cfg, spec.role))
        emit.add_packed(spec, DType::MXFP4, hf_mxfp4_expert_rows(*st, cfg, spec, read));
      else
        emit.add(spec, hf_moe_rows(*st, cfg, spec, read));
      for (const std::string& name : read) used[name] = true;
      continue;
    }
    const HfSource src = hf_source(spec, hp);
    if (src.name.empty()) {  // RoPE factors computed from config.json
      const std::vector<float>& v = spec.role == TensorRole::RopeFreqs         ? hp.rope_freqs
                                    : spec.role == TensorRole::RopeFactorsLong ? hp.rope_long
                                                                               : hp.rope_short;
      emit.add(spec, [v](int64_t, float* buf) { std::copy(v.begin(), v.end(), buf); });
      continue;
    }
    const SafetensorsTensor& t = st->get(src.name);
    // safetensors shapes are row-major [rows, cols]; GGUF ne is [cols, rows].
    const std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    RUNLM_CHECK(ne == spec.ne, "%s: tensor '%s' has shape %s, expected %s from config.json", t.file.c_str(),
                src.name.c_str(), shape_str(t.shape).c_str(),
                shape_str(std::vector<int64_t>(spec.ne.rbegin(), spec.ne.rend())).c_str());
    used[src.name] = true;
    const int64_t n_cols = spec.ne[0], n_rows = t.n_rows();
    const int64_t heads = src.permute_heads;
    RUNLM_CHECK(heads == 0 || n_rows % (2 * heads) == 0, "%s: tensor '%s': %lld rows do not split into %lld heads",
                t.file.c_str(), src.name.c_str(), static_cast<long long>(n_rows), static_cast<long long>(heads));
    const SafetensorsTensor* tp = &t;
    const float add = src.add;
    emit.add(spec, [tp, n_cols, n_rows, heads, add](int64_t r, float* buf) {
      const int64_t src_row = heads ? rope_unpermute_source_row(r, n_rows, heads) : r;
      tp->read_f32(src_row * n_cols, n_cols, buf);
      if (add != 0.0f)
        for (int64_t i = 0; i < n_cols; ++i) buf[i] += add;
    });
  }
  // Unconverted weights would silently change the model: refuse them, except
  // buffers transformers recomputes anyway and an lm_head copy of a tied embedding.
  for (const std::string& name : st->names()) {
    if (used.count(name)) continue;
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    if (hp.tied_embeddings && name == "lm_head.weight") continue;  // gemma2 included, as llama.cpp skips it
    fail("%s: tensor '%s' is not part of a %s and cannot be converted", dir.c_str(), name.c_str(),
         cfg.architecture.c_str());
  }
  w.write(out_path, stderr_progress("convert"));
  return result;
}

}  // namespace runlm
