// runlm chat: interactive conversation on the terminal. Ctrl-C stops the
// current reply (not the program), Ctrl-D or /exit leaves, /reset starts over.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "chat_session.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "model.h"
#include "tokenizer.h"

namespace runlm {

namespace {
std::atomic<bool> g_interrupt{false};
extern "C" void on_sigint(int) { g_interrupt.store(true); }

// --chat-template wins; otherwise the GGUF's own template must be one runlm knows.
std::string pick_template(const cxxopts::ParseResult& args, const Model& model) {
  if (args.count("chat-template")) {
    const std::string name = args["chat-template"].as<std::string>();
    const auto& names = chat_template_names();
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      fail("unknown chat template '%s' for --chat-template; known: %s", name.c_str(), list.c_str());
    }
    return name;
  }
  RUNLM_CHECK(!model.chat_template_source().empty(),
              "the model has no chat template (tokenizer.chat_template); choose one with --chat-template");
  return chat_template_detect(model.chat_template_source());
}
}  // namespace

int cmd_chat(int argc, char** argv) {
  cxxopts::Options opts("runlm chat", "Chat with a model");
  add_model_options(opts);
  add_sampling_options(opts);
  opts.add_options("chat")
      ("chat-template", "llama2, chatml, zephyr, mistral or gemma (default: from the model)",
       cxxopts::value<std::string>())
      ("sys,system-prompt", "system message", cxxopts::value<std::string>()->default_value(""))
      ("n,n-predict", "maximum tokens per reply (-1 = until the end of the turn)",
       cxxopts::value<int>()->default_value("-1"));
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams sp = sampling_params_from(args);
  auto model = load_model_from_options(args);
  const std::string tmpl = pick_template(args, *model);
  auto engine = make_engine(*model, engine_options_from(args, *model));
  Sampler sampler(sp);
  ChatSession session(*engine, model->tokenizer(), sampler, tmpl, args["system-prompt"].as<std::string>());

  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt must not break the read
  sigaction(SIGINT, &sa, nullptr);

  const bool interactive = isatty(STDIN_FILENO) == 1;
  std::fprintf(stderr, "chat: template %s, %s, %d tokens of context. /reset starts over, /exit or Ctrl-D leaves.\n",
               tmpl.c_str(), engine->backend_name(), engine->n_ctx());
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
