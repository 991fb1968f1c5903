// runlm perplexity: the accumulation math on hand-computed cases, the chunk
// plan, the stored log-prob records, sotu29m's reference perplexity, KL
// divergence of a model against itself and against its q8_0 copy, and the
// command's errors (missing or short text, mismatched or corrupt base files).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "common.h"
#include "convert.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "perplexity.h"
#include "quantize.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

namespace {

template <typename F>
void expect_error(F&& f, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "no Error thrown; expected one mentioning '" << words << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << "expected '" << words << "' in: " << e.what();
  }
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

std::string eval_text() { return read_file(shared_model("sotu29m/eval.txt")); }

// Exact log-softmax, by the definition, in long double.
std::vector<long double> log_softmax_ref(const std::vector<float>& logits) {
  long double z = 0;
  for (float x : logits) z += std::exp(static_cast<long double>(x));
  std::vector<long double> r;
  for (float x : logits) r.push_back(std::log(std::exp(static_cast<long double>(x)) / z));
  return r;
}

// The number after `key` in a command's output, or NaN.
double number_after(const std::string& out, const std::string& key) {
  const size_t at = out.find(key);
  if (at == std::string::npos) return NAN;
  return std::strtod(out.c_str() + at + key.size(), nullptr);
}

}  // namespace

// ---------------------------------------------------------------- math

TEST(PerplexityMath, TokenNllIsMinusLogSoftmax) {
  // p = (1, 1, 2) / 4 exactly with logits (0, 0, ln 2).
  const std::vector<float> l = {0.0f, 0.0f, static_cast<float>(std::log(2.0))};
  EXPECT_NEAR(token_nll(l.data(), 3, 0), std::log(4.0), 1e-6);
  EXPECT_NEAR(token_nll(l.data(), 3, 2), std::log(2.0), 1e-6);
  // Large logits: a shift does not change the softmax, and must not overflow.
  const std::vector<float> big = {1000.0f, 1000.0f, 1000.0f + static_cast<float>(std::log(2.0))};
  EXPECT_NEAR(token_nll(big.data(), 3, 0), std::log(4.0), 1e-4);
  const std::vector<float> bad = {0.0f, NAN, 1.0f};
  expect_error([&] { token_nll(bad.data(), 3, 0); }, "not finite");
  expect_error([&] { token_nll(l.data(), 3, 3); }, "out of range");
}

TEST(PerplexityMath, PplAndStderrAsLlamaPerplexity) {
  // Hand series: mean and its standard error computed two-pass here.
  const std::vector<double> nll = {1.5, 2.25, 0.5, 3.0, 1.75};
  MeanAccumulator acc;
  for (double x : nll) acc.add(x);
  const double n = 5, mean = 9.0 / 5;  // 1.8
  double ss = 0;
  for (double x : nll) ss += (x - mean) * (x - mean);
  const double var_pop = ss / n;
  const double se = std::sqrt(var_pop / (n - 1));
  EXPECT_NEAR(acc.mean(), mean, 1e-12);
  EXPECT_NEAR(acc.stderr_of_mean(), se, 1e-12);
  EXPECT_NEAR(ppl_from(acc), std::exp(1.8), 1e-9);
  EXPECT_NEAR(ppl_stderr_from(acc), std::exp(1.8) * se, 1e-9);
  MeanAccumulator one;
  one.add(2.0);
  EXPECT_EQ(one.stderr_of_mean(), 0.0);
}

TEST(PerplexityMath, SortedPercentileInterpolates) {
  const std::vector<float> v = {1, 2, 3, 4, 5};
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 0.5), 3.0);
  EXPECT_NEAR(sorted_percentile(v, 0.99), 4.96, 1e-6);  // 0.99 * 4 = 3.96: 4 + 0.96
  EXPECT_DOUBLE_EQ(sorted_percentile(v, 1.0), 5.0);
}

