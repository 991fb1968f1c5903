// Perplexity and KL divergence over a text: chunk plan, accumulation math,
// logits files and the run over an Engine. See perplexity.h for the two
// scoring modes and the file format.
#include "perplexity.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common.h"
#include "engine.h"
#include "tokenizer.h"

namespace runlm {

static_assert(std::endian::native == std::endian::little, "logits files are written in host order: little-endian only");

PplMode ppl_mode_from_name(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "reference") return PplMode::Reference;
  if (s == "llama") return PplMode::Llama;
  fail("unknown perplexity mode '%s' (--ppl-mode): use reference or llama", name.c_str());
}

const char* ppl_mode_name(PplMode mode) { return mode == PplMode::Llama ? "llama" : "reference"; }

// ---------------------------------------------------------------- plan

int64_t PerplexityPlan::n_tokens_used() const {
  return chunks.empty() ? 0 : chunks.back().start + chunks.back().n;
}

int64_t PerplexityPlan::n_scored() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.n_scored();
  return n;
}

std::vector<int> PerplexityPlan::chunk_tokens(size_t c) const {
  const PplChunk& ch = chunks.at(c);
  std::vector<int> t(tokens.begin() + ch.start, tokens.begin() + ch.start + ch.n);
  if (bos_per_chunk >= 0) t[0] = bos_per_chunk;
  return t;
}

std::string utf8_prefix(const std::string& text, int64_t n_chars) {
  if (n_chars <= 0) return text;
  int64_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    // A code point starts at every byte that is not a continuation byte
    // (10xxxxxx); cut before the (n_chars + 1)-th start.
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      if (seen == n_chars) return text.substr(0, i);
      ++seen;
    }
  }
  return text;
}

PerplexityPlan plan_perplexity(const Tokenizer& tokenizer, const std::string& text, const PerplexityOptions& options) {
  const bool llama = options.mode == PplMode::Llama;
  // Reference mode scores n_ctx - 1 tokens of a chunk, llama mode
  // n_ctx - n_ctx/2 - 1: each needs at least one.
  const int min_ctx = llama ? 3 : 2;
  RUNLM_CHECK(options.n_ctx >= min_ctx, "-c must be at least %d in %s mode, got %d", min_ctx,
              ppl_mode_name(options.mode), options.n_ctx);
  RUNLM_CHECK(options.n_chunks == -1 || options.n_chunks > 0, "--chunks must be positive (or -1 for all), got %d",
              options.n_chunks);
  RUNLM_CHECK(options.n_chars >= 0, "--chars must be >= 0 (0 = all), got %lld",
              static_cast<long long>(options.n_chars));

  PerplexityPlan plan;
  plan.options = options;
  const std::string used = utf8_prefix(text, options.n_chars);
  // Llama mode, as llama-perplexity: BOS before the text and over each
  // chunk's first token only where the vocabulary adds one (Qwen's does not).
  const bool bos = llama && tokenizer.add_bos() && tokenizer.bos() >= 0;
  plan.tokens = tokenizer.encode(used, bos);
  plan.n_text_tokens = static_cast<int64_t>(plan.tokens.size());
  const int64_t n_ctx = options.n_ctx;
  RUNLM_CHECK(plan.n_text_tokens >= n_ctx,
              "the text is %lld tokens (%zu bytes%s), shorter than one chunk of %d tokens: use a longer text or a "
              "smaller -c",
              static_cast<long long>(plan.n_text_tokens), used.size(), options.n_chars > 0 ? " after --chars" : "",
              options.n_ctx);

  const int64_t n_full = plan.n_text_tokens / n_ctx;
  for (int64_t i = 0; i < n_full; ++i)
    plan.chunks.push_back(PplChunk{i * n_ctx, options.n_ctx, llama ? options.n_ctx / 2 : 0});
  // Reference mode also scores the tail (as a loss over the whole text
  // would); a tail of one token predicts nothing. llama-perplexity drops it.
  const int tail = static_cast<int>(plan.n_text_tokens - n_full * n_ctx);
  if (!llama && tail >= 2) plan.chunks.push_back(PplChunk{n_full * n_ctx, tail, 0});
  if (options.n_chunks > 0 && plan.chunks.size() > static_cast<size_t>(options.n_chunks))
    plan.chunks.resize(static_cast<size_t>(options.n_chunks));
  if (bos) plan.bos_per_chunk = tokenizer.bos();
  return plan;
}

