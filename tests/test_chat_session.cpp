// Chat turns re-use the KV cache of earlier turns and give the same reply as
// evaluating the whole conversation from scratch.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>

#include "chat_session.h"
#include "common.h"
#include "engine.h"
#include "model.h"
#include "sampler.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {
std::unique_ptr<Engine> cpu_engine(const Model& m) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 512;
  return make_cpu_engine(m, eo);
}
ChatTemplate builtin(const std::string& name, const Tokenizer& tok) {
  return ChatTemplate(builtin_chat_template(name), name, tok.id_to_piece(tok.bos()), tok.id_to_piece(tok.eos()));
}
SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}
}  // namespace

TEST(ChatSession, SecondTurnReusesTheCacheAndMatchesAFreshRun) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  auto engine = cpu_engine(*model);
  Sampler sampler(greedy());
  const ChatTemplate llama2 = builtin("llama2", model->tokenizer());
  ChatSession chat(*engine, model->tokenizer(), sampler, llama2, "You tell stories.");
  std::string first;
  const auto r1 = chat.reply("Tell me about a cat.", 24, [&](const std::string& t) { first += t; });
  EXPECT_EQ(r1.n_prompt_evaluated, static_cast<int>(chat.cached_tokens().size()) - r1.n_generated_cached);
  const size_t cached_after_first = chat.cached_tokens().size();
  EXPECT_FALSE(first.empty());

  std::string second;
  const auto r2 = chat.reply("And a dog?", 24, [&](const std::string& t) { second += t; });
  // Only the tokens after the common prefix were evaluated.
  EXPECT_LT(r2.n_prompt_evaluated, static_cast<int>(cached_after_first));
  EXPECT_GT(r2.n_prompt_evaluated, 0);

  // The same conversation evaluated from scratch gives the same second reply.
  auto engine2 = cpu_engine(*model);
  Sampler sampler2(greedy());
  ChatSession fresh(*engine2, model->tokenizer(), sampler2, llama2, "You tell stories.");
  std::vector<ChatMessage> history(chat.messages().begin(), chat.messages().begin() + 3);
  fresh.load_history(history);
  std::string second_fresh;
  const auto r3 = fresh.reply("And a dog?", 24, [&](const std::string& t) { second_fresh += t; });
  EXPECT_EQ(r3.n_prompt_evaluated, static_cast<int>(fresh.cached_tokens().size()) - r3.n_generated_cached);  // all of it
  EXPECT_EQ(second, second_fresh);
  EXPECT_EQ(r2.tokens, r3.tokens);
}

TEST(ChatSession, ResetKeepsTheSystemPrompt) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  auto engine = cpu_engine(*model);
  Sampler sampler(greedy());
  const ChatTemplate chatml = builtin("chatml", model->tokenizer());
  ChatSession chat(*engine, model->tokenizer(), sampler, chatml, "Be brief.");
  chat.reply("Hi", 8, nullptr);
  EXPECT_EQ(chat.messages().size(), 3u);
  chat.reset();
  ASSERT_EQ(chat.messages().size(), 1u);
  EXPECT_EQ(chat.messages()[0].role, "system");
}

TEST(ChatSession, GemmaRejectsASystemPrompt) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  auto engine = cpu_engine(*model);
  Sampler sampler(greedy());
  const ChatTemplate gemma = builtin("gemma", model->tokenizer());
  // Refused when the session starts, not at the first turn.
  const std::string msg = error_of([&] { ChatSession chat(*engine, model->tokenizer(), sampler, gemma, "Be brief."); });
  EXPECT_NE(msg.find("System role not supported"), std::string::npos) << msg;
  ChatSession no_system(*engine, model->tokenizer(), sampler, gemma, "");
  EXPECT_NO_THROW(no_system.reply("Hi", 4, nullptr));
}

TEST(ChatSession, CliRefusesASystemPromptTheTemplateRejects) {
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                          " --chat-template gemma -sys 'Be brief.' -n 4 -t 2",
                                      "Hello\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("System role not supported"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("chat:"), std::string::npos) << r.err;  // the chat never started
}

TEST(ChatSession, CliVerbosePromptAndTemplateFile) {
  TempPath tmpl(".jinja");
  {
    std::ofstream f(tmpl.str());
    f << "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>";
  }
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                          " --jinja --chat-template-file " + tmpl.str() +
                                          " -sys 'Be brief.' --verbose-prompt -n 4 -t 2 --temp 0",
                                      "Hello\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("<system>Be brief.\n<user>Hello\n<assistant>"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens):"), std::string::npos) << r.err;
  const CommandResult both = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                         " --chat-template chatml --chat-template-file " + tmpl.str());
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("choose one"), std::string::npos) << both.err;
}

TEST(ChatSession, CliChatRunsTurnsFromStdin) {
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                          " --chat-template llama2 -sys 'You tell stories.' --temp 0 -n 16 -t 2",
                                      "Hello\n/reset\nOnce upon a time\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("conversation reset"), std::string::npos) << r.err;
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
}

TEST(ChatSession, CliUnknownTemplateIsAnError) {
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                      " --chat-template nosuch");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
  const CommandResult r2 = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf"));
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_NE(r2.err.find("--chat-template"), std::string::npos) << r2.err;
}

