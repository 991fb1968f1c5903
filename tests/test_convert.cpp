// Tests for model conversion (safetensors reader, config.json, llama2.c and
// Hugging Face converters), quantization and the make_random_model tool.
// References are real files (the embedded stories260K, shared sotu29m and Llama-2 tokenizer) and the format definitions
// (block layouts, the RoPE permutation) written out independently here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "convert.h"
#include "cpu/quant.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "hf_config.h"
#include "quantize.h"
#include "safetensors.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::error_of;
using runlm::test::shared_model;
namespace fs = std::filesystem;

namespace {


// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("runlm_conv_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A safetensors image: 8-byte little-endian length, the JSON header (padded
// with spaces as the reference writer does), then the data.
std::string safetensors_image(const std::string& header, const std::string& data, int64_t len_override = -1) {
  std::string h = header;
  while (h.size() % 8) h += ' ';
  const uint64_t len = len_override >= 0 ? static_cast<uint64_t>(len_override) : h.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + h + data;
}

template <typename T>
std::string as_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<float> decode_tensor(const GgufFile& g, const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  const int64_t n_cols = t.ne[0], n_rows = t.n_elements() / n_cols;
  const size_t row_bytes = dtype_row_bytes(t.type, n_cols);
  for (int64_t r = 0; r < n_rows; ++r)
    dequantize_row(t.type, g.tensor_data(t) + r * row_bytes, out.data() + r * n_cols, n_cols);
  return out;
}

// argv for cmd_* functions, which take argv[0] = "runlm SUBCOMMAND".
int call_cmd(int (*cmd)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return cmd(static_cast<int>(args.size()), argv.data());
}

}  // namespace

// ---- safetensors ---------------------------------------------------------

TEST(ConvertSafetensors, ReadsF32F16Bf16) {
  TempDir dir;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> a(2 * 3), b(4), c(2 * 2);
  for (auto* v : {&a, &b, &c})
    for (auto& x : *v) x = u(rng);
  std::vector<uint16_t> b16, c16;
  for (float x : b) b16.push_back(fp32_to_fp16(x));
  for (float x : c) c16.push_back(fp32_to_bf16(x));
  // Odd-sized leading blob so the f32 tensor sits at an unaligned offset.
  const std::string data = std::string(3, 'x') + as_bytes(a) + as_bytes(b16) + as_bytes(c16);
  nlohmann::json h;
  h["__metadata__"] = {{"format", "pt"}};
  h["a"] = {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {3, 27}}};
  h["b"] = {{"dtype", "F16"}, {"shape", {4}}, {"data_offsets", {27, 35}}};
  h["c"] = {{"dtype", "BF16"}, {"shape", {2, 2}}, {"data_offsets", {35, 43}}};
  write_bytes(dir / "m.safetensors", safetensors_image(h.dump(), data));

  auto f = SafetensorsFile::open(dir / "m.safetensors");
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const SafetensorsTensor* ta = f->find("a");
  ASSERT_TRUE(ta);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->row_length(), 3);
  EXPECT_EQ(ta->n_rows(), 2);
  std::vector<float> got(6);
  ta->read_f32(0, 6, got.data());
  EXPECT_EQ(got, a);
  got.resize(4);
  f->find("b")->read_f32(0, 4, got.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], fp16_to_fp32(b16[i]));
  f->find("c")->read_f32(0, 4, got.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], bf16_to_fp32(c16[i]));
  f->find("c")->read_f32(2, 2, got.data());  // second row alone
  EXPECT_EQ(got[0], bf16_to_fp32(c16[2]));
  EXPECT_EQ(f->find("missing"), nullptr);
  EXPECT_THROW(ta->read_f32(4, 3, got.data()), Error);
}

TEST(ConvertSafetensors, RejectsBadHeaders) {
  TempDir dir;
  const std::string data(16, '\0');
  auto open_image = [&](const std::string& image) {
    write_bytes(dir / "bad.safetensors", image);
    return error_of([&] { SafetensorsFile::open(dir / "bad.safetensors"); });
  };
  const std::string good = R"({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  EXPECT_EQ(open_image(safetensors_image(good, data)), "<no error>");

  std::string e = open_image(safetensors_image(good, data, 1 << 20));
  EXPECT_NE(e.find("header length"), std::string::npos) << e;
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}})", data));
  EXPECT_NE(e.find("out of bounds"), std::string::npos) << e;
  EXPECT_NE(e.find("'t'"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", data));
  EXPECT_NE(e.find("needs 24 bytes"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "F32", "shape": [2, 2], "data_offsets": [16, 0]}})", data));
  EXPECT_NE(e.find("out of bounds"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "F32", "shape": [2, 2], "data_o)", data));
  EXPECT_NE(e.find("bad JSON"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "I8", "shape": [16], "data_offsets": [0, 16]}})", data));
  EXPECT_NE(e.find("I8"), std::string::npos) << e;

  e = open_image(safetensors_image(R"({"t": {"dtype": "F32", "shape": [-2, 2], "data_offsets": [0, 16]}})", data));
  EXPECT_NE(e.find("non-negative"), std::string::npos) << e;

  // A shape whose byte count overflows 64 bits.
  e = open_image(safetensors_image(
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]}})", data));
  EXPECT_NE(e.find("overflows"), std::string::npos) << e;

  e = open_image("abc");
  EXPECT_NE(e.find("too small"), std::string::npos) << e;
}

