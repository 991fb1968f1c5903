// runlm template: prints exactly the rendered conversation, from the GGUF's
// metadata alone (vocabulary-only files work), with a template file, a
// built-in name or the model's own template.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf.h"
#include "test_support.h"

using namespace runlm::test;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string write_conversation(const TempPath& p, const nlohmann::json& conv) {
  std::ofstream(p.str()) << conv.dump();
  return p.str();
}

}  // namespace

TEST(CmdTemplate, VocabOnlyGgufWithATemplateFileMatchesJinja2) {
  const std::string vocab = test_asset("vocab/ggml-vocab-phi-3.gguf");
  const std::string tmpl = test_asset("templates/microsoft-Phi-3.5-mini-instruct.jinja");
  RUNLM_REQUIRE_ASSET(vocab);
  RUNLM_REQUIRE_ASSET(tmpl);
  const std::string goldens = std::string(RUNLM_SOURCE_DIR) + "/tests/data/jinja_goldens/";
  const auto convs = nlohmann::json::parse(slurp(goldens + "conversations.json")).at("conversations");
  const auto golden = nlohmann::json::parse(slurp(goldens + "microsoft-Phi-3.5-mini-instruct.json")).at("results");
  for (const char* conv : {"multi_turn", "unicode"}) {
    TempPath p(".json");
    const std::string base = runlm_binary() + " template -m " + vocab + " --chat-template-file " + tmpl +
                             " --messages " + write_conversation(p, convs.at(conv));
    const CommandResult gen = run_command(base);
    ASSERT_EQ(gen.exit_code, 0) << gen.err;
    EXPECT_EQ(gen.out, golden.at(std::string(conv) + ".gen").at("text").get<std::string>());
    EXPECT_EQ(gen.err, "");
    const CommandResult nogen = run_command(base + " --no-add-generation-prompt --jinja");
    ASSERT_EQ(nogen.exit_code, 0) << nogen.err;
    EXPECT_EQ(nogen.out, golden.at(std::string(conv) + ".nogen").at("text").get<std::string>());
  }
}

TEST(CmdTemplate, BuiltinNameUsesTheVocabularyTokens) {
  const std::string model = shared_model("stories260K.gguf");
  RUNLM_REQUIRE_ASSET(model);
  TempPath p(".json");
  const std::string conv = write_conversation(
      p, nlohmann::json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}));
  const CommandResult r = run_command(runlm_binary() + " template -m " + model + " --chat-template llama2 --messages " + conv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
}

TEST(CmdTemplate, ErrorsAreClearAndNonZero) {
  const std::string model = shared_model("stories260K.gguf");
  RUNLM_REQUIRE_ASSET(model);
  TempPath p(".json"), bad(".json"), tmpl(".jinja");
  const std::string conv = write_conversation(p, nlohmann::json::array({{{"role", "system"}, {"content", "S"}}}));
  std::ofstream(bad.str()) << R"([{"role": "user"}])";
  std::ofstream(tmpl.str()) << "line one\n{% for m in messages %}{{ m.content | nosuch }}{% endfor %}";
  struct C {
    std::string args;
    const char* what;
  };
  const C cases[] = {
      {" --chat-template gemma --messages " + conv, "System role not supported"},
      {" --chat-template nosuch --messages " + conv, "--chat-template"},
      {" --messages " + conv, "--chat-template-file"},  // stories260K has no template of its own
      {" --chat-template chatml --messages " + bad.str(), "\"content\""},
      {" --chat-template-file " + tmpl.str() + " --messages " + conv, "line 2, column"},
      {" --chat-template chatml", "--messages"},
  };
  for (const C& c : cases) {
    const CommandResult r = run_command(runlm_binary() + " template -m " + model + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args;
    EXPECT_EQ(r.out, "") << c.args;
    EXPECT_NE(r.err.find(c.what), std::string::npos) << c.args << " -> " << r.err;
  }
}

TEST(CmdTemplate, TheModelsOwnTemplateIsTheDefault) {
  RUNLM_REQUIRE_ASSET(shared_model("stories260K.gguf"));
  TempPath gguf(".gguf"), p(".json");
  rewritten_stories260k(gguf, [](runlm::GgufWriter& w) {
    w.set_string("tokenizer.chat_template",
                 "{{ bos_token }}{% for m in messages %}[{{ m.role|upper }}] {{ m.content }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}[ASSISTANT]{% endif %}");
  });
  const std::string conv = write_conversation(p, nlohmann::json::array({{{"role", "user"}, {"content", "Hi"}}}));
  const CommandResult r = run_command(runlm_binary() + " template -m " + gguf.str() + " --messages " + conv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[USER] Hi</s>[ASSISTANT]");
  // A flag overrides it.
  const CommandResult named =
      run_command(runlm_binary() + " template -m " + gguf.str() + " --chat-template chatml --messages " + conv);
  EXPECT_EQ(named.out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(CmdTemplate, BatchWithABrokenModelTemplateFailsOnlyMessagesRequests) {
  RUNLM_REQUIRE_ASSET(shared_model("stories260K.gguf"));
  TempPath gguf(".gguf"), in(".jsonl"), out(".jsonl");
  rewritten_stories260k(gguf, [](runlm::GgufWriter& w) { w.set_string("tokenizer.chat_template", "{% if %}"); });
  std::ofstream(in.str()) << R"({"prompt": "Once upon a time", "n_predict": 4})" << "\n"
                          << R"({"messages": [{"role": "user", "content": "Hi"}], "n_predict": 4})" << "\n";
  const CommandResult r = run_command(runlm_binary() + " batch -m " + gguf.str() + " -f " + in.str() + " -o " +
                                      out.str() + " --temp 0 -t 2");
  // Exit code 2: the run finished and some request failed.
  ASSERT_EQ(r.exit_code, 2) << r.err;
  std::ifstream f(out.str());
  std::string line1, line2;
  std::getline(f, line1);
  std::getline(f, line2);
  EXPECT_TRUE(nlohmann::json::parse(line1).contains("text")) << line1;
  const auto rec = nlohmann::json::parse(line2);
  ASSERT_TRUE(rec.contains("error")) << line2;
  EXPECT_NE(rec["error"].get<std::string>().find("line 1, column"), std::string::npos) << line2;
}
