// K smoothing: calibration statistics, the shift and scale made from them,
// and the calibration run (see k_smoothing.h for why).
#include "k_smoothing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli_common.h"
#include "common.h"
#include "engine.h"
#include "model.h"
#include "sampler.h"

namespace runlm {

QkStats::QkStats(int n_layers, int n_heads, int n_kv_heads, int head_dim)
    : n_layers_(n_layers), n_heads_(n_heads), n_kv_heads_(n_kv_heads), head_dim_(head_dim) {
  const size_t n = static_cast<size_t>(n_layers) * n_kv_heads * head_dim;
  n_.assign(static_cast<size_t>(n_layers), 0);
  k_sum_.assign(n, 0.0);
  k_sq_.assign(n, 0.0);
  q_sq_.assign(n, 0.0);
}

void QkStats::add(int layer, const float* q, const float* k, int m) {
  RUNLM_CHECK(layer >= 0 && layer < n_layers_, "QkStats: layer %d out of range", layer);
  const int kv_dim = n_kv_heads_ * head_dim_, q_dim = n_heads_ * head_dim_;
  const int group = n_heads_ / n_kv_heads_;
  const size_t base = static_cast<size_t>(layer) * kv_dim;
  for (int t = 0; t < m; ++t) {
    const float* kt = k + static_cast<size_t>(t) * kv_dim;
    const float* qt = q + static_cast<size_t>(t) * q_dim;
    for (int c = 0; c < kv_dim; ++c) {
      k_sum_[base + c] += kt[c];
      k_sq_[base + c] += static_cast<double>(kt[c]) * kt[c];
      // Query heads h * group .. h * group + group - 1 read KV head h.
      const int h = c / head_dim_, d = c % head_dim_;
      for (int g = 0; g < group; ++g) {
        const float x = qt[(h * group + g) * head_dim_ + d];
        q_sq_[base + c] += static_cast<double>(x) * x;
      }
    }
  }
  n_[static_cast<size_t>(layer)] += m;
}

KSmoothing k_smoothing_from_stats(const QkStats& st, const ModelConfig& c, int n_ctx) {
  const int kv_dim = c.kv_dim(), group = c.n_heads / c.n_kv_heads;
  KSmoothing s;
  s.n_layers = c.n_layers;
  s.kv_dim = kv_dim;
  s.params.assign(static_cast<size_t>(c.n_layers) * KSmoothing::kRows * kv_dim, 0.0f);
  // Channels 2i and 2i+1 form RoPE pair i (kernels/cpu/ops.cpp rope), which
  // turns by freq_scale * theta^(-2i / head_dim) radians per position.
  std::vector<bool> shifted(static_cast<size_t>(c.head_dim));
  const double kMaxTurn = M_PI / 3;  // 60 degrees: |R(p) c - mu| <= |c| for every position
  for (int d = 0; d < c.head_dim; ++d) {
    const double freq = c.rope_freq_scale * std::pow(static_cast<double>(c.rope_theta), -(d & ~1) / double(c.head_dim));
    shifted[static_cast<size_t>(d)] = freq * n_ctx <= kMaxTurn;
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const double n = static_cast<double>(st.n_[static_cast<size_t>(l)]);
    RUNLM_CHECK(n > 0, "K smoothing: no calibration tokens for layer %d", l);
    float* shift = s.params.data() + static_cast<size_t>(l) * KSmoothing::kRows * kv_dim;
    float* k_mul = shift + kv_dim;
    float* q_mul = k_mul + kv_dim;
    float* k_weight = q_mul + kv_dim;
    double weight_sum = 0;
    for (int ch = 0; ch < kv_dim; ++ch) {
      const size_t i = static_cast<size_t>(l) * kv_dim + ch;
      const double mean = st.k_sum_[i] / n;
      const double mu = shifted[static_cast<size_t>(ch % c.head_dim)] ? mean : 0.0;
      // E[(k - mu)^2] = E[k^2] - 2 mu E[k] + mu^2.
      const double k_ms = std::max(0.0, st.k_sq_[i] / n - 2 * mu * mean + mu * mu);
      const double q_ms = st.q_sq_[i] / (n * group);
      // A channel that is zero on either side carries nothing to balance;
      // the clamp keeps the multipliers finite in f32 whatever the data.
      double scale = 1.0;
      if (k_ms > 0 && q_ms > 0) scale = std::pow(k_ms / q_ms, 0.125);  // (rms k / rms q)^(1/4)
      scale = std::clamp(scale, 1e-4, 1e4);
      shift[ch] = static_cast<float>(mu);
      k_mul[ch] = static_cast<float>(1.0 / scale);
      q_mul[ch] = static_cast<float>(scale);
      k_weight[ch] = static_cast<float>(q_ms * scale * scale);  // E[(q s)^2]
      weight_sum += k_weight[ch];
    }
    // Mean 1 over the layer, and no channel below 1e-3 of it: a block whose
    // weights were all 0 would leave q4_0's scale fit undetermined.
    const double weight_mean = weight_sum / kv_dim;
    for (int ch = 0; ch < kv_dim; ++ch)
      k_weight[ch] = weight_mean > 0 ? static_cast<float>(std::max(k_weight[ch] / weight_mean, 1e-3)) : 1.0f;
  }
  return s;
}

KSmoothing calibrate_k_smoothing(Engine& engine, const ModelConfig& c, int bos) {
  int n = std::min(256, engine.n_ctx());
  // A paged pool smaller than that (--kv-mem) calibrates on what it holds.
  if (const BlockManager* blocks = engine.blocks()) n = std::min(n, blocks->n_free() * blocks->block_size());
  if (n < 2) return {};  // one token has nothing to calibrate on
  RUNLM_CHECK(bos >= 0 && bos < c.n_vocab, "K smoothing: BOS id %d out of range [0, %d)", bos, c.n_vocab);
  const bool tty = stderr_is_tty();
  engine.set_k_smoothing(KSmoothing{});  // statistics of the plain Q and K
  std::vector<int> tokens{bos};
  std::vector<float> logits(static_cast<size_t>(engine.n_vocab()));
  // Greedy continuation of BOS: the model's own text, deterministic.
  for (int i = 1; i < n; ++i) {
    engine.forward(&tokens[static_cast<size_t>(i - 1)], 1, i - 1, logits.data(), false);
    tokens.push_back(argmax(logits.data(), engine.n_vocab()));
    if (tty && (i % 32 == 0 || i == n - 1)) std::fprintf(stderr, "\rK smoothing: calibrating, %d/%d tokens", i + 1, n);
  }
  QkStats stats(c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  engine.set_qk_stats(&stats);
  try {
    engine.forward(tokens.data(), n, 0, logits.data(), false);
  } catch (...) {
    engine.set_qk_stats(nullptr);
    throw;
  }
  engine.set_qk_stats(nullptr);
  KSmoothing smoothing = k_smoothing_from_stats(stats, c, engine.n_ctx());
  engine.set_k_smoothing(smoothing);
  if (BlockManager* blocks = engine.blocks(); blocks && blocks->has_sequence(0)) blocks->free_sequence(0);
  if (tty) std::fprintf(stderr, "\rK smoothing: calibrated on %d tokens of the model's own text\n", n);
  return smoothing;
}

}  // namespace runlm