// U8 tensors (gpt-oss's MXFP4 blocks and scales) are read as packed bytes:
// their data as stored, never as numbers.
TEST(ConvertSafetensors, U8TensorsArePackedBytes) {
  TempDir dir;
  const std::string bytes = "\x01\x80\xff\x10";
  write_bytes(dir / "u8.safetensors",
              safetensors_image(R"({"b": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]}})", bytes));
  auto f = SafetensorsFile::open(dir / "u8.safetensors");
  const SafetensorsTensor* t = f->find("b");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->dtype, DType::I8);
  EXPECT_EQ(t->nbytes, 4u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), 4), bytes);
  float v[4];
  const std::string e = error_of([&] { t->read_f32(0, 4, v); });
  EXPECT_NE(e.find("packed bytes (U8)"), std::string::npos) << e;
}

TEST(ConvertSafetensors, ShardedDirectory) {
  TempDir dir;
  const std::vector<float> x = {1, 2, 3, 4}, y = {5, 6};
  write_bytes(dir / "s1.safetensors",
              safetensors_image(R"({"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})", as_bytes(x)));
  write_bytes(dir / "s2.safetensors",
              safetensors_image(R"({"y": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", as_bytes(y)));
  write_bytes(dir / "model.safetensors.index.json",
              R"({"metadata": {}, "weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})");
  auto m = SafetensorsModel::open_dir(dir.str());
  EXPECT_EQ(m->names(), (std::vector<std::string>{"x", "y"}));
  float v[2];
  m->get("y").read_f32(0, 2, v);
  EXPECT_EQ(v[0], 5.0f);
  EXPECT_EQ(v[1], 6.0f);
  EXPECT_NE(error_of([&] { m->get("z"); }).find("'z'"), std::string::npos);

  // The index names a tensor its shard does not hold.
  write_bytes(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "s2.safetensors"}})");
  const std::string e = error_of([&] { SafetensorsModel::open_dir(dir.str()); });
  EXPECT_NE(e.find("'x'"), std::string::npos) << e;
  EXPECT_NE(e.find("s2.safetensors"), std::string::npos) << e;

  fs::remove(dir / "model.safetensors.index.json");
  EXPECT_THROW(SafetensorsModel::open_dir(dir.str()), Error);  // neither file present
}

// ---- config.json -----------------------------------------------------------

TEST(ConvertHfConfig, OlderFormWithLinearScaling) {
  const HfConfig c = parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 3,
    "num_attention_heads": 8, "vocab_size": 1000, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
    "rope_scaling": {"type": "linear", "factor": 2.0},
    "tie_word_embeddings": true, "torch_dtype": "float16"})",
                                     "old.json");
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_key_value_heads, 8);  // defaults to the head count
  EXPECT_EQ(c.head_dim, 32);            // hidden / heads
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling_type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ConvertHfConfig, NewerFormAndMistral) {
  const HfConfig c = parse_hf_config(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 300,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "sliding_window": 4096,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 4.0}})",
                                     "new.json");
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope_scaling_type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 4.0);
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);

  const HfConfig n = parse_hf_config(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10,
    "sliding_window": null, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})",
                                     "null.json");
  EXPECT_FALSE(n.sliding_window.has_value());
  EXPECT_TRUE(n.rope_scaling_type.empty());
}

TEST(ConvertHfConfig, RejectsUnsupported) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "vocab_size": 10)";
  std::string e = error_of([&] { parse_hf_config(R"({"architectures": ["GPT2LMHeadModel"], )" + base + "}", "a.json"); });
  EXPECT_NE(e.find("GPT2LMHeadModel"), std::string::npos) << e;
  e = error_of([&] {
    parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "yarn", "factor": 4}, )" +
                        base + "}",
                    "b.json");
  });
  EXPECT_NE(e.find("yarn"), std::string::npos) << e;
  e = error_of([&] { parse_hf_config(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})", "c.json"); });
  EXPECT_NE(e.find("intermediate_size"), std::string::npos) << e;
  e = error_of([&] { parse_hf_config("{not json", "d.json"); });
  EXPECT_NE(e.find("d.json"), std::string::npos) << e;
}

TEST(ConvertHfConfig, Sotu29m) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/config.json"));
  const HfConfig c = read_hf_config(shared_model("sotu29m/config.json"));
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.intermediate_size, 1408);
  EXPECT_EQ(c.num_hidden_layers, 7);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(c.rope_scaling_type.empty());
}

// ---- sentencepiece normalizer flags ------------------------------------------

TEST(ConvertTokenizer, NormalizerFlagsFromModelProto) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  // SOURCES.md: tok512 has remove_extra_whitespaces=true, Llama 2's false;
  // both add_dummy_prefix.
  const auto tok512 = read_spm_normalizer_flags(shared_model("stories260K-tok512.model"));
  EXPECT_TRUE(tok512.add_dummy_prefix);
  EXPECT_TRUE(tok512.remove_extra_whitespaces);
  const auto llama2 = read_spm_normalizer_flags(shared_model("llama2-tokenizer.model"));
  EXPECT_TRUE(llama2.add_dummy_prefix);
  EXPECT_FALSE(llama2.remove_extra_whitespaces);

  // Hand-built ModelProto: field 3 (normalizer_spec) = {3: 0, 4: 1}, after an unrelated field 1 message.
  const uint8_t proto[] = {0x0a, 0x02, 0x0a, 0x00, 0x1a, 0x04, 0x18, 0x00, 0x20, 0x01};
  const auto f = parse_spm_normalizer_flags(proto, sizeof(proto), "hand");
  EXPECT_FALSE(f.add_dummy_prefix);
  EXPECT_TRUE(f.remove_extra_whitespaces);
  const uint8_t truncated[] = {0x1a, 0x09, 0x18, 0x00};
  EXPECT_THROW(parse_spm_normalizer_flags(truncated, sizeof(truncated), "hand"), Error);
}