TEST(PerplexityMath, KldOnHandComputedDistributions) {
  KldAccumulator acc;
  // Position 1: base p = (1/2, 1/2), model q = (3/4, 1/4), target 1.
  // KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3); nll = ln 4, base nll = ln 2.
  const double base1[2] = {std::log(0.5), std::log(0.5)};
  const std::vector<float> q1 = {static_cast<float>(std::log(3.0)), 0.0f};
  const double k1 = acc.add(base1, std::log(2.0), /*base_top=*/0, q1.data(), 2, 1);
  EXPECT_NEAR(k1, 0.5 * std::log(4.0 / 3.0), 1e-7);
  // Position 2: base p = (0.7, 0.2, 0.1), model logits (1, 2, 0.5), target 0.
  const std::vector<long double> p = {0.7L, 0.2L, 0.1L};
  const std::vector<float> q2 = {1.0f, 2.0f, 0.5f};
  const std::vector<long double> lq = log_softmax_ref(q2);
  long double kl2 = 0;
  for (int i = 0; i < 3; ++i) kl2 += p[i] * (std::log(p[i]) - lq[i]);
  const double base2[3] = {std::log(0.7), std::log(0.2), std::log(0.1)};
  const double k2 = acc.add(base2, -std::log(0.7), /*base_top=*/0, q2.data(), 3, 0);
  EXPECT_NEAR(k2, static_cast<double>(kl2), 1e-7);
  // Position 3: the same distribution: KL 0, same top.
  const std::vector<float> q3 = {0.0f, static_cast<float>(std::log(4.0)), 0.0f};  // (1/6, 4/6, 1/6)
  const double base3[3] = {std::log(1.0 / 6), std::log(4.0 / 6), std::log(1.0 / 6)};
  EXPECT_NEAR(acc.add(base3, -std::log(1.0 / 6), 1, q3.data(), 3, 2), 0.0, 1e-7);

  const KldSummary s = acc.summary();
  EXPECT_EQ(s.count, 3);
  const double kls[3] = {0.5 * std::log(4.0 / 3.0), static_cast<double>(kl2), 0.0};
  EXPECT_NEAR(s.kld_mean, (kls[0] + kls[1] + kls[2]) / 3, 1e-7);
  EXPECT_NEAR(s.kld_max, std::max(kls[0], kls[1]), 1e-7);
  EXPECT_NEAR(s.kld_min, 0.0, 1e-7);
  // Positions 1 and 3 agree on the top token; 2 does not (base 0, model 1).
  EXPECT_NEAR(s.same_top, 2.0 / 3.0, 1e-12);
  const double nll[3] = {std::log(4.0), static_cast<double>(-lq[0]), -std::log(1.0 / 6)};
  const double nll_base[3] = {std::log(2.0), -std::log(0.7), -std::log(1.0 / 6)};
  const double mean_nll = (nll[0] + nll[1] + nll[2]) / 3, mean_base = (nll_base[0] + nll_base[1] + nll_base[2]) / 3;
  EXPECT_NEAR(s.ppl, std::exp(mean_nll), 1e-6);
  EXPECT_NEAR(s.ppl_base, std::exp(mean_base), 1e-6);
  EXPECT_NEAR(s.ppl_ratio, std::exp(mean_nll - mean_base), 1e-6);
}

TEST(PerplexityMath, StoredLogProbsRoundTrip) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int nv = 3001;  // odd, like a file that needs the pad entry
  std::vector<float> logits(nv);
  for (auto& x : logits) x = nd(rng);
  logits[17] = -500.0f;  // far below the clamp floor
  const int target = 1234;
  LogProbRecord rec;
  encode_log_probs(logits.data(), nv, target, &rec);
  const std::vector<long double> exact = log_softmax_ref(logits);
  std::vector<double> dec(nv);
  decode_log_probs(rec, dec.data());
  int top = 0;
  for (int i = 1; i < nv; ++i)
    if (logits[i] > logits[top]) top = i;
  EXPECT_EQ(rec.top, top);
  EXPECT_NEAR(rec.nll, static_cast<double>(-exact[target]), 1e-5);
  // Each stored log-prob is within a step of the exact one (rounding plus
  // the small renormalisation shift), except the clamped one.
  const double floor_lp = static_cast<double>(exact[top]) - kLogProbRange;
  double kl = 0;
  for (int i = 0; i < nv; ++i) {
    if (exact[i] >= floor_lp) EXPECT_NEAR(dec[i], static_cast<double>(exact[i]), rec.scale) << i;
    else EXPECT_LE(dec[i], floor_lp + rec.scale) << i;
    kl += std::exp(dec[i]) * (dec[i] - static_cast<double>(exact[i]));
  }
  // KL(stored || exact): second order in the rounding error.
  EXPECT_GE(kl, -1e-12);
  EXPECT_LT(kl, 1e-7);
}