// ---------------------------------------------------------------- math

namespace {

struct SoftmaxStats {
  float max = 0;
  int argmax = 0;
  float min = 0;
  double log_sum_exp = 0;  // log sum exp(logits), max included
};

// One pass for max/argmax/min, one for the sum; double sum because 32000
// small terms in float lose the low bits that NLL differences live in.
SoftmaxStats softmax_stats(const float* logits, int n_vocab) {
  SoftmaxStats s;
  s.max = logits[0];
  s.min = logits[0];
  bool finite = std::isfinite(logits[0]);
  for (int i = 1; i < n_vocab; ++i) {
    const float x = logits[i];
    finite = finite && std::isfinite(x);
    if (x > s.max) {  // strict: the first of equal maxima, like llama-perplexity
      s.max = x;
      s.argmax = i;
    }
    s.min = std::min(s.min, x);
  }
  RUNLM_CHECK(finite, "logits are not finite (NaN or Inf)");
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - s.max);
  s.log_sum_exp = s.max + std::log(sum);
  return s;
}

}  // namespace

double token_nll(const float* logits, int n_vocab, int token) {
  RUNLM_CHECK(n_vocab > 0 && token >= 0 && token < n_vocab, "token %d out of range [0, %d)", token, n_vocab);
  const SoftmaxStats s = softmax_stats(logits, n_vocab);
  return s.log_sum_exp - logits[token];
}

double MeanAccumulator::stderr_of_mean() const {
  if (count < 2) return 0.0;
  const double n = static_cast<double>(count);
  const double m = sum / n;
  const double var = sum2 / n - m * m;
  return var > 0 ? std::sqrt(var / (n - 1)) : 0.0;
}

double ppl_from(const MeanAccumulator& nll) { return std::exp(nll.mean()); }
double ppl_stderr_from(const MeanAccumulator& nll) { return ppl_from(nll) * nll.stderr_of_mean(); }

void encode_log_probs(const float* logits, int n_vocab, int target, LogProbRecord* rec) {
  RUNLM_CHECK(n_vocab > 0 && target >= 0 && target < n_vocab, "token %d out of range [0, %d)", target, n_vocab);
  const SoftmaxStats s = softmax_stats(logits, n_vocab);
  // Log-probs below max - kLogProbRange are clamped: such a token has
  // p < e^-40 of the top one, too little to move a KLD.
  const double floor_logit = std::max(static_cast<double>(s.min), static_cast<double>(s.max) - kLogProbRange);
  const double range = s.max - floor_logit;
  const double scale = range / 65535.0;
  rec->scale = static_cast<float>(scale);
  rec->min_log_prob = static_cast<float>(floor_logit - s.log_sum_exp);
  rec->nll = static_cast<float>(s.log_sum_exp - logits[target]);
  rec->top = s.argmax;
  rec->q.resize(static_cast<size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) {
    const double x = logits[i] - floor_logit;
    rec->q[i] = (x <= 0 || scale <= 0) ? 0 : static_cast<uint16_t>(std::min(65535.0, std::nearbyint(x / scale)));
  }
}

void decode_log_probs(const LogProbRecord& rec, double* log_probs) {
  const size_t n = rec.q.size();
  double max = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    log_probs[i] = static_cast<double>(rec.min_log_prob) + static_cast<double>(rec.scale) * rec.q[i];
    max = std::max(max, log_probs[i]);
  }
  // Renormalise: the rounded values sum to 1 only approximately, and a KLD
  // against a distribution that is not one could go negative.
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(log_probs[i] - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < n; ++i) log_probs[i] -= lse;
}

double KldAccumulator::add(const double* base_log_probs, double base_nll, int base_top, const float* logits,
                           int n_vocab, int target) {
  RUNLM_CHECK(target >= 0 && target < n_vocab, "token %d out of range [0, %d)", target, n_vocab);
  const SoftmaxStats s = softmax_stats(logits, n_vocab);
  double kld = 0;
  for (int i = 0; i < n_vocab; ++i) {
    const double lp = base_log_probs[i];
    kld += std::exp(lp) * (lp - (logits[i] - s.log_sum_exp));
  }
  const double nll = s.log_sum_exp - logits[target];
  kld_.add(kld);
  nll_.add(nll);
  nll_base_.add(base_nll);
  sum_nll_nll_base_ += nll * base_nll;
  if (s.argmax == base_top) ++n_same_top_;
  kld_values_.push_back(static_cast<float>(kld));
  return kld;
}

