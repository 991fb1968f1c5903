// CPU backend: the reference forward pass. Plain fp32 activations, weights
// decoded from their file type row by row, fp32 KV cache. Reads top to
// bottom like the Llama equations.
//
// The KV cache is a pool of slots (rows of n_kv_heads * head_dim floats per
// layer). Contiguous: one sequence, position p in slot p. Paged: pages of
// block_size slots handed out by a BlockManager, position p of a sequence in
// slot table[p / block_size] * block_size + p % block_size. Every token of a
// step carries its own position and table, so one step can mix sequences and
// each token's result is the same as if it ran alone.
#include <algorithm>
#include <cstdio>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "engine.h"
#include "layer_rope.h"
#include "kv_types.h"
#include "model.h"
#include "moe_routing.h"
#include "ops.h"
#include "thread_pool.h"
#include "weight_matrix.h"

namespace runlm {

namespace {

std::vector<float> decode_vector(const WeightView& w) {
  std::vector<float> v(static_cast<size_t>(w.ne0));
  get_row(qmatrix(w), 0, v.data());
  return v;
}

// Where one token of a step goes.
struct TokenSlot {
  int pos;                // position in its sequence
  const int32_t* table;   // its sequence's block table (nullptr: contiguous)
};

class CpuEngine final : public Engine {
 public:
  CpuEngine(const Model& model, const EngineOptions& opt)
      : model_(model), cfg_(model.config()), pool_(opt.n_threads), layout_(opt.kv) {
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : cfg_.ctx_train;
    n_batch_ = std::max(1, opt.n_batch);
    windows_ = layer_windows(cfg_, opt.sliding_window);
    type_k_ = opt.type_k.value_or(KvType::F32);
    type_v_ = opt.type_v.value_or(KvType::F32);
    check_kv_types(Device::Cpu, type_k_, type_v_, layout_, cfg_.head_dim);
    // Stops with an error for a quantized type whose blocks cannot follow head_dim.
    row_bytes_k_ = kv_row_bytes(type_k_, cfg_.kv_dim(), cfg_.head_dim);
    row_bytes_v_ = kv_row_bytes(type_v_, cfg_.kv_dim(), cfg_.head_dim);
    int64_t n_slots = n_ctx_;
    if (layout_ == KvLayout::Paged) {
      block_size_ = opt.block_size;
      int64_t pages = opt.kv_pages;
      if (pages <= 0) {
        // Enough for kv_tokens (or n_ctx), at most --kv-mem or 8 GiB of f32 K and V.
        const int64_t tokens = opt.kv_tokens > 0 ? opt.kv_tokens : n_ctx_;
        const double page_bytes =
            static_cast<double>(cfg_.n_layers) * block_size_ * static_cast<double>(row_bytes_k_ + row_bytes_v_);
        const double budget = opt.kv_bytes > 0 ? static_cast<double>(opt.kv_bytes) : 8.0 * (1 << 30);
        pages = std::max<int64_t>(1, std::min<int64_t>((tokens + block_size_ - 1) / block_size_,
                                                       static_cast<int64_t>(budget / page_bytes)));
      }
      RUNLM_CHECK(pages < (int64_t{1} << 31), "KV cache: %lld pages is too many", static_cast<long long>(pages));
      blocks_ = std::make_unique<BlockManager>(static_cast<int>(pages), block_size_);
      n_slots = pages * block_size_;
    }
    // 64-bit: layers x slots x row bytes overflows 32 bits at 7B shapes.
    n_slots_ = n_slots;
    const uint64_t rows = static_cast<uint64_t>(cfg_.n_layers) * static_cast<uint64_t>(n_slots);  // both < 2^31
    uint64_t bytes_k = 0, bytes_v = 0, bytes_kv = 0;
    RUNLM_CHECK(!mul_overflows(rows, row_bytes_k_, &bytes_k) && !mul_overflows(rows, row_bytes_v_, &bytes_v) &&
                    !add_overflows(bytes_k, bytes_v, &bytes_kv),
                "KV cache of %lld slots overflows 64 bits; lower -c", static_cast<long long>(n_slots));
    // Checked against the machine first: under overcommit a
    // too-large new[] succeeds and the OOM killer strikes once the pages are
    // touched, and under AddressSanitizer a failed new[] aborts.
    check_host_allocation(bytes_kv, strfmt("the KV cache (%d layers x %lld slots, K %s, V %s)", cfg_.n_layers,
                                           static_cast<long long>(n_slots), kv_type_name(type_k_),
                                           kv_type_name(type_v_)));
    try {
      // new[] without value-initialisation: pages are touched only as used.
      k_cache_.reset(new uint8_t[bytes_k]);
      v_cache_.reset(new uint8_t[bytes_v]);
    } catch (const std::bad_alloc&) {
      fail("out of memory for the KV cache: needs %llu bytes (%.2f GiB: %d layers x %lld slots, K %s, V %s); lower -c",
           static_cast<unsigned long long>(bytes_k + bytes_v), static_cast<double>(bytes_k + bytes_v) / (1 << 30),
           cfg_.n_layers, static_cast<long long>(n_slots), kv_type_name(type_k_), kv_type_name(type_v_));
    }
    for (const auto& l : model.weights().layers) {
      attn_norm_.push_back(decode_vector(l.attn_norm));
      ffn_norm_.push_back(decode_vector(l.ffn_norm));
      if (cfg_.qkv_bias) bias_.push_back({decode_vector(l.bq), decode_vector(l.bk), decode_vector(l.bv)});
      if (cfg_.qk_norm) qk_norm_.push_back({decode_vector(l.q_norm), decode_vector(l.k_norm)});
      if (cfg_.post_norms) post_norm_.push_back({decode_vector(l.attn_post_norm), decode_vector(l.ffn_post_norm)});
      if (cfg_.attn_out_bias) out_bias_.push_back(decode_vector(l.bo));
      if (cfg_.attn_sinks) sinks_.push_back(decode_vector(l.sinks));
      if (cfg_.moe_biases) {
        auto rows = [](const WeightView& w) {  // every row, one after the other
          std::vector<float> v(static_cast<size_t>(w.ne0 * w.ne1));
          for (int64_t r = 0; r < w.ne1; ++r) get_row(qmatrix(w), r, &v[static_cast<size_t>(r * w.ne0)]);
          return v;
        };
        moe_bias_.push_back({decode_vector(l.gate_inp_b), rows(l.gate_exps_b), rows(l.up_exps_b), rows(l.down_exps_b)});
      }
    }
    output_norm_ = decode_vector(model.weights().output_norm);
    if (opt.verbose) std::fprintf(stderr, "decode attention: cpu (the CPU engine; attention on the host threads)\n");
    rope_ = layer_rope_specs(model, n_ctx_, &rope_factors_);
    for (const RopeSpec& rs : rope_)
      plain_rope_ = plain_rope_ && !rs.neox && rs.n_rot == cfg_.head_dim && !rs.factors && rs.attn_factor == 1.0f &&
                    rs.ext_factor == 0.0f && rs.theta == cfg_.rope_theta && rs.freq_scale == cfg_.rope_freq_scale;
  }