// ---------------------------------------------------------------- plan

TEST(PerplexityPlan, ReferenceAndLlamaChunking) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/eval.txt"));
  auto tok = Tokenizer::from_model_file(shared_model("stories260K-tok512.model"));
  const std::string text = eval_text().substr(0, 2000);
  const std::vector<int> ids = tok->encode(text, false);
  PerplexityOptions o;
  o.n_ctx = 64;
  const PerplexityPlan ref = plan_perplexity(*tok, text, o);
  EXPECT_EQ(ref.tokens, ids);
  const int64_t n_full = static_cast<int64_t>(ids.size()) / 64, tail = static_cast<int64_t>(ids.size()) % 64;
  ASSERT_EQ(ref.chunks.size(), static_cast<size_t>(n_full + (tail >= 2 ? 1 : 0)));
  int64_t scored = 0;
  for (size_t c = 0; c < ref.chunks.size(); ++c) {
    EXPECT_EQ(ref.chunks[c].start, static_cast<int64_t>(c) * 64);
    EXPECT_EQ(ref.chunks[c].first, 0);
    EXPECT_EQ(ref.chunk_tokens(c), std::vector<int>(ids.begin() + ref.chunks[c].start,
                                                     ids.begin() + ref.chunks[c].start + ref.chunks[c].n));
    scored += ref.chunks[c].n - 1;
  }
  EXPECT_EQ(ref.n_scored(), scored);
  EXPECT_EQ(ref.n_scored(), static_cast<int64_t>(ids.size()) - static_cast<int64_t>(ref.chunks.size()));

  o.n_chunks = 3;
  EXPECT_EQ(plan_perplexity(*tok, text, o).n_scored(), 3 * 63);

  o.n_chunks = -1;
  o.mode = PplMode::Llama;
  const PerplexityPlan ll = plan_perplexity(*tok, text, o);
  const std::vector<int> with_bos = tok->encode(text, true);
  EXPECT_EQ(ll.tokens, with_bos);
  ASSERT_EQ(ll.chunks.size(), with_bos.size() / 64);
  for (size_t c = 0; c < ll.chunks.size(); ++c) {
    const std::vector<int> t = ll.chunk_tokens(c);
    EXPECT_EQ(t[0], tok->bos());
    EXPECT_EQ(t[1], with_bos[c * 64 + 1]);
    EXPECT_EQ(ll.chunks[c].first, 32);
    EXPECT_EQ(ll.chunks[c].n_scored(), 64 - 32 - 1);
  }
}