// ---- llama2.c --------------------------------------------------------------

TEST(ConvertLlama2c, Stories260KMatchesReferenceGguf) {
  TempDir dir;
  const std::string out = dir / "s.gguf";
  const ConvertResult r =
      convert_llama2c(shared_model("stories260K.bin"), shared_model("stories260K-tok512.model"), out);
  EXPECT_TRUE(r.hparams.tied_embeddings);
  auto mine = GgufFile::open(out);
  auto ref = GgufFile::open(shared_model("stories260K.gguf"));

  // Every tensor bit-identical to llama.cpp's conversion of the same checkpoint.
  EXPECT_EQ(mine->tensors().size(), ref->tensors().size() - 1);  // output.weight omitted (tied)
  for (const GgufTensorInfo& t : mine->tensors()) {
    const GgufTensorInfo* rt = ref->find_tensor(t.name);
    ASSERT_TRUE(rt) << t.name;
    EXPECT_EQ(t.ne, rt->ne) << t.name;
    ASSERT_EQ(t.type, DType::F32) << t.name;
    ASSERT_EQ(t.nbytes, rt->nbytes) << t.name;
    EXPECT_EQ(std::memcmp(mine->tensor_data(t), ref->tensor_data(*rt), t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(mine->find_tensor("output.weight"), nullptr);
  const GgufTensorInfo* ref_out = ref->find_tensor("output.weight");
  const GgufTensorInfo* emb = mine->find_tensor("token_embd.weight");
  ASSERT_TRUE(ref_out && emb);
  EXPECT_EQ(std::memcmp(ref->tensor_data(*ref_out), mine->tensor_data(*emb), emb->nbytes), 0);

  for (const char* key : {"llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
                          "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.dimension_count",
                          "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id"})
    EXPECT_EQ(mine->get_int(key), ref->get_int(key)) << key;
  EXPECT_FLOAT_EQ(mine->get_float("llama.attention.layer_norm_rms_epsilon"),
                  ref->get_float("llama.attention.layer_norm_rms_epsilon"));
  EXPECT_EQ(mine->get_string("general.architecture"), "llama");
  EXPECT_EQ(mine->get_int("llama.context_length"), 512);  // the checkpoint's seq_len
  EXPECT_EQ(mine->get_int("general.file_type"), 0);
  EXPECT_EQ(mine->get_int("llama.vocab_size"), 512);
  EXPECT_EQ(mine->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(mine->get_string_array("tokenizer.ggml.tokens"), ref->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(mine->get_float_array("tokenizer.ggml.scores"), ref->get_float_array("tokenizer.ggml.scores"));
  EXPECT_EQ(mine->get_int_array("tokenizer.ggml.token_type"), ref->get_int_array("tokenizer.ggml.token_type"));
  EXPECT_TRUE(mine->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(mine->get_bool("tokenizer.ggml.add_eos_token"));
  EXPECT_TRUE(mine->get_bool("tokenizer.ggml.add_space_prefix"));
  EXPECT_TRUE(mine->get_bool("tokenizer.ggml.remove_extra_whitespaces"));
}

TEST(ConvertLlama2c, F16AndCommandLine) {
  TempDir dir;
  const std::string out = dir / "s16.gguf";
  EXPECT_EQ(call_cmd(cmd_convert, {"runlm convert", shared_model("stories260K.bin"), "-o", out, "--type", "f16",
                                   "--tokenizer", shared_model("stories260K-tok512.model")}),
            0);
  auto mine = GgufFile::open(out);
  auto ref = GgufFile::open(shared_model("stories260K.gguf"));
  EXPECT_EQ(mine->get_int("general.file_type"), 1);
  for (const GgufTensorInfo& t : mine->tensors()) {
    const GgufTensorInfo* rt = ref->find_tensor(t.name);
    ASSERT_TRUE(rt);
    EXPECT_EQ(t.type, t.ne.size() == 1 ? DType::F32 : DType::F16) << t.name;
    const std::vector<float> got = decode_tensor(*mine, t), want = decode_tensor(*ref, *rt);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), std::fabs(want[i]) * (1.0f / 2048) + 6e-8f) << t.name << "[" << i << "]";
  }
  // No tokenizer for a .bin: a clear error, no file.
  const std::string e = error_of([&] {
    call_cmd(cmd_convert, {"runlm convert", shared_model("stories260K.bin"), "-o", dir / "x.gguf"});
  });
  EXPECT_NE(e.find("--tokenizer"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  EXPECT_THROW(convert_llama2c(shared_model("stories260K.bin"), shared_model("stories260K-tok512.model"), dir / "q.gguf",
                               DType::Q8_0),
               Error);
}

TEST(ConvertLlama2c, RejectsBadFiles) {
  TempDir dir;
  const std::string bin = read_bytes(shared_model("stories260K.bin"));
  const std::string tok = shared_model("stories260K-tok512.model");
  auto convert_image = [&](const std::string& image) {
    write_bytes(dir / "m.bin", image);
    return error_of([&] { convert_llama2c(dir / "m.bin", tok, dir / "m.gguf"); });
  };
  std::string e = convert_image(bin.substr(0, bin.size() - 4));
  EXPECT_NE(e.find("implies 1056540"), std::string::npos) << e;
  EXPECT_NE(e.find("m.bin"), std::string::npos) << e;
  e = convert_image(bin + std::string(4, '\0'));
  EXPECT_NE(e.find("implies"), std::string::npos) << e;
  e = convert_image(bin.substr(0, 20));
  EXPECT_NE(e.find("too small"), std::string::npos) << e;
  std::string bad = bin;
  const int32_t zero = 0;
  std::memcpy(&bad[8], &zero, 4);  // n_layers = 0
  e = convert_image(bad);
  EXPECT_NE(e.find("n_layers=0"), std::string::npos) << e;
  // dim^2 * n_layers overflows 64 bits: must be caught, not wrap around.
  bad = bin;
  const int32_t dim = 0x7ffffffe, hidden = 0x7fffffff, one = 1;
  std::memcpy(&bad[0], &dim, 4);
  std::memcpy(&bad[4], &hidden, 4);
  std::memcpy(&bad[12], &one, 4);
  std::memcpy(&bad[16], &one, 4);
  e = convert_image(bad);
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "m.gguf"));
}

// ---- Hugging Face ------------------------------------------------------------

TEST(ConvertHf, Sotu29mShapesKeysAndRopePermutation) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/config.json"));
  TempDir dir;
  const std::string src = shared_model("sotu29m");
  const std::string out = dir / "sotu.gguf";
  const ConvertResult r = convert_hf(src, out);
  EXPECT_EQ(r.type, DType::BF16);  // the checkpoint's precision
  auto g = GgufFile::open(out);
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("general.file_type"), 32);
  EXPECT_EQ(g->get_int("llama.embedding_length"), 512);
  EXPECT_EQ(g->get_int("llama.feed_forward_length"), 1408);
  EXPECT_EQ(g->get_int("llama.block_count"), 7);
  EXPECT_EQ(g->get_int("llama.attention.head_count"), 4);
  EXPECT_EQ(g->get_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(g->get_int("llama.rope.dimension_count"), 128);
  EXPECT_EQ(g->get_int("llama.context_length"), 1024);
  EXPECT_EQ(g->get_int("llama.vocab_size"), 8192);
  EXPECT_FLOAT_EQ(g->get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_FLOAT_EQ(g->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(g->find("llama.attention.key_length"), nullptr);  // 512 / 4 = 128 already
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens").size(), 8192u);
  EXPECT_FALSE(g->get_bool("tokenizer.ggml.remove_extra_whitespaces"));

  EXPECT_EQ(g->tensors().size(), 3u + 7u * 9u);
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"token_embd.weight", {512, 8192}}, {"output.weight", {512, 8192}},     {"output_norm.weight", {512}},
      {"blk.6.attn_q.weight", {512, 512}}, {"blk.6.attn_k.weight", {512, 256}}, {"blk.6.attn_v.weight", {512, 256}},
      {"blk.6.attn_output.weight", {512, 512}}, {"blk.6.ffn_gate.weight", {512, 1408}},
      {"blk.6.ffn_up.weight", {512, 1408}}, {"blk.6.ffn_down.weight", {1408, 512}}, {"blk.6.attn_norm.weight", {512}},
      {"blk.6.ffn_norm.weight", {512}}};
  for (const auto& [name, ne] : shapes) {
    const GgufTensorInfo* t = g->find_tensor(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(t->ne, ne) << name;
    EXPECT_EQ(t->type, ne.size() == 1 ? DType::F32 : DType::BF16) << name;
  }

  // q/k rows: HF stores each head as [first halves | second halves]
  // (rotate_half); GGUF interleaves them. reshape(n_head, 2, hd/2, cols)
  // .swapaxes(1, 2): GGUF row (h, j, s) = HF row (h, s, j).
  auto st = SafetensorsModel::open_dir(src);
  const int64_t hd = 128, cols = 512;
  auto check_rows = [&](const std::string& hf, const std::string& gg, int64_t n_head, bool permuted) {
    const SafetensorsTensor& t = st->get(hf);
    const GgufTensorInfo* gt = g->find_tensor(gg);
    ASSERT_TRUE(gt);
    ASSERT_EQ(t.dtype, DType::BF16);
    const uint8_t* gdata = g->tensor_data(*gt);
    for (int64_t h = 0; h < n_head; ++h)
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t j = 0; j < hd / 2; ++j) {
          const int64_t hf_row = h * hd + s * (hd / 2) + j;
          const int64_t gg_row = permuted ? h * hd + j * 2 + s : hf_row;
          ASSERT_EQ(std::memcmp(t.data + hf_row * cols * 2, gdata + gg_row * cols * 2, cols * 2), 0)
              << gg << " row " << gg_row;
        }
  };
  check_rows("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", 4, true);
  check_rows("model.layers.3.self_attn.k_proj.weight", "blk.3.attn_k.weight", 2, true);
  check_rows("model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight", 2, false);
  // And the permutation really moved rows (the check above is not vacuous).
  const SafetensorsTensor& q = st->get("model.layers.0.self_attn.q_proj.weight");
  EXPECT_NE(std::memcmp(q.data + 1 * cols * 2, g->tensor_data(*g->find_tensor("blk.0.attn_q.weight")) + cols * 2,
                        cols * 2),
            0);
}

TEST(ConvertHf, RejectsMismatchedShapesAndExtraTensors) {
  TempDir dir;
  // A one-layer model with a config that disagrees with its tensors.
  // head_dim 8 != 8 / 2 heads, so q/k/o are 16 wide and key_length is written.
  const std::string cfg = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8, "vocab_size": 512, "tie_word_embeddings": true,
    "max_position_embeddings": 64, "rope_scaling": {"type": "linear", "factor": 2.0}})";
  nlohmann::json h;
  std::string data;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    h[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + n * 4}}};
    data += std::string(static_cast<size_t>(n) * 4, '\0');
  };
  add("model.embed_tokens.weight", {512, 8});
  add("model.norm.weight", {8});
  const std::string p = "model.layers.0.";
  add(p + "input_layernorm.weight", {8});
  add(p + "post_attention_layernorm.weight", {8});
  add(p + "self_attn.q_proj.weight", {16, 8});
  add(p + "self_attn.k_proj.weight", {16, 8});
  add(p + "self_attn.v_proj.weight", {16, 8});
  add(p + "self_attn.o_proj.weight", {8, 16});
  add(p + "mlp.gate_proj.weight", {16, 8});
  add(p + "mlp.up_proj.weight", {16, 8});
  add(p + "mlp.down_proj.weight", {8, 16});
  write_bytes(dir / "config.json", cfg);
  write_bytes(dir / "model.safetensors", safetensors_image(h.dump(), data));
  write_bytes(dir / "tokenizer_config.json", R"({"chat_template": "{{ messages }}", "add_bos_token": true})");
  const std::string tok = shared_model("stories260K-tok512.model");
  EXPECT_EQ(error_of([&] { convert_hf(dir.str(), dir / "ok.gguf", DType::F16, tok); }), "<no error>");
  auto g = GgufFile::open(dir / "ok.gguf");
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(g->find_tensor("blk.0.attn_q.weight")->ne, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(g->get_int("llama.attention.key_length"), 8);
  EXPECT_EQ(g->get_int("llama.attention.value_length"), 8);
  EXPECT_EQ(g->get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(g->get_int("llama.context_length"), 64);
  EXPECT_EQ(g->get_string("llama.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ(g->get_float("llama.rope.scaling.factor"), 2.0f);
  EXPECT_EQ(g->get_string("tokenizer.chat_template"), "{{ messages }}");
  EXPECT_EQ(g->get_int("general.file_type"), 1);
  // Where the template comes from, in llama.cpp's order: tokenizer_config.json,
  // else chat_template.jinja, else chat_template.json.
  write_bytes(dir / "chat_template.jinja", "from the jinja file");
  write_bytes(dir / "chat_template.json", R"({"chat_template": "from the json file"})");
  auto template_of_conversion = [&] {
    convert_hf(dir.str(), dir / "t.gguf", DType::F16, tok);
    return GgufFile::open(dir / "t.gguf")->get_string_opt("tokenizer.chat_template").value_or("(none)");
  };
  EXPECT_EQ(template_of_conversion(), "{{ messages }}");
  write_bytes(dir / "tokenizer_config.json", R"({"add_bos_token": true})");
  EXPECT_EQ(template_of_conversion(), "from the jinja file");
  fs::remove(dir / "chat_template.jinja");
  EXPECT_EQ(template_of_conversion(), "from the json file");
  fs::remove(dir / "chat_template.json");
  EXPECT_EQ(template_of_conversion(), "(none)");

  add("model.layers.0.self_attn.q_proj.bias", {8});
  write_bytes(dir / "model.safetensors", safetensors_image(h.dump(), data));
  std::string e = error_of([&] { convert_hf(dir.str(), dir / "bad.gguf", DType::F16, tok); });
  EXPECT_NE(e.find("q_proj.bias"), std::string::npos) << e;

  write_bytes(dir / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8,
    "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 8, "vocab_size": 512,
    "tie_word_embeddings": true})");
  e = error_of([&] { convert_hf(dir.str(), dir / "bad.gguf", DType::F16, tok); });
  EXPECT_NE(e.find("gate_proj"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "bad.gguf"));

  // No tokenizer.model in the directory and none given.
  e = error_of([&] { convert_hf(dir.str(), dir / "bad.gguf"); });
  EXPECT_NE(e.find("tokenizer"), std::string::npos) << e;
}

TEST(ConvertHf, UnpermuteFormula) {
  // Head dim 4, 2 heads: HF rows per head are [r0 r1 | r2 r3] with pairs
  // (r0, r2), (r1, r3); adjacent layout wants r0 r2 r1 r3.
  const int64_t expect[] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(rope_unpermute_source_row(r, 8, 2), expect[r]) << r;
}

// ---- quantize --------------------------------------------------------------

namespace {

// Largest |x| of the 32-element block holding element i of a row.
float block_amax(const std::vector<float>& v, size_t i) {
  const size_t b = i / kQK * kQK;
  float m = 0;
  for (size_t k = b; k < b + kQK; ++k) m = std::max(m, std::fabs(v[k]));
  return m;
}

}  // namespace

TEST(QuantizeGguf, Q8_0AndQ4_0CloseToOriginal) {
  TempDir dir;
  const std::string in = shared_model("stories260K.gguf");
  auto ref = GgufFile::open(in);
  struct Case {
    const char* type;
    DType dtype;
    int ftype;
    float step;  // quantization step as a fraction of the block's max |x|
  };
  // q8_0: d = amax/127, rounding error <= d/2, plus up to 127 * d * 2^-11
  // because d is stored as f16 after the codes were chosen with the exact d.
  // q4_0: d = amax/8, error <= d (the side opposite the max is clamped at 7
  // steps); the f16 error of d (8 * 2^-11 d) fits in the 1% slack below.
  for (const Case& c : {Case{"q8_0", DType::Q8_0, 7, (0.5f + 127.0f / 2048) / 127}, Case{"q4_0", DType::Q4_0, 2, 1.0f / 8}}) {
    const std::string out = dir / (std::string(c.type) + ".gguf");
    testing::internal::CaptureStderr();
    const QuantizeReport rep = quantize_gguf(in, out, c.type);
    const std::string err = testing::internal::GetCapturedStderr();
    // ffn_down rows are 172 long: not a multiple of 32, so they fall back to
    // f16. In the q4_0 mix the output matrix wants Q6_K (llama.cpp's rule),
    // whose 256-element blocks do not fit its 64-wide rows: Q8_0.
    const bool q4 = c.dtype == DType::Q4_0;
    EXPECT_EQ(rep.fallbacks.size(), q4 ? 6u : 5u) << c.type;
    EXPECT_NE(err.find("blk.0.ffn_down.weight"), std::string::npos) << err;
    auto q = GgufFile::open(out);
    EXPECT_EQ(q->get_int("general.file_type"), c.ftype);
    EXPECT_EQ(q->get_string_array("tokenizer.ggml.tokens"), ref->get_string_array("tokenizer.ggml.tokens"));
    EXPECT_EQ(q->get_int("llama.embedding_length"), 64);
    ASSERT_EQ(q->tensors().size(), ref->tensors().size());
    for (const GgufTensorInfo& t : q->tensors()) {
      const GgufTensorInfo* rt = ref->find_tensor(t.name);
      ASSERT_TRUE(rt);
      EXPECT_EQ(t.ne, rt->ne);
      const bool is_down = t.name.find("ffn_down") != std::string::npos;
      const DType want = t.ne.size() == 1      ? DType::F32
                         : is_down               ? DType::F16
                         : t.name == "output.weight" ? DType::Q8_0
                                                 : c.dtype;
      ASSERT_EQ(t.type, want) << t.name;
      const std::vector<float> got = decode_tensor(*q, t), orig = decode_tensor(*ref, *rt);
      double err2 = 0, ref2 = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const float q8_step = (0.5f + 127.0f / 2048) / 127;
        const float tol = t.type == c.dtype        ? block_amax(orig, i) * c.step * 1.01f + 1e-7f
                          : t.type == DType::Q8_0 ? block_amax(orig, i) * q8_step * 1.01f + 1e-7f
                          : t.type == DType::F16  ? std::fabs(orig[i]) / 2048 + 6e-8f
                                                  : 0.0f;
        ASSERT_LE(std::fabs(got[i] - orig[i]), tol) << c.type << " " << t.name << "[" << i << "]";
        err2 += (got[i] - orig[i]) * (got[i] - orig[i]);
        ref2 += orig[i] * orig[i];
      }
      if (t.type == c.dtype) {
        EXPECT_LT(std::sqrt(err2 / ref2), c.dtype == DType::Q8_0 ? 0.02 : 0.25) << t.name;
        EXPECT_GT(err2, 0.0) << t.name << " was not quantized";
      }
    }
  }
  // Command-line entry, and an already-q8_0 input copied as is.
  const std::string again = dir / "again.gguf";
  testing::internal::CaptureStderr();
  EXPECT_EQ(call_cmd(cmd_quantize, {"runlm quantize", dir / "q8_0.gguf", again, "Q8_0"}), 0);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(read_bytes(again), read_bytes(dir / "q8_0.gguf"));
  EXPECT_THROW(call_cmd(cmd_quantize, {"runlm quantize", in, dir / "x.gguf", "iq2_xxs"}), Error);
}

TEST(QuantizeGguf, Q4KFallsBackOnNarrowRows) {
  TempDir dir;
  testing::internal::CaptureStderr();
  QuantizeReport rep;
  ASSERT_NO_THROW(rep = quantize_gguf(shared_model("stories260K.gguf"), dir / "k.gguf", "q4_k"));
  const std::string err = testing::internal::GetCapturedStderr();
  // q4_k is llama-quantize's alias of q4_k_m. The output matrix's rows of 64
  // are not whole Q4_K blocks, so its rule picks Q8_0 outright (no
  // fallback). Every other 2-D tensor (embedding, 7 per layer) has rows of
  // 64 or 172 < 256 and falls back as llama.cpp's tensor_type_fallback does:
  // Q4_K -> Q5_0, Q6_K (attn_v of layers 2 and 4, use_more_bits for 5
  // layers) -> Q8_0, and rows of 172 (ffn_down) -> F16.
  EXPECT_EQ(rep.fallbacks.size(), 1u + 5u * 7u);
  EXPECT_NE(err.find("blk.2.attn_q.weight"), std::string::npos) << err;
  for (const std::string& note : rep.fallbacks) EXPECT_NE(note.rfind("output.weight", 0), 0u) << note;
  auto g = GgufFile::open(dir / "k.gguf");
  EXPECT_EQ(g->get_int("general.file_type"), 15);
  for (const GgufTensorInfo& t : g->tensors()) {
    const bool q6 = t.name == "output.weight" || t.name == "blk.2.attn_v.weight" || t.name == "blk.4.attn_v.weight";
    const DType want = t.ne.size() == 1    ? DType::F32
                       : t.ne[0] % 32 != 0 ? DType::F16
                       : q6                ? DType::Q8_0
                                           : DType::Q5_0;
    EXPECT_EQ(t.type, want) << t.name;
  }
}

TEST(QuantizeMix, Q4KMChoosesLikeLlamaCpp) {
  const QuantTarget& t = quant_target_from_name("Q4_K_M");
  EXPECT_EQ(t.ftype, 15u);
  QuantModelInfo info;
  info.n_layers = 32;
  QuantModelInfo tied = info;
  tied.has_output = false;
  QuantModelInfo five = info;
  five.n_layers = 5;
  // use_more_bits for 32 layers: i < 4, i >= 28, or (i - 4) % 3 == 2.
  const std::vector<int> more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  for (int i = 0; i < 32; ++i) {
    const bool m = std::find(more.begin(), more.end(), i) != more.end();
    const DType want = m ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(choose_tensor_type(t, strfmt("blk.%d.attn_v.weight", i), {4096, 4096}, info).type, want) << i;
    EXPECT_EQ(choose_tensor_type(t, strfmt("blk.%d.ffn_down.weight", i), {11008, 4096}, info).type, want) << i;
    EXPECT_EQ(choose_tensor_type(t, strfmt("blk.%d.attn_q.weight", i), {4096, 4096}, info).type, DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(t, strfmt("blk.%d.attn_norm.weight", i), {4096}, info).type, DType::F32);
  }
  EXPECT_EQ(choose_tensor_type(t, "output.weight", {4096, 32000}, info).type, DType::Q6_K);
  EXPECT_EQ(choose_tensor_type(t, "token_embd.weight", {4096, 32000}, info).type, DType::Q4_K);
  EXPECT_EQ(choose_tensor_type(t, "token_embd.weight", {4096, 32000}, tied).type, DType::Q6_K);  // tied
  const TensorTypeChoice fb = choose_tensor_type(t, "blk.4.ffn_down.weight", {172, 64}, five);  // 4 >= 7*5/8
  EXPECT_EQ(fb.type, DType::F16);  // Q6_K's fallback Q8_0 does not fit 172 either
  EXPECT_EQ(fb.wanted, DType::Q6_K);
  EXPECT_NE(fb.note.find("blk.4.ffn_down.weight"), std::string::npos);
  EXPECT_THROW(quant_target_from_name("q7_k_m"), Error);
}

TEST(QuantizeRows, ParallelEqualsSerial) {
  const int64_t cols = 256, rows = 2048;  // enough work for 7 threads
  auto src = [&](int64_t r, float* buf) {
    for (int64_t c = 0; c < cols; ++c) buf[c] = std::sin(0.37f * static_cast<float>(r * cols + c));
  };
  const size_t rb = dtype_row_bytes(DType::Q4_K, cols);
  std::vector<uint8_t> par(rb * rows), ser(rb * rows);
  encode_rows_parallel(DType::Q4_K, cols, rows, src, par.data(), 7);
  std::vector<float> buf(cols);
  for (int64_t r = 0; r < rows; ++r) {
    src(r, buf.data());
    quantize_row(DType::Q4_K, buf.data(), ser.data() + r * rb, cols);
  }
  EXPECT_EQ(par, ser);
  // A failing row in a worker thread surfaces as the Error on the caller.
  std::vector<uint8_t> f32(dtype_row_bytes(DType::F32, cols) * rows);
  EXPECT_THROW(encode_rows_parallel(DType::F32, cols, rows, [&](int64_t r, float* buf) {
                 if (r == 1900) fail("row %lld failed", static_cast<long long>(r));
                 std::fill(buf, buf + cols, 0.0f);
               }, f32.data(), 4),
               Error);
}

// ---- make_random_model -------------------------------------------------------

namespace {

int run_random_model(const std::string& args) {
  const std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) + " " + args + " > /dev/null 2>&1";
  return std::system(cmd.c_str());
}

}  // namespace