TEST(ChatSession, FullContextDropsTheOldestTurnsAndKeepsTheSystemPrompt) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 96;
  auto engine = make_cpu_engine(*model, eo);
  Sampler sampler(greedy());
  const ChatTemplate llama2 = builtin("llama2", model->tokenizer());
  ChatSession chat(*engine, model->tokenizer(), sampler, llama2, "Be brief.");
  int dropped = 0;
  for (int turn = 0; turn < 6; ++turn) {
    std::string reply;
    // Each turn must run: the context never refuses a turn.
    ASSERT_NO_THROW(chat.reply("Tell me a story about turn " + std::to_string(turn) + ".", 24,
                               [&](const std::string& t) { reply += t; }))
        << "turn " << turn;
    dropped += chat.dropped_messages();
    ASSERT_FALSE(chat.messages().empty());
    EXPECT_EQ(chat.messages()[0].role, "system");
    EXPECT_EQ(chat.messages()[0].content, "Be brief.");
    EXPECT_EQ(chat.messages().back().role, "assistant");
    EXPECT_LE(static_cast<int>(chat.cached_tokens().size()), 96);
  }
  EXPECT_GT(dropped, 0) << "six turns of 24-token replies cannot fit 96 tokens";
  EXPECT_LT(chat.messages().size(), 1u + 2 * 6);
  // The newest turn is always kept.
  EXPECT_EQ(chat.messages()[chat.messages().size() - 2].content, "Tell me a story about turn 5.");
}

TEST(ChatSession, ReversePromptEndsTheReplyAfterItAndStopBeforeIt) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  auto run = [&](std::vector<std::string> stop, std::vector<std::string> rp) {
    auto engine = cpu_engine(*model);
    Sampler sampler(greedy());
    const ChatTemplate llama2 = builtin("llama2", model->tokenizer());
    ChatSession chat(*engine, model->tokenizer(), sampler, llama2, "");
    chat.set_stop_strings(std::move(stop), std::move(rp));
    std::string shown;
    const auto r = chat.reply("Tell me about a cat.", 48, [&](const std::string& t) { shown += t; });
    EXPECT_EQ(shown, chat.messages().back().content);
    return std::make_pair(shown, r.finish);
  };
  const std::string base = run({}, {}).first;
  const size_t word = base.find(' ', base.size() / 3) + 1;
  const size_t word_end = base.find_first_of(" .,\n", word);
  ASSERT_TRUE(word != std::string::npos && word_end != std::string::npos && word_end > word) << base;
  const std::string w = base.substr(word, word_end - word);
  const size_t first = base.find(w);
  const auto rp = run({}, {w});
  EXPECT_EQ(rp.first, base.substr(0, first + w.size()));
  EXPECT_EQ(rp.second, FinishReason::Stop);
  const auto st = run({w}, {});
  EXPECT_EQ(st.first, base.substr(0, first));
}

TEST(ChatSession, CliSystemPromptTheTemplateRefusesFailsBeforeTheChat) {
  // gemma has no system role: the chat must not start and then fail every turn.
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                          " --chat-template gemma -sys 'Be brief.' --temp 0 -n 4 -t 2",
                                      "Hi\n");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("does not take a system prompt (-sys)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("chat: template"), std::string::npos) << "the chat started:\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // Without -sys gemma chats.
  const CommandResult ok = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                           " --chat-template gemma --temp 0 -n 4 -t 2",
                                       "Hi\n");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST(ChatSession, CliIgnoresBlankLinesAndListsItsCommands) {
  const CommandResult r = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                          " --chat-template llama2 --temp 0 -n 4 -t 2",
                                      "   \n\t\n\n/help\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.out.empty()) << "a blank line was sent as a turn:\n" << r.out;
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
  for (const char* cmd : {"/help", "/reset", "/exit", "Ctrl-C"})
    EXPECT_NE(r.err.find(cmd), std::string::npos) << cmd << " missing from:\n" << r.err;
  // Replies are bounded by default (-n 1024), and llama.cpp's -cnv is accepted.
  const CommandResult h = run_command(runlm_binary() + " chat --help");
  EXPECT_NE(h.out.find("(default: 1024)"), std::string::npos) << h.out;
  const CommandResult cnv = run_command(runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                                            " -cnv --chat-template llama2 --temp 0 -n 4 -t 2",
                                        "Hi\n");
  EXPECT_EQ(cnv.exit_code, 0) << cnv.err;
  EXPECT_FALSE(cnv.out.empty());
}

TEST(ChatSession, CliCtrlCAtThePromptLeaves) {
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  TempPath err(".err");
  const std::string cmd = "exec " + runlm_binary() + " chat -m " + shared_model("stories260K.gguf") +
                          " --chat-template llama2 --temp 0 -n 4 -t 2 >/dev/null 2>" + err.str();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    close(in[1]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  // Idle at the prompt once the banner is out (stdin stays open). The banner
  // must appear: a wait that ran out would send the signal before the prompt.
  bool at_prompt = false;
  for (int i = 0; i < 3000 && !at_prompt; ++i) {
    at_prompt = read_file(err.str()).find("/help lists the commands") != std::string::npos;
    if (!at_prompt) usleep(20000);
  }
  EXPECT_TRUE(at_prompt) << read_file(err.str());
  kill(pid, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 1500 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) usleep(20000);
  }
  close(in[1]);
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "chat did not leave on Ctrl-C at the prompt\n" << read_file(err.str());
  }
  ASSERT_TRUE(WIFEXITED(status)) << read_file(err.str());
  EXPECT_EQ(WEXITSTATUS(status), 130) << read_file(err.str());
}