// Llama mode follows the vocabulary's add_bos as llama-perplexity does: Qwen
// 2's vocabulary adds no BOS, so neither the text nor any chunk starts with
// one (an unconditional BOS moved Qwen perplexities by 0.5-1%).
TEST(PerplexityPlan, LlamaModeAddsBosOnlyWhereTheVocabularyDoes) {
  const std::string qwen = test_asset("vocab/ggml-vocab-qwen2.gguf");
  RUNLM_REQUIRE_ASSET(qwen);
  auto tok = Tokenizer::from_gguf(*GgufFile::open(qwen));
  ASSERT_FALSE(tok->add_bos());
  std::string text;
  for (int i = 0; i < 40; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  PerplexityOptions o;
  o.n_ctx = 32;
  o.mode = PplMode::Llama;
  const PerplexityPlan ll = plan_perplexity(*tok, text, o);
  EXPECT_EQ(ll.tokens, tok->encode(text, false));
  EXPECT_EQ(ll.bos_per_chunk, -1);
  ASSERT_GE(ll.chunks.size(), 2u);
  EXPECT_EQ(ll.chunk_tokens(1)[0], ll.tokens[32]);
}

TEST(PerplexityPlan, CharsCountsCodePoints) {
  EXPECT_EQ(utf8_prefix("h\xC3\xA9llo", 2), "h\xC3\xA9");
  EXPECT_EQ(utf8_prefix("\xE2\x82\xAC\xE2\x82\xAC", 1), "\xE2\x82\xAC");
  EXPECT_EQ(utf8_prefix("abc", 0), "abc");
  EXPECT_EQ(utf8_prefix("abc", 10), "abc");
}

TEST(PerplexityPlan, ShortTextAndBadOptionsAreErrors) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/eval.txt"));
  auto tok = Tokenizer::from_model_file(shared_model("stories260K-tok512.model"));
  PerplexityOptions o;
  o.n_ctx = 512;
  expect_error([&] { plan_perplexity(*tok, "Only a few words.", o); }, "shorter than one chunk");
  expect_error([&] { plan_perplexity(*tok, "", o); }, "shorter than one chunk");
  o.n_ctx = 1;
  expect_error([&] { plan_perplexity(*tok, eval_text(), o); }, "-c must be at least 2");
  o.n_ctx = 64;
  o.n_chunks = 0;
  expect_error([&] { plan_perplexity(*tok, eval_text(), o); }, "--chunks");
  expect_error([] { ppl_mode_from_name("hf"); }, "'hf'");
}

// ---------------------------------------------------------------- sotu29m

namespace {

class PerplexitySotu29m : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!missing_asset(shared_model("sotu29m/reference.json")).empty()) return;  // each test skips in SetUp
    gguf_ = new TempPath(".gguf");
    convert_hf(shared_model("sotu29m"), gguf_->str());  // bf16, the checkpoint's type
    reference_ = new nlohmann::json(nlohmann::json::parse(read_file(shared_model("sotu29m/reference.json"))));
  }
  void SetUp() override { RUNLM_REQUIRE_ASSET(shared_model("sotu29m/reference.json")); }
  static void TearDownTestSuite() {
    delete gguf_;
    delete reference_;
  }
  static std::unique_ptr<Engine> engine(const Model& m, int n_ctx) {
    EngineOptions eo;
    eo.device = Device::Cpu;
    eo.n_threads = 2;
    eo.n_ctx = n_ctx;
    return make_cpu_engine(m, eo);
  }
  static TempPath* gguf_;
  static nlohmann::json* reference_;
};
TempPath* PerplexitySotu29m::gguf_ = nullptr;
nlohmann::json* PerplexitySotu29m::reference_ = nullptr;

}  // namespace

// reference.json: "val.txt first 20000 chars, sentencepiece ids without BOS,
// non-overlapping chunks of 512 tokens, each chunk scored on its own (first
// token of each chunk not predicted)", computed by transformers in float32.
TEST_F(PerplexitySotu29m, ReproducesReferencePerplexity) {
  const auto& ref = (*reference_)["perplexity"];
  ASSERT_EQ(ref["text"].get<std::string>(), "eval.txt");
  auto model = Model::load(gguf_->str());
  PerplexityOptions o;
  o.n_ctx = 512;
  o.n_chars = 20000;
  const PerplexityPlan plan = plan_perplexity(model->tokenizer(), eval_text(), o);
  EXPECT_EQ(plan.n_scored(), ref["n_tokens_scored"].get<int64_t>());
  auto eng = engine(*model, 512);
  const PerplexityResult r = run_perplexity(*eng, model->config().n_vocab, plan, "", "");
  const double want = ref["ppl"].get<double>();
  EXPECT_EQ(r.n_scored, ref["n_tokens_scored"].get<int64_t>());
  EXPECT_NEAR(r.ppl, want, 0.005 * want);
  EXPECT_GT(r.ppl_stderr, 0.0);
  EXPECT_LT(r.ppl_stderr, 0.1 * r.ppl);
  ASSERT_EQ(r.chunk_ppl.size(), plan.chunks.size());
  EXPECT_NEAR(r.running_ppl.back(), r.ppl, 1e-9 * r.ppl);
  std::printf("sotu29m reference-mode perplexity %.4f +/- %.4f over %lld tokens (reference %.4f) in %.2f s\n", r.ppl,
              r.ppl_stderr, static_cast<long long>(r.n_scored), want, r.seconds);
}

