// `runlm convert` of the Hugging Face families (models/arch.h): tiny
// checkpoints written here (config.json, one safetensors file, the embedded
// sentencepiece vocabulary) become GGUFs with the architecture's keys and
// tensors as llama.cpp's converter writes them (Qwen2 biases, Gemma norms
// plus one and post norms, Phi-3 fused tensors and longrope factors, Llama
// 3.1's rope_freqs), which runlm then loads and runs; a byte-level BPE
// tokenizer.json becomes llama.cpp's gpt2 vocabulary metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "common.h"
#include "convert.h"
#include "dtype.h"
#include "engine.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "hf_bpe_vocab.h"
#include "hf_config.h"
#include "model.h"
#include "quant.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;
namespace fs = std::filesystem;

namespace {

using Tensors = std::map<std::string, std::vector<int64_t>>;  // name -> shape (row-major)

// A checkpoint directory: config.json, model.safetensors of f32 values
// (value i of a tensor: a hash of its name and i, in [-0.5, 0.5)),
// tokenizer.model. Each tensor is stored as stored_name(name) when given
// (its values still follow name). Returns every tensor's values.
std::map<std::string, std::vector<float>> write_checkpoint(
    const fs::path& dir, const nlohmann::json& config, const Tensors& tensors,
    const std::function<std::string(const std::string&)>& stored_name = {}) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  fs::copy_file(embedded_model_dir() + "/stories260K-tok512.model", dir / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float>& v = values[name];
    const size_t h = std::hash<std::string>{}(name);
    for (int64_t i = 0; i < n; ++i) v.push_back(float((h + uint64_t(i) * 2654435761u) % 1000) / 1000.0f - 0.5f);
    header[stored_name ? stored_name(name) : name] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + v.size() * 4}}};
    data.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  const std::string h = header.dump();
  const uint64_t len = h.size();
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << h << data;
  return values;
}

std::vector<float> tensor_values(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo* t = g.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> out(size_t(t->n_elements()));
  dequantize_row(t->type, g.tensor_data(*t), out.data(), t->n_elements());
  return out;
}

// The usual per-layer tensors of a Llama-style checkpoint of `dim` and
// `hidden`, with q/k/v widths q and kv.
Tensors llama_like(int64_t vocab, int64_t dim, int64_t hidden, int64_t q, int64_t kv, int layers, bool lm_head) {
  Tensors t{{"model.embed_tokens.weight", {vocab, dim}}, {"model.norm.weight", {dim}}};
  if (lm_head) t["lm_head.weight"] = {vocab, dim};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = {dim};
    t[p + "self_attn.q_proj.weight"] = {q, dim};
    t[p + "self_attn.k_proj.weight"] = {kv, dim};
    t[p + "self_attn.v_proj.weight"] = {kv, dim};
    t[p + "self_attn.o_proj.weight"] = {dim, q};
    t[p + "post_attention_layernorm.weight"] = {dim};
    t[p + "mlp.gate_proj.weight"] = {hidden, dim};
    t[p + "mlp.up_proj.weight"] = {hidden, dim};
    t[p + "mlp.down_proj.weight"] = {dim, hidden};
  }
  return t;
}

std::string convert_dir(const fs::path& dir) {
  const std::string out = (dir / "out.gguf").string();
  convert_hf(dir.string(), out);
  return out;
}

