// Greedy generation from stories260K reproduces llama2.c's golden output byte
// for byte, from the GGUF and from the converted llama2.c checkpoint.
#include <gtest/gtest.h>

#include <cmath>

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

struct Greedy {
  std::vector<int> ids;
  std::string text;
};

Greedy greedy_from_bos(const Model& model, int n) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  auto engine = make_cpu_engine(model, eo);
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  GenerationRequest req;
  req.prompt = {model.tokenizer().bos()};
  req.n_predict = n;
  Greedy g;
  const GenerationResult r = generate(*engine, sampler, model.tokenizer(), req, [&](int, const std::string& piece) {
    g.text += piece;
    return true;
  });
  g.ids = r.tokens;
  EXPECT_EQ(r.finish, FinishReason::Length);
  return g;
}

}  // namespace

TEST(Generate, Stories260KGgufMatchesGolden) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  const Greedy g = greedy_from_bos(*model, 200);
  EXPECT_EQ(g.ids, read_ids(shared_model("stories260K.greedy200.ids.txt")));
  EXPECT_EQ(g.text, read_file(shared_model("stories260K.greedy200.txt")));
}

TEST(Generate, Stories260KConvertedFromLlama2cMatchesGolden) {
  TempPath out(".gguf");
  convert_llama2c(shared_model("stories260K.bin"), shared_model("stories260K-tok512.model"), out.str());
  auto model = Model::load(out.str());
  const Greedy g = greedy_from_bos(*model, 200);
  EXPECT_EQ(g.ids, read_ids(shared_model("stories260K.greedy200.ids.txt")));
  EXPECT_EQ(g.text, read_file(shared_model("stories260K.greedy200.txt")));
}

TEST(Generate, CliPrintsTheGoldenText) {
  const CommandResult r = run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                                      " -n 200 --temp 0 -t 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(shared_model("stories260K.greedy200.txt")) + "\n");
  EXPECT_NE(r.err.find("t/s"), std::string::npos) << "timings go to stderr: " << r.err;
}

TEST(Generate, SameSeedSameText) {
  const std::string cmd = runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                          " -p 'Once upon a time' -n 40 --temp 0.9 -t 2 -s ";
  const CommandResult a = run_command(cmd + "42"), b = run_command(cmd + "42"), c = run_command(cmd + "43");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  EXPECT_EQ(a.out.rfind("Once upon a time", 0), 0u);
}

// Evaluating a prompt in one pass, in chunks (-b) or token by token must give
// the same logits: the chunked prefill is the same computation.
TEST(Generate, ChunkedPrefillGivesTheSameLogits) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  const auto prompt = model->tokenizer().encode("Lily and Tom went to the park to play with a red ball.", true);
  const int n = static_cast<int>(prompt.size());
  const int nv = model->config().n_vocab;
  auto run = [&](int n_batch, bool one_by_one) {
    EngineOptions eo;
    eo.device = Device::Cpu;
    eo.n_threads = 2;
    eo.n_batch = n_batch;
    auto engine = make_cpu_engine(*model, eo);
    std::vector<float> logits(static_cast<size_t>(n) * nv);
    if (one_by_one) {
      for (int i = 0; i < n; ++i) engine->forward(&prompt[i], 1, i, &logits[static_cast<size_t>(i) * nv], false);
    } else {
      engine->forward(prompt.data(), n, 0, logits.data(), true);
    }
    return logits;
  };
  const auto whole = run(512, false), chunked = run(5, false), single = run(512, true);
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_NEAR(whole[i], chunked[i], 1e-4f) << i;
    ASSERT_NEAR(whole[i], single[i], 1e-4f) << i;
  }
}

TEST(Generate, PagedKvGivesTheGoldenTokensToo) {
  const CommandResult r = run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                                      " -n 200 --temp 0 -t 2 --kv paged --block-size 8 -b 7");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(shared_model("stories260K.greedy200.txt")) + "\n");
  // A prompt evaluated in chunks of 7 across pages of 8, then decoded.
  const std::string cmd = runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                          " -p 'Lily and Tom went to the park to play with a red ball and a blue kite.' -n 40 --temp 0 -t 2";
  const CommandResult a = run_command(cmd + " --kv contiguous"), b = run_command(cmd + " --kv paged --block-size 8 -b 7");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(Generate, ContextFullStopsCleanly) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_ctx = 16;
  auto engine = make_cpu_engine(*model, eo);
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  GenerationRequest req;
  req.prompt = {model->tokenizer().bos()};
  req.ignore_eos = true;
  const GenerationResult r = generate(*engine, sampler, model->tokenizer(), req, nullptr);
  EXPECT_EQ(r.finish, FinishReason::Context);
  EXPECT_EQ(r.tokens.size(), 16u);  // positions 1..15 evaluated, the 16th sampled last
}
