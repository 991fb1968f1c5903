// runlm generate: complete a prompt, streaming tokens to stdout and the
// timings to stderr (as llama.cpp's llama-cli does without -cnv).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "chat_template_cli.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "escapes.h"
#include "generation.h"
#include "model.h"
#include "stop_strings.h"
#include "tokenizer.h"

namespace runlm {

namespace {
std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RUNLM_CHECK(in, "cannot open prompt file %s", path.c_str());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::atomic<bool> g_generate_interrupt{false};
extern "C" void on_generate_sigint(int) { g_generate_interrupt.store(true); }
}  // namespace

int cmd_generate(int argc, char** argv) {
  cxxopts::Options opts("runlm generate", "Generate text from a prompt");
  add_model_options(opts);
  add_sampling_options(opts);
  opts.add_options("generation")
      ("p,prompt", "prompt text", cxxopts::value<std::string>()->default_value(""))
      ("f,file", "read the prompt from a file", cxxopts::value<std::string>())
      ("n,n-predict", "tokens to generate (-1 = until EOS or the context is full)",
       cxxopts::value<int>()->default_value("-1"))
      ("ignore-eos", "keep generating after EOS")
      ("no-parse-special", "encode special-token texts in the prompt (<|im_start|>, </s>...) as plain text")
      ("no-display-prompt", "print only the generated text")
      ("r,reverse-prompt", "stop after the output ends with this text, printing it (repeatable)",
       cxxopts::value<std::string>())
      ("stop", "stop before this text, which is not printed (repeatable)", cxxopts::value<std::string>())
      ("e,escape", "process escapes in the prompt and stop strings: \\n \\r \\t \\\\ \\\" \\' \\xHH")
      ("no-conversation", "accepted: generate is always a plain completion (chat is 'runlm chat')")
      ("verbose-prompt", "print the prompt and its token count on stderr");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  RUNLM_CHECK(!(args.count("prompt") && args.count("file")), "use either -p or -f, not both");
  const bool escapes = args.count("escape") > 0;
  auto unescape = [&](const std::string& t) { return escapes ? process_escapes(t) : t; };
  const std::string prompt = unescape(args.count("file") ? read_text_file(args["file"].as<std::string>())
                                                         : args["prompt"].as<std::string>());
  std::vector<std::string> stop_after = option_values(args, "reverse-prompt");
  std::vector<std::string> stop_before = option_values(args, "stop");
  for (auto& s : stop_after) s = unescape(s);
  for (auto& s : stop_before) s = unescape(s);
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams sp = sampling_params_from(args);

  auto model = load_model_from_options(args);
  const EngineOptions eo = engine_options_from(args, *model);
  auto engine = make_engine(*model, eo);
  const Tokenizer& tok = model->tokenizer();

  GenerationRequest req;
  // As llama.cpp: BOS where the vocabulary asks for it, special-token texts
  // in the prompt parsed unless --no-parse-special.
  req.prompt = tok.encode(prompt, tok.add_bos(), /*parse_special=*/args.count("no-parse-special") == 0);
  RUNLM_CHECK(!req.prompt.empty(), "the prompt is empty and the vocabulary adds no BOS: give a prompt with -p or -f");
  if (args.count("verbose-prompt")) print_verbose_prompt(prompt, req.prompt.size());
  req.n_predict = n_predict;
  req.ignore_eos = args.count("ignore-eos") > 0;
  RUNLM_CHECK(static_cast<int>(req.prompt.size()) <= engine->n_ctx(),
              "prompt is %zu tokens, longer than the context size %d (-c)", req.prompt.size(), engine->n_ctx());

  Sampler sampler(sp);
  std::fprintf(stderr, "model: %s | %s | %d tokens of context | sampling: %s\n", args["model"].as<std::string>().c_str(),
               engine->backend_name(), engine->n_ctx(), sampler.describe().c_str());
  // write_stdout throws on a failed write (e.g. > /dev/full): generation
  // stops with an error and exit code 1 instead of succeeding silently.
  if (!args.count("no-display-prompt")) write_stdout(prompt);
  // Ctrl-C stops generation; the timings are still printed (as llama-cli).
  struct sigaction sa = {};
  sa.sa_handler = on_generate_sigint;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  StopStringFilter stops(stop_before, stop_after);
  const GenerationResult r = generate(*engine, sampler, tok, req, [&](int, const std::string& piece) {
    bool stopped = false;
    write_stdout(stops.push(piece, &stopped));
    return !stopped;
  }, &g_generate_interrupt);
  if (r.finish != FinishReason::Stop) write_stdout(stops.flush());
  write_stdout("\n");
  std::fprintf(stderr, "%s | stop: %s\n", format_timings(r).c_str(), finish_reason_name(r.finish));
  return r.finish == FinishReason::Interrupted ? 130 : 0;
}

}  // namespace runlm