TEST(RandomModel, TinyPresetOpensWithExpectedShapes) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  TempDir dir;
  const std::string tok = shared_model("llama2-tokenizer.model");
  const std::string out = dir / "tiny.gguf";
  ASSERT_EQ(run_random_model("--preset tiny --type q8_0 --seed 7 --tokenizer " + tok + " -o " + out), 0);
  auto g = GgufFile::open(out);
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("general.file_type"), 7);
  EXPECT_EQ(g->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(g->get_int("llama.block_count"), 4);
  EXPECT_EQ(g->get_int("llama.vocab_size"), 32000);
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.tokens").size(), 32000u);
  const int64_t n_heads = g->get_int("llama.attention.head_count");
  const int64_t n_kv = g->get_int("llama.attention.head_count_kv");
  const int64_t hidden = g->get_int("llama.feed_forward_length");
  const int64_t hd = 64 / n_heads;
  EXPECT_EQ(g->tensors().size(), 3u + 4u * 9u);
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"token_embd.weight", {64, 32000}},      {"output.weight", {64, 32000}},
      {"blk.3.attn_q.weight", {64, n_heads * hd}}, {"blk.3.attn_k.weight", {64, n_kv * hd}},
      {"blk.3.ffn_down.weight", {hidden, 64}}, {"blk.0.attn_norm.weight", {64}}};
  for (const auto& [name, ne] : shapes) {
    const GgufTensorInfo* t = g->find_tensor(name);
    ASSERT_TRUE(t) << name;
    EXPECT_EQ(t->ne, ne) << name;
    EXPECT_EQ(t->type, ne.size() == 1 ? DType::F32 : ne[0] % 32 == 0 ? DType::Q8_0 : DType::F16) << name;
  }
  // Weight statistics: U(-a, a) with a = sqrt(3/64) has variance 1/64; norms near 1.
  const std::vector<float> q = decode_tensor(*g, *g->find_tensor("blk.1.attn_q.weight"));
  double sum = 0, sum2 = 0;
  for (float x : q) {
    ASSERT_LE(std::fabs(x), std::sqrt(3.0f / 64) * 1.01f);
    sum += x;
    sum2 += x * x;
  }
  EXPECT_NEAR(sum / q.size(), 0.0, 0.01);
  EXPECT_NEAR(sum2 / q.size(), 1.0 / 64, 0.002);
  for (float x : decode_tensor(*g, *g->find_tensor("blk.2.ffn_norm.weight"))) {
    EXPECT_GT(x, 0.9f);
    EXPECT_LT(x, 1.1f);
  }

  // Same seed, same file; another seed, other weights.
  const std::string again = dir / "again.gguf", other = dir / "other.gguf";
  ASSERT_EQ(run_random_model("--preset tiny --type q8_0 --seed 7 --threads 3 --tokenizer " + tok + " -o " + again), 0);
  EXPECT_EQ(read_bytes(again), read_bytes(out));
  ASSERT_EQ(run_random_model("--preset tiny --type q8_0 --seed 8 --tokenizer " + tok + " -o " + other), 0);
  EXPECT_NE(read_bytes(other), read_bytes(out));
}

