// CPU reference attention: for each query row, the scores of the visible
// keys, a max-subtracted softmax and the weighted sum of values, all in
// float64 so the reference error is far below the bf16 error under test.
#include "cpu/attention_ref.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common.h"

namespace runlm {

namespace {

void check_params(const AttnRefParams& p, bool need_out) {
  RUNLM_CHECK(p.q && p.k && p.v && (p.out || !need_out) && p.cu_seqlens_q && p.cu_seqlens_k,
              "attention_ref: q, k, v, out and cu_seqlens must be set");
  RUNLM_CHECK(p.batch >= 1, "attention_ref: batch=%d must be >= 1", p.batch);
  RUNLM_CHECK(p.n_heads >= 1 && p.n_kv_heads >= 1 && p.n_heads % p.n_kv_heads == 0,
              "attention_ref: n_heads=%d must be a positive multiple of n_kv_heads=%d", p.n_heads, p.n_kv_heads);
  RUNLM_CHECK(p.head_dim >= 1, "attention_ref: head_dim=%d must be >= 1", p.head_dim);
  RUNLM_CHECK(p.cu_seqlens_q[0] == 0 && p.cu_seqlens_k[0] == 0, "attention_ref: cu_seqlens must start at 0");
  for (int b = 0; b < p.batch; ++b)
    RUNLM_CHECK(p.cu_seqlens_q[b + 1] >= p.cu_seqlens_q[b] && p.cu_seqlens_k[b + 1] >= p.cu_seqlens_k[b],
                "attention_ref: cu_seqlens decrease at sequence %d", b);
}

// One query row: row is the flattened query index, b its sequence.
void ref_row(const AttnRefParams& p, int b, int64_t row, int h, float* out_row, float* lse_out) {
  const int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
  const int64_t sq = p.cu_seqlens_q[b + 1] - q0, sk = p.cu_seqlens_k[b + 1] - k0;
  const int64_t i = row - q0;
  const int d = p.head_dim;
  const int kvh = h / (p.n_heads / p.n_kv_heads);
  const float* qr = p.q + (row * p.n_heads + h) * d;

  std::vector<double> s(static_cast<size_t>(sk));
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < sk; ++j) {
    if (!attn_key_visible(i, j, sq, sk, p.causal, p.window_left)) {
      s[j] = -std::numeric_limits<double>::infinity();
      continue;
    }
    const float* kr = p.k + ((k0 + j) * p.n_kv_heads + kvh) * d;
    double acc = 0;
    for (int c = 0; c < d; ++c) acc += static_cast<double>(qr[c]) * kr[c];
    s[j] = acc * p.scale;
    if (p.softcap > 0) s[j] = p.softcap * std::tanh(s[j] / p.softcap);
    mx = std::max(mx, s[j]);
  }
  std::vector<double> o(static_cast<size_t>(d), 0.0);
  if (mx == -std::numeric_limits<double>::infinity()) {
    // No visible key: defined as out = 0, lse = -inf, or the sink's logit
    // with one (as the kernels do).
    for (int c = 0; c < d; ++c) out_row[c] = 0.0f;
    if (lse_out) *lse_out = p.sinks ? p.sinks[h] : -std::numeric_limits<float>::infinity();
    return;
  }
  // The sink joins the max and the denominator, and has no value.
  if (p.sinks) mx = std::max(mx, static_cast<double>(p.sinks[h]));
  double sum = p.sinks ? std::exp(p.sinks[h] - mx) : 0.0;
  for (int64_t j = 0; j < sk; ++j) {
    if (s[j] == -std::numeric_limits<double>::infinity()) continue;
    const double w = std::exp(s[j] - mx);
    sum += w;
    const float* vr = p.v + ((k0 + j) * p.n_kv_heads + kvh) * d;
    for (int c = 0; c < d; ++c) o[c] += w * vr[c];
  }
  for (int c = 0; c < d; ++c) out_row[c] = static_cast<float>(o[c] / sum);
  if (lse_out) *lse_out = static_cast<float>(mx + std::log(sum));
}

}  // namespace

void attention_ref(const AttnRefParams& p) {
  check_params(p, true);
  const int64_t total_q = p.cu_seqlens_q[p.batch];
  for (int b = 0; b < p.batch; ++b) {
    for (int64_t row = p.cu_seqlens_q[b]; row < p.cu_seqlens_q[b + 1]; ++row) {
      for (int h = 0; h < p.n_heads; ++h) {
        float* lse = p.lse ? p.lse + h * total_q + row : nullptr;
        ref_row(p, b, row, h, p.out + (row * p.n_heads + h) * p.head_dim, lse);
      }
    }
  }
}

void attention_ref_row(const AttnRefParams& p, int64_t row, int head, float* out_row, float* lse_out) {
  check_params(p, false);  // p.out is not used: the row goes to out_row
  RUNLM_CHECK(row >= 0 && row < p.cu_seqlens_q[p.batch] && head >= 0 && head < p.n_heads,
              "attention_ref_row: row=%lld head=%d out of range", static_cast<long long>(row), head);
  int b = 0;
  while (p.cu_seqlens_q[b + 1] <= row) ++b;
  ref_row(p, b, row, head, out_row, lse_out);
}

}  // namespace runlm
