// CPU backend: the reference forward pass. Plain fp32 activations, weights
// decoded from their file type row by row, fp32 KV cache. Reads top to
// bottom like the Llama equations.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <vector>

#include "common.h"
#include "engine.h"
#include "model.h"
#include "ops.h"
#include "thread_pool.h"

namespace runlm {

namespace {

QMatrix qmatrix(const WeightView& w) { return QMatrix{w.type, w.data, w.row_bytes, w.ne0, w.ne1}; }

std::vector<float> decode_vector(const WeightView& w) {
  std::vector<float> v(static_cast<size_t>(w.ne0));
  get_row(qmatrix(w), 0, v.data());
  return v;
}

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Model& model, const EngineOptions& opt)
      : model_(model), cfg_(model.config()), pool_(opt.n_threads) {
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : cfg_.ctx_train;
    n_batch_ = std::max(1, opt.n_batch);
    window_ = opt.sliding_window >= 0 ? opt.sliding_window : cfg_.sliding_window;
    const size_t cache = static_cast<size_t>(cfg_.n_layers) * n_ctx_ * cfg_.kv_dim();
    // new[] without value-initialisation: pages are touched only as used.
    k_cache_.reset(new float[cache]);
    v_cache_.reset(new float[cache]);
    for (const auto& l : model.weights().layers) {
      attn_norm_.push_back(decode_vector(l.attn_norm));
      ffn_norm_.push_back(decode_vector(l.ffn_norm));
    }
    output_norm_ = decode_vector(model.weights().output_norm);
  }

  const char* backend_name() const override { return "cpu"; }
  int n_ctx() const override { return n_ctx_; }
  const char* kv_type_name() const override { return "f32"; }

  double measure_copy_bandwidth() override {
    // 256 MiB each way, split across the pool's threads like the matmuls.
    const size_t n = size_t{256} << 20;
    std::vector<char> a(n, 1), b(n, 2);
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      pool_.parallel_for(static_cast<int64_t>(n), [&](int64_t lo, int64_t hi, int) {
        std::memcpy(b.data() + lo, a.data() + lo, static_cast<size_t>(hi - lo));
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * static_cast<double>(n) / s);
    }
    return best;
  }

