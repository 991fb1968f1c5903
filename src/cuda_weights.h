// The CUDA engine's weights on the device: each matrix uploaded once in its
// GGUF type (repacked for 16-byte loads, kernels/cuda/gpu_ops.h), the norms
// as f32, the feed-forward width padded to a multiple of 8.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/gpu_ops.h"
#include "cuda/moe_ops.h"
#include "cuda_device_buffer.h"
#include "model.h"
#include "weight_matrix.h"

namespace runlm {

// Projections of one x that run as one batched GEMM (gpu::gemm_batched):
// where their n weight, n x and n y pointers start in the engine's pointer
// table; n = 0 when the matrices do not qualify (then one gemm each).
struct GemmGroup {
  size_t at = 0;
  int n = 0;
  int64_t rows = 0, cols = 0;
};

struct GpuLayer {
  gpu::GpuMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  DeviceBuffer<float> attn_norm, ffn_norm;
  // Present where the model's layer has them (ModelConfig's flags), else empty.
  DeviceBuffer<float> bq, bk, bv;                     // qkv_bias
  DeviceBuffer<float> bo;                             // attn_out_bias, [dim]
  DeviceBuffer<float> sinks;                          // attn_sinks, [n_heads]
  DeviceBuffer<float> q_norm, k_norm;                 // qk_norm, [head_dim]
  DeviceBuffer<float> attn_post_norm, ffn_post_norm;  // post_norms
  GemmGroup qkv, kv, gate_up;  // kv: when q's shape differs (GQA)
  // Mixture of experts (ModelConfig::moe(), in place of w_gate, w_up,
  // w_down): the router [n_expert, dim] in its GGUF type, the experts in
  // theirs (one allocation each, gpu::GpuExperts), and where the model has
  // them (moe_biases) the router bias [n_expert] and the experts' biases
  // [n_expert, rows] as f32.
  gpu::GpuMatrix router;
  gpu::GpuExperts gate_exps, up_exps, down_exps;
  DeviceBuffer<float> router_b, gate_exps_b, up_exps_b, down_exps_b;
};

// The feed-forward width the GPU uses: a multiple of 8 (see upload_padded).
inline int64_t padded_hidden(const ModelConfig& c) { return (c.hidden_dim + 7) / 8 * 8; }

struct GpuWeights {
  int64_t hidden = 0;  // feed-forward width on the GPU (padded_hidden)
  gpu::GpuMatrix tok_embd, output;  // output is tok_embd for tied embeddings
  DeviceBuffer<float> output_norm;
  std::vector<GpuLayer> layers;
};


// A layer's seven projection matrices as the GPU holds them. A fused
// attn_qkv (q rows, then k, then v) and a fused ffn_up (gate rows, then up)
// are split into their parts by rows: every GGUF type quantizes along a row,
// so a run of rows is a matrix of the type on its own. Split once at upload,
// they take the same GEMV/GEMM paths and batched groups as separate
// matrices, with no strided outputs or split kernels at run time.
struct LayerMatrices {
  WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
};
LayerMatrices layer_matrices(const ModelConfig& c, const LayerWeights& lw);

// A 3-D expert weight ([n_expert] x [rows, cols] as GGUF stores it): expert
// 0 as the host view the upload takes (the others follow every ne1 rows),
// and its upload as one gpu::GpuExperts.
QMatrix expert_qmatrix(const WeightView& w);
gpu::GpuExperts upload_experts(const WeightView& w);

// Uploads every weight of the model into gw. Throws when the device runs out
// of memory; what was uploaded so far stays in gw, for free_gpu_weights.
void upload_gpu_weights(const Model& model, GpuWeights& gw);
void free_gpu_weights(GpuWeights& w, bool tied_embeddings);

}  // namespace runlm
