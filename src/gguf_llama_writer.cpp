// Shared GGUF writing for Llama models (see gguf_llama_writer.h).
#include "gguf_llama_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "common.h"
#include "gguf.h"
#include "mapped_file.h"
#include "tokenizer.h"

namespace runlm {

namespace {

// Types of GGUF metadata this module writes; u32 as llama.cpp writes them.
void set_u32_checked(GgufWriter& w, const std::string& key, int64_t v) {
  RUNLM_CHECK(v >= 0 && v <= UINT32_MAX, "%s = %lld does not fit in u32", key.c_str(), static_cast<long long>(v));
  w.set_u32(key, static_cast<uint32_t>(v));
}

// sentencepiece piece type "unknown".
constexpr int kTokenTypeUnknown = 2;
constexpr int kTokenTypeUnused = 5;
// Score llama.cpp gives its "[PAD<i>]" filler tokens.
constexpr float kPadScore = -1000.0f;

// ---- minimal protobuf reader ---------------------------------------------
// Just enough of the wire format to skip every field and descend into one
// embedded message: varints, fixed 32/64-bit and length-delimited fields.
class ProtoReader {
 public:
  ProtoReader(const uint8_t* p, size_t n, const std::string& src) : p_(p), end_(p + n), src_(src) {}
  bool done() const { return p_ == end_; }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      RUNLM_CHECK(p_ < end_, "%s: truncated protobuf varint", src_.c_str());
      const uint8_t b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("%s: protobuf varint longer than 10 bytes", src_.c_str());
  }
  // Returns the bytes of a length-delimited field and steps over them.
  std::pair<const uint8_t*, size_t> bytes() {
    const uint64_t n = varint();
    RUNLM_CHECK(n <= static_cast<uint64_t>(end_ - p_), "%s: protobuf field of %llu bytes runs past the end",
                src_.c_str(), static_cast<unsigned long long>(n));
    const uint8_t* start = p_;
    p_ += n;
    return {start, static_cast<size_t>(n)};
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: varint(); return;
      case 1: advance(8); return;
      case 2: bytes(); return;
      case 5: advance(4); return;
      default: fail("%s: unsupported protobuf wire type %u", src_.c_str(), wire_type);
    }
  }

 private:
  void advance(size_t n) {
    RUNLM_CHECK(n <= static_cast<size_t>(end_ - p_), "%s: truncated protobuf field", src_.c_str());
    p_ += n;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& src_;
};

// Field numbers from sentencepiece_model.proto.
constexpr uint32_t kModelProtoNormalizerSpec = 3;
constexpr uint32_t kNormalizerAddDummyPrefix = 3;
constexpr uint32_t kNormalizerRemoveExtraWhitespaces = 4;
constexpr uint32_t kWireVarint = 0;
constexpr uint32_t kWireBytes = 2;

}  // namespace