  const char* backend_name() const override { return "cpu"; }
  const char* decode_kernel() const override { return "cpu"; }
  int n_ctx() const override { return n_ctx_; }
  int n_vocab() const override { return cfg_.n_vocab; }
  KvType type_k() const override { return type_k_; }
  KvType type_v() const override { return type_v_; }
  BlockManager* blocks() override { return blocks_.get(); }
  int max_batch_tokens() const override { return n_batch_; }
  int sliding_window() const override { return common_window(windows_); }
  void set_qk_stats(QkStats* stats) override { qk_stats_ = stats; }
  void set_k_smoothing(const KSmoothing& smoothing) override {
    RUNLM_CHECK(smoothing.empty() || (smoothing.n_layers == cfg_.n_layers && smoothing.kv_dim == cfg_.kv_dim() &&
                     smoothing.params.size() == size_t(cfg_.n_layers) * KSmoothing::kRows * cfg_.kv_dim()),
                "K smoothing made for %d layers x %d channels; this model has %d x %d", smoothing.n_layers,
                smoothing.kv_dim, cfg_.n_layers, cfg_.kv_dim());
    k_smoothing_ = smoothing;
  }
  bool k_smoothed() const override { return !k_smoothing_.empty(); }

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
    const int32_t* table = nullptr;
    if (blocks_) {
      reserve_sequence0(*blocks_, pos, n);  // forward() is sequence 0 of the paged cache
      table = blocks_->block_table(0).data();
    }
    for (int done = 0; done < n; done += n_batch_) {
      const int m = std::min(n_batch_, n - done);
      std::vector<TokenSlot> slots(static_cast<size_t>(m));
      for (int i = 0; i < m; ++i) slots[i] = {pos + done + i, table};
      std::vector<int> rows;  // tokens whose logits are wanted
      if (all_logits) {
        for (int i = 0; i < m; ++i) rows.push_back(i);
      } else if (done + m == n) {
        rows.push_back(m - 1);
      }
      float* out = all_logits ? logits + static_cast<size_t>(done) * cfg_.n_vocab : logits;
      run(tokens + done, slots, rows, out);
    }
  }

