// make_random_model: writes a Llama GGUF of a given shape with deterministic
// pseudo-random weights, so tests and benchmarks get realistic sizes (up to
// 7B) without downloads.
//
//   make_random_model --preset llama2-7b|tinyllama-1.1b|mistral-7b|stories110m|tiny
//       [--dim --hidden --layers --heads --kv-heads --vocab --ctx --sliding-window]
//       --type f32|f16|bf16|q8_0|q4_0|q4_k|q6_k|q4_k_m -o out.gguf [--seed N]
//       [--tokenizer PATH | --vocab-gguf VOCAB.gguf]
//
// --vocab-gguf copies every tokenizer.* key of a GGUF (e.g. llama.cpp's
// vocabulary-only ggml-vocab-*.gguf files), so the model carries that
// vocabulary, byte-level BPE ones included.
//
// Weights are scaled so activations stay near unit variance through the
// network: 2-D weights U(-a, a) with a = sqrt(3 / fan_in), norms 1 + small
// noise, embeddings roughly N(0, 1). Each row has its own generator seeded
// from (seed, tensor, row), so rows are generated and quantized in parallel
// and the output does not depend on the thread count.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cxxopts.hpp>
#include <iostream>
#include <optional>

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
  int64_t dim, hidden, layers, heads, kv_heads, vocab, ctx;  // vocab 0: the tokenizer's size
  std::optional<int64_t> sliding_window;
  float rope_theta;
};
constexpr float kTheta = 10000.0f;
const Preset kPresets[] = {
    {"llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, std::nullopt, kTheta},
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, std::nullopt, kTheta},
    {"mistral-7b", 4096, 14336, 32, 32, 8, 32000, 32768, 4096, kTheta},
    {"stories110m", 768, 2048, 12, 12, 12, 32000, 1024, std::nullopt, kTheta},
    {"tiny", 64, 192, 4, 4, 2, 0, 512, std::nullopt, kTheta},
};

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

enum class Fill { Uniform, Norm, Embedding };