void validate_llama_hparams(const LlamaHParams& hp, const std::string& src) {
  const char* s = src.c_str();
  auto positive = [&](int64_t v, const char* what) {
    RUNLM_CHECK(v > 0 && v < (int64_t{1} << 31), "%s: %s = %lld must be positive", s, what, static_cast<long long>(v));
  };
  positive(hp.context_length, "context length");
  positive(hp.dim, "dim");
  positive(hp.hidden_dim, "hidden dim");
  const ArchDesc& desc = arch_desc(hp.arch);
  RUNLM_CHECK(!desc.moe || hp.n_expert > 0, "%s: %s needs experts", s, desc.gguf_name);
  RUNLM_CHECK(hp.n_expert == 0 || desc.moe || hp.arch == Arch::Llama, "%s: %s has no experts", s, desc.gguf_name);
  if (hp.n_expert > 0) {
    positive(hp.n_expert_used, "experts used");
    positive(hp.expert_hidden_dim, "expert hidden dim");
    RUNLM_CHECK(hp.n_expert_used <= hp.n_expert, "%s: %lld experts used of %lld", s,
                static_cast<long long>(hp.n_expert_used), static_cast<long long>(hp.n_expert));
    RUNLM_CHECK(hp.arch != Arch::Llama || hp.expert_hidden_dim == hp.hidden_dim,
                "%s: llama's experts are feed_forward_length wide", s);
  }
  positive(hp.n_layers, "layers");
  positive(hp.n_heads, "heads");
  positive(hp.n_kv_heads, "kv heads");
  positive(hp.head_dim, "head dim");
  positive(hp.vocab_size, "vocab size");
  RUNLM_CHECK(hp.n_heads % hp.n_kv_heads == 0, "%s: heads %lld is not a multiple of kv heads %lld", s,
              static_cast<long long>(hp.n_heads), static_cast<long long>(hp.n_kv_heads));
  RUNLM_CHECK(hp.head_dim % 2 == 0, "%s: head dim %lld must be even for RoPE", s, static_cast<long long>(hp.head_dim));
  RUNLM_CHECK(hp.rms_eps > 0 && hp.rope_theta > 0, "%s: rms eps and rope theta must be positive", s);
  RUNLM_CHECK(hp.rope_scaling_type.empty() ||
                  ((hp.rope_scaling_type == "linear" || hp.rope_scaling_type == "yarn") && hp.rope_scaling_factor > 0) ||
                  (hp.rope_scaling_type == "longrope" && hp.arch == Arch::Phi3),
              "%s: rope scaling '%s' (factor %g) not supported (supported: linear or yarn with a positive factor; "
              "longrope for phi3)", s, hp.rope_scaling_type.c_str(), hp.rope_scaling_factor);
  const int64_t n_rot = hp.n_rot ? hp.n_rot : hp.head_dim;
  RUNLM_CHECK(n_rot > 0 && n_rot <= hp.head_dim && n_rot % 2 == 0, "%s: rotary dimensions %lld must be even and <= %lld",
              s, static_cast<long long>(n_rot), static_cast<long long>(hp.head_dim));
  for (const auto* f : {&hp.rope_freqs, &hp.rope_long, &hp.rope_short})
    RUNLM_CHECK(f->empty() || int64_t(f->size()) == n_rot / 2, "%s: RoPE factors have %zu values, expected %lld", s,
                f->size(), static_cast<long long>(n_rot / 2));
  RUNLM_CHECK((hp.rope_scaling_type == "longrope") == !hp.rope_long.empty() && hp.rope_long.empty() == hp.rope_short.empty(),
              "%s: longrope needs both long and short factors", s);
  const ArchDesc& d = arch_desc(hp.arch);
  RUNLM_CHECK(!hp.qkv_bias || d.qkv_bias, "%s: %s has no q/k/v biases", s, d.gguf_name);
  RUNLM_CHECK(hp.qk_norm == d.qk_norm && hp.post_norms == d.post_norms,
              "%s: %s %s q/k norms and %s post norms", s, d.gguf_name, d.qk_norm ? "needs" : "has no",
              d.post_norms ? "needs" : "has no");
  RUNLM_CHECK(!hp.fused_gate_up || d.fused_gate_up, "%s: %s has no fused gate+up", s, d.gguf_name);
  RUNLM_CHECK(hp.rope_freqs.empty() || d.rope_freqs, "%s: %s has no rope_freqs", s, d.gguf_name);
  RUNLM_CHECK(d.output_tensor || hp.tied_embeddings, "%s: %s always ties the output to token_embd", s, d.gguf_name);
  if (hp.sliding_window) positive(*hp.sliding_window, "sliding window");
  RUNLM_CHECK(hp.swa_layers.empty() || int64_t(hp.swa_layers.size()) == hp.n_layers,
              "%s: the sliding-window pattern has %zu entries for %lld layers", s, hp.swa_layers.size(),
              static_cast<long long>(hp.n_layers));
}

