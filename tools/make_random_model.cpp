// make_random_model: writes a GGUF of a given architecture and shape with
// deterministic pseudo-random weights, so tests and benchmarks get realistic
// sizes without downloads. The file is what llama.cpp's converter would
// write for that family (architecture name, keys, tensor names), so
// llama.cpp loads it too.
//
//   make_random_model --preset NAME (see --help: llama2-7b, llama3-8b, qwen2.5-7b, qwen3-8b, gemma2-9b,
//       gemma3-12b, phi3-mini, mistral-nemo-12b, ..., tiny)
//       [--dim --hidden --layers --heads --kv-heads --head-dim --vocab --ctx --sliding-window]
//       [--split-qkv | --fuse-qkv] [--no-rope-freqs] [--rope-orig-ctx N]
//       [--experts N --experts-used K --expert-hidden N] (mixtral-8x7b, qwen3-30b-a3b, gpt-oss-20b, gpt-oss-120b)
//       --type MIX|TYPE -o out.gguf [--seed N] [--repeat-rows N]
//       [--tokenizer PATH [--pad-vocab] | --vocab-from VOCAB.gguf] [--chat-template-file T.jinja]
//
// --vocab-from copies the vocabulary and chat template (every tokenizer.*
// key) of a vocab-only GGUF, e.g. llama.cpp's ggml-vocab-*.gguf, so a
// preset carries its family's real vocabulary.
//
// Weights are scaled so activations stay near unit variance through the
// network: 2-D weights U(-a, a) with a = sqrt(3 / fan_in), norms 1 + small
// noise, embeddings roughly N(0, 1) (N(0, 1/dim) for Gemma, which scales
// them by sqrt(dim)). Each row has its own generator seeded
// from (seed, tensor, row), so rows are generated and quantized in parallel
// and the output does not depend on the thread count. The tensor number is
// that of the unfused layout, so a fused attn_qkv or gate+up ffn_up holds
// exactly the rows the split tensors would (the same model either way).
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "common.h"
#include "cpu/quant.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "quantize.h"
#include "tokenizer.h"

using namespace runlm;

