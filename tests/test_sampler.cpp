#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "common.h"
#include "sampler.h"

using namespace runlm;

namespace {
std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}
SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}
}  // namespace

TEST(Sampler, GreedyTakesTheFirstLargestLogit) {
  auto logits = random_logits(1000, 1);
  const int best = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Sampler s(greedy());
  EXPECT_EQ(s.sample(logits.data(), 1000), best);
  std::vector<float> tie = {1.0f, 5.0f, 2.0f, 5.0f};
  EXPECT_EQ(s.sample(tie.data(), 4), 1);
}

TEST(Sampler, RepetitionPenaltyMovesGreedyAway) {
  std::vector<float> logits = {1.0f, 3.0f, 2.5f, -1.0f};
  SamplingParams p = greedy();
  p.repeat_penalty = 1.5f;  // 3.0 / 1.5 = 2.0 < 2.5
  Sampler s(p);
  s.accept(1);
  EXPECT_EQ(s.sample(logits.data(), 4), 2);
  s.reset();
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
}

TEST(Sampler, TopKTopPMinPKeepTheRightCandidates) {
  std::vector<TokenCandidate> c;
  const float probs[] = {0.5f, 0.2f, 0.15f, 0.1f, 0.05f};
  for (int i = 0; i < 5; ++i) c.push_back({4 - i, std::log(probs[i]), 0});
  auto k = make_top_k(3);
  auto c1 = c;
  k->apply(c1);
  ASSERT_EQ(c1.size(), 3u);
  EXPECT_EQ(c1[0].id, 4);
  EXPECT_EQ(c1[2].id, 2);

  auto c2 = c;
  make_top_p(0.8f)->apply(c2);  // 0.5 + 0.2 = 0.7 < 0.8, + 0.15 reaches it
  EXPECT_EQ(c2.size(), 3u);

  auto c3 = c;
  make_min_p(0.29f)->apply(c3);  // threshold 0.145: keeps 0.5, 0.2, 0.15
  EXPECT_EQ(c3.size(), 3u);
  auto c4 = c;
  make_min_p(0.35f)->apply(c4);
  EXPECT_EQ(c4.size(), 2u);
}

TEST(Sampler, SameSeedSameTokens) {
  auto logits = random_logits(500, 7);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    const int ta = a.sample(logits.data(), 500);
    EXPECT_EQ(ta, b.sample(logits.data(), 500));
    differ += ta != c.sample(logits.data(), 500);
  }
  EXPECT_GT(differ, 50);  // another seed draws another sequence
}

TEST(Sampler, DrawFollowsTheTemperatureScaledDistribution) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 99;
  Sampler s(p);
  std::map<int, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), 4)];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.5);
  for (int i = 0; i < 4; ++i) {
    const double expected = std::exp(logits[i] / 0.5) / z;
    // 5 standard errors of a binomial proportion.
    const double tol = 5 * std::sqrt(expected * (1 - expected) / n) + 1e-4;
    EXPECT_NEAR(counts[i] / static_cast<double>(n), expected, tol) << "token " << i;
  }
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.top_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = SamplingParams{};
  p.repeat_penalty = 0;
  EXPECT_THROW(Sampler{p}, Error);
}

TEST(Sampler, SelectBestEqualsPartialSortWithTies) {
  std::mt19937 gen(5);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(gen() % 3000);
    std::vector<float> logits(n);
    // Few distinct values, so ties are common and the id order decides.
    for (auto& x : logits) x = static_cast<float>(static_cast<int>(gen() % 40)) * 0.25f - 5.0f;
    std::vector<TokenCandidate> all;
    for (int i = 0; i < n; ++i) all.push_back({i, logits[i], 0});
    for (int k : {1, 7, 40, n}) {
      auto ref = all;
      const size_t kk = static_cast<size_t>(std::min(k, n));
      std::partial_sort(ref.begin(), ref.begin() + kk, ref.end(), [](const auto& a, const auto& b) {
        return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
      });
      ref.resize(kk);
      std::vector<TokenCandidate> got;
      select_best(logits.data(), n, k, got);
      ASSERT_EQ(got.size(), ref.size());
      for (size_t i = 0; i < kk; ++i) ASSERT_EQ(got[i].id, ref[i].id) << "n " << n << " k " << k << " rank " << i;
    }
  }
}

// The sampler builds only the candidates it needs (argmax, or the top k on
// the penalised logits); it must draw exactly what the plain pipeline of
// stages over all n_vocab candidates draws, with the same random numbers.
TEST(Sampler, FastPathsDrawWhatTheFullPipelineDraws) {
  for (const float temp : {0.0f, 0.7f}) {
    for (const int top_k : {0, 1, 40}) {
      SamplingParams p;
      p.temperature = temp;
      p.top_k = top_k;
      p.top_p = 0.9f;
      p.min_p = 0.02f;
      p.repeat_penalty = 1.3f;
      p.repeat_last_n = 8;
      p.seed = 42;
      Sampler fast(p);
      auto penalty = make_repetition_penalty(p.repeat_penalty, p.repeat_last_n);
      std::vector<std::unique_ptr<SamplerStage>> rest;
      rest.push_back(make_top_k(p.top_k));
      rest.push_back(make_top_p(p.top_p));
      rest.push_back(make_min_p(p.min_p));
      rest.push_back(make_temperature(p.temperature));
      Rng rng(p.seed);
      for (int step = 0; step < 60; ++step) {
        auto logits = random_logits(3000, 100 + step);
        logits[7] = logits[8];  // a tie
        std::vector<TokenCandidate> c;
        for (int i = 0; i < 3000; ++i) c.push_back({i, logits[i], 0});
        penalty->apply(c);
        int want;
        if (temp <= 0) {
          want = static_cast<int>(std::max_element(c.begin(), c.end(), [](const auto& a, const auto& b) {
                                    return a.logit < b.logit;
                                  }) - c.begin());
        } else {
          for (auto& s : rest) s->apply(c);
          softmax_candidates(c);
          const double r = rng.uniform();
          double cum = 0;
          want = c.back().id;
          for (const auto& x : c) {
            cum += x.p;
            if (r < cum) {
              want = x.id;
              break;
            }
          }
        }
        const int got = fast.sample(logits.data(), 3000);
        ASSERT_EQ(got, want) << "temp " << temp << " top_k " << top_k << " step " << step;
        fast.accept(got);
        penalty->accept(got);
      }
    }
  }
}

TEST(Sampler, PlainArgmaxOnlyWhenGreedyWithNothingToEdit) {
  SamplingParams p = greedy();
  EXPECT_TRUE(Sampler(p).is_plain_argmax());
  p.repeat_penalty = 1.3f;
  Sampler penalised(p);
  EXPECT_TRUE(penalised.is_plain_argmax());  // no history yet: the penalty changes nothing
  penalised.accept(3);
  EXPECT_FALSE(penalised.is_plain_argmax());
  p = SamplingParams{};
  p.temperature = 0.7f;
  EXPECT_FALSE(Sampler(p).is_plain_argmax());
}
