#include "cli_common.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "cli_flags.h"
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
      ("n-gpu-layers",
       "llama.cpp's layer count on the GPU: 0 = --device cpu; -1 or at least the model's layers = --device auto "
       "(runlm runs a whole model on one device)",
       cxxopts::value<int>())
      ("attn", "prefill attention on the GPU: auto (fa2 or fa3), naive, fa2 or fa3",
       cxxopts::value<std::string>()->default_value("auto"))
      ("flash-attn",
       "llama.cpp's switch: on or auto = --attn auto (fa2 or fa3); off = --attn naive on the GPU, and on the CPU "
       "its own attention, which is not flash attention",
       cxxopts::value<std::string>())
      ("kv", "KV cache layout: contiguous or paged", cxxopts::value<std::string>()->default_value("contiguous"))
      ("block-size", "KV page size in tokens (paged)", cxxopts::value<int>()->default_value("16"))
      ("cache-type-k", "KV cache type of K: f32, f16, bf16, q8_0, q4_0, fp8 (default: f32 on the CPU, f16 on the GPU)",
       cxxopts::value<std::string>())
      ("cache-type-v", "KV cache type of V: same choices", cxxopts::value<std::string>())
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

std::vector<CliOptionInfo> option_infos(const cxxopts::Options& opts) {
  std::vector<CliOptionInfo> infos;
  for (const auto& group : opts.groups())
    for (const auto& d : opts.group_help(group).options) {
      CliOptionInfo info;
      info.short_name = d.s;
      info.long_names.assign(d.l.begin(), d.l.end());
      info.takes_value = !d.is_boolean;
      infos.push_back(std::move(info));
    }
  return infos;
}

std::vector<std::string> option_values(const cxxopts::ParseResult& args, const std::string& long_name) {
  std::vector<std::string> values;
  for (const auto& kv : args.arguments())
    if (kv.key() == long_name) values.push_back(kv.value());
  return values;
}

std::string help_text(const cxxopts::Options& opts) { return help_with_llama_spellings(opts.help(), option_infos(opts)); }

cxxopts::ParseResult parse_options(cxxopts::Options& opts, int argc, char** argv, bool allow_positional) {
  // llama.cpp's spellings (-ngl, -fa, -np, -sys...) become runlm's long
  // options before cxxopts, which would read "-fa" as "-f a".
  std::vector<std::string> in(argv + 1, argv + argc);
  const CliRewrite rw = rewrite_cli_args(in, option_infos(opts), opts.program(), allow_positional);
  std::vector<std::string> storage;
  storage.push_back(argv[0]);
  storage.insert(storage.end(), rw.args.begin(), rw.args.end());
  std::vector<char*> ptrs;
  for (auto& s : storage) ptrs.push_back(s.data());
  ptrs.push_back(nullptr);
  argc = static_cast<int>(storage.size());
  argv = ptrs.data();
  try {
    auto result = opts.parse(argc, argv);
    if (!allow_positional && !result.unmatched().empty())
      fail("unexpected argument '%s' (see '%s --help')", result.unmatched()[0].c_str(), opts.program().c_str());
    return result;
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

Device device_from_gpu_layers(const cxxopts::ParseResult& args, int n_layers, Device device) {
  const int ngl = args["n-gpu-layers"].as<int>();
  const bool device_given = args.count("device") > 0;
  RUNLM_CHECK(ngl >= -1, "-ngl must be >= -1, got %d", ngl);
  if (ngl == 0) {
    RUNLM_CHECK(!device_given || device == Device::Cpu, "-ngl 0 runs on the CPU; it contradicts --device %s",
                device_name(device));
    return Device::Cpu;
  }
  RUNLM_CHECK(ngl == -1 || ngl >= n_layers,
              "-ngl %d: runlm runs a whole model on one device, it does not split layers between the CPU and a GPU; "
              "use -ngl 0 (the CPU) or -ngl %d or more (all %d layers on the GPU, the CPU when there is none)",
              ngl, n_layers, n_layers);
  // As a llama.cpp build without a GPU does, "all layers" runs on the CPU
  // when there is no GPU: that is --device auto.
  RUNLM_CHECK(!device_given || device != Device::Cpu, "-ngl %d asks for the GPU; it contradicts --device cpu", ngl);
  return device_given ? device : Device::Auto;
}

int capped_thread_count(int requested) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (requested <= hw) return requested;
  // More threads than the hardware runs at once only adds switching (and at
  // -t 100000 would starve the machine creating them).
  std::fprintf(stderr, "warning: -t %d is more than the %d hardware threads; using %d\n", requested, hw, hw);
  return hw;
}

EngineOptions engine_options_from(const cxxopts::ParseResult& args, const Model& model) {
  EngineOptions o;
  o.device = device_from_name(args["device"].as<std::string>());
  if (args.count("n-gpu-layers")) o.device = device_from_gpu_layers(args, model.config().n_layers, o.device);
  o.attn = attn_backend_from_name(args["attn"].as<std::string>());
  if (args.count("flash-attn")) {
    RUNLM_CHECK(!args.count("attn"), "use either -fa or --attn, not both");
    const std::string fa = args["flash-attn"].as<std::string>();
    RUNLM_CHECK(fa == "on" || fa == "off" || fa == "auto", "-fa takes on, off or auto, got '%s'", fa.c_str());
    // The CPU backend has one attention, a plain (not flash) one: "off" is
    // what it does already. On the GPU "off" is the naive kernel.
    const bool on_cpu = o.device == Device::Cpu || (o.device == Device::Auto && !cuda_device_available());
    o.attn = fa == "off" && !on_cpu ? AttnBackend::Naive : AttnBackend::Auto;
  }
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
  o.n_threads = capped_thread_count(o.n_threads);
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