double sorted_percentile(const std::vector<float>& sorted, double fraction) {
  if (sorted.empty()) return 0.0;
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  const double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double t = p - static_cast<double>(i);
  return (1 - t) * sorted[i] + t * sorted[std::min(i + 1, sorted.size() - 1)];
}

KldSummary KldAccumulator::summary() const {
  KldSummary r;
  r.count = kld_.count;
  if (r.count == 0) return r;
  const double n = static_cast<double>(r.count);
  r.kld_mean = kld_.mean();
  r.kld_stderr = kld_.stderr_of_mean();
  std::vector<float> sorted = kld_values_;
  std::sort(sorted.begin(), sorted.end());
  r.kld_min = sorted.front();
  r.kld_max = sorted.back();
  r.kld_median = sorted_percentile(sorted, 0.5);
  r.kld_p99 = sorted_percentile(sorted, 0.99);
  r.same_top = static_cast<double>(n_same_top_) / n;
  r.same_top_stderr = r.count > 1 ? std::sqrt(r.same_top * (1 - r.same_top) / (n - 1)) : 0.0;
  r.ppl = ppl_from(nll_);
  r.ppl_stderr = ppl_stderr_from(nll_);
  r.ppl_base = ppl_from(nll_base_);
  r.ppl_base_stderr = ppl_stderr_from(nll_base_);
  // The two NLL series are strongly correlated (same text), so the ratio's
  // uncertainty subtracts their covariance, as llama-perplexity does.
  const double s1 = nll_.stderr_of_mean(), s2 = nll_base_.stderr_of_mean();
  const double cov = r.count > 1 ? (sum_nll_nll_base_ / n - nll_.mean() * nll_base_.mean()) / (n - 1) : 0.0;
  r.ln_ppl_ratio = nll_.mean() - nll_base_.mean();
  r.ln_ppl_ratio_stderr = std::sqrt(std::max(0.0, s1 * s1 + s2 * s2 - 2 * cov));
  r.ppl_ratio = std::exp(r.ln_ppl_ratio);
  r.ppl_ratio_stderr = r.ppl_ratio * r.ln_ppl_ratio_stderr;
  r.ppl_correlation = (s1 > 0 && s2 > 0) ? cov / (s1 * s2) : 0.0;
  return r;
}

// ---------------------------------------------------------------- files

namespace {

constexpr char kLogitsMagic[8] = {'R', 'L', 'M', 'L', 'O', 'G', 'I', 'T'};
constexpr uint32_t kLogitsVersion = 1;
constexpr size_t kHeaderBytes = 8 + 6 * 4 + 3 * 8;
constexpr size_t kRecordHeaderBytes = 16;

struct LogitsHeader {
  uint32_t version = kLogitsVersion, n_vocab = 0, n_ctx = 0, mode = 0, n_chunks = 0, reserved = 0;
  uint64_t n_chars = 0, n_tokens = 0, n_scored = 0;
};

size_t record_bytes(uint64_t n_vocab) {
  return kRecordHeaderBytes + 2 * static_cast<size_t>(n_vocab + (n_vocab & 1));
}

template <typename T>
void put(std::vector<uint8_t>& buf, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  buf.insert(buf.end(), p, p + sizeof(T));
}

template <typename T>
T get(const uint8_t*& p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  p += sizeof(T);
  return v;
}

}  // namespace

LogitsFileWriter::LogitsFileWriter(const std::string& path, const PerplexityPlan& plan, int n_vocab)
    : path_(path), n_vocab_(n_vocab), n_expected_(plan.n_scored()) {
  RUNLM_CHECK(n_vocab > 0, "logits file %s: no vocabulary", path.c_str());
  const std::string tmp = path + ".tmp";
  f_ = std::fopen(tmp.c_str(), "wb");
  RUNLM_CHECK(f_, "cannot create logits file %s: %s", tmp.c_str(), std::strerror(errno));
  std::vector<uint8_t> buf(kLogitsMagic, kLogitsMagic + 8);
  put<uint32_t>(buf, kLogitsVersion);
  put<uint32_t>(buf, static_cast<uint32_t>(n_vocab));
  put<uint32_t>(buf, static_cast<uint32_t>(plan.options.n_ctx));
  put<uint32_t>(buf, plan.options.mode == PplMode::Llama ? 1u : 0u);
  put<uint32_t>(buf, static_cast<uint32_t>(plan.chunks.size()));
  put<uint32_t>(buf, 0u);
  put<uint64_t>(buf, static_cast<uint64_t>(plan.options.n_chars));
  put<uint64_t>(buf, static_cast<uint64_t>(plan.n_tokens_used()));
  put<uint64_t>(buf, static_cast<uint64_t>(n_expected_));
  for (int64_t i = 0; i < plan.n_tokens_used(); ++i) put<int32_t>(buf, plan.tokens[static_cast<size_t>(i)]);
  RUNLM_CHECK(std::fwrite(buf.data(), 1, buf.size(), f_) == buf.size(), "cannot write logits file %s: %s",
              tmp.c_str(), std::strerror(errno));
}