  void forward_batch(const std::vector<BatchItem>& items, float* logits) override {
    RUNLM_CHECK(blocks_, "forward_batch needs the paged KV cache (--kv paged)");
    std::vector<int> tokens;
    std::vector<TokenSlot> slots;
    std::vector<int> rows;
    for (const BatchItem& it : items) {
      RUNLM_CHECK(it.n_tokens > 0, "forward_batch: empty item for sequence %d", it.seq_id);
      RUNLM_CHECK(blocks_->seq_len(it.seq_id) >= it.pos + it.n_tokens,
                  "forward_batch: pages for positions [%d, %d) of sequence %d were not reserved", it.pos,
                  it.pos + it.n_tokens, it.seq_id);
      const int32_t* table = blocks_->block_table(it.seq_id).data();
      for (int i = 0; i < it.n_tokens; ++i) {
        tokens.push_back(it.tokens[i]);
        slots.push_back({it.pos + i, table});
      }
      if (it.want_logits) rows.push_back(static_cast<int>(tokens.size()) - 1);
    }
    RUNLM_CHECK(static_cast<int>(tokens.size()) <= n_batch_, "forward_batch: %zu tokens exceed the batch size %d (-b)",
                tokens.size(), n_batch_);
    run(tokens.data(), slots, rows, logits);
  }

 private:
  int64_t slot_of(const TokenSlot& s, int pos) const {
    return s.table ? static_cast<int64_t>(s.table[pos / block_size_]) * block_size_ + pos % block_size_ : pos;
  }

  // Evaluates one step of m = slots.size() tokens; writes the logits of the
  // tokens listed in rows (in that order) to out.
  void run(const int* tokens, const std::vector<TokenSlot>& slots, const std::vector<int>& rows, float* out) {
    const ModelConfig& c = cfg_;
    const ModelWeights& w = model_.weights();
    const int m = static_cast<int>(slots.size());
    const int dim = c.dim, q_dim = c.q_dim(), kv_dim = c.kv_dim(), hidden = c.hidden_dim;
    for (int t = 0; t < m; ++t)
      RUNLM_CHECK(tokens[t] >= 0 && tokens[t] < c.n_vocab, "token id %d out of range [0, %d)", tokens[t], c.n_vocab);
    resize(m);

    for (int t = 0; t < m; ++t) get_row(qmatrix(w.tok_embd), tokens[t], &x_[t * dim]);

    if (c.embd_scale != 1.0f)
      for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] *= c.embd_scale;

    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      uint8_t* k_layer = k_cache_.get() + static_cast<size_t>(l) * n_slots_ * row_bytes_k_;
      uint8_t* v_layer = v_cache_.get() + static_cast<size_t>(l) * n_slots_ * row_bytes_v_;