// A model against its own saved log-probs: KLD 0 (up to the second-order
// effect of the stored rounding, < 1e-7), same top token everywhere, PPL
// ratio 1. Its q8_0 copy: small, positive KLD and nearly the same PPL.
TEST_F(PerplexitySotu29m, KldAgainstSelfAndQ8_0) {
  auto model = Model::load(gguf_->str());
  PerplexityOptions o;
  o.n_ctx = 512;
  o.n_chunks = 2;
  const PerplexityPlan plan = plan_perplexity(model->tokenizer(), eval_text(), o);
  const int nv = model->config().n_vocab;
  TempPath base(".logits");
  const PerplexityResult r0 = [&] {
    auto eng = engine(*model, 512);
    return run_perplexity(*eng, nv, plan, base.str(), "");
  }();
  EXPECT_EQ(r0.n_scored, 2 * 511);
  EXPECT_FALSE(r0.kld.has_value());

  {
    auto eng = engine(*model, 512);
    const PerplexityResult r = run_perplexity(*eng, nv, plan, "", base.str());
    ASSERT_TRUE(r.kld.has_value());
    const KldSummary& k = *r.kld;
    EXPECT_EQ(k.count, 2 * 511);
    EXPECT_GE(k.kld_min, -1e-12);
    EXPECT_LT(k.kld_mean, 1e-7);
    EXPECT_LT(k.kld_max, 1e-6);
    EXPECT_EQ(k.same_top, 1.0);
    EXPECT_NEAR(k.ppl_ratio, 1.0, 1e-6);
    EXPECT_NEAR(k.ppl, r0.ppl, 1e-9 * r0.ppl);
    EXPECT_NEAR(k.ppl_base, r0.ppl, 1e-5 * r0.ppl);  // base NLLs were stored as float
  }

  TempPath q8(".gguf");
  quantize_gguf(gguf_->str(), q8.str(), "q8_0", {2});
  auto model_q8 = Model::load(q8.str());
  auto eng = engine(*model_q8, 512);
  const PerplexityResult r = run_perplexity(*eng, nv, plan, "", base.str());
  ASSERT_TRUE(r.kld.has_value());
  const KldSummary& k = *r.kld;
  std::printf("sotu29m q8_0 vs bf16: PPL %.4f vs %.4f (ratio %.5f +/- %.5f), mean KLD %.6f +/- %.6f, max %.6f, "
              "p99 %.6f, same top %.2f%%\n",
              k.ppl, k.ppl_base, k.ppl_ratio, k.ppl_ratio_stderr, k.kld_mean, k.kld_stderr, k.kld_max, k.kld_p99,
              100 * k.same_top);
  EXPECT_GT(k.kld_mean, 1e-6);  // q8_0 does change the weights
  EXPECT_LT(k.kld_mean, 5e-3);
  EXPECT_GT(k.kld_mean, 2 * k.kld_stderr);
  EXPECT_GE(k.kld_p99, k.kld_median);
  EXPECT_GE(k.kld_max, k.kld_p99);
  EXPECT_GT(k.same_top, 0.9);
  EXPECT_LT(k.same_top, 1.0 + 1e-12);
  EXPECT_NEAR(k.ppl_ratio, 1.0, 0.02);
  EXPECT_NEAR(k.ppl_base, r0.ppl, 1e-5 * r0.ppl);
}

// ---------------------------------------------------------------- command

