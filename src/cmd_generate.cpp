// runlm generate: complete a prompt, streaming tokens to stdout and the
// timings to stderr (as llama.cpp's llama-cli does without -cnv).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "chat_template_cli.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "generation.h"
#include "model.h"
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
      ("no-display-prompt", "print only the generated text")
      ("verbose-prompt", "print the prompt and its token count on stderr");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  RUNLM_CHECK(!(args.count("prompt") && args.count("file")), "use either -p or -f, not both");
  const std::string prompt = args.count("file") ? read_text_file(args["file"].as<std::string>())
                                                : args["prompt"].as<std::string>();
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams sp = sampling_params_from(args);

  auto model = load_model_from_options(args);
  const EngineOptions eo = engine_options_from(args, *model);
  auto engine = make_engine(*model, eo);
  const Tokenizer& tok = model->tokenizer();

  GenerationRequest req;
  req.prompt = tok.encode(prompt, /*add_bos=*/true);
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
  const GenerationResult r = generate(*engine, sampler, tok, req, [](int, const std::string& piece) {
    write_stdout(piece);
    return true;
  });
  write_stdout("\n");
  std::fprintf(stderr, "%s | stop: %s\n", format_timings(r).c_str(), finish_reason_name(r.finish));
  return 0;
}

}  // namespace runlm