LogitsFileWriter::~LogitsFileWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove((path_ + ".tmp").c_str());
  }
}

void LogitsFileWriter::write(const LogProbRecord& rec) {
  RUNLM_CHECK(f_ && n_written_ < n_expected_, "logits file %s: more records than scored tokens (%lld)",
              path_.c_str(), static_cast<long long>(n_expected_));
  RUNLM_CHECK(rec.q.size() == static_cast<size_t>(n_vocab_), "logits file %s: record of %zu entries, vocabulary %d",
              path_.c_str(), rec.q.size(), n_vocab_);
  std::vector<uint8_t> buf;
  buf.reserve(record_bytes(static_cast<uint64_t>(n_vocab_)));
  put<float>(buf, rec.scale);
  put<float>(buf, rec.min_log_prob);
  put<float>(buf, rec.nll);
  put<int32_t>(buf, rec.top);
  const auto* q = reinterpret_cast<const uint8_t*>(rec.q.data());
  buf.insert(buf.end(), q, q + 2 * rec.q.size());
  if (n_vocab_ & 1) put<uint16_t>(buf, 0);
  RUNLM_CHECK(std::fwrite(buf.data(), 1, buf.size(), f_) == buf.size(), "cannot write logits file %s.tmp: %s",
              path_.c_str(), std::strerror(errno));
  ++n_written_;
}

