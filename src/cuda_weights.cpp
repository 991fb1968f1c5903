#ifdef RUNLM_CUDA

#include "cuda_weights.h"

#include <climits>
#include <cstring>

#include "common.h"
#include "ops.h"

namespace runlm {

namespace {

// Uploads w as a rows x cols matrix, zero-padded where it is smaller. The
// feed-forward width is padded to a multiple of 8 (the GPU layout of plain
// float types needs it): the extra gate/up rows give silu(0) * 0 = 0 and the
// extra down columns multiply those zeros, so the result is exact.
gpu::GpuMatrix upload_padded(const WeightView& w, int64_t rows, int64_t cols) {
  if (rows == w.ne1 && cols == w.ne0) return gpu::upload_matrix(qmatrix(w));
  const size_t row_bytes = dtype_row_bytes(w.type, cols);
  std::vector<uint8_t> buf(row_bytes * static_cast<size_t>(rows), 0);  // zero bits are 0.0 in every plain type
  for (int64_t r = 0; r < w.ne1; ++r) std::memcpy(buf.data() + r * row_bytes, w.row(r), w.row_bytes);
  return gpu::upload_matrix(QMatrix{w.type, buf.data(), row_bytes, cols, rows});
}

// Every row of v (a vector, or an [n_expert, rows] bias table), as f32.
void upload_vector_into(const WeightView& v, DeviceBuffer<float>& dst) {
  const int64_t n_rows = v.ne1 * v.ne2;
  std::vector<float> host(static_cast<size_t>(v.ne0 * n_rows));
  for (int64_t r = 0; r < n_rows; ++r) get_row(qmatrix(v), r, &host[static_cast<size_t>(r * v.ne0)]);
  dst.allocate(host.size());
  check(cudaMemcpy(dst.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
}

// Rows [first, first + n) of w.
WeightView row_slice(const WeightView& w, int64_t first, int64_t n, const char* part) {
  RUNLM_CHECK(first >= 0 && first + n <= w.ne1, "%s: %lld rows, the %s needs rows [%lld, %lld)", w.name.c_str(),
              static_cast<long long>(w.ne1), part, static_cast<long long>(first), static_cast<long long>(first + n));
  WeightView s = w;
  s.name = w.name + " (" + part + ")";
  s.data = w.row(first);
  s.ne1 = n;
  return s;
}

}  // namespace

QMatrix expert_qmatrix(const WeightView& w) { return qmatrix(w.expert(0)); }

gpu::GpuExperts upload_experts(const WeightView& w) {
  RUNLM_CHECK(w.ne2 >= 1 && w.ne2 <= INT32_MAX, "%s: %lld experts", w.name.c_str(), static_cast<long long>(w.ne2));
  return gpu::upload_experts(expert_qmatrix(w), static_cast<int>(w.ne2), w.row_bytes * static_cast<size_t>(w.ne1));
}

LayerMatrices layer_matrices(const ModelConfig& c, const LayerWeights& lw) {
  LayerMatrices m;
  if (c.fused_qkv) {
    m.wq = row_slice(lw.wqkv, 0, c.q_dim(), "q part");
    m.wk = row_slice(lw.wqkv, c.q_dim(), c.kv_dim(), "k part");
    m.wv = row_slice(lw.wqkv, int64_t{c.q_dim()} + c.kv_dim(), c.kv_dim(), "v part");
  } else {
    m.wq = lw.wq;
    m.wk = lw.wk;
    m.wv = lw.wv;
  }
  m.wo = lw.wo;
  if (c.fused_gate_up) {
    m.w_gate = row_slice(lw.w_up, 0, c.hidden_dim, "gate part");
    m.w_up = row_slice(lw.w_up, c.hidden_dim, c.hidden_dim, "up part");
  } else {
    m.w_gate = lw.w_gate;
    m.w_up = lw.w_up;
  }
  m.w_down = lw.w_down;
  return m;
}

void upload_gpu_weights(const Model& model, GpuWeights& gw) {
  const ModelConfig& cfg = model.config();
  const ModelWeights& w = model.weights();
  gw.hidden = padded_hidden(cfg);
  gw.tok_embd = gpu::upload_matrix(qmatrix(w.tok_embd));
  gw.output = cfg.tied_embeddings ? gw.tok_embd : gpu::upload_matrix(qmatrix(w.output));
  upload_vector_into(w.output_norm, gw.output_norm);
  gw.layers.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    const LayerMatrices lm = layer_matrices(cfg, lw);
    GpuLayer& g = gw.layers[l];
    g.wq = gpu::upload_matrix(qmatrix(lm.wq));
    g.wk = gpu::upload_matrix(qmatrix(lm.wk));
    g.wv = gpu::upload_matrix(qmatrix(lm.wv));
    g.wo = gpu::upload_matrix(qmatrix(lm.wo));
    if (cfg.moe()) {
      g.router = gpu::upload_matrix(qmatrix(lw.gate_inp));
      g.gate_exps = upload_experts(lw.gate_exps);
      g.up_exps = upload_experts(lw.up_exps);
      g.down_exps = upload_experts(lw.down_exps);
      if (cfg.moe_biases) {
        upload_vector_into(lw.gate_inp_b, g.router_b);
        upload_vector_into(lw.gate_exps_b, g.gate_exps_b);
        upload_vector_into(lw.up_exps_b, g.up_exps_b);
        upload_vector_into(lw.down_exps_b, g.down_exps_b);
      }
    } else {
      g.w_gate = upload_padded(lm.w_gate, gw.hidden, lm.w_gate.ne0);
      g.w_up = upload_padded(lm.w_up, gw.hidden, lm.w_up.ne0);
      g.w_down = upload_padded(lm.w_down, lm.w_down.ne1, gw.hidden);
    }
    upload_vector_into(lw.attn_norm, g.attn_norm);
    upload_vector_into(lw.ffn_norm, g.ffn_norm);
    if (cfg.qkv_bias) {
      upload_vector_into(lw.bq, g.bq);
      upload_vector_into(lw.bk, g.bk);
      upload_vector_into(lw.bv, g.bv);
    }
    if (cfg.attn_out_bias) upload_vector_into(lw.bo, g.bo);
    if (cfg.attn_sinks) upload_vector_into(lw.sinks, g.sinks);
    if (cfg.qk_norm) {
      upload_vector_into(lw.q_norm, g.q_norm);
      upload_vector_into(lw.k_norm, g.k_norm);
    }
    if (cfg.post_norms) {
      upload_vector_into(lw.attn_post_norm, g.attn_post_norm);
      upload_vector_into(lw.ffn_post_norm, g.ffn_post_norm);
    }
  }
}

void free_gpu_weights(GpuWeights& w, bool tied_embeddings) {
  for (auto& l : w.layers) {
    for (gpu::GpuMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.router})
      gpu::free_matrix(*m);
    for (gpu::GpuExperts* x : {&l.gate_exps, &l.up_exps, &l.down_exps}) gpu::free_experts(*x);
  }
  gpu::free_matrix(w.tok_embd);
  if (!tied_embeddings) gpu::free_matrix(w.output);
  w.output = gpu::GpuMatrix{};  // tied: the same allocation as tok_embd
}

}  // namespace runlm

#endif  // RUNLM_CUDA