  void forward(const int* tokens, int n, int pos, float* logits, bool all_logits) override {
    RUNLM_CHECK(n > 0, "forward: no tokens");
    RUNLM_CHECK(pos >= 0 && static_cast<int64_t>(pos) + n <= n_ctx_,
                "context full: %d tokens at position %d exceed the context size %d (-c)", n, pos, n_ctx_);
    for (int i = 0; i < n; ++i)
      RUNLM_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab, "token id %d out of range [0, %d)", tokens[i],
                  cfg_.n_vocab);
    for (int done = 0; done < n; done += n_batch_) {
      const int m = std::min(n_batch_, n - done);
      const bool last_chunk = done + m == n;
      float* out = all_logits ? logits + static_cast<size_t>(done) * cfg_.n_vocab : logits;
      forward_chunk(tokens + done, m, pos + done, all_logits ? out : (last_chunk ? out : nullptr), all_logits);
    }
  }

 private:
  // Evaluates m tokens; writes logits (all or last) unless out is null.
  void forward_chunk(const int* tokens, int m, int pos, float* out, bool all_logits) {
    const ModelConfig& c = cfg_;
    const ModelWeights& w = model_.weights();
    const int dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    resize(m);

    for (int t = 0; t < m; ++t) get_row(qmatrix(w.tok_embd), tokens[t], &x_[t * dim]);

    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      float* k_layer = k_cache_.get() + static_cast<size_t>(l) * n_ctx_ * kv_dim;
      float* v_layer = v_cache_.get() + static_cast<size_t>(l) * n_ctx_ * kv_dim;

      // Attention block: x += Wo · attn(rope(Wq·h), rope(Wk·h), Wv·h), h = rmsnorm(x).
      for (int t = 0; t < m; ++t) rmsnorm(&xb_[t * dim], &x_[t * dim], attn_norm_[l].data(), dim, c.rms_eps);
      matmul(qmatrix(lw.wq), xb_.data(), q_.data(), m, pool_);
      matmul(qmatrix(lw.wk), xb_.data(), k_.data(), m, pool_);
      matmul(qmatrix(lw.wv), xb_.data(), v_.data(), m, pool_);
      for (int t = 0; t < m; ++t) {
        rope(&q_[t * q_dim], c.n_heads, c.head_dim, pos + t, c.rope_theta, c.rope_freq_scale);
        rope(&k_[t * kv_dim], c.n_kv_heads, c.head_dim, pos + t, c.rope_theta, c.rope_freq_scale);
        std::copy_n(&k_[t * kv_dim], kv_dim, k_layer + static_cast<size_t>(pos + t) * kv_dim);
        std::copy_n(&v_[t * kv_dim], kv_dim, v_layer + static_cast<size_t>(pos + t) * kv_dim);
      }
      pool_.parallel_for(m, [&](int64_t b, int64_t e, int thread) {
        for (int64_t t = b; t < e; ++t)
          attention_one_token(&att_[t * q_dim], &q_[t * q_dim], k_layer, v_layer, kv_dim, pos + static_cast<int>(t),
                              c.n_heads, c.n_kv_heads, c.head_dim, window_, scale, scores_[thread].data());
      });
      matmul(qmatrix(lw.wo), att_.data(), xb_.data(), m, pool_);
      for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] += xb_[i];

      // Feed-forward block: x += W_down · (silu(W_gate·h) * W_up·h), h = rmsnorm(x).
      for (int t = 0; t < m; ++t) rmsnorm(&xb_[t * dim], &x_[t * dim], ffn_norm_[l].data(), dim, c.rms_eps);
      matmul(qmatrix(lw.w_gate), xb_.data(), gate_.data(), m, pool_);
      matmul(qmatrix(lw.w_up), xb_.data(), up_.data(), m, pool_);
      swiglu(gate_.data(), up_.data(), static_cast<int64_t>(m) * hidden);
      matmul(qmatrix(lw.w_down), gate_.data(), xb_.data(), m, pool_);
      for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] += xb_[i];
    }

    if (!out) return;
    const int first = all_logits ? 0 : m - 1;
    const int count = m - first;
    for (int t = first; t < m; ++t)
      rmsnorm(&xb_[(t - first) * dim], &x_[t * dim], output_norm_.data(), dim, c.rms_eps);
    matmul(qmatrix(w.output), xb_.data(), out, count, pool_);
  }

  void resize(int m) {
    const ModelConfig& c = cfg_;
    auto grow = [](std::vector<float>& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(x_, static_cast<size_t>(m) * c.dim);
    grow(xb_, static_cast<size_t>(m) * c.dim);
    grow(q_, static_cast<size_t>(m) * c.q_dim());
    grow(att_, static_cast<size_t>(m) * c.q_dim());
    grow(k_, static_cast<size_t>(m) * c.kv_dim());
    grow(v_, static_cast<size_t>(m) * c.kv_dim());
    grow(gate_, static_cast<size_t>(m) * c.hidden_dim);
    grow(up_, static_cast<size_t>(m) * c.hidden_dim);
    scores_.resize(pool_.size());
    for (auto& s : scores_) grow(s, static_cast<size_t>(n_ctx_));
  }

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool pool_;
  int n_ctx_ = 0;
  int n_batch_ = 512;
  int window_ = 0;
  std::unique_ptr<float[]> k_cache_;  // [n_layers, n_ctx, n_kv_heads * head_dim]
  std::unique_ptr<float[]> v_cache_;  // [n_layers, n_ctx, n_kv_heads * head_dim]
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;
  std::vector<float> output_norm_;
  // Activations for a chunk of m tokens, row-major [m, width].
  std::vector<float> x_, xb_, q_, att_, k_, v_, gate_, up_;
  std::vector<std::vector<float>> scores_;  // per thread [n_ctx]
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<CpuEngine>(model, options);
}

}  // namespace runlm