void write_llama_hparams(GgufWriter& w, const LlamaHParams& hp, uint32_t file_type) {
  validate_llama_hparams(hp, hp.name.empty() ? "model" : hp.name);
  // Mistral is written as "llama" plus a sliding window, as llama.cpp does.
  const std::string arch = hp.arch == Arch::Mistral ? "llama" : arch_name(hp.arch);
  const std::string p = arch + ".";
  w.set_string("general.architecture", arch);
  w.set_string("general.name", hp.name.empty() ? arch : hp.name);
  w.set_u32("general.file_type", file_type);
  set_u32_checked(w, p + "context_length", hp.context_length);
  set_u32_checked(w, p + "embedding_length", hp.dim);
  set_u32_checked(w, p + "block_count", hp.n_layers);
  set_u32_checked(w, p + "feed_forward_length", hp.hidden_dim);
  set_u32_checked(w, p + "attention.head_count", hp.n_heads);
  set_u32_checked(w, p + "attention.head_count_kv", hp.n_kv_heads);
  set_u32_checked(w, p + "rope.dimension_count", hp.n_rot ? hp.n_rot : hp.head_dim);
  w.set_f32(p + "attention.layer_norm_rms_epsilon", hp.rms_eps);
  w.set_f32(p + "rope.freq_base", hp.rope_theta);
  set_u32_checked(w, p + "vocab_size", hp.vocab_size);
  // Readers assume head_dim = dim / n_heads unless told otherwise; llama.cpp's
  // gemma converters always write it.
  if (hp.dim % hp.n_heads != 0 || hp.head_dim != hp.dim / hp.n_heads || hp.arch == Arch::Gemma2 ||
      hp.arch == Arch::Gemma3) {
    set_u32_checked(w, p + "attention.key_length", hp.head_dim);
    set_u32_checked(w, p + "attention.value_length", hp.head_dim);
  }
  if (hp.rope_scaling_type == "linear") {
    w.set_string(p + "rope.scaling.type", hp.rope_scaling_type);
    w.set_f32(p + "rope.scaling.factor", hp.rope_scaling_factor);
  } else if (hp.rope_scaling_type == "longrope") {
    w.set_string(p + "rope.scaling.type", hp.rope_scaling_type);
    w.set_f32(p + "rope.scaling.attn_factor", hp.rope_attn_factor);
  } else if (hp.rope_scaling_type == "yarn") {
    w.set_string(p + "rope.scaling.type", hp.rope_scaling_type);
    w.set_f32(p + "rope.scaling.factor", hp.rope_scaling_factor);
    if (hp.yarn_beta_fast > 0) w.set_f32(p + "rope.scaling.yarn_beta_fast", hp.yarn_beta_fast);
    if (hp.yarn_beta_slow > 0) w.set_f32(p + "rope.scaling.yarn_beta_slow", hp.yarn_beta_slow);
  }
  if (hp.n_expert > 0) {
    set_u32_checked(w, p + "expert_count", hp.n_expert);
    set_u32_checked(w, p + "expert_used_count", hp.n_expert_used);
    if (arch_desc(hp.arch).expert_ffn_key == ExpertFfnKey::ExpertFeedForward)
      set_u32_checked(w, p + "expert_feed_forward_length", hp.expert_hidden_dim);
    if (hp.expert_weights_norm) w.set(p + "expert_weights_norm", GgufValue::make_bool(*hp.expert_weights_norm));
  }
  if (!hp.rope_scaling_type.empty() && hp.rope_scaling_original_context > 0)
    set_u32_checked(w, p + "rope.scaling.original_context_length", hp.rope_scaling_original_context);
  if (hp.rope_freq_base_swa) w.set_f32(p + "rope.freq_base_swa", *hp.rope_freq_base_swa);
  if (hp.attn_softcap) w.set_f32(p + "attn_logit_softcapping", *hp.attn_softcap);
  if (hp.final_softcap) w.set_f32(p + "final_logit_softcapping", *hp.final_softcap);
  if (hp.sliding_window) set_u32_checked(w, p + "attention.sliding_window", *hp.sliding_window);
  // llama.cpp's per-layer form: one bool a layer (true = sliding).
  if (!hp.swa_layers.empty()) {
    std::vector<GgufValue> flags;
    for (uint8_t x : hp.swa_layers) flags.push_back(GgufValue::make_bool(x != 0));
    w.set(p + "attention.sliding_window_pattern", GgufValue::make_array(GgufType::BOOL, std::move(flags)));
  }
}

uint32_t llama_ftype_for(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 7;
    case DType::Q4_K: return 14;
    case DType::Q6_K: return 18;
    case DType::BF16: return 32;
    default: fail("no llama file type for %s (supported: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k)", dtype_name(t));
  }
}

