// Token samplers: small stages with one interface (name, apply, accept,
// reset), chained in llama.cpp's order: repetition penalty -> top-k -> top-p
// -> min-p -> temperature -> draw. Temperature <= 0 means greedy (argmax
// after the penalty). The random draw uses a seeded xoshiro256** generator,
// so the same seed gives the same text on every machine.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace runlm {

struct SamplingParams {
  float temperature = 0.8f;
  int top_k = 40;             // <= 0: off
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

struct TokenCandidate {
  int id;
  float logit;
  float p;  // filled by softmax_candidates
};

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1) with 53 random bits
 private:
  uint64_t s_[4];
};

class SamplerStage {
 public:
  virtual ~SamplerStage() = default;
  virtual const char* name() const = 0;
  virtual void apply(std::vector<TokenCandidate>& cands) = 0;
  // A stage that only rewrites single logits (the penalty) can run on the raw
  // logits instead, before any candidate exists: then the sampler builds
  // only the candidates it needs (one argmax, or the top k), not n_vocab of
  // them for every sequence and step.
  virtual bool edits_logits() const { return false; }
  virtual bool idle() const { return false; }  // would change nothing now (penalty 1, no history)
  virtual void apply_to_logits(float* logits, int n_vocab) {}
  // > 0: the stage keeps only the best k candidates (top-k).
  virtual int keeps_best() const { return 0; }
  virtual void accept(int token) {}
  virtual void reset() {}
};

// Sorts by logit (descending) and fills p with the softmax of the logits.
void softmax_candidates(std::vector<TokenCandidate>& cands);
// The first index of the largest of logits[0..n) (NaNs are skipped).
int argmax(const float* logits, int n);
// The k best of logits[0..n) (larger logit first, the smaller id first on a
// tie), sorted: the same as building every candidate and partial_sort-ing
// them, in one pass that touches only the ones that beat the k-th so far.
void select_best(const float* logits, int n, int k, std::vector<TokenCandidate>& out);

std::unique_ptr<SamplerStage> make_repetition_penalty(float penalty, int last_n);
std::unique_ptr<SamplerStage> make_top_k(int k);
std::unique_ptr<SamplerStage> make_top_p(float p);
std::unique_ptr<SamplerStage> make_min_p(float p);
std::unique_ptr<SamplerStage> make_temperature(float t);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from logits [n_vocab].
  int sample(const float* logits, int n_vocab);
  // True when the next sample() is the plain argmax of the logits (greedy,
  // no penalty to apply): a caller may then take the argmax elsewhere (the
  // GPU) and skip sample().
  bool is_plain_argmax() const;
  // Records a token of the context (prompt or generated) for the penalty.
  void accept(int token);
  void reset();
  const SamplingParams& params() const { return params_; }
  std::string describe() const;  // "penalty -> top-k 40 -> ..."

 private:
  SamplingParams params_;
  std::vector<std::unique_ptr<SamplerStage>> stages_;
  Rng rng_;
  std::vector<TokenCandidate> cands_;
  std::vector<float> edited_;  // the logits after edits_logits() stages
};

}  // namespace runlm