void fill_row(Fill kind, float scale, uint64_t state, float* out, int64_t n) {
  constexpr float kInv24 = 1.0f / 16777216.0f;  // 2^-24: 24 random bits -> [0, 1)
  constexpr float kInv16 = 1.0f / 65536.0f;
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t x = splitmix64(state);
    switch (kind) {
      case Fill::Uniform:
        out[i] = scale * (2.0f * static_cast<float>(x >> 40) * kInv24 - 1.0f);
        break;
      case Fill::Norm:
        out[i] = 1.0f + kNormNoise * (2.0f * static_cast<float>(x >> 40) * kInv24 - 1.0f);
        break;
      case Fill::Embedding: {
        // Irwin-Hall: the sum of four 16-bit uniforms has variance 4/12;
        // times sqrt(3) gives unit variance, close enough to a normal.
        const float s = static_cast<float>(x & 0xffff) + static_cast<float>((x >> 16) & 0xffff) +
                        static_cast<float>((x >> 32) & 0xffff) + static_cast<float>(x >> 48);
        out[i] = kSqrt3 * (s * kInv16 - 2.0f);
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
      ("preset", "llama2-7b, tinyllama-1.1b, mistral-7b, stories110m or tiny", cxxopts::value<std::string>())
      ("dim", "embedding size", cxxopts::value<int64_t>())
      ("hidden", "feed-forward size", cxxopts::value<int64_t>())
      ("layers", "layer count", cxxopts::value<int64_t>())
      ("heads", "attention heads", cxxopts::value<int64_t>())
      ("kv-heads", "key/value heads", cxxopts::value<int64_t>())
      ("vocab", "vocabulary size (must equal the tokenizer's)", cxxopts::value<int64_t>())
      ("ctx", "context length", cxxopts::value<int64_t>())
      ("sliding-window", "attention window (0: none)", cxxopts::value<int64_t>())
      ("type", "a quantize mix (" + quant_target_names() + ") or a plain type (q2_k, q3_k, q4_k, q5_k, iq4_nl, iq4_xs, mxfp4, ...)",
       cxxopts::value<std::string>()->default_value("f16"))
      ("pure", "every weight matrix gets --type's base type (no per-tensor mix rules)")
      ("o,output", "output GGUF path", cxxopts::value<std::string>())
      ("seed", "random seed", cxxopts::value<uint64_t>()->default_value("1"))
      ("tokenizer", "sentencepiece tokenizer.model", cxxopts::value<std::string>()->default_value(kDefaultTokenizer))
      ("vocab-gguf", "copy the vocabulary (tokenizer.* keys) of this GGUF instead", cxxopts::value<std::string>())
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
  RUNLM_CHECK(args.count("preset"), "--preset is required (llama2-7b, tinyllama-1.1b, mistral-7b, stories110m, tiny)");
  RUNLM_CHECK(args.count("output"), "-o OUT.gguf is required");
  const std::string preset_name = args["preset"].as<std::string>();
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (preset_name == p.name) preset = &p;
  RUNLM_CHECK(preset, "unknown preset '%s' (known: llama2-7b, tinyllama-1.1b, mistral-7b, stories110m, tiny)",
              preset_name.c_str());
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
  RUNLM_CHECK(!(args.count("tokenizer") && args.count("vocab-gguf")), "use either --tokenizer or --vocab-gguf, not both");
  std::unique_ptr<GgufFile> vocab_gguf;
  if (args.count("vocab-gguf")) vocab_gguf = GgufFile::open(args["vocab-gguf"].as<std::string>());
  RUNLM_CHECK(vocab_gguf || file_exists(tok_path), "tokenizer '%s' not found; pass --tokenizer PATH/tokenizer.model",
              tok_path.c_str());
  const std::string out = args["output"].as<std::string>();
  const uint64_t seed = args["seed"].as<uint64_t>();
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
  hp.rms_eps = 1e-5f;
  hp.sliding_window = preset->sliding_window;
  if (args.count("sliding-window")) {
    const int64_t win = args["sliding-window"].as<int64_t>();
    hp.sliding_window = win > 0 ? std::optional<int64_t>(win) : std::nullopt;
  }
  RUNLM_CHECK(hp.n_heads > 0, "--heads must be positive, got %lld", static_cast<long long>(hp.n_heads));
  RUNLM_CHECK(hp.dim % hp.n_heads == 0, "--dim %lld is not a multiple of --heads %lld",
              static_cast<long long>(hp.dim), static_cast<long long>(hp.n_heads));
  hp.head_dim = hp.dim / hp.n_heads;
  hp.vocab_size = preset->vocab;
  if (args.count("vocab")) hp.vocab_size = args["vocab"].as<int64_t>();
  if (hp.vocab_size == 0)
    hp.vocab_size = vocab_gguf ? Tokenizer::from_gguf(*vocab_gguf)->n_vocab() : Tokenizer::from_model_file(tok_path)->n_vocab();
  validate_llama_hparams(hp, "make_random_model");

  const auto t0 = std::chrono::steady_clock::now();
  GgufWriter w;
  write_llama_hparams(w, hp, target.ftype);
  if (vocab_gguf) {
    const int n_tok = Tokenizer::from_gguf(*vocab_gguf)->n_vocab();  // also checks the vocabulary loads
    RUNLM_CHECK(n_tok == hp.vocab_size, "%s has %d tokens but --vocab is %lld", vocab_gguf->path().c_str(), n_tok,
                static_cast<long long>(hp.vocab_size));
    for (const GgufKV& kv : vocab_gguf->metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, kv.value);
  } else {
    write_llama_tokenizer(w, tok_path, hp.vocab_size);  // vocab mismatch is an Error
  }

  int64_t n_params = 0;
  uint64_t n_bytes = 0;
  const auto specs = llama_tensor_specs(hp);
  QuantModelInfo model_info;
  model_info.n_layers = static_cast<int>(hp.n_layers);
  model_info.n_head = static_cast<int>(hp.n_heads);
  model_info.n_head_kv = static_cast<int>(hp.n_kv_heads);
  model_info.has_output = !hp.tied_embeddings;
  model_info.is_70b = hp.n_layers == 80 && hp.n_heads != hp.n_kv_heads;
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const LlamaTensorSpec& spec = specs[ti];
    const TensorTypeChoice choice = choose_tensor_type(target, spec.name, spec.ne, model_info, pure);
    if (!choice.note.empty()) std::fprintf(stderr, "make_random_model: %s\n", choice.note.c_str());
    const int64_t n_cols = spec.ne[0];
    const int64_t n_rows = spec.ne.size() > 1 ? spec.ne[1] : 1;
    const Fill kind = spec.ne.size() == 1 ? Fill::Norm
                      : spec.role == TensorRole::TokenEmbd ? Fill::Embedding
                                                          : Fill::Uniform;
    const float scale = kSqrt3 / std::sqrt(static_cast<float>(n_cols));  // unit-variance outputs
    const DType type = choice.type;
    w.add_tensor(spec.name, type, spec.ne, [=](uint8_t* dst) {
      encode_rows_parallel(
          type, n_cols, n_rows,
          [&](int64_t r, float* buf) { fill_row(kind, scale, row_seed(seed, ti, static_cast<uint64_t>(r)), buf, n_cols); },
          dst, n_threads);
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
