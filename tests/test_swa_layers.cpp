// Per-layer sliding windows (models that alternate local and global
// layers): llama.attention.sliding_window_pattern in GGUF (an array of bools,
// or llama.cpp's integer "every n-th layer is global"), transformers'
// layer_types in config.json, the converter writing it, and the engines
// applying the window only on the marked layers. A paged cache frees pages
// that left the window only when every layer has it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "common.h"
#include "convert.h"
#include "engine.h"
#include "generation.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "hf_config.h"
#include "model.h"
#include "sampler.h"
#include "scheduler.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {

constexpr int kWindow = 4;

// stories260K.gguf (5 layers) with a window of `window` and `pattern` (null:
// no pattern key) in its metadata.
std::string with_window(const TempPath& out, int window, const GgufValue* pattern) {
  return rewritten_stories260k(out, [&](GgufWriter& w) {
    if (window > 0) w.set_u32("llama.attention.sliding_window", uint32_t(window));
    if (pattern) w.set("llama.attention.sliding_window_pattern", *pattern);
  });
}

GgufValue bools(const std::vector<int>& flags) {
  std::vector<GgufValue> items;
  for (int f : flags) items.push_back(GgufValue::make_bool(f != 0));
  return GgufValue::make_array(GgufType::BOOL, std::move(items));
}

std::unique_ptr<Engine> cpu_engine(const Model& m, int window_option = -1, KvLayout kv = KvLayout::Contiguous) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 256;
  eo.kv = kv;
  eo.block_size = 16;
  eo.sliding_window = window_option;
  return make_cpu_engine(m, eo);
}

// The logits of every position of a 40-token prompt.
std::vector<float> prompt_logits(Engine& e, const Model& m) {
  std::vector<int> ids = m.tokenizer().encode("Once upon a time, there was a little girl named Lily. She loved", true);
  while (ids.size() < 40) ids.push_back(ids[ids.size() % 13 + 1]);
  std::vector<float> out(ids.size() * size_t(m.config().n_vocab), NAN);
  e.forward(ids.data(), static_cast<int>(ids.size()), 0, out.data(), true);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

std::vector<int> greedy(Engine& engine, const Model& model, const std::vector<int>& prompt, int n) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  GenerationRequest req;
  req.prompt = prompt;
  req.n_predict = n;
  req.ignore_eos = true;
  return generate(engine, sampler, model.tokenizer(), req, nullptr).tokens;
}

// sotu29m (7 layers, head_dim 128) converted from a copy of its directory
// whose config.json adds a window of 32 and layer_types sliding on the even
// layers; the directory is removed when the object dies.
struct Sotu29mWithLayerTypes {
  std::filesystem::path dir;
  TempPath gguf{".gguf"};
  Sotu29mWithLayerTypes() {
    namespace fs = std::filesystem;
    dir = fs::path(TempPath(".d").str());
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(shared_model("sotu29m")))
      if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
    auto cfg = nlohmann::json::parse(read_file(shared_model("sotu29m/config.json")));
    cfg["sliding_window"] = 32;
    cfg["layer_types"] = nlohmann::json::array();
    for (int l = 0; l < cfg["num_hidden_layers"].get<int>(); ++l)
      cfg["layer_types"].push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
    std::ofstream(dir / "config.json") << cfg.dump();
    convert_hf(dir.string(), gguf.str());
  }
  ~Sotu29mWithLayerTypes() { std::filesystem::remove_all(dir); }
};

}  // namespace

TEST(SwaLayers, GgufPatternAsArrayOrInteger) {
  TempPath a(".gguf"), n2(".gguf"), n0(".gguf"), all(".gguf");
  const GgufValue mixed = bools({1, 0, 1, 0, 1});
  auto m = Model::load(with_window(a, 32, &mixed));
  EXPECT_EQ(m->config().sliding_window, 32);
  EXPECT_EQ(m->config().swa_layers, (std::vector<uint8_t>{1, 0, 1, 0, 1}));
  // llama.cpp's integer form: every 2nd layer (l % 2 == 1) is global.
  const GgufValue every2 = GgufValue::make_u32(2);
  EXPECT_EQ(Model::load(with_window(n2, 32, &every2))->config().swa_layers, (std::vector<uint8_t>{1, 0, 1, 0, 1}));
  // 0, or an array of all-true: every layer slides, i.e. no pattern.
  const GgufValue zero = GgufValue::make_u32(0);
  EXPECT_TRUE(Model::load(with_window(n0, 32, &zero))->config().swa_layers.empty());
  const GgufValue ones = bools({1, 1, 1, 1, 1});
  auto ma = Model::load(with_window(all, 32, &ones));
  EXPECT_TRUE(ma->config().swa_layers.empty());
  for (int l = 0; l < 5; ++l) EXPECT_TRUE(ma->config().layer_uses_window(l));
  EXPECT_FALSE(m->config().layer_uses_window(1));
}

