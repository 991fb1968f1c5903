// K smoothing: a per-channel shift and scale of the keys, calibrated once per
// engine, that makes a quantized K cache keep its precision where attention
// needs it.
//
// Why. A quantized K row keeps an absolute error of about its block's largest
// value / 2^bits. Some models put a large, nearly constant value in a few
// channels (stories260K: the last RoPE pair of every head, values up to 28
// against 1-7 elsewhere), and Q is large there too, so that error goes
// straight into the attention logits (q8_0 K: KL divergence 0.0049; q4_0 K:
// perplexity +43%). Two exact rewrites of q . k remove it:
//   - shift: k - mu. Softmax over the keys of one query does not change when
//     every logit moves by the same q . mu, so a shift common to all keys is
//     free (SageAttention's "smooth K"). It only helps where the offset stays
//     an offset: RoPE turns pair i by theta_i per position, so mu is applied
//     only on pairs that turn less than 60 degrees across the context, where
//     |R(p) c - mu| <= |c| holds for every position (never worse than none).
//   - scale: (q * s) . (k / s) = q . k for any per-channel s > 0. With
//     s = (rms(k - mu) / rms(q))^(1/4) Q takes a quarter (in log terms) of
//     K's channel spread; Q is never quantized. SmoothQuant's alpha = 0.5
//     (exponent 1/2) is better still on stories260K but costs sotu29m's q4_0
//     K a quarter more KL divergence (0.0051 against 0.0040); 1/4 helps both.
// K is stored as (k - mu) / s and Q is used as q * s, by every attention path
// (both are applied where K is written and Q rotated), so nothing that reads
// the cache changes.
//   - weight: E[(q s)^2] per channel, what an error in that channel of the
//     stored K costs a logit (q . dk, with channels uncorrelated). q4_0 K's
//     least-squares scale search (kernels/cpu/kv_quant.h) minimises the error
//     weighted by it: stories260K's q4_0 K KL divergence 0.084 unweighted,
//     0.071 weighted (32 grids; docs/kv-quality.md).
//
// Calibration (calibrate_k_smoothing): the engine's own greedy continuation of
// BOS (min(256, n_ctx) tokens), evaluated once with statistics on: a fixed,
// deterministic input in the model's own distribution, the same for every
// sequence, so pages stay shareable between sequences (prefix caching).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace runlm {

class Engine;
struct ModelConfig;

// Per layer and K channel (n_kv_heads * head_dim of them): K is stored as
// (k - shift) * k_mul and Q (each query head of the KV head's group) is used
// as q * q_mul, with q_mul = 1 / k_mul; k_weight (mean 1 over a layer) weighs
// the channel's error when K is quantized to q4_0.
struct KSmoothing {
  static constexpr int kRows = 4;  // shift, k_mul, q_mul, k_weight
  int n_layers = 0;
  int kv_dim = 0;
  // [n_layers][kRows][kv_dim]: shift, k_mul, q_mul, k_weight of each layer,
  // in that order.
  std::vector<float> params;

  bool empty() const { return params.empty(); }
  const float* layer(int l) const { return params.data() + static_cast<size_t>(l) * kRows * kv_dim; }
};

// Sums over the calibration tokens, per layer and K channel, of the RoPE'd
// K, its square, and the square of Q summed over the KV head's query group.
class QkStats {
 public:
  QkStats(int n_layers, int n_heads, int n_kv_heads, int head_dim);
  // m tokens of one layer, RoPE applied: q [m, n_heads * head_dim],
  // k [m, n_kv_heads * head_dim], row-major.
  void add(int layer, const float* q, const float* k, int m);

 private:
  friend KSmoothing k_smoothing_from_stats(const QkStats&, const ModelConfig&, int);
  int n_layers_, n_heads_, n_kv_heads_, head_dim_;
  std::vector<int64_t> n_;               // [n_layers] tokens added
  std::vector<double> k_sum_, k_sq_, q_sq_;  // [n_layers][kv_dim]
};

// The shift and scale described above, for a context of n_ctx positions.
KSmoothing k_smoothing_from_stats(const QkStats& stats, const ModelConfig& config, int n_ctx);

// Runs the calibration on `engine` (greedy continuation of `bos`, then one
// pass with statistics), installs the result with set_k_smoothing and
// returns it (empty when the context holds fewer than 2 tokens). Leaves the
// cache empty (sequence 0 of a paged engine is freed). Progress on stderr
// when it is a terminal.
KSmoothing calibrate_k_smoothing(Engine& engine, const ModelConfig& config, int bos);

}  // namespace runlm