SpmNormalizerFlags parse_spm_normalizer_flags(const uint8_t* data, size_t size, const std::string& src) {
  SpmNormalizerFlags flags;
  ProtoReader top(data, size, src);
  while (!top.done()) {
    const uint64_t tag = top.varint();
    const uint32_t field = static_cast<uint32_t>(tag >> 3), wire = static_cast<uint32_t>(tag & 7);
    if (field != kModelProtoNormalizerSpec || wire != kWireBytes) {
      top.skip(wire);
      continue;
    }
    // Repeated embedded messages merge, so later values win, as here.
    auto [p, n] = top.bytes();
    ProtoReader spec(p, n, src);
    while (!spec.done()) {
      const uint64_t t = spec.varint();
      const uint32_t f = static_cast<uint32_t>(t >> 3), wt = static_cast<uint32_t>(t & 7);
      if (wt == kWireVarint && f == kNormalizerAddDummyPrefix) flags.add_dummy_prefix = spec.varint() != 0;
      else if (wt == kWireVarint && f == kNormalizerRemoveExtraWhitespaces) flags.remove_extra_whitespaces = spec.varint() != 0;
      else spec.skip(wt);
    }
  }
  return flags;
}

SpmNormalizerFlags read_spm_normalizer_flags(const std::string& model_path) {
  const MappedFile f(model_path);
  return parse_spm_normalizer_flags(f.data(), f.size(), model_path);
}

void write_llama_tokenizer(GgufWriter& w, const std::string& model_path, int64_t n_vocab,
                           const std::string& chat_template, bool pad_to_vocab) {
  const auto tok = Tokenizer::from_model_file(model_path);
  const SpmNormalizerFlags flags = read_spm_normalizer_flags(model_path);
  const int64_t n_tok = tok->n_vocab();
  RUNLM_CHECK(n_tok <= n_vocab, "%s: tokenizer has %lld tokens but the model's vocabulary is %lld", model_path.c_str(),
              static_cast<long long>(n_tok), static_cast<long long>(n_vocab));
  RUNLM_CHECK(n_tok == n_vocab || pad_to_vocab, "%s: tokenizer has %lld tokens but the model's vocabulary is %lld",
              model_path.c_str(), static_cast<long long>(n_tok), static_cast<long long>(n_vocab));

  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  tokens.reserve(n_vocab);
  int64_t unk = -1;
  for (int i = 0; i < n_tok; ++i) {
    tokens.push_back(tok->id_to_piece(i));
    scores.push_back(tok->score(i));
    types.push_back(tok->token_type(i));
    if (unk < 0 && types.back() == kTokenTypeUnknown) unk = i;
  }
  if (n_tok < n_vocab) {
    std::fprintf(stderr, "%s: tokenizer has %lld tokens; padding to the model's %lld with [PAD1]..[PAD%lld]\n",
                 model_path.c_str(), static_cast<long long>(n_tok), static_cast<long long>(n_vocab),
                 static_cast<long long>(n_vocab - n_tok));
    for (int64_t i = 1; i <= n_vocab - n_tok; ++i) {
      tokens.push_back(strfmt("[PAD%lld]", static_cast<long long>(i)));
      scores.push_back(kPadScore);
      types.push_back(kTokenTypeUnused);
    }
  }

  w.set_string("tokenizer.ggml.model", "llama");
  w.set("tokenizer.ggml.tokens", GgufValue::make_string_array(tokens));
  w.set("tokenizer.ggml.scores", GgufValue::make_f32_array(scores));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  if (tok->bos() >= 0) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok->bos()));
  if (tok->eos() >= 0) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok->eos()));
  if (unk >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(unk));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", flags.add_dummy_prefix);
  w.set_bool("tokenizer.ggml.remove_extra_whitespaces", flags.remove_extra_whitespaces);
  if (!chat_template.empty()) w.set_string("tokenizer.chat_template", chat_template);
}

