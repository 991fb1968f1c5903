// sotu29m (a real Llama with head dim 128 and GQA, Hugging Face format)
// converted by runlm gives transformers' greedy token ids and top-5 logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "convert.h"
#include "engine.h"
#include "generation.h"
#include "model.h"
#include "sampler.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {

class Sotu29m : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!missing_asset(shared_model("sotu29m/reference.json")).empty()) return;  // each test skips in SetUp
    gguf_ = new TempPath(".gguf");
    convert_hf(shared_model("sotu29m"), gguf_->str());
    reference_ = new nlohmann::json(nlohmann::json::parse(read_file(shared_model("sotu29m/reference.json"))));
  }
  void SetUp() override { RUNLM_REQUIRE_ASSET(shared_model("sotu29m/reference.json")); }
  static void TearDownTestSuite() {
    delete gguf_;
    delete reference_;
  }
  static std::unique_ptr<Engine> engine(const Model& m) {
    EngineOptions eo;
    eo.device = Device::Cpu;
    eo.n_threads = 2;
    return make_cpu_engine(m, eo);
  }
  static TempPath* gguf_;
  static nlohmann::json* reference_;
};
TempPath* Sotu29m::gguf_ = nullptr;
nlohmann::json* Sotu29m::reference_ = nullptr;

}  // namespace

TEST_F(Sotu29m, GreedyContinuationsMatchTransformers) {
  auto model = Model::load(gguf_->str());
  EXPECT_EQ(model->config().head_dim, 128);
  EXPECT_EQ(model->config().n_kv_heads, 2);
  for (const auto& [prompt, ref] : (*reference_)["greedy_64"].items()) {
    const std::vector<int> prompt_ids = ref["prompt_ids"].get<std::vector<int>>();
    EXPECT_EQ(model->tokenizer().encode(prompt, true), prompt_ids) << prompt;
    auto eng = engine(*model);
    SamplingParams sp;
    sp.temperature = 0;
    Sampler sampler(sp);
    GenerationRequest req;
    req.prompt = prompt_ids;
    req.n_predict = 64;
    req.ignore_eos = true;
    const GenerationResult r = generate(*eng, sampler, model->tokenizer(), req, nullptr);
    EXPECT_EQ(r.tokens, ref["new_ids"].get<std::vector<int>>()) << prompt;
    EXPECT_EQ(model->tokenizer().decode(r.tokens), ref["text"].get<std::string>().substr(prompt.size() + 1)) << prompt;
  }
}

// transformers ran in float32 from the same bf16 weights; runlm decodes bf16
// exactly and accumulates in fp32 too, so the only differences are summation
// order (about 1e-6 relative per dot product, growing through 7 layers).
// 2e-3 absolute on logits of size ~8 allows that drift with a wide margin and
// is still far below the gaps between the top-5 candidates (> 0.05).
TEST_F(Sotu29m, ProbeTop5LogitsMatchTransformers) {
  auto model = Model::load(gguf_->str());
  const auto& probe = (*reference_)["logits_probe"];
  const std::vector<int> ids = probe["ids"].get<std::vector<int>>();
  const int nv = model->config().n_vocab;
  auto eng = engine(*model);
  std::vector<float> logits(ids.size() * nv);
  eng->forward(ids.data(), static_cast<int>(ids.size()), 0, logits.data(), true);
  for (const auto& [pos_s, ref] : probe["positions"].items()) {
    const int pos = std::stoi(pos_s);
    const float* row = &logits[static_cast<size_t>(pos) * nv];
    std::vector<int> order(nv);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) { return row[a] > row[b]; });
    const auto ref_ids = ref["top5_ids"].get<std::vector<int>>();
    const auto ref_logits = ref["top5_logits"].get<std::vector<float>>();
    for (int k = 0; k < 5; ++k) {
      EXPECT_EQ(order[k], ref_ids[k]) << "position " << pos << " rank " << k;
      EXPECT_NEAR(row[ref_ids[k]], ref_logits[k], 2e-3) << "position " << pos << " token " << ref_ids[k];
    }
  }
}
