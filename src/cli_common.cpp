#include "cli_common.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "common.h"
#include "model.h"

namespace runlm {

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

void write_stdout(const std::string& text) {
  errno = 0;
  const size_t n = std::fwrite(text.data(), 1, text.size(), stdout);
  // Flushing each piece streams tokens as they come and surfaces write errors
  // here rather than at exit, where stdio would drop them.
  if (n != text.size() || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    const int e = errno;
    std::clearerr(stdout);
    fail("writing to stdout failed: %s", e ? std::strerror(e) : "I/O error");
  }
}

void add_model_options(cxxopts::Options& opts) {
  opts.add_options("model")
      ("m,model", "GGUF model file", cxxopts::value<std::string>())
      ("tokenizer", "sentencepiece tokenizer.model to use instead of the GGUF vocabulary",
       cxxopts::value<std::string>()->default_value(""))
      ("c,ctx-size", "context size in tokens (0 = the model's, at most 4096)",
       cxxopts::value<int>()->default_value("0"))
      ("t,threads", "CPU threads (0 = all)", cxxopts::value<int>()->default_value("0"))
      ("b,batch-size", "prompt tokens evaluated per pass", cxxopts::value<int>()->default_value("512"))
      ("device", "auto, cpu or cuda", cxxopts::value<std::string>()->default_value("auto"))
      ("attn", "prefill attention on the GPU: auto, naive, fa2 or fa3", cxxopts::value<std::string>()->default_value("auto"))
      ("kv", "KV cache layout: contiguous or paged", cxxopts::value<std::string>()->default_value("contiguous"))
      ("block-size", "KV page size in tokens (paged)", cxxopts::value<int>()->default_value("16"))
      ("cache-type-k", "KV cache type of K (-ctk): f32, f16, bf16, q8_0, q4_0, fp8 (default: f32 on the CPU, f16 on the GPU)",
       cxxopts::value<std::string>())
      ("cache-type-v", "KV cache type of V (-ctv): same choices", cxxopts::value<std::string>())
      ("k-smoothing", "K smoothing for a quantized K cache: on (calibrated when the engine starts) or off",
       cxxopts::value<std::string>()->default_value("on"))
      ("swa", "sliding window: N tokens (on the layers the model's pattern marks), or 'off' (default: the model's)",
       cxxopts::value<std::string>()->default_value(""))
      ("verbose", "say which decode attention kernel and prefill attention backend the engine runs, and why")
      ("h,help", "show this help");
}

void add_sampling_options(cxxopts::Options& opts) {
  opts.add_options("sampling")
      ("temp", "temperature (0 = greedy)", cxxopts::value<float>()->default_value("0.8"))
      ("top-k", "top-k sampling (0 = off)", cxxopts::value<int>()->default_value("40"))
      ("top-p", "top-p sampling (1 = off)", cxxopts::value<float>()->default_value("0.95"))
      ("min-p", "min-p sampling (0 = off)", cxxopts::value<float>()->default_value("0.05"))
      ("repeat-penalty", "penalty for repeated tokens (1 = off)", cxxopts::value<float>()->default_value("1.0"))
      ("repeat-last-n", "tokens considered by the penalty", cxxopts::value<int>()->default_value("64"))
      ("s,seed", "random seed (-1 = random)", cxxopts::value<int64_t>()->default_value("-1"));
}

cxxopts::ParseResult parse_options(cxxopts::Options& opts, int argc, char** argv) {
  // llama.cpp spells some flags with several letters after one dash (-ctk,
  // -sys, -np); cxxopts takes one-letter short options only, so those become
  // their long forms here.
  static const std::pair<const char*, const char*> kMultiLetter[] = {
      {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"}, {"-sys", "--system-prompt"}, {"-np", "--parallel"},
      {"-npl", "--npl"},           {"-npp", "--npp"},           {"-ntg", "--ntg"}};
  for (int i = 1; i < argc; ++i)
    for (const auto& [from, to] : kMultiLetter)
      if (std::strcmp(argv[i], from) == 0) argv[i] = const_cast<char*>(to);
  try {
    return opts.parse(argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& e) {
    // cxxopts names the value but not the flag: find the flag it followed.
    const std::string msg = e.what();
    const size_t a = msg.find("\u2018") != std::string::npos ? msg.find("\u2018") + 3 : std::string::npos;
    const size_t b = a != std::string::npos ? msg.find("\u2019", a) : std::string::npos;
    std::string flag = "?";
    if (b != std::string::npos) {
      const std::string value = msg.substr(a, b - a);
      for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == value && i > 1) flag = argv[i - 1];
        else if (arg.size() > value.size() && arg.compare(arg.size() - value.size() - 1, std::string::npos, "=" + value) == 0)
          flag = arg.substr(0, arg.size() - value.size() - 1);
      }
      fail("invalid value '%s' for %s (see '%s --help')", value.c_str(), flag.c_str(), opts.program().c_str());
    }
    fail("%s (see '%s --help')", e.what(), opts.program().c_str());
  } catch (const cxxopts::exceptions::exception& e) {
    fail("%s (see '%s --help')", e.what(), opts.program().c_str());
  }
}

std::unique_ptr<Model> load_model_from_options(const cxxopts::ParseResult& args) {
  RUNLM_CHECK(args.count("model"), "no model given: use -m MODEL.gguf");
  const std::string path = args["model"].as<std::string>();
  if (stderr_is_tty()) std::fprintf(stderr, "loading %s ...\r", path.c_str());
  auto model = Model::load(path, args["tokenizer"].as<std::string>());
  if (stderr_is_tty()) std::fprintf(stderr, "\033[K");
  return model;
}

EngineOptions engine_options_from(const cxxopts::ParseResult& args, const Model& model) {
  EngineOptions o;
  o.device = device_from_name(args["device"].as<std::string>());
  o.attn = attn_backend_from_name(args["attn"].as<std::string>());
  o.kv = kv_layout_from_name(args["kv"].as<std::string>());
  if (args.count("cache-type-k")) o.type_k = kv_type_from_name(args["cache-type-k"].as<std::string>());
  if (args.count("cache-type-v")) o.type_v = kv_type_from_name(args["cache-type-v"].as<std::string>());
  const std::string smoothing = args["k-smoothing"].as<std::string>();
  RUNLM_CHECK(smoothing == "on" || smoothing == "off", "--k-smoothing must be on or off, got '%s'", smoothing.c_str());
  o.k_smoothing = smoothing == "on";
  o.verbose = args.count("verbose") > 0;
  o.block_size = args["block-size"].as<int>();
  const int ctx = args["ctx-size"].as<int>();
  RUNLM_CHECK(ctx >= 0, "-c must be >= 0, got %d", ctx);
  o.n_ctx = ctx > 0 ? ctx : std::min(model.config().ctx_train, 4096);
  o.n_threads = args["threads"].as<int>();
  RUNLM_CHECK(o.n_threads >= 0, "-t must be >= 0, got %d", o.n_threads);
  o.n_batch = args["batch-size"].as<int>();
  RUNLM_CHECK(o.n_batch > 0, "-b must be positive, got %d", o.n_batch);
  const std::string swa = args["swa"].as<std::string>();
  if (swa == "off") {
    o.sliding_window = 0;
  } else if (!swa.empty()) {
    char* end = nullptr;
    const long w = std::strtol(swa.c_str(), &end, 10);
    RUNLM_CHECK(*end == '\0' && w > 0 && w < (1L << 30), "--swa must be a positive number of tokens or 'off', got '%s'",
                swa.c_str());
    o.sliding_window = static_cast<int>(w);
  }
  return o;
}

SamplingParams sampling_params_from(const cxxopts::ParseResult& args) {
  SamplingParams p;
  p.temperature = args["temp"].as<float>();
  p.top_k = args["top-k"].as<int>();
  p.top_p = args["top-p"].as<float>();
  p.min_p = args["min-p"].as<float>();
  p.repeat_penalty = args["repeat-penalty"].as<float>();
  p.repeat_last_n = args["repeat-last-n"].as<int>();
  RUNLM_CHECK(std::isfinite(p.temperature) && p.temperature >= 0, "--temp must be >= 0, got %g", p.temperature);
  RUNLM_CHECK(p.repeat_last_n >= 0, "--repeat-last-n must be >= 0, got %d", p.repeat_last_n);
  const int64_t seed = args["seed"].as<int64_t>();
  RUNLM_CHECK(seed >= -1, "-s must be >= 0 (or -1 for random), got %lld", static_cast<long long>(seed));
  p.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();
  return p;
}

}  // namespace runlm
