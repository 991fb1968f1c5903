// Perplexity and KL divergence of a model over a text, independent of the
// CLI: the chunk plan (which tokens are evaluated and which are scored), the
// accumulation math (NLL in double, llama-perplexity's uncertainties), the
// logits file that --save-logits writes and --kl-base reads, and the run
// over an Engine (any backend, any KV-cache type: the engine is built by the
// caller, so KV options only change how the caller builds it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace runlm {

class Engine;
class Tokenizer;

// How a text is chunked and scored.
//  Reference: the text's tokens without BOS, cut into non-overlapping chunks
//    of n_ctx tokens (the last chunk may be shorter); each chunk is evaluated
//    on its own from position 0 and every token but its first is scored
//    (sotu29m reference.json's definition; what a Hugging Face
//    loss-over-windows evaluation computes).
//  Llama: llama-perplexity's method: the text's tokens with BOS in front,
//    full chunks of n_ctx only, the first token of each chunk replaced by
//    BOS, and only the second half of each chunk scored (tokens
//    n_ctx/2+1 .. n_ctx-1), so every scored token has at least n_ctx/2 tokens
//    of context.
enum class PplMode { Reference, Llama };
PplMode ppl_mode_from_name(const std::string& name);  // "reference" or "llama"; Error otherwise
const char* ppl_mode_name(PplMode mode);

struct PerplexityOptions {
  int n_ctx = 512;       // chunk size in tokens (-c)
  int n_chunks = -1;     // chunks to score (--chunks); -1 = all
  int64_t n_chars = 0;   // only the first N characters of the text (--chars); 0 = all
  PplMode mode = PplMode::Reference;
};

// One chunk: tokens [start, start + n) of PerplexityPlan::tokens, evaluated
// at positions 0..n-1. The logits at positions first..n-2 are scored: the
// logits at position j predict chunk token j+1.
struct PplChunk {
  int64_t start = 0;
  int n = 0;
  int first = 0;
  int n_scored() const { return n - 1 - first; }
};

struct PerplexityPlan {
  PerplexityOptions options;
  std::vector<int> tokens;       // the (truncated) text's tokens; Llama mode: BOS first where the vocabulary adds one
  std::vector<PplChunk> chunks;
  int bos_per_chunk = -1;        // Llama mode: the BOS id written over each chunk's first token; -1 = none
  int64_t n_text_tokens = 0;     // tokens of the (truncated) text, before --chunks drops any
  int64_t n_tokens_used() const;  // tokens covered by the chunks
  int64_t n_scored() const;
  // The tokens chunk c is evaluated with (BOS substituted in Llama mode).
  std::vector<int> chunk_tokens(size_t c) const;
};

// The first n_chars characters (UTF-8 code points, as Python's text[:n]
// counts them) of text; all of it when n_chars is 0 or larger than the text.
std::string utf8_prefix(const std::string& text, int64_t n_chars);

// Tokenises text and cuts it into chunks. Error when the text has fewer
// tokens than one chunk, or when an option is out of range.
PerplexityPlan plan_perplexity(const Tokenizer& tokenizer, const std::string& text, const PerplexityOptions& options);

// ---- Accumulation math (no model needed) ----

// -log softmax(logits)[token], computed in double. Error when the logits are
// not finite or token is out of range.
double token_nll(const float* logits, int n_vocab, int token);

// Mean of a series and its standard error, accumulated as llama-perplexity
// does (sum and sum of squares in double; uncertainty sqrt(var / (n - 1))).
struct MeanAccumulator {
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  void add(double x) {
    sum += x;
    sum2 += x * x;
    ++count;
  }
  double mean() const { return count > 0 ? sum / static_cast<double>(count) : 0.0; }
  // 0 when count < 2 or the variance rounds to <= 0.
  double stderr_of_mean() const;
};

// exp(mean NLL) and its standard error ppl * sqrt(var(nll) / (n - 1)), the
// "PPL = x +/- y" of llama-perplexity.
double ppl_from(const MeanAccumulator& nll);
double ppl_stderr_from(const MeanAccumulator& nll);

// The stored form of one scored position's distribution (one record of a
// logits file). llama-perplexity's uint16 log-prob quantization, with a
// wider range and two exact extras:
//   q[i] = round((log p_i - min_log_prob) / scale), log p_i clamped below at
//   min_log_prob = max(min log p, max log p - kLogProbRange);
//   nll = exact -log p(target) and top = exact argmax, so the base PPL and
//   the top-1 agreement do not depend on the quantization.
// The dequantization error is at most scale / 2 <= kLogProbRange / 131070
// (3e-4 nats); decode_log_probs renormalises, so the KLD against the stored
// distribution stays >= 0 and that error enters it only at second order
// (about 1e-8 nats for a model against its own logits).
constexpr float kLogProbRange = 40.0f;
struct LogProbRecord {
  float scale = 0;         // nats per step
  float min_log_prob = 0;  // log-prob of q == 0
  float nll = 0;           // -log p(target), exact (float)
  int32_t top = 0;         // argmax
  std::vector<uint16_t> q; // [n_vocab]
};
void encode_log_probs(const float* logits, int n_vocab, int target, LogProbRecord* rec);
// Normalised log-probs [n_vocab] of the stored distribution.
void decode_log_probs(const LogProbRecord& rec, double* log_probs);