namespace {

class PerplexityCli : public ::testing::Test {
 protected:
  static std::string model() { return shared_model("stories260K.gguf"); }
  static std::string cmd(const std::string& text, const std::string& extra, const std::string& m = model()) {
    return runlm_binary() + " perplexity -m " + m + " -f " + text + " -t 2 " + extra;
  }
  void SetUp() override {
    RUNLM_REQUIRE_ASSET(shared_model("sotu29m/eval.txt"));
    const std::string t = eval_text();
    write_file(text_a_.str(), t.substr(0, 6000));
    write_file(text_b_.str(), t.substr(100000, 6000));
  }
  TempPath text_a_{".txt"}, text_b_{".txt"};
};

}  // namespace

TEST_F(PerplexityCli, SaveThenCompareEndToEnd) {
  TempPath base(".logits");
  const CommandResult save =
      run_command(cmd(text_a_.str(), "-c 128 --ppl-mode reference --per-chunk --save-logits " + base.str()));
  ASSERT_EQ(save.exit_code, 0) << save.err;
  const double ppl = number_after(save.out, "Final estimate: PPL = ");
  EXPECT_TRUE(std::isfinite(ppl) && ppl > 1.0) << save.out;
  EXPECT_NE(save.out.find("chunk 1: ppl "), std::string::npos) << save.out;
  EXPECT_NE(save.out.find("reference mode"), std::string::npos) << save.out;
  const CommandResult cmp = run_command(cmd(text_a_.str(), "-c 128 --ppl-mode reference --kl-base " + base.str()));
  ASSERT_EQ(cmp.exit_code, 0) << cmp.err;
  EXPECT_EQ(number_after(cmp.out, "Final estimate: PPL = "), ppl) << cmp.out;
  EXPECT_LT(std::fabs(number_after(cmp.out, "Mean KLD             : ")), 1e-6) << cmp.out;
  EXPECT_NEAR(number_after(cmp.out, "Same top token       : "), 100.0, 1e-9) << cmp.out;
  EXPECT_NEAR(number_after(cmp.out, "PPL(Q)/PPL(base)     : "), 1.0, 1e-5) << cmp.out;

  const CommandResult ll = run_command(cmd(text_a_.str(), "-c 128 --ppl-mode llama"));
  ASSERT_EQ(ll.exit_code, 0) << ll.err;
  EXPECT_NE(ll.out.find("llama mode"), std::string::npos) << ll.out;
  EXPECT_TRUE(std::isfinite(number_after(ll.out, "Final estimate: PPL = "))) << ll.out;
  // llama-perplexity's method is the default: the same numbers without the flag.
  const CommandResult def = run_command(cmd(text_a_.str(), "-c 128"));
  ASSERT_EQ(def.exit_code, 0) << def.err;
  EXPECT_EQ(def.out, ll.out);
}