      // Attention block: x += post_norm(Wo · attn(rope(norm(Wq·h + bq)), rope(norm(Wk·h + bk)), Wv·h + bv)),
      // h = rmsnorm(x); the norms and biases only where the model has them.
      for (int t = 0; t < m; ++t) rmsnorm(&xb_[t * dim], &x_[t * dim], attn_norm_[l].data(), dim, c.rms_eps);
      if (c.fused_qkv) {
        const int qkv_dim = q_dim + 2 * kv_dim;
        matmul(qmatrix(lw.wqkv), xb_.data(), qkv_.data(), m, pool_);
        for (int t = 0; t < m; ++t) {
          const float* row = &qkv_[static_cast<size_t>(t) * qkv_dim];
          std::copy(row, row + q_dim, &q_[static_cast<size_t>(t) * q_dim]);
          std::copy(row + q_dim, row + q_dim + kv_dim, &k_[static_cast<size_t>(t) * kv_dim]);
          std::copy(row + q_dim + kv_dim, row + qkv_dim, &v_[static_cast<size_t>(t) * kv_dim]);
        }
      } else {
        matmul(qmatrix(lw.wq), xb_.data(), q_.data(), m, pool_);
        matmul(qmatrix(lw.wk), xb_.data(), k_.data(), m, pool_);
        matmul(qmatrix(lw.wv), xb_.data(), v_.data(), m, pool_);
      }
      if (c.qkv_bias) {
        add_rows(q_.data(), bias_[l][0].data(), m, q_dim);
        add_rows(k_.data(), bias_[l][1].data(), m, kv_dim);
        add_rows(v_.data(), bias_[l][2].data(), m, kv_dim);
      }
      if (c.qk_norm) {
        // Each head of each token on its own, in place.
        for (int64_t i = 0; i < static_cast<int64_t>(m) * c.n_heads; ++i)
          rmsnorm(&q_[i * c.head_dim], &q_[i * c.head_dim], qk_norm_[l][0].data(), c.head_dim, c.rms_eps);
        for (int64_t i = 0; i < static_cast<int64_t>(m) * c.n_kv_heads; ++i)
          rmsnorm(&k_[i * c.head_dim], &k_[i * c.head_dim], qk_norm_[l][1].data(), c.head_dim, c.rms_eps);
      }
      const RopeSpec& rs = rope_[size_t(l)];
      for (int t = 0; t < m; ++t) {
        if (plain_rope_) {
          rope(&q_[t * q_dim], c.n_heads, c.head_dim, slots[t].pos, c.rope_theta, c.rope_freq_scale);
          rope(&k_[t * kv_dim], c.n_kv_heads, c.head_dim, slots[t].pos, c.rope_theta, c.rope_freq_scale);
        } else {
          rope_ext(&q_[t * q_dim], c.n_heads, c.head_dim, slots[t].pos, rs);
          rope_ext(&k_[t * kv_dim], c.n_kv_heads, c.head_dim, slots[t].pos, rs);
        }
      }
      if (qk_stats_) qk_stats_->add(l, q_.data(), k_.data(), m);
      if (!k_smoothing_.empty()) smooth_qk(k_smoothing_.layer(l), m);
      // K smoothing's per-channel weights steer a q4_0 K's scale fit.
      const float* k_weight = k_smoothing_.empty() ? nullptr : k_smoothing_.layer(l) + 3 * kv_dim;
      for (int t = 0; t < m; ++t) {
        const int pos = slots[t].pos;
        // K and V are encoded into the cache's types as they are written.
        const size_t slot = static_cast<size_t>(slot_of(slots[t], pos));
        kv_encode_row(type_k_, &k_[t * kv_dim], k_layer + slot * row_bytes_k_, kv_dim, c.head_dim, k_weight);
        kv_encode_row(type_v_, &v_[t * kv_dim], v_layer + slot * row_bytes_v_, kv_dim, c.head_dim);
      }
      pool_.parallel_for(m, [&](int64_t b, int64_t e, int thread) {
        KvLayerView kv{k_layer, v_layer, type_k_, type_v_, row_bytes_k_, row_bytes_v_, nullptr, block_size_};
        for (int64_t t = b; t < e; ++t) {
          kv.block_table = slots[t].table;
          attention_one_token(&att_[t * q_dim], &q_[t * q_dim], kv, slots[t].pos, c.n_heads, c.n_kv_heads, c.head_dim,
                              windows_[size_t(l)], c.attn_scale(), scores_[thread].data(), c.attn_softcap,
                              c.attn_sinks ? sinks_[l].data() : nullptr);
        }
      });
      matmul(qmatrix(lw.wo), att_.data(), xb_.data(), m, pool_);
      if (c.attn_out_bias) add_rows(xb_.data(), out_bias_[l].data(), m, dim);
      if (c.post_norms) post_norm(post_norm_[l][0].data(), m);
      for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] += xb_[i];