void LogitsFileWriter::finish() {
  RUNLM_CHECK(f_, "logits file %s already finished", path_.c_str());
  RUNLM_CHECK(n_written_ == n_expected_, "logits file %s: %lld records written, %lld expected", path_.c_str(),
              static_cast<long long>(n_written_), static_cast<long long>(n_expected_));
  const std::string tmp = path_ + ".tmp";
  const bool ok = std::fclose(f_) == 0;
  f_ = nullptr;
  if (!ok || std::rename(tmp.c_str(), path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    fail("cannot write logits file %s: %s", path_.c_str(), why.c_str());
  }
}

LogitsFileReader::LogitsFileReader(const std::string& path, const PerplexityPlan& plan, int n_vocab)
    : path_(path), n_vocab_(n_vocab) {
  const char* p = path.c_str();
  f_ = std::fopen(p, "rb");
  RUNLM_CHECK(f_, "cannot open --kl-base file %s: %s", p, std::strerror(errno));
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  RUNLM_CHECK(!ec, "cannot read the size of --kl-base file %s: %s", p, ec.message().c_str());

  uint8_t raw[kHeaderBytes];
  RUNLM_CHECK(std::fread(raw, 1, kHeaderBytes, f_) == kHeaderBytes,
              "%s is not a runlm logits file: %llu bytes, shorter than the %zu-byte header", p,
              static_cast<unsigned long long>(file_size), kHeaderBytes);
  RUNLM_CHECK(std::memcmp(raw, kLogitsMagic, 8) == 0,
              "%s is not a runlm logits file (bad magic; write one with runlm perplexity --save-logits)", p);
  const uint8_t* q = raw + 8;
  LogitsHeader h;
  h.version = get<uint32_t>(q);
  h.n_vocab = get<uint32_t>(q);
  h.n_ctx = get<uint32_t>(q);
  h.mode = get<uint32_t>(q);
  h.n_chunks = get<uint32_t>(q);
  h.reserved = get<uint32_t>(q);
  h.n_chars = get<uint64_t>(q);
  h.n_tokens = get<uint64_t>(q);
  h.n_scored = get<uint64_t>(q);
  RUNLM_CHECK(h.version == kLogitsVersion, "logits file %s: version %u, this runlm reads version %u", p, h.version,
              kLogitsVersion);
  RUNLM_CHECK(h.n_vocab > 0 && h.mode <= 1 && h.reserved == 0 && h.n_ctx > 0,
              "logits file %s is corrupt: bad header (n_vocab %u, mode %u, n_ctx %u)", p, h.n_vocab, h.mode, h.n_ctx);
  // The size the header implies, overflow-checked: every count is untrusted.
  uint64_t tok_bytes = 0, rec_bytes = 0, expected = 0;
  const bool overflow = mul_overflows(h.n_tokens, 4, &tok_bytes) ||
                        mul_overflows(h.n_scored, record_bytes(h.n_vocab), &rec_bytes) ||
                        add_overflows(kHeaderBytes, tok_bytes, &expected) || add_overflows(expected, rec_bytes, &expected);
  RUNLM_CHECK(!overflow && expected == file_size,
              "logits file %s is corrupt or truncated: its header (%llu tokens, %llu records of %u logits) implies %s "
              "bytes, the file has %llu",
              p, static_cast<unsigned long long>(h.n_tokens), static_cast<unsigned long long>(h.n_scored), h.n_vocab,
              overflow ? "more than 2^64" : std::to_string(expected).c_str(),
              static_cast<unsigned long long>(file_size));

  // Compatibility with this run, most basic first.
  RUNLM_CHECK(h.n_vocab == static_cast<uint32_t>(n_vocab),
              "--kl-base %s was saved with a vocabulary of %u tokens; this model has %d", p, h.n_vocab, n_vocab);
  RUNLM_CHECK(h.n_ctx == static_cast<uint32_t>(plan.options.n_ctx),
              "--kl-base %s was saved with chunks of %u tokens; this run uses -c %d", p, h.n_ctx, plan.options.n_ctx);
  const uint32_t mode = plan.options.mode == PplMode::Llama ? 1u : 0u;
  RUNLM_CHECK(h.mode == mode, "--kl-base %s was saved in %s scoring mode; this run uses --ppl-mode %s", p,
              ppl_mode_name(h.mode ? PplMode::Llama : PplMode::Reference), ppl_mode_name(plan.options.mode));
  // The text before the chunk count: another text usually changes both,
  // and "another text" is the message that helps.
  std::vector<int32_t> tokens(h.n_tokens);
  RUNLM_CHECK(std::fread(tokens.data(), 4, tokens.size(), f_) == tokens.size(), "cannot read logits file %s", p);
  const size_t n_common = std::min(tokens.size(), static_cast<size_t>(plan.n_tokens_used()));
  for (size_t i = 0; i < n_common; ++i)
    RUNLM_CHECK(tokens[i] == plan.tokens[i],
                "--kl-base %s was saved from another text: token %zu is %d there and %d here (other text, "
                "tokenizer or --chars)",
                p, i, tokens[i], plan.tokens[i]);
  RUNLM_CHECK(h.n_chunks == plan.chunks.size() && h.n_tokens == static_cast<uint64_t>(plan.n_tokens_used()),
              "--kl-base %s was saved with %u chunks (%llu tokens); this run has %zu (%lld tokens): the text is "
              "the same as far as both go, so --chars or --chunks differ",
              p, h.n_chunks, static_cast<unsigned long long>(h.n_tokens), plan.chunks.size(),
              static_cast<long long>(plan.n_tokens_used()));
  RUNLM_CHECK(h.n_scored == static_cast<uint64_t>(plan.n_scored()),
              "logits file %s is corrupt: %llu records for %lld scored tokens", p,
              static_cast<unsigned long long>(h.n_scored), static_cast<long long>(plan.n_scored()));
  n_records_ = static_cast<int64_t>(h.n_scored);
}

LogitsFileReader::~LogitsFileReader() {
  if (f_) std::fclose(f_);
}

void LogitsFileReader::read(LogProbRecord* rec) {
  RUNLM_CHECK(n_read_ < n_records_, "logits file %s: all %lld records already read", path_.c_str(),
              static_cast<long long>(n_records_));
  const size_t nv = static_cast<size_t>(n_vocab_);
  uint8_t head[kRecordHeaderBytes];
  rec->q.resize(nv);
  bool ok = std::fread(head, 1, kRecordHeaderBytes, f_) == kRecordHeaderBytes &&
            std::fread(rec->q.data(), 2, nv, f_) == nv;
  uint16_t pad = 0;
  if (ok && (nv & 1)) ok = std::fread(&pad, 2, 1, f_) == 1;
  RUNLM_CHECK(ok, "cannot read record %lld of logits file %s", static_cast<long long>(n_read_), path_.c_str());
  const uint8_t* q = head;
  rec->scale = get<float>(q);
  rec->min_log_prob = get<float>(q);
  rec->nll = get<float>(q);
  rec->top = get<int32_t>(q);
  RUNLM_CHECK(std::isfinite(rec->scale) && rec->scale >= 0 && rec->scale * 65535.0f <= 2 * kLogProbRange &&
                  std::isfinite(rec->min_log_prob) && rec->min_log_prob <= 0 && std::isfinite(rec->nll) &&
                  rec->nll >= 0 && rec->top >= 0 && rec->top < n_vocab_,
              "logits file %s is corrupt: record %lld has scale %g, min log-prob %g, nll %g, top %d", path_.c_str(),
              static_cast<long long>(n_read_), rec->scale, rec->min_log_prob, rec->nll, rec->top);
  ++n_read_;
}

// ---------------------------------------------------------------- run

PerplexityResult run_perplexity(Engine& engine, int n_vocab, const PerplexityPlan& plan,
                                const std::string& save_logits_path, const std::string& kl_base_path,
                                const std::function<void(const PerplexityProgress&)>& on_chunk) {
  const int n_ctx = plan.options.n_ctx;
  RUNLM_CHECK(engine.n_ctx() >= n_ctx, "the engine's context (%d tokens) cannot hold a chunk of %d", engine.n_ctx(),
              n_ctx);
  RUNLM_CHECK(!plan.chunks.empty(), "nothing to score: no chunks");
  // Open the base first: a mismatch should stop the run before any work.
  std::unique_ptr<LogitsFileReader> reader;
  if (!kl_base_path.empty()) reader = std::make_unique<LogitsFileReader>(kl_base_path, plan, n_vocab);
  std::unique_ptr<LogitsFileWriter> writer;
  if (!save_logits_path.empty()) writer = std::make_unique<LogitsFileWriter>(save_logits_path, plan, n_vocab);

  const auto clock_start = std::chrono::steady_clock::now();
  std::vector<float> logits(static_cast<size_t>(n_ctx) * n_vocab);  // [n_ctx, n_vocab]
  std::vector<double> base_log_probs(reader ? static_cast<size_t>(n_vocab) : 0);
  LogProbRecord rec;
  MeanAccumulator total;
  KldAccumulator kld;
  PerplexityResult result;
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const PplChunk& ch = plan.chunks[c];
    const std::vector<int> toks = plan.chunk_tokens(c);
    // Position 0 every time: the chunk replaces whatever the cache held.
    engine.forward(toks.data(), ch.n, 0, logits.data(), /*all_logits=*/true);
    MeanAccumulator chunk;
    for (int j = ch.first; j + 1 < ch.n; ++j) {
      const float* row = &logits[static_cast<size_t>(j) * n_vocab];
      // The target is the text's token (BOS only ever replaces position 0).
      const int target = plan.tokens[static_cast<size_t>(ch.start + j + 1)];
      try {
        const double nll = token_nll(row, n_vocab, target);
        chunk.add(nll);
        total.add(nll);
        if (writer) {
          encode_log_probs(row, n_vocab, target, &rec);
          writer->write(rec);
        }
        if (reader) {
          reader->read(&rec);
          decode_log_probs(rec, base_log_probs.data());
          kld.add(base_log_probs.data(), rec.nll, rec.top, row, n_vocab, target);
        }
      } catch (const Error& e) {
        fail("chunk %zu, position %d: %s", c + 1, j, e.what());
      }
    }
    result.chunk_ppl.push_back(ppl_from(chunk));
    result.running_ppl.push_back(ppl_from(total));
    if (on_chunk) {
      PerplexityProgress p;
      p.chunk = static_cast<int>(c + 1);
      p.n_chunks = static_cast<int>(plan.chunks.size());
      p.running_ppl = result.running_ppl.back();
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
      on_chunk(p);
    }
  }
  if (writer) writer->finish();
  result.ppl = ppl_from(total);
  result.ppl_stderr = ppl_stderr_from(total);
  result.n_scored = total.count;
  if (reader) result.kld = kld.summary();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  return result;
}

}  // namespace runlm
