// runlm chat: interactive conversation on the terminal. Ctrl-C stops the
// current reply (not the program), Ctrl-D or /exit leaves, /reset starts over.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "chat_session.h"
#include "chat_template_cli.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "model.h"
#include "tokenizer.h"

namespace runlm {

namespace {
std::atomic<bool> g_interrupt{false};
extern "C" void on_sigint(int) { g_interrupt.store(true); }

}  // namespace

int cmd_chat(int argc, char** argv) {
  cxxopts::Options opts("runlm chat", "Chat with a model");
  add_model_options(opts);
  add_sampling_options(opts);
  opts.add_options("chat")
      ("sys,system-prompt", "system message", cxxopts::value<std::string>()->default_value(""))
      ("n,n-predict", "maximum tokens per reply (-1 = until the end of the turn)",
       cxxopts::value<int>()->default_value("-1"));
  add_chat_template_options(opts, "chat");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams sp = sampling_params_from(args);
  auto model = load_model_from_options(args);
  const Tokenizer& tok = model->tokenizer();
  const std::optional<ChatTemplate> tmpl =
      chat_template_from_options(args, model->chat_template_source(), args["model"].as<std::string>(),
                                 tok.id_to_piece(tok.bos()), tok.id_to_piece(tok.eos()));
  RUNLM_CHECK(tmpl.has_value(), "%s", no_chat_template_message().c_str());
  // A system prompt the template refuses is refused before the model loads
  // onto the device or the chat starts.
  tmpl->check_system_prompt(args["system-prompt"].as<std::string>());
  auto engine = make_engine(*model, engine_options_from(args, *model));
  Sampler sampler(sp);
  ChatSession session(*engine, tok, sampler, *tmpl, args["system-prompt"].as<std::string>());
  if (args.count("verbose-prompt")) session.set_prompt_observer(print_verbose_prompt);

  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt must not break the read
  sigaction(SIGINT, &sa, nullptr);

  const bool interactive = isatty(STDIN_FILENO) == 1;
  std::fprintf(stderr, "chat: %s, %s, %d tokens of context. /reset starts over, /exit or Ctrl-D leaves.\n",
               tmpl->origin().c_str(), engine->backend_name(), engine->n_ctx());
  std::string line;
  for (;;) {
    if (interactive) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;  // Ctrl-D
    if (line == "/exit") break;
    if (line == "/reset") {
      session.reset();
      std::fprintf(stderr, "(conversation reset)\n");
      continue;
    }
    if (line.empty()) continue;
    g_interrupt.store(false);
    bool output_failed = false;
    try {
      const GenerationResult r = session.reply(line, n_predict, [&](const std::string& text) {
        try {
          write_stdout(text);
        } catch (const Error&) {
          output_failed = true;
          throw;
        }
      }, &g_interrupt);
      output_failed = true;  // the newline below is output too
      write_stdout("\n");
      output_failed = false;
      if (r.finish == FinishReason::Interrupted) std::fprintf(stderr, "(reply stopped)\n");
      if (interactive) std::fprintf(stderr, "[%s]\n", format_timings(r).c_str());
    } catch (const Error& e) {
      // A turn that cannot run (context full, template rule) ends the turn,
      // not the chat; lost output (stdout failed) ends the chat.
      if (output_failed) throw;
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace runlm
