// Flags shared by the subcommands that run a model (generate, chat,
// perplexity, bench, batch), named as llama.cpp names them, and the helpers
// that turn them into a loaded Model, an Engine and a Sampler.
#pragma once

#include <chrono>
#include <cxxopts.hpp>
#include <memory>
#include <string>

#include "engine.h"
#include "sampler.h"

namespace runlm {

class Model;

// -m, --tokenizer, -c, -t, -b, --device, --swa.
void add_model_options(cxxopts::Options& opts);
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, -s.
void add_sampling_options(cxxopts::Options& opts);

// Parses argv; on a bad flag or value throws Error with cxxopts' message.
cxxopts::ParseResult parse_options(cxxopts::Options& opts, int argc, char** argv);

// Loads -m (with --tokenizer), showing progress on stderr when it is a terminal.
std::unique_ptr<Model> load_model_from_options(const cxxopts::ParseResult& args);
EngineOptions engine_options_from(const cxxopts::ParseResult& args, const Model& model);
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
