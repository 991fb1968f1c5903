// Regression tests for the crashes found by fuzzing (tests/fuzz/) and by the
// limits review of issue 8: each input here once crashed runlm (or escaped
// as a non-runlm exception) and must now be a runlm::Error that names the
// file and the fault. See docs/bad-inputs.md for the whole table.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common.h"
#include "convert.h"
#include "hf_config.h"
#include "safetensors.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;
namespace fs = std::filesystem;

namespace {

// A million levels: nlohmann::json::dump() recurses once per level, which
// overflowed the 8 MB stack when an error message dumped such a value.
constexpr size_t kDeep = 1000000;

std::string nested_array(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::vector<uint8_t> safetensors_image(const std::string& header) {
  std::vector<uint8_t> img(8);
  const uint64_t n = header.size();
  std::memcpy(img.data(), &n, 8);
  img.insert(img.end(), header.begin(), header.end());
  return img;
}

// The Error message of f(), or "<no error>".
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

void expect_words(const std::string& msg, const std::vector<std::string>& words) {
  for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg.substr(0, 400);
}

std::string st_error(const std::string& header) {
  const auto img = safetensors_image(header);
  return error_of([&] { SafetensorsFile::from_memory(img.data(), img.size(), "deep.safetensors"); });
}

}  // namespace

TEST(FuzzRegression, SafetensorsDeeplyNestedShapeIsAnError) {
  const std::string msg =
      st_error(R"({"w": {"dtype": "F32", "shape": [)" + nested_array(kDeep) + R"(], "data_offsets": [0, 0]}})");
  expect_words(msg, {"deep.safetensors", "'w'", "shape", "nested"});
}

TEST(FuzzRegression, SafetensorsDeeplyNestedOffsetIsAnError) {
  const std::string msg =
      st_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [)" + nested_array(kDeep) + R"(, 4]}})");
  expect_words(msg, {"deep.safetensors", "data_offsets", "nested"});
}

TEST(FuzzRegression, SafetensorsShallowValuesAreStillQuoted) {
  // The safe rendering keeps short values in the message.
  const std::string msg = st_error(R"({"w": {"dtype": "F32", "shape": [[1, 2]], "data_offsets": [0, 8]}})");
  expect_words(msg, {"deep.safetensors", "[1,2]"});
}

TEST(FuzzRegression, HfConfigDeeplyNestedValuesAreErrors) {
  const std::string base = R"("architectures": ["LlamaForCausalLM"], "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "vocab_size": 32)";
  // A size, the rope_scaling type, and the architectures list itself.
  std::string msg = error_of(
      [&] { parse_hf_config("{" + base + R"(, "hidden_size": )" + nested_array(kDeep) + "}", "deep/config.json"); });
  expect_words(msg, {"deep/config.json", "hidden_size", "nested"});
  msg = error_of([&] {
    parse_hf_config("{" + base + R"(, "hidden_size": 8, "rope_scaling": {"type": )" + nested_array(kDeep) + "}}",
                    "deep/config.json");
  });
  expect_words(msg, {"deep/config.json", "rope_scaling", "not supported"});
  msg = error_of([&] {
    parse_hf_config(R"({"architectures": [)" + nested_array(kDeep) + R"(], "hidden_size": 8})", "deep/config.json");
  });
  expect_words(msg, {"deep/config.json", "architectures", "nested"});
}

TEST(FuzzRegression, HfConfigNumberOutOfDoubleRangeIsAnError) {
  const std::string msg = error_of([] {
    parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32, "rms_norm_eps": 1e999})",
                    "big/config.json");
  });
  expect_words(msg, {"big/config.json"});
}

// ---- convert_hf: config.json sizes checked against the checkpoint ----------

namespace {

// A tiny Hugging Face Llama directory (hidden 8, 1 layer, 2 heads, 1 KV
// head, the stories260K 512-token tokenizer), f32 zeros; `edit` changes
// config.json before it is written.
class TinyHfDir {
 public:
  explicit TinyHfDir(const std::function<void(nlohmann::json&)>& edit = nullptr,
                     const std::string& tokenizer_config = "") {
    dir_ = fs::path(testing::TempDir()) / ("runlm_fuzzreg_hf_" + std::to_string(::getpid()) + "_" +
                                           testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                          {"hidden_size", 8},
                          {"intermediate_size", 16},
                          {"num_hidden_layers", 1},
                          {"num_attention_heads", 2},
                          {"num_key_value_heads", 1},
                          {"vocab_size", 512},
                          {"max_position_embeddings", 64},
                          {"tie_word_embeddings", true}};
    if (edit) edit(cfg);
    std::ofstream(dir_ / "config.json") << cfg.dump();
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.embed_tokens.weight", {512, 8}},
        {"model.norm.weight", {8}},
        {"model.layers.0.input_layernorm.weight", {8}},
        {"model.layers.0.post_attention_layernorm.weight", {8}},
        {"model.layers.0.self_attn.q_proj.weight", {8, 8}},
        {"model.layers.0.self_attn.k_proj.weight", {4, 8}},
        {"model.layers.0.self_attn.v_proj.weight", {4, 8}},
        {"model.layers.0.self_attn.o_proj.weight", {8, 8}},
        {"model.layers.0.mlp.gate_proj.weight", {16, 8}},
        {"model.layers.0.mlp.up_proj.weight", {16, 8}},
        {"model.layers.0.mlp.down_proj.weight", {8, 16}},
    };
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const auto& [name, shape] : shapes) {
      uint64_t n = 4;
      for (int64_t d : shape) n *= static_cast<uint64_t>(d);
      header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
    std::vector<uint8_t> img = safetensors_image(header.dump());
    img.resize(img.size() + offset, 0);
    std::ofstream(dir_ / "model.safetensors", std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
    fs::copy_file(shared_model("stories260K-tok512.model"), dir_ / "tokenizer.model");
    if (!tokenizer_config.empty()) std::ofstream(dir_ / "tokenizer_config.json") << tokenizer_config;
  }
  ~TinyHfDir() { fs::remove_all(dir_); }
  std::string str() const { return dir_.string(); }
  std::string out() const { return (dir_ / "out.gguf").string(); }

 private:
  fs::path dir_;
};

}  // namespace

TEST(FuzzRegression, ConvertTinyHfDirWorks) {
  // The fixture itself converts: the failures below are the edits' doing.
  TinyHfDir d;
  EXPECT_EQ(error_of([&] { convert_hf(d.str(), d.out()); }), "<no error>");
}

TEST(FuzzRegression, ConvertHugeVocabSizeIsCheckedAgainstTheEmbedding) {
  // Used to pad the 512-token vocabulary to 2e9 "[PAD]" entries before any
  // tensor was looked at: tens of GB, then std::bad_alloc.
  TinyHfDir d([](nlohmann::json& c) { c["vocab_size"] = 2000000000; });
  expect_words(error_of([&] { convert_hf(d.str(), d.out()); }),
               {"model.embed_tokens.weight", "[512, 8]", "2000000000", "vocab_size"});
}

TEST(FuzzRegression, ConvertHugeLayerCountIsCheckedAgainstTheTensors) {
  // Used to list 9 x 2e9 tensor specs before the first missing one.
  TinyHfDir d([](nlohmann::json& c) { c["num_hidden_layers"] = 2000000000; });
  expect_words(error_of([&] { convert_hf(d.str(), d.out()); }),
               {d.str(), "num_hidden_layers=2000000000", "model.layers.1999999999"});
}

TEST(FuzzRegression, ConvertChatTemplateWithNonStringNameIsAnError) {
  // tokenizer_config.json's chat_template list with a numeric "name": json's
  // value() threw nlohmann's type_error, which is no runlm::Error.
  TinyHfDir d(nullptr, R"({"chat_template": [{"name": 5, "template": "x"}, {"name": "default", "template": "y"}]})");
  std::string msg;
  try {
    convert_hf(d.str(), d.out());
    msg = "<no error>";
  } catch (const Error& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    FAIL() << "escaped as a non-runlm exception: " << e.what();
  }
  EXPECT_EQ(msg, "<no error>");  // the numeric entry is skipped, "default" is taken
}