std::vector<LlamaTensorSpec> llama_tensor_specs(const LlamaHParams& hp) {
  const int64_t q_dim = hp.n_heads * hp.head_dim, kv_dim = hp.n_kv_heads * hp.head_dim;
  const int64_t half_rot = (hp.n_rot ? hp.n_rot : hp.head_dim) / 2;
  const ArchDesc& d = arch_desc(hp.arch);
  std::vector<LlamaTensorSpec> out;
  auto add = [&](TensorRole role, int layer, std::vector<int64_t> ne) {
    out.push_back({tensor_name(role, layer), role, layer, std::move(ne)});
  };
  add(TensorRole::TokenEmbd, -1, {hp.dim, hp.vocab_size});
  if (!hp.rope_freqs.empty()) add(TensorRole::RopeFreqs, -1, {half_rot});
  if (!hp.rope_long.empty()) {
    add(TensorRole::RopeFactorsLong, -1, {half_rot});
    add(TensorRole::RopeFactorsShort, -1, {half_rot});
  }
  for (int l = 0; l < hp.n_layers; ++l) {
    add(TensorRole::AttnNorm, l, {hp.dim});
    if (hp.fused_qkv) {
      add(TensorRole::AttnQkv, l, {hp.dim, q_dim + 2 * kv_dim});
    } else {
      add(TensorRole::AttnQ, l, {hp.dim, q_dim});
      add(TensorRole::AttnK, l, {hp.dim, kv_dim});
      add(TensorRole::AttnV, l, {hp.dim, kv_dim});
    }
    if (hp.qkv_bias) {
      add(TensorRole::AttnQBias, l, {q_dim});
      add(TensorRole::AttnKBias, l, {kv_dim});
      add(TensorRole::AttnVBias, l, {kv_dim});
    }
    if (hp.qk_norm) {
      add(TensorRole::AttnQNorm, l, {hp.head_dim});
      add(TensorRole::AttnKNorm, l, {hp.head_dim});
    }
    add(TensorRole::AttnOut, l, {q_dim, hp.dim});
    if (d.attn_out_bias) add(TensorRole::AttnOutBias, l, {hp.dim});
    if (d.attn_sinks) add(TensorRole::AttnSinks, l, {hp.n_heads});
    if (hp.post_norms || d.ffn_norm_post_attention) add(TensorRole::AttnPostNorm, l, {hp.dim});
    if (!d.ffn_norm_post_attention) add(TensorRole::FfnNorm, l, {hp.dim});
    if (hp.n_expert > 0) {
      const int64_t ne = hp.n_expert, eh = hp.expert_hidden_dim;
      add(TensorRole::FfnGateInp, l, {hp.dim, ne});
      if (d.moe_biases) add(TensorRole::FfnGateInpBias, l, {ne});
      add(TensorRole::FfnGateExps, l, {hp.dim, eh, ne});
      add(TensorRole::FfnUpExps, l, {hp.dim, eh, ne});
      add(TensorRole::FfnDownExps, l, {eh, hp.dim, ne});
      if (d.moe_biases) {
        add(TensorRole::FfnGateExpsBias, l, {eh, ne});
        add(TensorRole::FfnUpExpsBias, l, {eh, ne});
        add(TensorRole::FfnDownExpsBias, l, {hp.dim, ne});
      }
    } else if (hp.fused_gate_up) {
      add(TensorRole::FfnUp, l, {hp.dim, 2 * hp.hidden_dim});
    } else {
      add(TensorRole::FfnGate, l, {hp.dim, hp.hidden_dim});
      add(TensorRole::FfnUp, l, {hp.dim, hp.hidden_dim});
    }
    if (hp.n_expert == 0) add(TensorRole::FfnDown, l, {hp.hidden_dim, hp.dim});
    if (hp.post_norms) add(TensorRole::FfnPostNorm, l, {hp.dim});
  }
  add(TensorRole::OutputNorm, -1, {hp.dim});
  if (!hp.tied_embeddings) add(TensorRole::Output, -1, {hp.dim, hp.vocab_size});
  return out;
}

std::vector<float> llama3_rope_freqs(float theta, int64_t head_dim, double factor, double low_freq_factor,
                                     double high_freq_factor, double original_context) {
  constexpr double kPi = 3.14159265358979323846;
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < head_dim; i += 2) {
    // As the converter: the frequency in float32, the rest in double.
    const float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(head_dim));
    const double wavelen = 2 * kPi / freq;
    if (wavelen < high_freq_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      out.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      out.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

std::function<void(size_t, size_t)> stderr_progress(const std::string& label) {
  if (!::isatty(2)) return nullptr;
  return [label](size_t done, size_t total) {
    std::fprintf(stderr, "\r%s: tensor %zu/%zu", label.c_str(), done, total);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  };
}

}  // namespace runlm