TEST(SwaLayers, BadGgufPatternsAreNamed) {
  TempPath p(".gguf"), q(".gguf"), r(".gguf");
  const GgufValue short_pattern = bools({1, 0, 1});
  std::string e = load_error(with_window(p, 32, &short_pattern));
  EXPECT_NE(e.find("sliding_window_pattern has 3 entries for 5 layers"), std::string::npos) << e;
  const GgufValue text = GgufValue::make_string("local");
  e = load_error(with_window(q, 32, &text));
  EXPECT_NE(e.find("sliding_window_pattern must be a non-negative integer or an array of bools"), std::string::npos)
      << e;
  const GgufValue twos = GgufValue::make_i32_array({1, 2, 1, 0, 1});
  e = load_error(with_window(r, 32, &twos));
  EXPECT_NE(e.find("sliding_window_pattern[1] must be a bool"), std::string::npos) << e;
}

TEST(SwaLayers, HfLayerTypesAndTheConvertedKey) {
  const HfConfig c = parse_hf_config(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2, "vocab_size": 10,
    "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})",
                                     "lt.json");
  EXPECT_EQ(c.swa_layers, (std::vector<uint8_t>{1, 0, 1}));
  auto error_of = [](const std::string& json) {
    try {
      parse_hf_config(json, "bad.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10, )";
  std::string e = error_of(base + R"("sliding_window": 8, "layer_types": ["full_attention"]})");
  EXPECT_NE(e.find("layer_types must be a list of 2 entries"), std::string::npos) << e;
  e = error_of(base + R"("sliding_window": 8, "layer_types": ["full_attention", "chunked_attention"]})");
  EXPECT_NE(e.find("layer_types entry \"chunked_attention\" is not supported"), std::string::npos) << e;
  e = error_of(base + R"("layer_types": ["full_attention", "sliding_attention"]})");
  EXPECT_NE(e.find("sliding_attention layers but no sliding_window"), std::string::npos) << e;

  // The writer's key: llama.cpp's array form (the loader's side is
  // GgufPatternAsArrayOrInteger).
  LlamaHParams hp;
  hp.context_length = 64;
  hp.dim = 64;
  hp.hidden_dim = 128;
  hp.n_layers = 3;
  hp.n_heads = 2;
  hp.n_kv_heads = 2;
  hp.head_dim = 32;
  hp.vocab_size = 10;
  hp.sliding_window = 16;
  hp.swa_layers = c.swa_layers;
  GgufWriter w;
  write_llama_hparams(w, hp, llama_ftype_for(DType::F32));
  TempPath out(".gguf");
  w.write(out.str());
  auto back = GgufFile::open(out.str());
  EXPECT_EQ(back->get_int("llama.attention.sliding_window"), 16);
  const GgufValue& pattern = back->get("llama.attention.sliding_window_pattern");
  ASSERT_EQ(pattern.type, GgufType::ARRAY);
  ASSERT_EQ(pattern.arr.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(pattern.arr[l].type, GgufType::BOOL);
    EXPECT_EQ(pattern.arr[l].as_bool(), c.swa_layers[l] != 0) << l;
  }
  hp.swa_layers = {1, 0};
  EXPECT_THROW(write_llama_hparams(w, hp, llama_ftype_for(DType::F32)), Error);
}

TEST(SwaLayers, ConvertedLayerTypesReachTheModel) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/config.json"));
  const Sotu29mWithLayerTypes conv;
  auto model = Model::load(conv.gguf.str());
  EXPECT_EQ(model->config().sliding_window, 32);
  EXPECT_EQ(model->config().swa_layers, (std::vector<uint8_t>{1, 0, 1, 0, 1, 0, 1}));
}

// The CPU engine (the reference) applies the window on the marked layers
// only: an all-true pattern is the window model, an all-false one the full
// model (bit for bit), a mixed one neither; --swa 0 makes the mixed model
// full and --swa N resizes its marked layers' window.
TEST(SwaLayers, CpuEngineWindowsOnlyTheMarkedLayers) {
  TempPath pw(".gguf"), pf(".gguf"), pt(".gguf"), pz(".gguf"), pm(".gguf"), p8(".gguf");
  auto window_model = Model::load(with_window(pw, kWindow, nullptr));
  auto full_model = Model::load(with_window(pf, 0, nullptr));
  const GgufValue ones = bools({1, 1, 1, 1, 1}), zeros = bools({0, 0, 0, 0, 0}), mixed = bools({1, 0, 1, 0, 1});
  auto all_true = Model::load(with_window(pt, kWindow, &ones));
  auto all_false = Model::load(with_window(pz, kWindow, &zeros));
  auto mixed_model = Model::load(with_window(pm, kWindow, &mixed));
  auto mixed8 = Model::load(with_window(p8, 8, &mixed));

  const auto lw = prompt_logits(*cpu_engine(*window_model), *window_model);
  const auto lf = prompt_logits(*cpu_engine(*full_model), *full_model);
  EXPECT_GT(max_abs_diff(lw, lf), 1e-3) << "a window of 4 over 40 tokens must change the logits";
  EXPECT_EQ(prompt_logits(*cpu_engine(*all_true), *all_true), lw);
  EXPECT_EQ(prompt_logits(*cpu_engine(*all_false), *all_false), lf);
  const auto lm = prompt_logits(*cpu_engine(*mixed_model), *mixed_model);
  EXPECT_GT(max_abs_diff(lm, lw), 1e-3);
  EXPECT_GT(max_abs_diff(lm, lf), 1e-3);
  EXPECT_EQ(prompt_logits(*cpu_engine(*mixed_model, 0), *mixed_model), lf);
  EXPECT_EQ(prompt_logits(*cpu_engine(*mixed_model, 8), *mixed_model), prompt_logits(*cpu_engine(*mixed8), *mixed8));
  // The paged cache gives the contiguous cache's logits.
  EXPECT_EQ(prompt_logits(*cpu_engine(*mixed_model, -1, KvLayout::Paged), *mixed_model), lm);
  // Only a window on every layer lets pages go.
  EXPECT_EQ(cpu_engine(*mixed_model)->sliding_window(), 0);
  EXPECT_EQ(cpu_engine(*all_true)->sliding_window(), kWindow);
}

// Continuous batching on the mixed model: the global layers still read every
// key, so no page is released, and each request gets its tokens from running
// alone.
TEST(SwaLayers, BatchKeepsPagesForTheGlobalLayers) {
  TempPath pm(".gguf");
  const GgufValue mixed = bools({1, 0, 1, 0, 1});
  auto model = Model::load(with_window(pm, 16, &mixed));
  const std::vector<std::string> prompts = {"Once upon a time, there was a little girl named Lily.",
                                            "Tom had a big red ball.", "The cat sat on the mat and"};
  auto engine = cpu_engine(*model, -1, KvLayout::Paged);
  SchedulerOptions so;
  so.max_parallel = 3;
  so.max_seq_len = 256;
  Scheduler sched(*engine, model->tokenizer(), so);
  std::vector<std::vector<int>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.index = static_cast<int>(i);
    r.prompt = model->tokenizer().encode(prompts[i], true);
    r.n_predict = 80;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    ids.push_back(r.prompt);
    sched.submit(r);
  }
  std::map<int, std::vector<int>> out;
  int peak = 0;
  sched.run([&](Completion&& c) { out[c.index] = std::move(c.tokens); }, nullptr, [&](const SchedulerProgress&) {
    peak = std::max(peak, engine->blocks()->n_pages() - engine->blocks()->n_free());
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = cpu_engine(*model);
    EXPECT_EQ(out.at(static_cast<int>(i)), greedy(*alone, *model, ids[i], 80)) << prompts[i];
  }
  // 3 sequences of >= 80 tokens keep >= 5 pages each (a window of 16 would keep ~2-3).
  EXPECT_GE(peak, 3 * 5);
}

// The GPU engine takes the same per-layer windows (contiguous and paged
// caches): its greedy tokens on the mixed model equal the CPU engine's.
TEST(SwaLayers, GpuEngineMatchesTheCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)";
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/config.json"));
  // The GPU's greedy tokens with a contiguous and a paged cache against the CPU's.
  auto expect_gpu_equals_cpu = [](const Model& model, const std::vector<int>& prompt, int n, const char* what) {
    const std::vector<int> want = greedy(*cpu_engine(model), model, prompt, n);
    for (KvLayout kv : {KvLayout::Contiguous, KvLayout::Paged}) {
      EngineOptions eo;
      eo.device = Device::Cuda;
      eo.n_ctx = 256;
      eo.kv = kv;
      eo.block_size = 16;
      auto gpu = make_cuda_engine(model, eo);
      EXPECT_EQ(greedy(*gpu, model, prompt, n), want) << what << " " << kv_layout_name(kv);
    }
  };
  TempPath pm(".gguf");
  const GgufValue mixed = bools({1, 0, 1, 0, 1});
  auto model = Model::load(with_window(pm, kWindow, &mixed));
  expect_gpu_equals_cpu(*model, model->tokenizer().encode("Once upon a time, there was a little girl", true), 120,
                        "stories260K");
  // sotu29m (head_dim 128: the fa2/fa3 prefill and tensor-core decode
  // kernels) with a window of 32 on its even layers, a 100-token prompt.
  const Sotu29mWithLayerTypes conv;
  auto sotu = Model::load(conv.gguf.str());
  std::vector<int> long_prompt = sotu->tokenizer().encode(
      "The state of the union is strong, and the work of the people goes on in every town and every city", true);
  while (long_prompt.size() < 100) long_prompt.push_back(long_prompt[long_prompt.size() % 20 + 1]);
  expect_gpu_equals_cpu(*sotu, long_prompt, 48, "sotu29m");
}