      // Feed-forward block: x += post_norm(W_down · (act(W_gate·h) * W_up·h)), h = rmsnorm(x).
      for (int t = 0; t < m; ++t) rmsnorm(&xb_[t * dim], &x_[t * dim], ffn_norm_[l].data(), dim, c.rms_eps);
      if (c.moe()) {
        moe_ffn(l, m);
        if (c.post_norms) post_norm(post_norm_[l][1].data(), m);
        for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] += xb_[i];
        continue;
      }
      if (c.fused_gate_up) {
        matmul(qmatrix(lw.w_up), xb_.data(), gate_up_.data(), m, pool_);
        for (int t = 0; t < m; ++t) {
          const float* row = &gate_up_[static_cast<size_t>(t) * 2 * hidden];
          std::copy(row, row + hidden, &gate_[static_cast<size_t>(t) * hidden]);
          std::copy(row + hidden, row + 2 * hidden, &up_[static_cast<size_t>(t) * hidden]);
        }
      } else {
        matmul(qmatrix(lw.w_gate), xb_.data(), gate_.data(), m, pool_);
        matmul(qmatrix(lw.w_up), xb_.data(), up_.data(), m, pool_);
      }
      if (c.ffn_act == FfnActivation::GeluTanh) geglu(gate_.data(), up_.data(), static_cast<int64_t>(m) * hidden);
      else swiglu(gate_.data(), up_.data(), static_cast<int64_t>(m) * hidden);
      matmul(qmatrix(lw.w_down), gate_.data(), xb_.data(), m, pool_);
      if (c.post_norms) post_norm(post_norm_[l][1].data(), m);
      for (size_t i = 0; i < static_cast<size_t>(m) * dim; ++i) x_[i] += xb_[i];
    }

    if (rows.empty()) return;
    for (size_t r = 0; r < rows.size(); ++r)
      rmsnorm(&xb_[r * dim], &x_[static_cast<size_t>(rows[r]) * dim], output_norm_.data(), dim, c.rms_eps);
    matmul(qmatrix(w.output), xb_.data(), out, static_cast<int64_t>(rows.size()), pool_);
    if (c.final_softcap > 0) softcap(out, static_cast<int64_t>(rows.size()) * c.n_vocab, c.final_softcap);
  }

  // The mixture of experts of layer l on xb_ (m normed tokens), output in
  // xb_: each token's router picks n_expert_used experts (moe_route); every
  // expert runs its gated FFN on the tokens that chose it, at once; a token's
  // output is the sum over its chosen experts, in the router's order, of
  // weight * expert output (llama.cpp's build_moe_ffn).
  void moe_ffn(int l, int m) {
    const ModelConfig& c = cfg_;
    const LayerWeights& lw = model_.weights().layers[l];
    const int dim = c.dim, ne = c.n_expert, k = c.n_expert_used, eh = c.expert_hidden_dim;
    const float* bias = c.moe_biases ? moe_bias_[l][0].data() : nullptr;
    matmul(qmatrix(lw.gate_inp), xb_.data(), router_.data(), m, pool_);
    MoeRouting r;
    r.n_expert = ne;
    r.n_used = k;
    r.softmax_first = c.moe_gating == MoeGating::SoftmaxThenTopK;
    r.normalize = c.moe_norm_weights;
    r.scale = c.moe_weights_scale;
    std::vector<std::vector<int>> users(static_cast<size_t>(ne));  // per expert: its (token * k + slot)s
    for (int t = 0; t < m; ++t) {
      float* logits = &router_[static_cast<size_t>(t) * ne];
      if (bias)
        for (int e = 0; e < ne; ++e) logits[e] += bias[e];
      moe_route(logits, r, &chosen_[static_cast<size_t>(t) * k], &chosen_w_[static_cast<size_t>(t) * k],
                route_tmp_.data());
      for (int s = 0; s < k; ++s) users[size_t(chosen_[static_cast<size_t>(t) * k + s])].push_back(t * k + s);
    }
    for (int e = 0; e < ne; ++e) {
      const std::vector<int>& u = users[size_t(e)];
      if (u.empty()) continue;
      const int n = static_cast<int>(u.size());
      for (int i = 0; i < n; ++i)
        std::copy(&xb_[static_cast<size_t>(u[i] / k) * dim], &xb_[static_cast<size_t>(u[i] / k + 1) * dim],
                  &moe_in_[static_cast<size_t>(i) * dim]);
      matmul(qmatrix(lw.gate_exps.expert(e)), moe_in_.data(), gate_.data(), n, pool_);
      matmul(qmatrix(lw.up_exps.expert(e)), moe_in_.data(), up_.data(), n, pool_);
      if (c.moe_biases) {
        add_rows(gate_.data(), &moe_bias_[l][1][static_cast<size_t>(e) * eh], n, eh);
        add_rows(up_.data(), &moe_bias_[l][2][static_cast<size_t>(e) * eh], n, eh);
      }
      if (c.ffn_act == FfnActivation::SwigluOai) swiglu_oai(gate_.data(), up_.data(), static_cast<int64_t>(n) * eh);
      else if (c.ffn_act == FfnActivation::GeluTanh) geglu(gate_.data(), up_.data(), static_cast<int64_t>(n) * eh);
      else swiglu(gate_.data(), up_.data(), static_cast<int64_t>(n) * eh);
      matmul(qmatrix(lw.down_exps.expert(e)), gate_.data(), moe_in_.data(), n, pool_);
      if (c.moe_biases) add_rows(moe_in_.data(), &moe_bias_[l][3][static_cast<size_t>(e) * dim], n, dim);
      for (int i = 0; i < n; ++i) {
        const float w = chosen_w_[size_t(u[i])];
        float* dst = &moe_out_[static_cast<size_t>(u[i]) * dim];
        const float* src = &moe_in_[static_cast<size_t>(i) * dim];
        for (int j = 0; j < dim; ++j) dst[j] = src[j] * w;
      }
    }
    for (int t = 0; t < m; ++t) {
      float* out = &xb_[static_cast<size_t>(t) * dim];
      const float* first = &moe_out_[static_cast<size_t>(t) * k * dim];
      std::copy(first, first + dim, out);
      for (int s = 1; s < k; ++s) {
        const float* o = first + static_cast<size_t>(s) * dim;
        for (int j = 0; j < dim; ++j) out[j] += o[j];
      }
    }
  }

  // xb_ = rmsnorm(xb_) with weight w, token by token (Gemma's post norms).
  void post_norm(const float* w, int m) {
    const int dim = cfg_.dim;
    for (int t = 0; t < m; ++t) {
      std::copy(&xb_[static_cast<size_t>(t) * dim], &xb_[static_cast<size_t>(t + 1) * dim], norm_tmp_.data());
      rmsnorm(&xb_[static_cast<size_t>(t) * dim], norm_tmp_.data(), w, dim, cfg_.rms_eps);
    }
  }

  static void add_rows(float* x, const float* bias, int m, int width) {
    for (int t = 0; t < m; ++t)
      for (int i = 0; i < width; ++i) x[static_cast<size_t>(t) * width + i] += bias[i];
  }

  // K smoothing (src/k_smoothing.h): K becomes (k - shift) * k_mul and each
  // query head of the KV head's group q * q_mul, so q . k changes only by a
  // per-query constant that softmax ignores.
  void smooth_qk(const float* params, int m) {
    const ModelConfig& c = cfg_;
    const int kv_dim = c.kv_dim(), q_dim = c.q_dim(), group = c.n_heads / c.n_kv_heads;
    const float* shift = params;
    const float* k_mul = params + kv_dim;
    const float* q_mul = params + 2 * kv_dim;
    for (int t = 0; t < m; ++t) {
      float* k = &k_[static_cast<size_t>(t) * kv_dim];
      float* q = &q_[static_cast<size_t>(t) * q_dim];
      for (int ch = 0; ch < kv_dim; ++ch) k[ch] = (k[ch] - shift[ch]) * k_mul[ch];
      for (int h = 0; h < c.n_heads; ++h)
        for (int d = 0; d < c.head_dim; ++d) q[h * c.head_dim + d] *= q_mul[(h / group) * c.head_dim + d];
    }
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
    if (c.moe()) {
      const size_t k = static_cast<size_t>(c.n_expert_used);
      // An expert may serve every token of the step: its FFN buffers hold m rows.
      grow(gate_, static_cast<size_t>(m) * c.expert_hidden_dim);
      grow(up_, static_cast<size_t>(m) * c.expert_hidden_dim);
      grow(router_, static_cast<size_t>(m) * c.n_expert);
      grow(route_tmp_, static_cast<size_t>(c.n_expert));
      grow(moe_in_, static_cast<size_t>(m) * c.dim);
      grow(moe_out_, static_cast<size_t>(m) * k * c.dim);
      grow(chosen_w_, static_cast<size_t>(m) * k);
      if (chosen_.size() < static_cast<size_t>(m) * k) chosen_.resize(static_cast<size_t>(m) * k);
    }
    if (c.fused_qkv) grow(qkv_, static_cast<size_t>(m) * (c.q_dim() + 2 * c.kv_dim()));
    if (c.fused_gate_up) grow(gate_up_, static_cast<size_t>(m) * 2 * c.hidden_dim);
    grow(norm_tmp_, static_cast<size_t>(c.dim));
    grow(up_, static_cast<size_t>(m) * c.hidden_dim);
    scores_.resize(pool_.size());
    for (auto& s : scores_) grow(s, static_cast<size_t>(c.n_heads) * (n_ctx_ + 1) + 2 * c.kv_dim());
  }

  const Model& model_;
  const ModelConfig& cfg_;
  ThreadPool pool_;
  KvLayout layout_;
  int n_ctx_ = 0;
  int n_batch_ = 512;
  std::vector<int> windows_;  // per layer, 0 = full attention (layer_windows)
  int block_size_ = 0;
  std::unique_ptr<BlockManager> blocks_;  // paged only
  KvType type_k_ = KvType::F32, type_v_ = KvType::F32;
  size_t row_bytes_k_ = 0, row_bytes_v_ = 0;  // one slot: n_kv_heads * head_dim elements, encoded
  int64_t n_slots_ = 0;
  std::unique_ptr<uint8_t[]> k_cache_;  // [n_layers, n_slots, row_bytes_k]
  std::unique_ptr<uint8_t[]> v_cache_;  // [n_layers, n_slots, row_bytes_v]
  std::vector<std::vector<float>> attn_norm_, ffn_norm_;
  std::vector<float> output_norm_;
  // Activations for a step of m tokens, row-major [m, width].
  std::vector<float> x_, xb_, q_, att_, k_, v_, gate_, up_, qkv_, gate_up_, norm_tmp_;
  // Mixture of experts: router logits [m, n_expert], routing scratch, one
  // expert's gathered inputs / outputs [m, dim], each (token, slot)'s weighted
  // output [m, k, dim], the chosen experts and their weights [m, k].
  std::vector<float> router_, route_tmp_, moe_in_, moe_out_, chosen_w_;
  std::vector<int32_t> chosen_;
  // Small per-layer weights decoded once: q, k, v biases; q and k norms;
  // attention and FFN post norms.
  std::vector<std::array<std::vector<float>, 3>> bias_;
  std::vector<std::array<std::vector<float>, 2>> qk_norm_, post_norm_;
  std::vector<std::vector<float>> out_bias_, sinks_;  // attention output bias, sinks (gpt-oss)
  // Router bias, then the experts' gate, up and down biases, all experts' rows in a row.
  std::vector<std::array<std::vector<float>, 4>> moe_bias_;
  std::vector<float> rope_factors_;  // the divisors in use (rope_freqs, or longrope's long or short), or empty
  std::vector<RopeSpec> rope_;       // per layer
  bool plain_rope_ = true;           // the Llama rotation: rope() exactly as before the description existed
  QkStats* qk_stats_ = nullptr;  // set_qk_stats
  KSmoothing k_smoothing_;       // set_k_smoothing; empty = none
  std::vector<std::vector<float>> scores_;  // per thread: attention scratch (see attention_one_token)
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<CpuEngine>(model, options);
}

}  // namespace runlm
