// Every shared vocabulary chats end to end with its family's own template:
// a small random-weight model carrying the vocabulary (make_random_model
// --vocab-from) and the template in its GGUF (tokenizer.chat_template, the
// vocabulary's own where it has one) runs `runlm chat` on the CPU for two
// turns with no template flag, and the second turn reuses the first turn's
// KV cache and replies as a fresh evaluation of the whole conversation does.
// gpt-oss chats through its harmony template with a vocabulary that has the
// harmony tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "chat_session.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "sampler.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {

struct VocabChatCase {
  const char* name;
  const char* vocab;     // test_asset path of the vocabulary GGUF
  const char* tmpl;      // test_asset path of the family's template; "" = the vocabulary's own
  const char* user_tag;  // what the template writes before a user message
};

const VocabChatCase kCases[] = {
    {"llama3", "vocab/ggml-vocab-llama-bpe.gguf", "templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
     "<|start_header_id|>user<|end_header_id|>\n\n"},
    {"qwen2", "vocab/ggml-vocab-qwen2.gguf", "", "<|im_start|>user\n"},
    {"qwen35", "vocab/ggml-vocab-qwen35.gguf", "", "<|im_start|>user\n"},
    {"gpt2_granite", "vocab/ggml-vocab-gpt-2.gguf", "templates/ibm-granite-granite-3.3-2B-Instruct.jinja",
     "<|start_of_role|>user<|end_of_role|>"},
    {"deepseek", "vocab/ggml-vocab-deepseek-llm.gguf", "templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
     "<\xef\xbd\x9cUser\xef\xbd\x9c>"},
    {"phi3", "vocab/ggml-vocab-phi-3.gguf", "", "<|user|>\n"},
    {"llama_spm_mistral", "models/ggml-vocab-llama-spm.gguf",
     "templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", "[INST]"},
};

class VocabChat : public ::testing::TestWithParam<VocabChatCase> {
 protected:
  // The random model with the case's vocabulary and template; "" when an
  // asset is missing (the test has then been skipped or failed).
  std::string make_model(const TempPath& out) {
    const VocabChatCase& c = GetParam();
    const std::string vocab = test_asset(c.vocab);
    std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) +
                      " --preset tiny --type f16 --layers 1 --threads 2 --vocab-from " + vocab + " -o " + out.str();
    if (*c.tmpl) cmd += " --chat-template-file " + test_asset(c.tmpl);
    const CommandResult made = run_command(cmd);
    EXPECT_EQ(made.exit_code, 0) << made.err;
    return made.exit_code == 0 ? out.str() : "";
  }
};

const char* kTurn1 = "Hello there, tell me a story.";
const char* kTurn2 = "And one about a caf\xc3\xa9?";

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_P(VocabChat, ChatsTwoTurnsWithTheTemplateInItsGguf) {
  const VocabChatCase& c = GetParam();
  RUNLM_REQUIRE_ASSET(test_asset(c.vocab));
  if (*c.tmpl) RUNLM_REQUIRE_ASSET(test_asset(c.tmpl));
  TempPath file(".gguf");
  const std::string model = make_model(file);
  ASSERT_FALSE(model.empty());

  const CommandResult r =
      run_command(runlm_binary() + " chat -m " + model + " --device cpu -t 2 --temp 0 -n 6 --verbose-prompt",
                  std::string(kTurn1) + "\n" + kTurn2 + "\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The template is the GGUF's own, not a built-in one.
  EXPECT_NE(r.err.find("chat: tokenizer.chat_template of " + model), std::string::npos) << r.err;
  // Two prompts were rendered; the second holds both user turns, each after
  // the template's user tag.
  EXPECT_EQ(count_of(r.err, "prompt ("), 2u) << r.err;
  const size_t second = r.err.rfind("prompt (");
  const std::string last_prompt = r.err.substr(second);
  EXPECT_NE(last_prompt.find(std::string(c.user_tag) + kTurn1), std::string::npos) << last_prompt;
  EXPECT_NE(last_prompt.find(kTurn2), std::string::npos) << last_prompt;
  EXPECT_GE(count_of(last_prompt, c.user_tag), 2u) << last_prompt;
  // Each reply ends with a newline (a reply of random weights may hold more).
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
}

TEST_P(VocabChat, SecondTurnReusesTheCacheAndMatchesAFreshRun) {
  const VocabChatCase& c = GetParam();
  RUNLM_REQUIRE_ASSET(test_asset(c.vocab));
  if (*c.tmpl) RUNLM_REQUIRE_ASSET(test_asset(c.tmpl));
  TempPath file(".gguf");
  const std::string path = make_model(file);
  ASSERT_FALSE(path.empty());
  auto model = Model::load(path);
  const Tokenizer& tok = model->tokenizer();
  ASSERT_FALSE(model->chat_template_source().empty());
  const ChatTemplate tmpl(model->chat_template_source(), "the model's", tok.bos() >= 0 ? tok.id_to_piece(tok.bos()) : "",
                          tok.eos() >= 0 ? tok.id_to_piece(tok.eos()) : "");
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 512;
  SamplingParams greedy;
  greedy.temperature = 0;

  auto engine = make_cpu_engine(*model, eo);
  Sampler sampler(greedy);
  ChatSession chat(*engine, tok, sampler, tmpl, "");
  chat.reply(kTurn1, 8, [](const std::string&) {});
  const GenerationResult second = chat.reply(kTurn2, 8, [](const std::string&) {});
  // The second prompt is the cache less the reply's own tokens; only what
  // follows its common prefix with the first turn was evaluated.
  const int second_prompt = static_cast<int>(chat.cached_tokens().size()) - second.n_generated_cached;
  EXPECT_GT(second.n_prompt_evaluated, 0);
  EXPECT_LT(second.n_prompt_evaluated, second_prompt);

  auto engine2 = make_cpu_engine(*model, eo);
  Sampler sampler2(greedy);
  ChatSession fresh(*engine2, tok, sampler2, tmpl, "");
  fresh.load_history(std::vector<ChatMessage>(chat.messages().begin(), chat.messages().begin() + 2));
  const GenerationResult again = fresh.reply(kTurn2, 8, [](const std::string&) {});
  EXPECT_EQ(again.n_prompt_evaluated, second_prompt);  // all of it
  EXPECT_EQ(second.tokens, again.tokens);
}

INSTANTIATE_TEST_SUITE_P(SharedVocabularies, VocabChat, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<VocabChatCase>& i) { return std::string(i.param.name); });

