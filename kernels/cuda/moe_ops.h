// The GPU engine's mixture-of-experts operations (kernels/cuda/moe.cu,
// kernels/cuda/gemv_experts.cu, kernels/cuda/gemv_expert_groups.cu, the
// expert upload in gpu_weights.cu): expert weights in one allocation per
// tensor, routing, the per-pair expert GEMV of single-token decode, the
// grouping of (token, slot) pairs by expert and the grouped expert GEMV of
// longer steps, the experts' activation, and the weighted sum of their
// outputs. Asynchronous on `stream`, no allocation or synchronisation
// inside: graph-capturable.
#pragma once

#include <algorithm>

#include "cuda/gpu_ops.h"

namespace runlm::gpu {

// The n experts of a 3-D GGUF weight ([n][rows][cols]) in one allocation:
// expert e is a GpuMatrix of `rows` x `cols` at data + e * stride, each in
// upload_matrix's layout (a GGUF type quantizes along rows, so an expert's
// matrix is a contiguous run of rows and stays in its type: no f16 copy).
struct GpuExperts {
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;  // of one expert
  int n = 0;
  size_t stride = 0;           // bytes from one expert to the next
  void* data = nullptr;
  size_t bytes = 0;
};
// host: expert 0 as a QMatrix; expert e's rows start host_stride * e bytes
// after host.data. Throws as upload_matrix does.
GpuExperts upload_experts(const QMatrix& host, int n_expert, size_t host_stride);
GpuMatrix expert_matrix(const GpuExperts& x, int e);  // a view, not to be freed
void free_experts(GpuExperts& x);

// How a router turns one token's logits into its experts and their weights
// (kernels/cpu/moe_routing.h MoeRouting, the same fields).
struct MoeRoute {
  int n_expert = 0, n_used = 0;
  bool softmax_first = true;
  bool normalize = false;
  float scale = 1.0f;
};
constexpr int kMaxMoeExperts = 256;  // routing keeps a token's scores in a warp's registers
// Per token t < m: logits [m, n_expert] (+ bias [n_expert] when non-null)
// -> experts [m, n_used] (int32, descending score, ties to the lower index)
// and weights [m, n_used], as kernels/cpu/moe_routing's moe_route.
void moe_route(const float* logits, const float* bias, const MoeRoute& r, int m, int32_t* experts, float* weights,
               Stream stream);

// The expert GEMV of decode: for each out i (1 or 2 expert sets of one type
// and shape, gate and up), each pair p < n_pairs and row r:
//   y_i[p, r] = sum_c W_i[experts[p]][r, c] * x[p / x_div, c],
// reading only the chosen experts' rows; the expert id is read from device
// memory (graph-capturable). x is int8 (x8_bytes(x_rows, cols)) for the
// gemv_x8 types, f32 [x_rows, cols] for f32 / f16 / bf16.
struct ExpertGemvOut {
  const GpuExperts* w;
  float* y;
};
constexpr int kMaxExpertGemvOuts = 2;
void expert_gemv_x8(const ExpertGemvOut* outs, int n_outs, const void* x8, int x_rows, const int32_t* experts,
                    int n_pairs, int x_div, Stream stream);
void expert_gemv_f32(const ExpertGemvOut* outs, int n_outs, const float* x, const int32_t* experts, int n_pairs,
                     int x_div, Stream stream);
bool expert_gemv_f32_supports(DType t);  // f32, f16, bf16

// The experts' gated activation on rows of [n_rows, n_cols] whose expert is
// expert_of_row[r]: g = gate + gate_b[e], u = up + up_b[e] (biases [n_expert,
// n_cols] where non-null), then silu(g) * u, or with oai gpt-oss's clamped
// SwiGLU (kernels/cpu/ops.h swiglu_oai: alpha, limit). Written as f32 into
// gate, and as f16 into out_f16 (when non-null).
struct MoeActivation {
  bool oai = false;
  float alpha = 1.702f, limit = 7.0f;
};
void moe_activation(float* gate, const float* up, const float* gate_b, const float* up_b,
                    const int32_t* expert_of_row, int n_rows, int64_t n_cols, const MoeActivation& act,
                    uint16_t* out_f16, Stream stream);
// The same written only as int8 x for gemv_x8 (out_x8, x8_bytes(n_rows,
// n_cols), n_cols % 32 == 0).
void moe_activation_x8(const float* gate, const float* up, const float* gate_b, const float* up_b,
                       const int32_t* expert_of_row, int n_rows, int64_t n_cols, const MoeActivation& act,
                       void* out_x8, Stream stream);

// out[t, :] = sum over slots s < k, in slot order, of weights[t, s] *
// (y[row, :] + down_b[experts[t, s], :]) with row = t * k + s, or
// row_of_pair[t * k + s] when non-null (the grouped path's order). y
// [*, dim]; down_b [n_expert, dim] or null; out [m, dim].
void moe_combine(const float* y, const int32_t* row_of_pair, const int32_t* experts, const float* weights,
                 const float* down_b, int m, int k, int dim, float* out, Stream stream);

// A run of grouped rows [row, row + n) of one expert, 1 <= n <=
// kMaxChunkPairs: the unit of work of the grouped expert GEMV, which reads
// the expert's rows once for all n (the int8-x GEMV takes 1..16 tokens).
struct MoeChunk {
  int32_t expert, row, n;
};
constexpr int kMaxChunkPairs = 16;
// The most chunks n_pairs pairs over n_expert experts can make: each expert's
// pairs cut into ceil(count / 16) chunks, sum <= n_pairs / 16 + n_expert, and
// never more chunks than pairs. Launches are sized by this, not by the count
// the device computes, so no count comes to the host.
inline int moe_chunk_bound(int n_pairs, int n_expert) {
  return std::min(n_pairs, (n_pairs + kMaxChunkPairs - 1) / kMaxChunkPairs + n_expert);
}

// Groups the n_pairs (token, slot) pairs by expert, stably: offsets
// [n_expert + 1] (pairs of expert e at [offsets[e], offsets[e+1])), perm
// [n_pairs] (the pair at each grouped row), expert_of_row [n_pairs],
// row_of_pair [n_pairs] (perm's inverse); with non-null chunks
// [moe_chunk_bound] and n_chunks [1], each expert's rows cut into chunks of
// kMaxChunkPairs (the last one shorter), in expert order, and their count.
// One block.
void moe_group(const int32_t* experts, int n_pairs, int n_expert, int32_t* offsets, int32_t* perm,
               int32_t* expert_of_row, int32_t* row_of_pair, MoeChunk* chunks, int32_t* n_chunks, Stream stream);
// Grouped row i of out_x8 (x8_bytes(n_rows, cols), cols % 32 == 0) = token
// perm[i] / div's row of x (f32 [*, cols]) quantized as quantize_x8 does:
// the grouped expert GEMV's int8 x, the same bytes as quantize_x8's.
void moe_gather_x8(const float* x, const int32_t* perm, int div, int n_rows, int64_t cols, void* out_x8,
                   Stream stream);
// The grouped expert GEMV: for each out i (1 or 2 expert sets of one type
// and shape, a gemv_x8 type), each chunk c < *n_chunks (device memory) and
// each row r:
//   y_i[row, r] = sum_c W_i[chunk.expert][r, c] * x[row, c]
// for the chunk's grouped rows, each CTA reading its chunk's expert rows
// once for all of them. x int8 (x8_bytes(x_rows, cols)); y [x_rows, rows].
// The grid covers max_chunks chunks (moe_chunk_bound); CTAs past the real
// count exit at once.
void grouped_expert_gemv_x8(const ExpertGemvOut* outs, int n_outs, const void* x8, int x_rows,
                            const MoeChunk* chunks, const int32_t* n_chunks, int max_chunks, Stream stream);
// dst[i, :] = src[idx[i] / div, :] for i < n, f16 rows of `width`.
void gather_rows_f16(const uint16_t* src, const int32_t* idx, int div, int n, int width, uint16_t* dst,
                     Stream stream);

}  // namespace runlm::gpu
