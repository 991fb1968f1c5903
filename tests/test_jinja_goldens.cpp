// Real chat templates (../shared/templates/*.jinja, the tokenizer.chat_template
// of released models) rendered by runlm's Jinja interpreter must match
// jinja2 byte for byte, as transformers' apply_chat_template renders them, on
// every conversation of tests/data/jinja_goldens/conversations.json with and
// without the generation prompt; where jinja2 raises, runlm must raise too.
// Goldens: tools/render_chat_goldens.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_template.h"
#include "common.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::error_of;

namespace {

const std::string kGoldens = std::string(RUNLM_SOURCE_DIR) + "/tests/data/jinja_goldens/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The clock the goldens were rendered with: Friday 26 July 2024, 10:30:00.
std::tm fixed_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 10;
  t.tm_min = 30;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

std::vector<std::string> template_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(kGoldens))
    if (e.path().extension() == ".json" && e.path().stem() != "conversations") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

class JinjaGolden : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST(JinjaGoldens, CoverEverySharedTemplate) {
  const std::string dir = runlm::test::test_asset("templates");
  RUNLM_REQUIRE_ASSET(dir);
  std::vector<std::string> shared;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jinja") shared.push_back(e.path().stem().string());
  std::sort(shared.begin(), shared.end());
  EXPECT_EQ(shared, template_names());
  EXPECT_GE(shared.size(), 20u);
}

TEST_P(JinjaGolden, MatchesJinja2) {
  const std::string name = GetParam();
  const std::string path = runlm::test::test_asset("templates/" + name + ".jinja");
  RUNLM_REQUIRE_ASSET(path);
  const nlohmann::json golden = nlohmann::json::parse(slurp(kGoldens + name + ".json"));
  const nlohmann::json convs = nlohmann::json::parse(slurp(kGoldens + "conversations.json")).at("conversations");
  ChatTemplate tmpl(slurp(path), name, golden.at("bos_token"), golden.at("eos_token"));
  tmpl.set_clock(fixed_now);
  size_t checked = 0;
  for (const auto& [conv_name, conv] : convs.items()) {
    std::vector<ChatMessage> messages;
    for (const auto& m : conv) messages.push_back({m.at("role"), m.at("content")});
    for (const bool gen : {true, false}) {
      const std::string key = conv_name + (gen ? ".gen" : ".nogen");
      const auto& want = golden.at("results").at(key);
      if (want.contains("text")) {
        std::string got;
        try {
          got = tmpl.apply(messages, gen).text;
        } catch (const Error& e) {
          ADD_FAILURE() << name << " " << key << ": " << e.what();
          continue;
        }
        EXPECT_EQ(got, want.at("text").get<std::string>()) << name << " " << key;
      } else {
        const std::string err = want.at("error");
        const std::string msg = error_of([&] { tmpl.apply(messages, gen); });
        EXPECT_NE(msg, "<no error>") << name << " " << key << " should raise " << err;
        // raise_exception's own words come through.
        if (err.rfind("TemplateError: ", 0) == 0)
          EXPECT_NE(msg.find(err.substr(15)), std::string::npos) << msg;
        EXPECT_NE(msg.find("line "), std::string::npos) << msg;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 16u);
}

INSTANTIATE_TEST_SUITE_P(SharedTemplates, JinjaGolden, ::testing::ValuesIn(template_names()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });
