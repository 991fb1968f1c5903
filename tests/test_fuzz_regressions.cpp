// Regression tests for the crashes found by fuzzing (tests/fuzz/) and by the
// limits review: each input here once crashed runlm (or escaped
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

#include "batch_input.h"
#include "batch_record.h"
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

// ---- runlm batch requests (fuzz_batch_input) --------------------------------

namespace {

// The record of a line must be one line of valid JSON (the whole output is
// JSONL); returns it parsed.
nlohmann::json parsed_record(const std::string& rec) {
  EXPECT_EQ(rec.find('\n'), std::string::npos) << rec;
  return nlohmann::json::parse(rec);  // throws (and fails the test) when invalid
}

}  // namespace

// nlohmann's parse error quotes the raw bytes last read ("last read:
// '"a\xff'"), and dumping that message into the error record threw
// type_error 316 (invalid UTF-8): one bad line ended the whole batch run
// with exit code 1 instead of getting its error record.
TEST(FuzzRegression, BatchLineWithInvalidUtf8GetsAValidErrorRecord) {
  const BatchEntry e = parse_batch_json_line("{\"prompt\": \"a\xff\"}", 3);
  ASSERT_FALSE(e.error.empty());
  EXPECT_NE(e.error.find("invalid JSON"), std::string::npos) << e.error;
  const nlohmann::json rec = parsed_record(batch_error_record(e, e.error));
  EXPECT_FALSE(rec.contains("id")) << rec;  // no id could be read: the line says where
  EXPECT_EQ(rec["line"], 3);
  // Generated text cut inside a UTF-8 character is replaced, not a throw.
  Completion c;
  c.text = "ok \xe2\x96";
  EXPECT_EQ(parsed_record(batch_completion_record(e, c))["text"], "ok \xef\xbf\xbd");
}

// The id is echoed in the output: an id nested a million deep overflowed
// the stack in dump(). Only a string or a number is an id now.
TEST(FuzzRegression, BatchDeeplyNestedIdIsAnError) {
  const std::string line = "{\"id\": " + nested_array(kDeep) + ", \"prompt\": \"x\"}";
  const BatchEntry e = parse_batch_json_line(line, 7);
  EXPECT_EQ(e.error, "\"id\" must be a string or a number");
  const nlohmann::json rec = parsed_record(batch_error_record(e, e.error));
  EXPECT_FALSE(rec.contains("id")) << rec;  // the bad id is not echoed
  EXPECT_EQ(rec["line"], 7);
  // Deep values elsewhere in a request are parsed and dropped without
  // recursion (with --allow-extra-fields), or named as an unknown field.
  const std::string deep_extra = "{\"extra\": " + nested_array(kDeep) + ", \"prompt\": \"x\"}";
  const BatchEntry other = parse_batch_json_line(deep_extra, 8, /*allow_extra_fields=*/true);
  EXPECT_TRUE(other.error.empty()) << other.error;
  EXPECT_EQ(other.prompt, "x");
  const BatchEntry strict = parse_batch_json_line(deep_extra, 8);
  EXPECT_NE(strict.error.find("unknown field \"extra\""), std::string::npos) << strict.error;
  for (const char* id : {"{\"id\": {\"a\": 1}, \"prompt\": \"x\"}", "{\"id\": [1], \"prompt\": \"x\"}",
                         "{\"id\": true, \"prompt\": \"x\"}"})
    EXPECT_FALSE(parse_batch_json_line(id, 1).error.empty()) << id;
  EXPECT_EQ(parse_batch_json_line("{\"id\": \"a\", \"prompt\": \"x\"}", 1).id, "\"a\"");
  EXPECT_EQ(parse_batch_json_line("{\"id\": 1.5, \"prompt\": \"x\"}", 1).id, "1.5");
}

// get<int>() wrapped silently: n_predict 4294967301 ran as 5, top_k 2^32 as
// 0 (off); a temperature of 1e300 became inf and passed ">= 0".
TEST(FuzzRegression, BatchNumbersOutOfTheirTypesRangeAreErrors) {
  for (const char* line : {R"({"prompt": "x", "n_predict": 4294967301})", R"({"prompt": "x", "top_k": 4294967296})",
                           R"({"prompt": "x", "top_k": -2147483649})", R"({"prompt": "x", "seed": 18446744073709551615})",
                           R"({"prompt": "x", "temperature": 1e300})", R"({"prompt": "x", "repeat_penalty": -1e39})"}) {
    const BatchEntry e = parse_batch_json_line(line, 1);
    EXPECT_NE(e.error.find("is out of range"), std::string::npos) << line << ": " << e.error;
  }
  const BatchEntry ok = parse_batch_json_line(R"({"prompt": "x", "n_predict": 2147483647, "seed": 9223372036854775807, "temperature": 3e38})", 1);
  EXPECT_TRUE(ok.error.empty()) << ok.error;
  EXPECT_EQ(*ok.n_predict, 2147483647);
  EXPECT_EQ(*ok.seed, INT64_MAX);
}

// End to end: the bad line gets its record, the others run, exit code 0.
TEST(FuzzRegression, BatchRunWithAnInvalidUtf8LineKeepsGoing) {
  TempPath in(".jsonl"), out(".jsonl");
  {
    std::ofstream f(in.str(), std::ios::binary);
    f << R"({"id": 1, "prompt": "Once upon a time", "n_predict": 4})" << "\n";
    f << "{\"id\": 2, \"prompt\": \"bad \xff byte\"}\n";
    f << R"({"id": 3, "prompt": "Tom had a big red ball.", "n_predict": 4})" << "\n";
  }
  const CommandResult r = run_command(runlm_binary() + " batch -m " + shared_model("stories260K.gguf") + " -f " +
                                      in.str() + " -o " + out.str() + " --temp 0 -t 1");
  // The run goes on; exit code 2 says that a request failed.
  ASSERT_EQ(r.exit_code, 2) << r.err;
  std::ifstream f(out.str());
  std::vector<nlohmann::json> recs;
  for (std::string line; std::getline(f, line);) recs.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0]["tokens_out"], 4);
  EXPECT_EQ(recs[1]["line"], 2);
  EXPECT_FALSE(recs[1].contains("id")) << "an unreadable line has no id";
  EXPECT_NE(recs[1]["error"].get<std::string>().find("invalid JSON"), std::string::npos) << recs[1].dump();
  EXPECT_EQ(recs[2]["tokens_out"], 4);
}