namespace {

struct Preset {
  const char* name;
  Arch arch;
  int64_t dim, hidden, layers, heads, kv_heads, head_dim, vocab, ctx;  // head_dim 0: dim/heads; vocab 0: the tokenizer's
  std::optional<int64_t> sliding_window;
  float rope_theta;
  float rms_eps;
  bool tied;
  // llama3 RoPE scaling factor (0: none) with its original context, or a
  // linear factor (0: none).
  float llama3_factor = 0;
  int64_t llama3_orig_ctx = 0;
  float linear_factor = 0;
  // Mixture of experts (0: dense): experts, used per token, expert FFN size;
  // YaRN RoPE factor (0: none) with its original context (gpt-oss).
  int64_t n_expert = 0, n_expert_used = 0, expert_hidden = 0;
  float yarn_factor = 0;
  int64_t yarn_orig_ctx = 0;
};
constexpr float kTheta = 10000.0f;
// Shapes of the released models (their config.json).
const Preset kPresets[] = {
    {"llama2-7b", Arch::Llama, 4096, 11008, 32, 32, 32, 0, 32000, 4096, std::nullopt, kTheta, 1e-5f, false},
    {"tinyllama-1.1b", Arch::Llama, 2048, 5632, 22, 32, 4, 0, 32000, 2048, std::nullopt, kTheta, 1e-5f, false},
    {"mistral-7b", Arch::Llama, 4096, 14336, 32, 32, 8, 0, 32000, 32768, 4096, kTheta, 1e-5f, false},
    {"stories110m", Arch::Llama, 768, 2048, 12, 12, 12, 0, 32000, 1024, std::nullopt, kTheta, 1e-5f, false},
    {"llama3-8b", Arch::Llama, 4096, 14336, 32, 32, 8, 0, 128256, 131072, std::nullopt, 500000.0f, 1e-5f, false, 8.0f,
     8192},
    {"qwen2.5-7b", Arch::Qwen2, 3584, 18944, 28, 28, 4, 0, 152064, 32768, std::nullopt, 1e6f, 1e-6f, false},
    {"qwen3-8b", Arch::Qwen3, 4096, 12288, 36, 32, 8, 128, 151936, 40960, std::nullopt, 1e6f, 1e-6f, false},
    {"gemma2-9b", Arch::Gemma2, 3584, 14336, 42, 16, 8, 256, 256000, 8192, 4096, kTheta, 1e-6f, true},
    {"gemma3-12b", Arch::Gemma3, 3840, 15360, 48, 16, 8, 256, 262208, 131072, 1024, 1e6f, 1e-6f, true, 0, 0, 8.0f},
    {"phi3-mini", Arch::Phi3, 3072, 8192, 32, 32, 32, 0, 32064, 4096, 2047, kTheta, 1e-5f, false},
    {"mistral-nemo-12b", Arch::Llama, 5120, 14336, 40, 32, 8, 128, 131072, 1024000, std::nullopt, 1e6f, 1e-5f, false},
    {"tiny", Arch::Llama, 64, 192, 4, 4, 2, 0, 0, 512, std::nullopt, kTheta, 1e-5f, false},
    // Mixtral 8x7B is written as "llama" with experts of feed_forward_length.
    {"mixtral-8x7b", Arch::Llama, 4096, 14336, 32, 32, 8, 0, 32000, 32768, std::nullopt, 1e6f, 1e-5f, false, 0, 0, 0,
     8, 2, 14336},
    {"qwen3-30b-a3b", Arch::Qwen3Moe, 2048, 6144, 48, 32, 4, 128, 151936, 40960, std::nullopt, 1e6f, 1e-6f, false, 0, 0,
     0, 128, 8, 768},
    // gpt-oss: every other layer a 128-token window, YaRN x32 from 4096.
    {"gpt-oss-20b", Arch::GptOss, 2880, 2880, 24, 64, 8, 64, 201088, 131072, 128, 150000.0f, 1e-5f, false, 0, 0, 0, 32,
     4, 2880, 32.0f, 4096},
    {"gpt-oss-120b", Arch::GptOss, 2880, 2880, 36, 64, 8, 64, 201088, 131072, 128, 150000.0f, 1e-5f, false, 0, 0, 0,
     128, 4, 2880, 32.0f, 4096},
};

std::string preset_names() {
  std::string s;
  for (const auto& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

constexpr const char* kDefaultTokenizer = "../shared/models/llama2-tokenizer.model";
constexpr float kNormNoise = 0.05f;  // norms are 1 +- this
constexpr float kSqrt3 = 1.7320508075688772f;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Independent stream per (seed, tensor, row).
uint64_t row_seed(uint64_t seed, uint64_t tensor, uint64_t row) {
  uint64_t s = seed;
  uint64_t a = splitmix64(s) ^ (tensor * 0xd1b54a32d192ed03ull);
  uint64_t b = splitmix64(a) ^ (row * 0x8cb92ba72f3d8dd7ull);
  return splitmix64(b);
}

enum class Fill { Uniform, Norm, Embedding, Bias };

void fill_row(Fill kind, float scale, uint64_t state, float* out, int64_t n) {
  constexpr float kInv24 = 1.0f / 16777216.0f;  // 2^-24: 24 random bits -> [0, 1)
  constexpr float kInv16 = 1.0f / 65536.0f;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t x = splitmix64(state);
    switch (kind) {
      case Fill::Uniform:
        out[i] = scale * (2.0f * static_cast<float>(x >> 40) * kInv24 - 1.0f);
        break;
      case Fill::Bias:
        out[i] = 0.1f * (2.0f * static_cast<float>(x >> 40) * kInv24 - 1.0f);
        break;
      case Fill::Norm:
        out[i] = 1.0f + kNormNoise * (2.0f * static_cast<float>(x >> 40) * kInv24 - 1.0f);
        break;
      case Fill::Embedding: {
        // Irwin-Hall: the sum of four 16-bit uniforms has variance 4/12;
        // times sqrt(3) gives unit variance, close enough to a normal.
        const float s = static_cast<float>(x & 0xffff) + static_cast<float>((x >> 16) & 0xffff) +
                        static_cast<float>((x >> 32) & 0xffff) + static_cast<float>(x >> 48);
        out[i] = scale * (kSqrt3 * (s * kInv16 - 2.0f));
        break;
      }
    }
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

int run(int argc, char** argv) {
  cxxopts::Options opts("make_random_model", "Write a random-weight Llama GGUF of a given shape");
  opts.add_options()
      ("preset", preset_names(), cxxopts::value<std::string>())
      ("dim", "embedding size", cxxopts::value<int64_t>())
      ("hidden", "feed-forward size", cxxopts::value<int64_t>())
      ("layers", "layer count", cxxopts::value<int64_t>())
      ("heads", "attention heads", cxxopts::value<int64_t>())
      ("kv-heads", "key/value heads", cxxopts::value<int64_t>())
      ("head-dim", "head size (default: the preset's, else dim / heads)", cxxopts::value<int64_t>())
      ("split-qkv", "write attn_q/k/v and ffn_gate/ffn_up separately even where the family fuses them (phi3)")
      ("fuse-qkv", "write one attn_qkv where the family's converter writes attn_q/k/v (llama.cpp reads either)")
      ("no-rope-freqs", "leave out rope_freqs.weight (llama3)")
      ("rope-orig-ctx", "llama3 RoPE scaling's original context (default: the preset's)", cxxopts::value<int64_t>())
      ("vocab-from", "copy the vocabulary (tokenizer.* keys) from this GGUF", cxxopts::value<std::string>())
      ("chat-template-file", "store this Jinja file as tokenizer.chat_template", cxxopts::value<std::string>())
      ("vocab", "vocabulary size (must equal the tokenizer's)", cxxopts::value<int64_t>())
      ("ctx", "context length", cxxopts::value<int64_t>())
      ("sliding-window", "attention window (0: none)", cxxopts::value<int64_t>())
      ("experts", "experts per layer (mixture-of-experts presets)", cxxopts::value<int64_t>())
      ("experts-used", "experts each token runs", cxxopts::value<int64_t>())
      ("expert-hidden", "an expert's feed-forward size", cxxopts::value<int64_t>())
      ("type", "a quantize mix (" + quant_target_names() + ") or a plain type (q2_k, q3_k, q4_k, q5_k, iq4_nl, iq4_xs, mxfp4, ...)",
       cxxopts::value<std::string>()->default_value("f16"))
      ("pure", "every weight matrix gets --type's base type (no per-tensor mix rules)")
      ("o,output", "output GGUF path", cxxopts::value<std::string>())
      ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("1"))
      ("repeat-rows", "encode N random rows of each matrix taller than 2N and repeat them down it (speed runs on big presets: real shapes and blocks in a fraction of the time; 0: every row its own)",
       cxxopts::value<int64_t>()->default_value("0"))
      ("tokenizer", "sentencepiece tokenizer.model", cxxopts::value<std::string>()->default_value(kDefaultTokenizer))
      ("pad-vocab", "pad --tokenizer's vocabulary with unused tokens up to the preset's size (real output shapes)")
      ("threads", "worker threads (0: all cores)", cxxopts::value<int>()->default_value("0"))
      ("h,help", "show this help");
  cxxopts::ParseResult args;
  try {
    args = opts.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    fail("%s", e.what());
  }
  if (args.count("help")) {
    std::cout << opts.help() << "\n";
    return 0;
  }
  RUNLM_CHECK(args.count("preset"), "--preset is required (%s)", preset_names().c_str());
  RUNLM_CHECK(args.count("output"), "-o OUT.gguf is required");
  const std::string preset_name = args["preset"].as<std::string>();
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (preset_name == p.name) preset = &p;
  RUNLM_CHECK(preset, "unknown preset '%s' (known: %s)", preset_name.c_str(), preset_names().c_str());
  // A mix name first (llama.cpp's rules), else a plain type written pure.
  const std::string type_name = args["type"].as<std::string>();
  bool pure = args.count("pure") > 0;
  const QuantTarget* target_ptr = nullptr;
  try {
    target_ptr = &quant_target_from_name(type_name);
  } catch (const Error&) {
    const DType t = dtype_from_name(type_name);  // Error listing the types if unknown
    RUNLM_CHECK(can_quantize(t), "--type %s: runlm cannot write this type", type_name.c_str());
    target_ptr = &quant_target_for_type(t);
    pure = true;
  }
  const QuantTarget& target = *target_ptr;
  const std::string tok_path = args["tokenizer"].as<std::string>();
  std::unique_ptr<GgufFile> vocab_src;
  if (args.count("vocab-from")) {
    RUNLM_CHECK(!args.count("tokenizer"), "--vocab-from and --tokenizer are alternatives");
    vocab_src = GgufFile::open(args["vocab-from"].as<std::string>());
  } else {
    RUNLM_CHECK(file_exists(tok_path), "tokenizer '%s' not found; pass --tokenizer PATH/tokenizer.model",
                tok_path.c_str());
  }
  const std::string out = args["output"].as<std::string>();
  const uint64_t seed = args["seed"].as<uint64_t>();
  const int64_t repeat_rows = args["repeat-rows"].as<int64_t>();
  RUNLM_CHECK(repeat_rows >= 0, "--repeat-rows %lld: must be 0 or more", static_cast<long long>(repeat_rows));
  const int n_threads = args["threads"].as<int>();

  auto pick = [&](const char* key, int64_t dflt) { return args.count(key) ? args[key].as<int64_t>() : dflt; };
  LlamaHParams hp;
  hp.name = strfmt("random-%s", preset->name);
  hp.dim = pick("dim", preset->dim);
  hp.hidden_dim = pick("hidden", preset->hidden);
  hp.n_layers = pick("layers", preset->layers);
  hp.n_heads = pick("heads", preset->heads);
  hp.n_kv_heads = pick("kv-heads", preset->kv_heads);
  hp.context_length = pick("ctx", preset->ctx);
  hp.rope_theta = preset->rope_theta;
  hp.rms_eps = preset->rms_eps;
  hp.arch = preset->arch;
  hp.tied_embeddings = preset->tied;
  hp.sliding_window = preset->sliding_window;
  if (args.count("sliding-window")) {
    const int64_t win = args["sliding-window"].as<int64_t>();
    hp.sliding_window = win > 0 ? std::optional<int64_t>(win) : std::nullopt;
  }
  RUNLM_CHECK(hp.n_heads > 0, "--heads must be positive, got %lld", static_cast<long long>(hp.n_heads));
  // A preset's own head size holds only at its own width and head count.
  const bool own_shape = !args.count("dim") && !args.count("heads");
  hp.head_dim = pick("head-dim", own_shape && preset->head_dim ? preset->head_dim : 0);
  if (hp.head_dim == 0) {
    RUNLM_CHECK(hp.dim % hp.n_heads == 0, "--dim %lld is not a multiple of --heads %lld (or pass --head-dim)",
                static_cast<long long>(hp.dim), static_cast<long long>(hp.n_heads));
    hp.head_dim = hp.dim / hp.n_heads;
  }
  // The family's layer, as llama.cpp's converter writes it.
  const ArchDesc& d = arch_desc(hp.arch);
  const bool split = args.count("split-qkv") > 0;
  hp.qkv_bias = d.qkv_bias;
  hp.qk_norm = d.qk_norm;
  hp.post_norms = d.post_norms;
  hp.fused_qkv = (d.fused_qkv || args.count("fuse-qkv")) && !split;
  hp.fused_gate_up = d.fused_gate_up && !split;
  if (hp.arch == Arch::Gemma2) hp.attn_softcap = 50.0f, hp.final_softcap = 30.0f;
  if (preset->llama3_factor > 0 && !args.count("no-rope-freqs")) {
    const int64_t orig = pick("rope-orig-ctx", preset->llama3_orig_ctx);
    hp.rope_freqs = llama3_rope_freqs(hp.rope_theta, hp.head_dim, preset->llama3_factor, 1.0, 4.0,
                                      static_cast<double>(orig));
  }
  if (preset->linear_factor > 0) hp.rope_scaling_type = "linear", hp.rope_scaling_factor = preset->linear_factor;
  if (preset->yarn_factor > 0) {
    hp.rope_scaling_type = "yarn";
    hp.rope_scaling_factor = preset->yarn_factor;
    hp.rope_scaling_original_context = preset->yarn_orig_ctx;
    hp.yarn_beta_fast = 32.0f, hp.yarn_beta_slow = 1.0f;  // gpt-oss's config.json, written by the converter
  }
  if (preset->n_expert > 0) {
    hp.n_expert = pick("experts", preset->n_expert);
    hp.n_expert_used = pick("experts-used", preset->n_expert_used);
    // Mixtral's experts are feed_forward_length wide (--hidden).
    hp.expert_hidden_dim = hp.arch == Arch::Llama ? hp.hidden_dim : pick("expert-hidden", preset->expert_hidden);
  } else {
    RUNLM_CHECK(!args.count("experts") && !args.count("experts-used") && !args.count("expert-hidden"),
                "--experts, --experts-used and --expert-hidden are for the mixture-of-experts presets");
  }
  // The vocabulary: --vocab; else --vocab-from's; else an explicit
  // --tokenizer's; else (also with --pad-vocab) the preset's real size, the tokenizer
  // padded with unused "[PAD<i>]" tokens up to it (real shapes for speed work).
  hp.vocab_size = preset->vocab;
  const bool pad_vocab = !args.count("vocab") && (!args.count("tokenizer") || args.count("pad-vocab"));
  RUNLM_CHECK(!args.count("pad-vocab") || (!vocab_src && !args.count("vocab")),
              "--pad-vocab pads --tokenizer's vocabulary; it does not go with --vocab-from or --vocab");
  if (vocab_src) hp.vocab_size = static_cast<int64_t>(vocab_src->get("tokenizer.ggml.tokens").arr.size());
  else if (!pad_vocab) hp.vocab_size = 0;
  if (args.count("vocab")) hp.vocab_size = args["vocab"].as<int64_t>();
  if (hp.vocab_size == 0)
    hp.vocab_size = Tokenizer::from_model_file(tok_path)->n_vocab();
  validate_llama_hparams(hp, "make_random_model");

  const auto t0 = std::chrono::steady_clock::now();
  GgufWriter w;
  write_llama_hparams(w, hp, target.ftype);
  if (vocab_src) {
    const int n_tok = Tokenizer::from_gguf(*vocab_src)->n_vocab();  // also checks the vocabulary loads
    RUNLM_CHECK(n_tok == hp.vocab_size, "%s has %d tokens but the model's vocabulary is %lld",
                vocab_src->path().c_str(), n_tok, static_cast<long long>(hp.vocab_size));
    for (const GgufKV& kv : vocab_src->metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, kv.value);
  } else {
    write_llama_tokenizer(w, tok_path, hp.vocab_size, "", pad_vocab);  // otherwise a vocab mismatch is an Error
  }
  if (args.count("chat-template-file")) {
    const std::string path = args["chat-template-file"].as<std::string>();
    std::ifstream f(path, std::ios::binary);
    RUNLM_CHECK(f.good(), "cannot open chat template file %s (--chat-template-file)", path.c_str());
    std::stringstream text;
    text << f.rdbuf();
    w.set_string("tokenizer.chat_template", text.str());
  }

  int64_t n_params = 0;
  uint64_t n_bytes = 0;
  const auto specs = llama_tensor_specs(hp);
  QuantModelInfo model_info;
  model_info.n_layers = static_cast<int>(hp.n_layers);
  model_info.n_head = static_cast<int>(hp.n_heads);
  model_info.n_head_kv = static_cast<int>(hp.n_kv_heads);
  model_info.has_output = !hp.tied_embeddings;
  model_info.n_expert = static_cast<int>(hp.n_expert);
  model_info.is_70b = hp.n_layers == 80 && hp.n_heads != hp.n_kv_heads;
  // Seeds follow the tensor's number in the unfused layout (see the top).
  LlamaHParams unfused = hp;
  unfused.fused_qkv = unfused.fused_gate_up = false;
  unfused.rope_freqs.clear();  // nor do the RoPE factor tensors shift the numbers
  unfused.rope_long.clear();
  unfused.rope_short.clear();
  std::map<std::string, uint64_t> number;
  {
    const auto u = llama_tensor_specs(unfused);
    for (size_t i = 0; i < u.size(); ++i) number[u[i].name] = i;
  }
  // Where a tensor's rows come from: (tensor number, row count) pieces in order.
  struct Piece {
    uint64_t tensor;
    int64_t rows;
  };
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const LlamaTensorSpec& spec = specs[ti];
    const TensorTypeChoice choice = choose_tensor_type(target, spec.name, spec.ne, model_info, pure);
    if (!choice.note.empty()) std::fprintf(stderr, "make_random_model: %s\n", choice.note.c_str());
    const int64_t n_cols = spec.ne[0];
    // A 3-D expert tensor is its experts' matrices one after the other.
    int64_t n_rows = 1;
    for (size_t k = 1; k < spec.ne.size(); ++k) n_rows *= spec.ne[k];
    const bool bias = spec.role == TensorRole::AttnQBias || spec.role == TensorRole::AttnKBias ||
                      spec.role == TensorRole::AttnVBias || spec.role == TensorRole::AttnOutBias ||
                      spec.role == TensorRole::AttnSinks || spec.role == TensorRole::FfnGateInpBias ||
                      spec.role == TensorRole::FfnGateExpsBias || spec.role == TensorRole::FfnUpExpsBias ||
                      spec.role == TensorRole::FfnDownExpsBias;
    const Fill kind = bias ? Fill::Bias
                      : spec.ne.size() == 1 ? Fill::Norm
                      : spec.role == TensorRole::TokenEmbd ? Fill::Embedding
                                                          : Fill::Uniform;
    // Unit-variance outputs; embeddings N(0, 1), or N(0, 1/dim) where the
    // family multiplies them by sqrt(dim) (Gemma), so the residual stream
    // starts at unit size either way.
    const float scale = kind != Fill::Embedding ? kSqrt3 / std::sqrt(static_cast<float>(n_cols))
                        : d.embd_scale_sqrt_dim ? 1.0f / std::sqrt(static_cast<float>(n_cols))
                                                : 1.0f;
    const DType type = choice.type;
    const std::vector<float>* fixed = spec.role == TensorRole::RopeFreqs          ? &hp.rope_freqs
                                      : spec.role == TensorRole::RopeFactorsLong  ? &hp.rope_long
                                      : spec.role == TensorRole::RopeFactorsShort ? &hp.rope_short
                                                                                  : nullptr;
    std::vector<Piece> pieces;
    const int64_t q_rows = hp.n_heads * hp.head_dim, kv_rows = hp.n_kv_heads * hp.head_dim;
    if (spec.role == TensorRole::AttnQkv) {
      pieces = {{number.at(tensor_name(TensorRole::AttnQ, spec.layer)), q_rows},
                {number.at(tensor_name(TensorRole::AttnK, spec.layer)), kv_rows},
                {number.at(tensor_name(TensorRole::AttnV, spec.layer)), kv_rows}};
    } else if (spec.role == TensorRole::FfnUp && hp.fused_gate_up) {
      pieces = {{number.at(tensor_name(TensorRole::FfnGate, spec.layer)), hp.hidden_dim},
                {number.at(tensor_name(TensorRole::FfnUp, spec.layer)), hp.hidden_dim}};
    } else if (!fixed) {
      pieces = {{number.at(spec.name), n_rows}};
    }
    // Small matrices (the router, norms) stay random throughout: repeated
    // router rows would tie experts.
    const int64_t n_encoded = repeat_rows > 0 && n_rows > 2 * repeat_rows ? repeat_rows : n_rows;
    w.add_tensor(spec.name, type, spec.ne, [=](uint8_t* dst) {
      encode_rows_parallel(
          type, n_cols, n_encoded,
          [&](int64_t r, float* buf) {
            if (fixed) {
              std::copy(fixed->begin(), fixed->end(), buf);
              return;
            }
            size_t k = 0;
            while (r >= pieces[k].rows) r -= pieces[k++].rows;
            fill_row(kind, scale, row_seed(seed, pieces[k].tensor, static_cast<uint64_t>(r)), buf, n_cols);
          },
          dst, n_threads);
      const size_t row_bytes = dtype_row_bytes(type, n_cols);
      for (int64_t r = n_encoded; r < n_rows; r += n_encoded)
        std::memcpy(dst + row_bytes * static_cast<size_t>(r), dst,
                    row_bytes * static_cast<size_t>(std::min(n_encoded, n_rows - r)));
    });
    n_params += n_cols * n_rows;
    n_bytes += dtype_row_bytes(type, n_cols) * static_cast<uint64_t>(n_rows);
  }
  w.write(out, stderr_progress("make_random_model"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("make_random_model: wrote %s: %s, %s, %.1fM params, %.1f MB of weights, %.1f s\n", out.c_str(),
              preset->name, target.name, static_cast<double>(n_params) / 1e6, static_cast<double>(n_bytes) / 1e6,
              secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