// The output lines llama-perplexity prints: "[1]x,[2]y,..." with the running
// perplexity after each chunk, then "Final estimate: PPL = X +/- Y" with its
// uncertainty ppl * sqrt(var(nll) / (n - 1)); the last running value is the
// final estimate.
TEST_F(PerplexityCli, OutputAsLlamaPerplexityPrintsIt) {
  const CommandResult r = run_command(cmd(text_a_.str(), "-c 128 --per-chunk"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t line_end = r.out.find('\n');
  ASSERT_NE(line_end, std::string::npos) << r.out;
  const std::string stream = r.out.substr(0, line_end);
  int n_chunks = 0;
  double last = 0;
  for (size_t at = 0; at < stream.size();) {
    const std::string head = "[" + std::to_string(n_chunks + 1) + "]";
    ASSERT_EQ(stream.compare(at, head.size(), head), 0) << stream;
    const size_t comma = stream.find(',', at);
    ASSERT_NE(comma, std::string::npos) << stream;
    last = std::stod(stream.substr(at + head.size(), comma - at - head.size()));
    ++n_chunks;
    at = comma + 1;
  }
  EXPECT_GE(n_chunks, 2) << stream;
  EXPECT_NE(r.out.find("chunk " + std::to_string(n_chunks) + ": ppl "), std::string::npos) << r.out;
  const double ppl = number_after(r.out, "Final estimate: PPL = ");
  EXPECT_NEAR(ppl, last, 1e-4) << r.out;
  const size_t pm = r.out.find(" +/- ", r.out.find("Final estimate: PPL = "));
  ASSERT_NE(pm, std::string::npos) << r.out;
  const double err = std::stod(r.out.substr(pm + 5));
  EXPECT_GT(err, 0) << r.out;
  EXPECT_LT(err, ppl) << r.out;
  EXPECT_NE(r.err.find("seconds per pass - ETA"), std::string::npos) << r.err;
}

TEST_F(PerplexityCli, MissingOrShortText) {
  expect_clean_error(run_command(cmd("/nonexistent/text.txt", "")), "/nonexistent/text.txt");
  expect_clean_error(run_command(runlm_binary() + " perplexity -m " + model()), "-f");
  TempPath tiny(".txt");
  write_file(tiny.str(), "A short text.");
  expect_clean_error(run_command(cmd(tiny.str(), "-c 128")), "shorter than one chunk");
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 128 --chars 40")), "shorter than one chunk");
  expect_clean_error(run_command(cmd(text_a_.str(), "--ppl-mode hf")), "--ppl-mode");
}

TEST_F(PerplexityCli, MismatchedBaseIsAnError) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/config.json"));
  TempPath base(".logits");
  ASSERT_EQ(run_command(cmd(text_a_.str(), "-c 128 --save-logits " + base.str())).exit_code, 0);
  expect_clean_error(run_command(cmd(text_b_.str(), "-c 128 --kl-base " + base.str())), "another text");
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 64 --kl-base " + base.str())), "chunks of 128 tokens");
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 128 --ppl-mode reference --kl-base " + base.str())),
                     "scoring mode");
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 128 --chunks 2 --kl-base " + base.str())), "chunks");
  // Another vocabulary: a model with 8192 tokens against stories260K's 512.
  TempPath sotu(".gguf");
  convert_hf(shared_model("sotu29m"), sotu.str());
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 128 --kl-base " + base.str(), sotu.str())), "vocabulary");
  expect_clean_error(run_command(cmd(text_a_.str(), "-c 128 --kl-base /nonexistent/base.logits")),
                     "/nonexistent/base.logits");
}

TEST_F(PerplexityCli, CorruptBaseIsAnError) {
  TempPath base(".logits");
  ASSERT_EQ(run_command(cmd(text_a_.str(), "-c 128 --save-logits " + base.str())).exit_code, 0);
  const std::string good = read_file(base.str());
  ASSERT_GT(good.size(), 1000u);
  TempPath bad(".logits");
  const std::string run = "-c 128 --kl-base " + bad.str();

  write_file(bad.str(), good.substr(0, good.size() - 100));
  expect_clean_error(run_command(cmd(text_a_.str(), run)), "truncated");
  write_file(bad.str(), good.substr(0, 20));
  expect_clean_error(run_command(cmd(text_a_.str(), run)), "header");
  std::string s = good;
  s[0] = 'X';
  write_file(bad.str(), s);
  expect_clean_error(run_command(cmd(text_a_.str(), run)), "magic");
  s = good;
  s[8] = 9;  // version
  write_file(bad.str(), s);
  expect_clean_error(run_command(cmd(text_a_.str(), run)), "version");
  // A huge record count: the implied size overflows or disagrees.
  s = good;
  for (int i = 0; i < 8; ++i) s[48 + i] = static_cast<char>(0xFF);
  write_file(bad.str(), s);
  expect_clean_error(run_command(cmd(text_a_.str(), run)), "corrupt");
  // The first record's scale becomes NaN: named as a corrupt record.
  {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(good.data());
    uint64_t n_tokens;
    std::memcpy(&n_tokens, p + 40, 8);
    s = good;
    const size_t rec0 = 56 + 4 * n_tokens;
    const float nan = NAN;
    std::memcpy(&s[rec0], &nan, 4);
    write_file(bad.str(), s);
    expect_clean_error(run_command(cmd(text_a_.str(), run)), "record 0");
  }
}