// A small random gpt-oss (experts, sinks, alternating windows) with a
// vocabulary that has the harmony tokens (GPT-2's plus them: no o200k
// vocabulary is among the shared files) and gpt-oss's own template chats two
// turns; the first reply goes back into the conversation as a final-channel
// message, and <|end|> (which closes a harmony message) does not end a reply.
TEST(GptOssChat, TwoTurnsThroughTheHarmonyTemplate) {
  const std::string vocab_src = test_asset("vocab/ggml-vocab-gpt-2.gguf");
  const std::string tmpl = test_asset("templates/openai-gpt-oss-120b.jinja");
  RUNLM_REQUIRE_ASSET(vocab_src);
  RUNLM_REQUIRE_ASSET(tmpl);
  TempPath vocab(".gguf"), file(".gguf");
  {
    auto g = GgufFile::open(vocab_src);
    GgufWriter w;
    for (GgufKV e : g->metadata()) {
      if (e.key.rfind("tokenizer.", 0) != 0) continue;
      for (const char* t : {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                            "<|constrain|>"}) {
        if (e.key == "tokenizer.ggml.tokens") e.value.arr.push_back(GgufValue::make_string(t));
        if (e.key == "tokenizer.ggml.token_type") e.value.arr.push_back(GgufValue::make_i32(3));
      }
      w.set(e.key, e.value);
    }
    w.write(vocab.str());
  }
  const CommandResult made = run_command(
      std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset gpt-oss-20b --dim 64 --heads 4 --kv-heads 2 --head-dim 16" +
      " --layers 2 --experts 4 --experts-used 2 --expert-hidden 64 --type f32 --threads 2 --vocab-from " +
      vocab.str() + " --chat-template-file " + tmpl + " -o " + file.str());
  ASSERT_EQ(made.exit_code, 0) << made.err;

  const CommandResult r =
      run_command(runlm_binary() + " chat -m " + file.str() + " --device cpu -t 2 --temp 0 -n 6 --verbose-prompt",
                  std::string(kTurn1) + "\n" + kTurn2 + "\n/exit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "prompt ("), 2u) << r.err;
  const std::string last_prompt = r.err.substr(r.err.rfind("prompt ("));
  EXPECT_NE(last_prompt.find(std::string("<|start|>user<|message|>") + kTurn1 + "<|end|>"), std::string::npos)
      << last_prompt;
  EXPECT_NE(last_prompt.find(std::string("<|start|>user<|message|>") + kTurn2 + "<|end|>"), std::string::npos)
      << last_prompt;
  EXPECT_NE(last_prompt.find("<|start|>assistant<|channel|>final<|message|>"), std::string::npos) << last_prompt;
  EXPECT_GE(std::count(r.out.begin(), r.out.end(), '\n'), 2) << r.out;
}
