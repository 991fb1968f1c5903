// runlm chat: interactive conversation on the terminal (line editing and
// history through libedit). Ctrl-C during a reply stops the reply; at the
// prompt it leaves, as llama-cli does (exit code 130). Ctrl-D or /exit
// leaves, /reset starts over, /help lists the commands.
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
#include "escapes.h"
#include "line_reader.h"
#include "model.h"
#include "tokenizer.h"

namespace runlm {

namespace {
std::atomic<bool> g_interrupt{false};
std::atomic<bool> g_in_reply{false};
extern "C" void on_sigint(int) {
  if (g_in_reply.load()) {
    g_interrupt.store(true);  // stops the reply; the chat goes on
    return;
  }
  // At the prompt: leave, as llama-cli does. Only async-signal-safe calls.
  const char nl = '\n';
  (void)!write(STDERR_FILENO, &nl, 1);
  _exit(130);
}

constexpr const char* kCommandsHelp =
    "commands: /help this list | /reset forget the conversation (the system prompt stays) | /exit leave "
    "(or Ctrl-D; Ctrl-C at the prompt) | Ctrl-C during a reply stops it\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  cxxopts::Options opts("runlm chat", "Chat with a model");
  add_model_options(opts);
  add_sampling_options(opts);
  opts.add_options("chat")
      ("system-prompt", "system message", cxxopts::value<std::string>()->default_value(""))
      ("n,n-predict", "maximum tokens per reply (-1 = until the end of the turn or a full context)",
       cxxopts::value<int>()->default_value("1024"))
      ("r,reverse-prompt", "end the reply after this text and return to the prompt, as llama-cli (repeatable)",
       cxxopts::value<std::string>())
      ("stop", "end the reply before this text (repeatable)", cxxopts::value<std::string>())
      ("e,escape", "process escapes (\\n \\t \\xHH...) in the system prompt and the -r/--stop strings")
      ("conversation", "accepted: chat is always a conversation");
  add_chat_template_options(opts, "chat");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams sp = sampling_params_from(args);
  auto model = load_model_from_options(args);
  const Tokenizer& tok = model->tokenizer();
  const std::optional<ChatTemplate> tmpl = chat_template_from_options(
      args, model->chat_template_source(), args["model"].as<std::string>(),
      tok.bos() >= 0 ? tok.id_to_piece(tok.bos()) : "", tok.eos() >= 0 ? tok.id_to_piece(tok.eos()) : "");
  RUNLM_CHECK(tmpl.has_value(), "%s", no_chat_template_message().c_str());
  const bool escapes = args.count("escape") > 0;
  auto unescape = [&](std::string t) { return escapes ? process_escapes(t) : t; };
  const std::string system_prompt = unescape(args["system-prompt"].as<std::string>());
  std::vector<std::string> stop = option_values(args, "stop"), reverse = option_values(args, "reverse-prompt");
  for (auto& x : stop) x = unescape(x);
  for (auto& x : reverse) x = unescape(x);
  // A system prompt the template refuses is refused before the model loads
  // onto the device or the chat starts, not on every turn.
  tmpl->check_system_prompt(system_prompt);
  auto engine = make_engine(*model, engine_options_from(args, *model));
  Sampler sampler(sp);
  ChatSession session(*engine, tok, sampler, *tmpl, system_prompt);
  session.set_stop_strings(stop, reverse);
  if (args.count("verbose-prompt")) session.set_prompt_observer(print_verbose_prompt);

  struct sigaction sa = {};
  sa.sa_handler = on_sigint;
  sa.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt must not break the read
  sigaction(SIGINT, &sa, nullptr);

  LineReader reader(isatty(STDIN_FILENO) == 1);
  std::fprintf(stderr,
               "chat: %s, %s, %d tokens of context, replies of at most %s tokens. /help lists the "
               "commands.\n",
               tmpl->origin().c_str(), engine->backend_name(), engine->n_ctx(),
               n_predict < 0 ? "context" : std::to_string(n_predict).c_str());
  std::string line;
  while (reader.read("> ", &line)) {
    if (line == "/exit") break;
    if (line == "/help") {
      std::fprintf(stderr, "%s", kCommandsHelp);
      continue;
    }
    if (line == "/reset") {
      session.reset();
      std::fprintf(stderr, "(conversation reset)\n");
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // nothing to send
    g_interrupt.store(false);
    bool output_failed = false;
    try {
      g_in_reply.store(true);
      const GenerationResult r = session.reply(line, n_predict, [&](const std::string& text) {
        try {
          write_stdout(text);
        } catch (const Error&) {
          output_failed = true;
          throw;
        }
      }, &g_interrupt);
      g_in_reply.store(false);
      output_failed = true;  // the newline below is output too
      write_stdout("\n");
      output_failed = false;
      if (session.dropped_messages() > 0)
        std::fprintf(stderr, "(context full: the %d oldest messages were dropped, the system prompt kept)\n",
                     session.dropped_messages());
      if (r.finish == FinishReason::Interrupted) std::fprintf(stderr, "(reply stopped)\n");
      if (r.finish == FinishReason::Length) std::fprintf(stderr, "(reply cut at -n %d tokens)\n", n_predict);
      if (reader.interactive() || r.finish == FinishReason::Interrupted)
        std::fprintf(stderr, "[%s]\n", format_timings(r).c_str());
    } catch (const Error& e) {
      g_in_reply.store(false);
      // A turn that cannot run (a message longer than the context) ends the
      // turn, not the chat; lost output (stdout failed) ends the chat.
      if (output_failed) throw;
      std::fprintf(stderr, "error: %s\n", e.what());
    }
  }
  return 0;
}

}  // namespace runlm
