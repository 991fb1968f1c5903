// Flags shared by the subcommands that run a model (generate, chat,
// perplexity, bench, batch), named as llama.cpp names them, and the helpers
// that turn them into a loaded Model, an Engine and a Sampler.
#pragma once

#include <chrono>
#include <cxxopts.hpp>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "sampler.h"

namespace runlm {

class Model;

// -m, --tokenizer, -c, -t, -b, --device, --swa.
void add_model_options(cxxopts::Options& opts);
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, -s.
void add_sampling_options(cxxopts::Options& opts);

// Parses argv; on a bad flag or value throws Error with cxxopts' message.
// llama.cpp's spellings are rewritten first (src/cli_flags.h); a stray
// positional argument is an Error unless allow_positional.
cxxopts::ParseResult parse_options(cxxopts::Options& opts, int argc, char** argv, bool allow_positional = false);
// Every value of an option given several times (-r A -r B), in order; the
// values are taken whole (commas are not separators).
std::vector<std::string> option_values(const cxxopts::ParseResult& args, const std::string& long_name);
// opts.help() with the llama.cpp spellings (-np, -sys, -ngl...) shown.
std::string help_text(const cxxopts::Options& opts);

// Loads -m (with --tokenizer), showing progress on stderr when it is a terminal.
std::unique_ptr<Model> load_model_from_options(const cxxopts::ParseResult& args);
EngineOptions engine_options_from(const cxxopts::ParseResult& args, const Model& model);
// -ngl N (llama.cpp's --n-gpu-layers) as a device: 0 = the CPU, -1 or at
// least n_layers = `device` when --device was given, else auto; a split
// between devices is an Error (runlm runs a model on one device).
Device device_from_gpu_layers(const cxxopts::ParseResult& args, int n_layers, Device device);
// -t above the hardware thread count: that count, with a warning on stderr.
int capped_thread_count(int requested);
SamplingParams sampling_params_from(const cxxopts::ParseResult& args);

// True when stderr is a terminal (progress output is shown only then).
bool stderr_is_tty();

// Writes text to stdout and flushes it. A failed write (a full disk,
// /dev/full, a closed pipe with SIGPIPE ignored) is an Error naming the
// cause: output is never lost silently with exit code 0.
void write_stdout(const std::string& text);

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace runlm