// KL divergence statistics of a model's distributions against base ones,
// llama-perplexity --kl-divergence style.
struct KldSummary {
  int64_t count = 0;
  double kld_mean = 0, kld_stderr = 0, kld_max = 0, kld_p99 = 0, kld_median = 0, kld_min = 0;
  double same_top = 0, same_top_stderr = 0;  // fraction of positions with the same argmax
  double ppl = 0, ppl_stderr = 0;            // this run (over the same positions)
  double ppl_base = 0, ppl_base_stderr = 0;  // the base run's
  double ln_ppl_ratio = 0, ln_ppl_ratio_stderr = 0;  // mean ln(PPL/PPL_base), with covariance
  double ppl_ratio = 0, ppl_ratio_stderr = 0;        // PPL / PPL_base
  double ppl_correlation = 0;                        // Cor(ln PPL, ln PPL_base)
};

class KldAccumulator {
 public:
  // One position: base_log_probs [n_vocab] (normalised), base_nll and
  // base_top as stored, this model's logits [n_vocab] and the target token.
  // Returns this position's KL(base || model).
  double add(const double* base_log_probs, double base_nll, int base_top, const float* logits, int n_vocab,
             int target);
  KldSummary summary() const;
  int64_t count() const { return nll_.count; }

 private:
  MeanAccumulator kld_, nll_, nll_base_;
  double sum_nll_nll_base_ = 0;
  int64_t n_same_top_ = 0;
  std::vector<float> kld_values_;  // for the percentiles
};

// Linear-interpolated percentile (fraction in [0, 1]) of sorted values, as
// llama-perplexity computes its KLD percentiles.
double sorted_percentile(const std::vector<float>& sorted, double fraction);

// ---- Logits files (--save-logits / --kl-base) ----
//
// Little-endian binary:
//   char[8] "RLMLOGIT"; u32 version (1); u32 n_vocab; u32 n_ctx; u32 mode
//   (0 reference, 1 llama); u32 n_chunks; u32 reserved (0); u64 n_chars;
//   u64 n_tokens; u64 n_scored;
//   i32 tokens[n_tokens]    the chunks' tokens, to prove the same text
//   n_scored records of: f32 scale; f32 min_log_prob; f32 nll; i32 top;
//                        u16 q[n_vocab]; u16 pad when n_vocab is odd
// About 2 bytes per vocabulary entry per scored token: half of f32 logits,
// as llama.cpp's own file.
class LogitsFileWriter {
 public:
  // Writes to path + ".tmp", renamed to path by finish(), so an interrupted
  // run leaves no file that looks complete.
  LogitsFileWriter(const std::string& path, const PerplexityPlan& plan, int n_vocab);
  ~LogitsFileWriter();
  void write(const LogProbRecord& rec);
  void finish();

 private:
  std::string path_;
  FILE* f_ = nullptr;
  int n_vocab_ = 0;
  int64_t n_expected_ = 0, n_written_ = 0;
};

class LogitsFileReader {
 public:
  // Opens and validates the header against this run: Error naming the
  // mismatch (vocabulary size, chunk size, scoring mode, number of chunks,
  // text) or the corruption (magic, version, size).
  LogitsFileReader(const std::string& path, const PerplexityPlan& plan, int n_vocab);
  ~LogitsFileReader();
  // The next record; Error when it is corrupt (names the record).
  void read(LogProbRecord* rec);

 private:
  std::string path_;
  FILE* f_ = nullptr;
  int n_vocab_ = 0;
  int64_t n_records_ = 0, n_read_ = 0;
};

// ---- The run ----

struct PerplexityResult {
  double ppl = 0, ppl_stderr = 0;
  int64_t n_scored = 0;
  std::vector<double> chunk_ppl;       // each chunk's own perplexity
  std::vector<double> running_ppl;     // perplexity over chunks 0..c
  std::optional<KldSummary> kld;       // with a kl_base file
  double seconds = 0;
};

struct PerplexityProgress {
  int chunk = 0;         // chunks done (1-based)
  int n_chunks = 0;
  double running_ppl = 0;
  double seconds = 0;    // elapsed
};

// Evaluates every chunk of the plan with the engine (whose n_ctx must hold a
// chunk). save_logits_path / kl_base_path may be empty. on_chunk, when set,
// is called after each chunk.
PerplexityResult run_perplexity(Engine& engine, int n_vocab, const PerplexityPlan& plan,
                                const std::string& save_logits_path, const std::string& kl_base_path,
                                const std::function<void(const PerplexityProgress&)>& on_chunk = nullptr);

}  // namespace runlm