// Loads the GGUF and runs a few tokens on the CPU: finite logits.
void runs(const std::string& path) {
  auto m = Model::load(path);
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 64;
  auto e = make_cpu_engine(*m, eo);
  const int ids[] = {1, 20, 30, 40, 50};
  std::vector<float> logits(size_t(m->config().n_vocab));
  e->forward(ids, 5, 0, logits.data(), false);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

class ConvertFamilies : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("runlm_convfam_" + std::to_string(getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  void TearDown() override { fs::remove_all(dir); }
};

}  // namespace

TEST_F(ConvertFamilies, Qwen2BiasesNoPermutationNoWindow) {
  Tensors t = llama_like(512, 64, 128, 64, 32, 1, true);
  t["model.layers.0.self_attn.q_proj.bias"] = {64};
  t["model.layers.0.self_attn.k_proj.bias"] = {32};
  t["model.layers.0.self_attn.v_proj.bias"] = {32};
  const nlohmann::json cfg = {{"architectures", {"Qwen2ForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"vocab_size", 512}, {"rope_theta", 1e6}, {"rms_norm_eps", 1e-6},
                              {"sliding_window", 4096}, {"use_sliding_window", false}, {"tie_word_embeddings", false},
                              {"hidden_act", "silu"}, {"torch_dtype", "float32"}};
  const auto v = write_checkpoint(dir, cfg, t);
  auto g = GgufFile::open(convert_dir(dir));
  EXPECT_EQ(g->get_string("general.architecture"), "qwen2");
  EXPECT_FLOAT_EQ(float(g->get_float("qwen2.rope.freq_base")), 1e6f);
  EXPECT_EQ(g->find("qwen2.attention.sliding_window"), nullptr);
  EXPECT_EQ(tensor_values(*g, "blk.0.attn_q.bias"), v.at("model.layers.0.self_attn.q_proj.bias"));
  // NeoX layout: q rows as they are.
  EXPECT_EQ(tensor_values(*g, "blk.0.attn_q.weight"), v.at("model.layers.0.self_attn.q_proj.weight"));
  runs((dir / "out.gguf").string());

  nlohmann::json swa = cfg;
  swa["use_sliding_window"] = true;
  std::ofstream(dir / "config.json") << swa.dump();
  expect_words(error_of([&] { convert_dir(dir); }), {"use_sliding_window", "Qwen2ForCausalLM"});
}

TEST_F(ConvertFamilies, Gemma2NormsPlusOnePostNormsSoftcapsPattern) {
  Tensors t = llama_like(512, 64, 128, 64, 32, 2, false);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "pre_feedforward_layernorm.weight"] = {64};
    t[p + "post_feedforward_layernorm.weight"] = {64};
  }
  const nlohmann::json cfg = {{"architectures", {"Gemma2ForCausalLM"}}, {"hidden_size", 64},
                              {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                              {"num_key_value_heads", 1}, {"head_dim", 32}, {"vocab_size", 512},
                              {"query_pre_attn_scalar", 32}, {"attn_logit_softcapping", 50.0},
                              {"final_logit_softcapping", 30.0}, {"sliding_window", 16},
                              {"hidden_activation", "gelu_pytorch_tanh"}, {"torch_dtype", "float32"}};
  const auto v = write_checkpoint(dir, cfg, t);
  auto g = GgufFile::open(convert_dir(dir));
  EXPECT_EQ(g->get_string("general.architecture"), "gemma2");
  EXPECT_FLOAT_EQ(float(g->get_float("gemma2.attn_logit_softcapping")), 50.0f);
  EXPECT_FLOAT_EQ(float(g->get_float("gemma2.final_logit_softcapping")), 30.0f);
  EXPECT_EQ(g->get_int("gemma2.attention.key_length"), 32);
  EXPECT_EQ(g->get_int("gemma2.attention.sliding_window"), 16);
  EXPECT_FALSE(g->get_bool("tokenizer.ggml.add_space_prefix"));
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
  auto plus_one = [](std::vector<float> x) {
    for (float& f : x) f += 1.0f;
    return x;
  };
  EXPECT_EQ(tensor_values(*g, "blk.1.attn_norm.weight"), plus_one(v.at("model.layers.1.input_layernorm.weight")));
  EXPECT_EQ(tensor_values(*g, "blk.1.post_attention_norm.weight"),
            plus_one(v.at("model.layers.1.post_attention_layernorm.weight")));
  EXPECT_EQ(tensor_values(*g, "blk.1.ffn_norm.weight"), plus_one(v.at("model.layers.1.pre_feedforward_layernorm.weight")));
  EXPECT_EQ(tensor_values(*g, "blk.1.post_ffw_norm.weight"),
            plus_one(v.at("model.layers.1.post_feedforward_layernorm.weight")));
  EXPECT_EQ(tensor_values(*g, "output_norm.weight"), plus_one(v.at("model.norm.weight")));
  const ModelConfig c = Model::load((dir / "out.gguf").string())->config();
  EXPECT_EQ(c.swa_layers, (std::vector<uint8_t>{1, 0}));
  EXPECT_FLOAT_EQ(c.attn_softcap, 50.0f);
  runs((dir / "out.gguf").string());

  nlohmann::json bad = cfg;
  bad["query_pre_attn_scalar"] = 64;
  std::ofstream(dir / "config.json") << bad.dump();
  expect_words(error_of([&] { convert_dir(dir); }), {"query_pre_attn_scalar"});
  bad = cfg;
  bad["hidden_activation"] = "relu";
  std::ofstream(dir / "config.json") << bad.dump();
  expect_words(error_of([&] { convert_dir(dir); }), {"hidden_activation", "relu", "gelu_pytorch_tanh"});
}

// Gemma 3 as released at 4B-27B, Gemma3ForConditionalGeneration: its text
// model (text_config holding only what differs from Gemma3TextConfig's
// defaults; tensors under language_model.model., or model.language_model. as
// newer transformers save them) converts to the same GGUF, byte for byte,
// as a Gemma3ForCausalLM checkpoint of the same weights with every default
// spelled out; the vision tower is left out.
TEST_F(ConvertFamilies, Gemma3MultimodalConvertsItsTextModel) {
  Tensors t = llama_like(512, 64, 128, 64, 32, 6, false);
  for (int l = 0; l < 6; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "self_attn.q_norm.weight"] = {32};
    t[p + "self_attn.k_norm.weight"] = {32};
    t[p + "pre_feedforward_layernorm.weight"] = {64};
    t[p + "post_feedforward_layernorm.weight"] = {64};
  }
  const nlohmann::json differing = {{"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 6},
                                    {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 32},
                                    {"vocab_size", 512}, {"query_pre_attn_scalar", 32}, {"sliding_window", 16},
                                    {"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}};
  nlohmann::json causal = differing;
  causal.update({{"architectures", {"Gemma3ForCausalLM"}}, {"torch_dtype", "float32"}, {"rope_theta", 1e6},
                 {"rope_local_base_freq", 1e4}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 131072},
                 {"sliding_window_pattern", 6}, {"hidden_activation", "gelu_pytorch_tanh"},
                 {"tie_word_embeddings", true}});
  // The same stem, so that general.name is the same.
  write_checkpoint(dir / "causal" / "gemma3", causal, t);
  const std::string want = read_file(convert_dir(dir / "causal" / "gemma3"));

  nlohmann::json text = differing;
  text["model_type"] = "gemma3_text";
  const nlohmann::json multimodal = {{"architectures", {"Gemma3ForConditionalGeneration"}},
                                     {"model_type", "gemma3"},
                                     {"torch_dtype", "float32"},
                                     {"text_config", text},
                                     {"vision_config", {{"model_type", "siglip_vision_model"}, {"hidden_size", 16}}}};
  Tensors with_vision = t;
  with_vision["vision_tower.vision_model.embeddings.patch_embedding.weight"] = {16, 3, 2, 2};
  with_vision["multi_modal_projector.mm_input_projection_weight"] = {16, 64};
  for (const bool newer : {false, true}) {
    SCOPED_TRACE(newer ? "model.language_model." : "language_model.model.");
    const fs::path d = dir / (newer ? "newer" : "released") / "gemma3";
    write_checkpoint(d, multimodal, with_vision, [newer](const std::string& name) {
      const bool vision = name.rfind("model.", 0) != 0;
      if (newer) return "model." + (vision ? name : "language_model." + name.substr(6));
      return vision ? name : "language_model." + name;
    });
    testing::internal::CaptureStderr();
    const std::string got = read_file(convert_dir(d));
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(got == want) << "the GGUFs differ";
    EXPECT_NE(err.find("vision tower and projector (2 tensors) are left out"), std::string::npos) << err;
  }
  runs((dir / "causal" / "gemma3" / "out.gguf").string());

  nlohmann::json no_text = multimodal;
  no_text.erase("text_config");
  write_checkpoint(dir / "bad", no_text, with_vision);
  expect_words(error_of([&] { convert_dir(dir / "bad"); }), {"Gemma3ForConditionalGeneration", "text_config"});
}

TEST_F(ConvertFamilies, Phi3FusedTensorsAndLongrope) {
  Tensors t{{"model.embed_tokens.weight", {512, 64}}, {"model.norm.weight", {64}}, {"lm_head.weight", {512, 64}}};
  const std::string p = "model.layers.0.";
  t[p + "input_layernorm.weight"] = {64};
  t[p + "self_attn.qkv_proj.weight"] = {192, 64};
  t[p + "self_attn.o_proj.weight"] = {64, 64};
  t[p + "post_attention_layernorm.weight"] = {64};
  t[p + "mlp.gate_up_proj.weight"] = {256, 64};
  t[p + "mlp.down_proj.weight"] = {64, 128};
  std::vector<double> long_f(8), short_f(8);
  for (int i = 0; i < 8; ++i) long_f[i] = 1.0 + i, short_f[i] = 1.0 + 0.1 * i;
  const nlohmann::json cfg = {{"architectures", {"Phi3ForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 4},
                              {"vocab_size", 512}, {"max_position_embeddings", 128},
                              {"rope_scaling", {{"type", "longrope"}, {"long_factor", long_f},
                                                {"short_factor", short_f},
                                                {"original_max_position_embeddings", 32}}},
                              {"torch_dtype", "float32"}};
  const auto v = write_checkpoint(dir, cfg, t);
  auto g = GgufFile::open(convert_dir(dir));
  EXPECT_EQ(g->get_string("general.architecture"), "phi3");
  EXPECT_EQ(tensor_values(*g, "blk.0.attn_qkv.weight"), v.at(p + "self_attn.qkv_proj.weight"));
  EXPECT_EQ(tensor_values(*g, "blk.0.ffn_up.weight"), v.at(p + "mlp.gate_up_proj.weight"));
  EXPECT_EQ(g->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(g->get_string("phi3.rope.scaling.type"), "longrope");
  EXPECT_NEAR(g->get_float("phi3.rope.scaling.attn_factor"), std::sqrt(1 + std::log(4.0) / std::log(32.0)), 1e-6);
  EXPECT_EQ(g->get_int("phi3.rope.scaling.original_context_length"), 32);
  const std::vector<float> lf = tensor_values(*g, "rope_factors_long.weight");
  ASSERT_EQ(lf.size(), 8u);
  EXPECT_EQ(lf[7], 8.0f);
  const ModelConfig c = Model::load((dir / "out.gguf").string())->config();
  EXPECT_TRUE(c.fused_qkv && c.fused_gate_up);
  EXPECT_EQ(c.rope_factors, RopeFactors::LongShort);
  runs((dir / "out.gguf").string());
}

TEST_F(ConvertFamilies, Llama3RopeScalingBecomesRopeFreqs) {
  const Tensors t = llama_like(512, 64, 128, 64, 32, 1, true);
  const nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"vocab_size", 512}, {"rope_theta", 500000.0},
                              {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                                {"high_freq_factor", 4.0},
                                                {"original_max_position_embeddings", 64}}},
                              {"torch_dtype", "float32"}};
  write_checkpoint(dir, cfg, t);
  auto g = GgufFile::open(convert_dir(dir));
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->find("llama.rope.scaling.type"), nullptr);
  EXPECT_EQ(tensor_values(*g, "rope_freqs.weight"), llama3_rope_freqs(500000.0f, 16, 8.0, 1.0, 4.0, 64.0));
  EXPECT_EQ(Model::load((dir / "out.gguf").string())->config().rope_factors, RopeFactors::Freqs);
  runs((dir / "out.gguf").string());
}

TEST_F(ConvertFamilies, Qwen3QkNormsAndHeadDim) {
  Tensors t = llama_like(512, 64, 128, 128, 64, 1, false);
  t["model.layers.0.self_attn.q_norm.weight"] = {32};
  t["model.layers.0.self_attn.k_norm.weight"] = {32};
  const nlohmann::json cfg = {{"architectures", {"Qwen3ForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 128},
                              {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                              {"head_dim", 32}, {"vocab_size", 512}, {"tie_word_embeddings", true},
                              {"torch_dtype", "float32"}};
  const auto v = write_checkpoint(dir, cfg, t);
  auto g = GgufFile::open(convert_dir(dir));
  EXPECT_EQ(g->get_string("general.architecture"), "qwen3");
  EXPECT_EQ(g->get_int("qwen3.attention.key_length"), 32);
  EXPECT_EQ(tensor_values(*g, "blk.0.attn_k_norm.weight"), v.at("model.layers.0.self_attn.k_norm.weight"));
  runs((dir / "out.gguf").string());
  // A checkpoint missing the norms names the tensor.
  t.erase("model.layers.0.self_attn.k_norm.weight");
  write_checkpoint(dir, cfg, t);
  expect_words(error_of([&] { convert_dir(dir); }), {"k_norm"});
}

TEST(ConvertBpeVocab, FromTokenizerJson) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("runlm_bpe_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3},
              "merges": ["a b", ["\u0120", "a"]]},
    "added_tokens": [{"id": 5, "content": "<|begin_of_text|>", "special": true},
                     {"id": 6, "content": "<|eot|>", "special": true},
                     {"id": 7, "content": "my\u2581word", "special": false}],
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}]}
  })";
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"})";
  HfConfig cfg;
  cfg.arch = Arch::Qwen2;
  cfg.architecture = "Qwen2ForCausalLM";
  GgufWriter w;
  write_bpe_vocab(w, dir.string(), cfg, 10, "{{ messages }}");
  TempPath out(".gguf");
  w.write(out.str());
  auto g = GgufFile::open(out.str());
  EXPECT_EQ(g->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g->get_string("tokenizer.ggml.pre"), "qwen2");
  const auto toks = g->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(toks.size(), 10u);
  EXPECT_EQ(toks[2], "ab");
  EXPECT_EQ(toks[4], "[PAD4]");
  EXPECT_EQ(toks[7], "my word");
  EXPECT_EQ(g->get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 1, 1, 1, 5, 3, 3, 4, 5, 5}));
  EXPECT_EQ(g->get_string_array("tokenizer.ggml.merges"), (std::vector<std::string>{"a b", "\xc4\xa0 a"}));
  EXPECT_EQ(g->get_int("tokenizer.ggml.bos_token_id"), 5);
  EXPECT_EQ(g->get_int("tokenizer.ggml.eos_token_id"), 6);
  EXPECT_TRUE(g->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(g->get_string("tokenizer.chat_template"), "{{ messages }}");
  cfg.arch = Arch::Gemma2;
  cfg.architecture = "Gemma2ForCausalLM";
  GgufWriter w2;
  expect_words(error_of([&] { write_bpe_vocab(w2, dir.string(), cfg, 10, ""); }),
               {"Gemma2ForCausalLM", "pre-tokenizer"});
  fs::remove_all(dir);
}
