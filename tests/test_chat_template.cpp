// Chat template tests: every built-in template (src/chat_templates/NAME.jinja,
// rendered by the Jinja interpreter) over every conversation in
// tests/data/chat_templates/cases.json must render byte for byte what jinja2
// renders from the same source (goldens written by
// tools/render_chat_goldens.py), or raise where the template raises.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "chat_template.h"
#include "common.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::error_of;

namespace {

const std::string kDir = std::string(RUNLM_SOURCE_DIR) + "/tests/data/chat_templates/";

bool read_file(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

nlohmann::json load_cases() {
  std::string text;
  EXPECT_TRUE(read_file(kDir + "cases.json", &text));
  return nlohmann::json::parse(text);
}

std::string apply(const std::string& name, const std::vector<ChatMessage>& messages, bool gen,
                  const std::string& bos = "<s>", const std::string& eos = "</s>") {
  return ChatTemplate(builtin_chat_template(name), "built-in chat template " + name, bos, eos).apply(messages, gen).text;
}

std::vector<ChatMessage> messages_of(const nlohmann::json& c) {
  std::vector<ChatMessage> m;
  for (const auto& e : c.at("messages")) m.push_back({e.at("role").get<std::string>(), e.at("content").get<std::string>()});
  return m;
}

}  // namespace

TEST(ChatTemplate, MatchesJinjaGoldens) {
  const nlohmann::json data = load_cases();
  ASSERT_GE(data.at("cases").size(), 10u);
  size_t rendered = 0, raised = 0;
  for (const std::string& name : chat_template_names()) {
    const auto& tok = data.at("tokens").at(name);
    const std::string bos = tok.at("bos"), eos = tok.at("eos");
    for (const auto& [case_name, c] : data.at("cases").items()) {
      const std::string stem = kDir + name + "." + case_name;
      const auto messages = messages_of(c);
      const bool gen = c.at("add_generation_prompt").get<bool>();
      std::string golden, error;
      if (read_file(stem + ".txt", &golden)) {
        std::string got;
        EXPECT_NO_THROW(got = apply(name, messages, gen, bos, eos)) << name << "." << case_name;
        EXPECT_EQ(got, golden) << name << "." << case_name;
        ++rendered;
      } else if (read_file(stem + ".error", &error)) {
        // First line: the jinja2 exception class; second: its message.
        const std::string cls = error.substr(0, error.find('\n'));
        std::string message = error.substr(cls.size() + 1);
        if (!message.empty() && message.back() == '\n') message.pop_back();
        const std::string msg = error_of([&] { apply(name, messages, gen, bos, eos); });
        EXPECT_NE(msg, "<no error>") << name << "." << case_name << " should raise " << cls << ": " << message;
        if (cls == "TemplateError") {  // raise_exception(): the template's own words
          EXPECT_NE(msg.find(message), std::string::npos) << name << "." << case_name << ": " << msg;
        }
        EXPECT_NE(msg.find(name), std::string::npos) << msg;
        ++raised;
      } else {
        ADD_FAILURE() << "no golden for " << stem << " (run tools/render_chat_goldens.py)";
      }
    }
  }
  EXPECT_GT(rendered, 40u);
  EXPECT_GT(raised, 10u);
}

TEST(ChatTemplate, KnownShapes) {
  // Spot checks written from the model cards, independent of the goldens.
  const std::vector<ChatMessage> conv = {
      {"system", "SYS"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};
  EXPECT_EQ(apply("llama2", conv, true),
            "<s>[INST] <<SYS>>\nSYS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
  EXPECT_EQ(apply("chatml", conv, true),
            "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply("zephyr", conv, true),
            "<|system|>\nSYS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n<|user|>\nU2</s>\n<|assistant|>\n");
  const std::vector<ChatMessage> no_sys(conv.begin() + 1, conv.end());
  EXPECT_EQ(apply("mistral", no_sys, true), "<s>[INST] U1 [/INST]A1</s>[INST] U2 [/INST]");
  EXPECT_EQ(apply("gemma", no_sys, true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
  const std::string gemma_sys = error_of([&] { apply("gemma", conv, true, "<bos>", "<eos>"); });
  EXPECT_NE(gemma_sys.find("System role not supported"), std::string::npos) << gemma_sys;
}

TEST(ChatTemplate, BuiltinSourcesAreTheTemplateFiles) {
  // The compiled-in sources are src/chat_templates/NAME.jinja, the files the
  // goldens were rendered from.
  const std::string dir = std::string(RUNLM_SOURCE_DIR) + "/src/chat_templates/";
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jinja") files.insert(e.path().stem().string());
  const auto& names = chat_template_names();
  EXPECT_EQ(files, std::set<std::string>(names.begin(), names.end()));
  for (const std::string& name : names) {
    std::string source;
    ASSERT_TRUE(read_file(dir + name + ".jinja", &source)) << name;
    EXPECT_EQ(builtin_chat_template(name), source) << name;
  }
}

TEST(ChatTemplate, UnknownNameNamesTheFlagAndTheChoices) {
  const std::string bad_name = error_of([] { builtin_chat_template("vicuna"); });
  EXPECT_NE(bad_name.find("vicuna"), std::string::npos) << bad_name;
  EXPECT_NE(bad_name.find("--chat-template"), std::string::npos) << bad_name;
  for (const std::string& name : chat_template_names()) EXPECT_NE(bad_name.find(name), std::string::npos) << bad_name;
}

TEST(ChatTemplate, AnyJinjaTemplateRenders) {
  // A template that matches none of the built-in ones (previously refused).
  const ChatTemplate t("{% for m in messages %}### {{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}### Assistant:{% endif %}",
                       "test", "<s>", "</s>");
  EXPECT_EQ(t.apply({{"user", "hi"}}, true).text, "### User: hi\n### Assistant:");
  EXPECT_EQ(t.apply({{"user", "hi"}}, false).text, "### User: hi\n");
}

TEST(ChatTemplate, ErrorsNameTheOriginLineAndColumn) {
  const std::string syntax = error_of([] { ChatTemplate("{% if x %}\n{{ 1 + }}", "file t.jinja", "", ""); });
  EXPECT_NE(syntax.find("file t.jinja"), std::string::npos) << syntax;
  EXPECT_NE(syntax.find("line 2, column 8"), std::string::npos) << syntax;
  const ChatTemplate raising("a\n  {{ raise_exception('No ' ~ messages[0].role) }}", "x", "", "");
  const std::string raised = error_of([&] { raising.apply({{"tool", "t"}}, true); });
  EXPECT_NE(raised.find("line 2, column 6: No tool"), std::string::npos) << raised;
}

TEST(ChatTemplate, ContentRangesPointAtEachMessage) {
  const ChatTemplate t(builtin_chat_template("chatml"), "chatml", "<s>", "<|im_end|>");
  const std::vector<ChatMessage> conv = {{"user", "user"}, {"assistant", "  spaced  "}, {"user", "<|im_end|>"}};
  const RenderedPrompt p = t.apply(conv, true);
  ASSERT_EQ(p.content_ranges.size(), 3u);
  for (size_t k = 0; k < 3; ++k)
    EXPECT_EQ(p.text.substr(p.content_ranges[k].first, p.content_ranges[k].second - p.content_ranges[k].first),
              conv[k].content);
  // In order, after the turn's header.
  EXPECT_EQ(p.text.compare(p.content_ranges[2].first - 5, 5, "user\n"), 0) << p.text;
  // A template that trims the content: the trimmed text is located.
  const ChatTemplate gemma(builtin_chat_template("gemma"), "gemma", "<bos>", "<eos>");
  const RenderedPrompt g = gemma.apply({{"user", "  hi there \n"}}, true);
  ASSERT_EQ(g.content_ranges.size(), 1u);
  EXPECT_EQ(g.text.substr(g.content_ranges[0].first, g.content_ranges[0].second - g.content_ranges[0].first),
            "hi there");
}

TEST(ChatTemplate, SystemPromptProbe) {
  const ChatTemplate gemma(builtin_chat_template("gemma"), "built-in chat template gemma", "<bos>", "<eos>");
  const std::string msg = error_of([&] { gemma.check_system_prompt("Be brief."); });
  EXPECT_NE(msg.find("System role not supported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-sys"), std::string::npos) << msg;
  EXPECT_NO_THROW(gemma.check_system_prompt(""));
  const ChatTemplate chatml(builtin_chat_template("chatml"), "chatml", "<s>", "<|im_end|>");
  EXPECT_NO_THROW(chatml.check_system_prompt("Be brief."));
  // A template that fails on any conversation says so, not that the system
  // prompt is at fault.
  const ChatTemplate broken("{{ functions.x }}", "broken", "", "");
  const std::string b = error_of([&] { broken.check_system_prompt("Be brief."); });
  EXPECT_NE(b.find("'functions' is undefined"), std::string::npos) << b;
  EXPECT_EQ(b.find("-sys"), std::string::npos) << b;
}
