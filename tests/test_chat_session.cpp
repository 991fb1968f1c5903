// Chat turns re-use the KV cache of earlier turns and give the same reply as
// evaluating the whole conversation from scratch.
#include <gtest/gtest.h>

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
