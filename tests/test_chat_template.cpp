// Chat template tests: every known template over every conversation in
// tests/data/chat_templates/cases.json must render byte for byte what jinja2
// renders from the model's official Jinja template (goldens written by
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
        EXPECT_NO_THROW(got = chat_template_apply(name, messages, gen, bos, eos)) << name << "." << case_name;
        EXPECT_EQ(got, golden) << name << "." << case_name;
        ++rendered;
      } else if (read_file(stem + ".error", &error)) {
        // First line: the jinja2 exception class; second: its message.
        const std::string cls = error.substr(0, error.find('\n'));
        std::string message = error.substr(cls.size() + 1);
        if (!message.empty() && message.back() == '\n') message.pop_back();
        const std::string msg = error_of([&] { chat_template_apply(name, messages, gen, bos, eos); });
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
  EXPECT_EQ(chat_template_apply("llama2", conv, true),
            "<s>[INST] <<SYS>>\nSYS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
  EXPECT_EQ(chat_template_apply("chatml", conv, true),
            "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(chat_template_apply("zephyr", conv, true),
            "<|system|>\nSYS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n<|user|>\nU2</s>\n<|assistant|>\n");
  const std::vector<ChatMessage> no_sys(conv.begin() + 1, conv.end());
  EXPECT_EQ(chat_template_apply("mistral", no_sys, true), "<s>[INST] U1 [/INST]A1</s>[INST] U2 [/INST]");
  EXPECT_EQ(chat_template_apply("gemma", no_sys, true, "<bos>", "<eos>"),
            "<bos><start_of_turn>user\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
            "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
  const std::string gemma_sys = error_of([&] { chat_template_apply("gemma", conv, true, "<bos>", "<eos>"); });
  EXPECT_NE(gemma_sys.find("System role not supported"), std::string::npos) << gemma_sys;
}

TEST(ChatTemplate, DetectsEachOfficialTemplate) {
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(kDir))
    if (e.path().extension() == ".jinja") files.insert(e.path().stem().string());
  const auto& names = chat_template_names();
  EXPECT_EQ(files, std::set<std::string>(names.begin(), names.end()));
  for (const std::string& name : names) {
    std::string source;
    ASSERT_TRUE(read_file(kDir + name + ".jinja", &source)) << name;
    EXPECT_EQ(chat_template_detect(source), name);
  }
}

TEST(ChatTemplate, UnknownTemplateNamesTheFlagAndTheChoices) {
  const std::string unknown =
      "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}### Assistant:";
  const std::string msg = error_of([&] { chat_template_detect(unknown); });
  EXPECT_NE(msg.find("--chat-template"), std::string::npos) << msg;
  for (const std::string& name : chat_template_names()) EXPECT_NE(msg.find(name), std::string::npos) << msg;

  const std::string bad_name = error_of([] { chat_template_apply("vicuna", {{"user", "hi"}}, true); });
  EXPECT_NE(bad_name.find("vicuna"), std::string::npos) << bad_name;
  for (const std::string& name : chat_template_names()) EXPECT_NE(bad_name.find(name), std::string::npos) << bad_name;
}

TEST(ChatTemplate, EndMarkerFollowsEveryAssistantTurn) {
  // The end marker is what the template writes right after an assistant
  // reply, so it must appear right after the reply text in the rendering.
  const std::vector<ChatMessage> conv = {{"user", "U1"}, {"assistant", "REPLY"}, {"user", "U2"}};
  for (const std::string& name : chat_template_names()) {
    const std::string marker = chat_template_end_marker(name);
    const std::string eos = name == "gemma" ? "<eos>" : "</s>";
    const std::string text = chat_template_apply(name, conv, true, name == "gemma" ? "<bos>" : "<s>", eos);
    const size_t at = text.find("REPLY");
    ASSERT_NE(at, std::string::npos) << name;
    const std::string after = text.substr(at + 5);
    EXPECT_EQ(after.rfind(marker, 0) == 0 || after.rfind(" " + marker, 0) == 0, true) << name << ": " << after;
  }
  EXPECT_THROW(chat_template_end_marker("vicuna"), Error);
}