TEST(RandomModel, OverridesAndErrors) {
  TempDir dir;
  const std::string tok = shared_model("stories260K-tok512.model");
  const std::string out = dir / "m.gguf";
  ASSERT_EQ(run_random_model("--preset tiny --type q4_k_m --dim 256 --heads 2 --kv-heads 1 --layers 2 --hidden 512 "
                             "--ctx 128 --tokenizer " + tok + " -o " + out),
            0);
  auto g = GgufFile::open(out);
  EXPECT_EQ(g->get_int("general.file_type"), 15);
  EXPECT_EQ(g->get_int("llama.context_length"), 128);
  EXPECT_EQ(g->get_int("llama.vocab_size"), 512);  // tiny takes the tokenizer's size
  EXPECT_EQ(g->find_tensor("blk.0.attn_k.weight")->ne, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(g->find_tensor("blk.0.attn_q.weight")->type, DType::Q4_K);
  // use_more_bits for 2 layers: n/8 = 0 and 7n/8 = 1, so layer 1 only.
  EXPECT_EQ(g->find_tensor("blk.0.attn_v.weight")->type, DType::Q4_K);
  EXPECT_EQ(g->find_tensor("blk.1.attn_v.weight")->type, DType::Q6_K);
  EXPECT_EQ(g->find_tensor("blk.1.ffn_down.weight")->type, DType::Q6_K);
  EXPECT_EQ(g->find_tensor("output.weight")->type, DType::Q6_K);

  // Mistral: llama arch plus a sliding window; shrunk so the test stays fast.
  ASSERT_EQ(run_random_model("--preset mistral-7b --type f16 --dim 128 --heads 2 --kv-heads 1 --layers 1 --hidden 256 "
                             "--vocab 512 --tokenizer " + tok + " -o " + dir / "mistral.gguf"),
            0);
  auto mis = GgufFile::open(dir / "mistral.gguf");
  EXPECT_EQ(mis->get_string("general.architecture"), "llama");
  EXPECT_EQ(mis->get_int("llama.attention.sliding_window"), 4096);
  EXPECT_EQ(mis->get_int("llama.context_length"), 32768);
  EXPECT_EQ(mis->find_tensor("blk.0.attn_v.weight")->ne, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(mis->find_tensor("blk.0.attn_v.weight")->type, DType::F16);

  EXPECT_NE(run_random_model("--preset tiny --vocab 1000 --tokenizer " + tok + " -o " + dir / "v.gguf"), 0);
  EXPECT_NE(run_random_model("--preset tiny --tokenizer " + dir / "none.model" + " -o " + dir / "t.gguf"), 0);
  EXPECT_NE(run_random_model("--preset nope --tokenizer " + tok + " -o " + dir / "p.gguf"), 0);
  EXPECT_NE(run_random_model("--preset tiny --type iq2_xxs --tokenizer " + tok + " -o " + dir / "q.gguf"), 0);
  EXPECT_FALSE(fs::exists(dir / "v.gguf"));
}
