// Mixture-of-experts kernels beside the expert GEMVs (moe_ops.h): routing,
// the experts' gated activation, the weighted sum of the chosen experts'
// outputs, the grouping of (token, slot) pairs by expert (and its chunks)
// and the gathers of x into the grouped order. Every one is an ordinary
// launch that allocates nothing and reads its sizes from arguments:
// graph-capturable.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>

#include "cuda/common.cuh"
#include "cuda/moe_ops.h"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

namespace {

constexpr int kRouteWarps = 4;
constexpr int kScoresPerLane = kMaxMoeExperts / 32;

// (score, index) of the better of two: the larger score, the lower index on
// a tie (ggml_argsort_top_k and moe_route's partial_sort order).
__device__ __forceinline__ bool better(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// One warp per token: lane l holds the scores of experts l, l + 32, ...;
// k rounds of a warp argmax pick the top k in moe_route's order. Softmaxes
// as kernels/cpu/ops.cpp softmax: max, exp(x - max), the sum in double,
// one float reciprocal.
__global__ void __launch_bounds__(kRouteWarps * 32)
    moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, MoeRoute r, int m,
                     int32_t* __restrict__ experts, float* __restrict__ weights) {
  const int t = blockIdx.x * kRouteWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (t >= m) return;
  const float* row = logits + int64_t(t) * r.n_expert;
  float s[kScoresPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kScoresPerLane; ++j) {
    const int e = lane + 32 * j;
    s[j] = -INFINITY;
    if (e < r.n_expert) {
      s[j] = row[e];
      if (bias) s[j] += bias[e];
      mx = fmaxf(mx, s[j]);
    }
  }
  if (r.softmax_first) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
#pragma unroll
    for (int j = 0; j < kScoresPerLane; ++j)
      if (lane + 32 * j < r.n_expert) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = static_cast<float>(1.0 / sum);
#pragma unroll
    for (int j = 0; j < kScoresPerLane; ++j) s[j] *= inv;
  }
  // The top k, best first; the chosen drop out (-inf and a taken mark).
  float w_lane = 0.0f;  // lane k < n_used keeps slot k's weight
  int e_lane = 0;
  unsigned taken = 0;  // bit j: expert lane + 32 j chosen
  for (int k = 0; k < r.n_used; ++k) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int j = 0; j < kScoresPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < r.n_expert && !(taken >> j & 1u) && (bi == INT_MAX || better(s[j], e, bv, bi))) {
        bv = s[j];
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi != INT_MAX && (bi == INT_MAX || better(ov, oi, bv, bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (bi % 32 == lane) taken |= 1u << (bi / 32);
    if (lane == k) {
      w_lane = bv;
      e_lane = bi;
    }
  }
  // Lanes 0..k-1 hold the chosen; the weights' finishing steps in lane 0,
  // in moe_route's order of operations.
  __shared__ float ws[kRouteWarps][32];
  float* w = ws[threadIdx.x >> 5];
  w[lane] = w_lane;
  __syncwarp();
  if (lane == 0) {
    const int k = r.n_used;
    if (!r.softmax_first) {
      float wmx = w[0];
      for (int i = 1; i < k; ++i) wmx = fmaxf(wmx, w[i]);
      double sum = 0;
      for (int i = 0; i < k; ++i) {
        w[i] = expf(w[i] - wmx);
        sum += w[i];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int i = 0; i < k; ++i) w[i] *= inv;
    }
    if (r.normalize) {
      double sum = 0;
      for (int i = 0; i < k; ++i) sum += w[i];
      const float d = fmaxf(static_cast<float>(sum), 6.103515625e-5f);
      for (int i = 0; i < k; ++i) w[i] /= d;
    }
    if (r.scale != 1.0f)
      for (int i = 0; i < k; ++i) w[i] *= r.scale;
  }
  __syncwarp();
  if (lane < r.n_used) {
    experts[int64_t(t) * r.n_used + lane] = e_lane;
    weights[int64_t(t) * r.n_used + lane] = w[lane];
  }
}

// One value of the experts' activation, bias added first (as the CPU's
// add_rows, then swiglu / swiglu_oai of kernels/cpu/ops.cpp).
__device__ __forceinline__ float moe_act_value(float g, float u, const MoeActivation& a) {
  if (!a.oai) return swiglu_value(g, u);
  g = fminf(g, a.limit);
  u = fminf(fmaxf(u, -a.limit), a.limit);
  return g / (1.0f + expf(a.alpha * (-g))) * (u + 1.0f);
}

__device__ __forceinline__ float moe_act_at(const float* gate, const float* up, const float* gate_b, const float* up_b,
                                            const int32_t* expert_of_row, int64_t n_cols, int64_t i,
                                            const MoeActivation& a) {
  const int64_t r = i / n_cols, c = i - r * n_cols;
  float g = gate[i], u = up[i];
  if (gate_b || up_b) {
    const int64_t e = expert_of_row[r];
    if (gate_b) g += gate_b[e * n_cols + c];
    if (up_b) u += up_b[e * n_cols + c];
  }
  return moe_act_value(g, u, a);
}

__global__ void moe_activation_kernel(float* gate, const float* __restrict__ up, const float* __restrict__ gate_b,
                                      const float* __restrict__ up_b, const int32_t* __restrict__ expert_of_row,
                                      int64_t n, int64_t n_cols, MoeActivation a, __half* out_f16) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = moe_act_at(gate, up, gate_b, up_b, expert_of_row, n_cols, i, a);
    gate[i] = v;
    if (out_f16) out_f16[i] = __float2half_rn(v);
  }
}

// A warp per 32-value block (n_cols % 32 == 0), quantized as swiglu_x8.
__global__ void moe_activation_x8_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                         const float* __restrict__ gate_b, const float* __restrict__ up_b,
                                         const int32_t* __restrict__ expert_of_row, int64_t n, int64_t n_cols,
                                         MoeActivation a, int8_t* q, float2* ds) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); b * 32 < n; b += warps) {
    const int64_t i = b * 32 + lane;
    const float v = moe_act_at(gate, up, gate_b, up_b, expert_of_row, n_cols, i, a);
    warp_quantize_x8(v, q + i, ds + b);
  }
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ row_of_pair,
                                   const int32_t* __restrict__ experts, const float* __restrict__ weights,
                                   const float* __restrict__ down_b, int m, int k, int dim, float* __restrict__ out) {
  const int64_t n = int64_t(m) * dim;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / dim, j = i - t * dim;
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) {
      const int64_t p = t * k + s;
      const int64_t row = row_of_pair ? row_of_pair[p] : p;
      float v = y[row * dim + j];
      if (down_b) v += down_b[int64_t(experts[p]) * dim + j];
      const float wv = __fmul_rn(v, weights[p]);  // moe_out = src * w, then the slots summed in order
      acc = s == 0 ? wv : __fadd_rn(acc, wv);
    }
    out[i] = acc;
  }
}

// One block, a thread per expert: counts, an exclusive scan (of the rows
// and of the chunks), then each thread writes its pairs in pair order
// (stable, deterministic) and its chunks.
__global__ void moe_group_kernel(const int32_t* __restrict__ experts, int n_pairs, int n_expert,
                                 int32_t* __restrict__ offsets, int32_t* __restrict__ perm,
                                 int32_t* __restrict__ expert_of_row, int32_t* __restrict__ row_of_pair,
                                 MoeChunk* __restrict__ chunks, int32_t* __restrict__ n_chunks) {
  __shared__ int start[kMaxMoeExperts + 1];
  __shared__ int first_chunk[kMaxMoeExperts + 1];
  const int e = threadIdx.x;
  int count = 0;
  if (e < n_expert)
    for (int p = 0; p < n_pairs; ++p) count += experts[p] == e;
  if (e < n_expert) start[e + 1] = count;
  __syncthreads();
  if (e == 0) {
    start[0] = 0;
    first_chunk[0] = 0;
    for (int i = 1; i <= n_expert; ++i) {
      const int c = start[i];
      start[i] += start[i - 1];
      first_chunk[i] = first_chunk[i - 1] + (c + kMaxChunkPairs - 1) / kMaxChunkPairs;
    }
    if (n_chunks) *n_chunks = first_chunk[n_expert];
  }
  __syncthreads();
  if (e <= n_expert) offsets[e] = start[e];
  if (e >= n_expert) return;
  int at = start[e];
  for (int p = 0; p < n_pairs; ++p)
    if (experts[p] == e) {
      perm[at] = p;
      expert_of_row[at] = e;
      row_of_pair[p] = at;
      ++at;
    }
  if (chunks)
    for (int c = first_chunk[e], row = start[e]; row < start[e + 1]; ++c, row += kMaxChunkPairs)
      chunks[c] = MoeChunk{e, row, min(kMaxChunkPairs, start[e + 1] - row)};
}

// A warp per 32-value block of the output (cols % 32 == 0, so a block lies
// in one row), quantized as quantize_x8_kernel.
__global__ void moe_gather_x8_kernel(const float* __restrict__ x, const int32_t* __restrict__ perm, int div,
                                     int64_t n, int64_t cols, int8_t* __restrict__ q, float2* __restrict__ ds) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  const int lane = threadIdx.x & 31;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); b * 32 < n; b += warps) {
    const int64_t i = b * 32 + lane, r = i / cols, c = i - r * cols;
    warp_quantize_x8(x[int64_t(perm[r] / div) * cols + c], q + i, ds + b);
  }
}

__global__ void gather_rows_f16_kernel(const __half* __restrict__ src, const int32_t* __restrict__ idx, int div,
                                       int n, int width, __half* __restrict__ dst) {
  const int64_t total = int64_t(n) * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i - r * width;
    dst[i] = src[int64_t(idx[r] / div) * width + c];
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

}  // namespace

void moe_route(const float* logits, const float* bias, const MoeRoute& r, int m, int32_t* experts, float* weights,
               Stream stream) {
  RUNLM_CHECK(r.n_expert >= 1 && r.n_expert <= kMaxMoeExperts, "moe_route: %d experts; supported: 1..%d",
              r.n_expert, kMaxMoeExperts);
  RUNLM_CHECK(r.n_used >= 1 && r.n_used <= r.n_expert && r.n_used <= 32, "moe_route: %d of %d experts", r.n_used,
              r.n_expert);
  if (m <= 0) return;
  moe_route_kernel<<<(m + kRouteWarps - 1) / kRouteWarps, kRouteWarps * 32, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, bias, r, m, experts, weights);
  cudaCheckLaunch();
}

void moe_activation(float* gate, const float* up, const float* gate_b, const float* up_b,
                    const int32_t* expert_of_row, int n_rows, int64_t n_cols, const MoeActivation& act,
                    uint16_t* out_f16, Stream stream) {
  RUNLM_CHECK(!(gate_b || up_b) || expert_of_row, "moe_activation: biases need the rows' experts");
  const int64_t n = int64_t(n_rows) * n_cols;
  if (n <= 0) return;
  moe_activation_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gate, up, gate_b, up_b, expert_of_row, n, n_cols, act, reinterpret_cast<__half*>(out_f16));
  cudaCheckLaunch();
}

void moe_activation_x8(const float* gate, const float* up, const float* gate_b, const float* up_b,
                       const int32_t* expert_of_row, int n_rows, int64_t n_cols, const MoeActivation& act,
                       void* out_x8, Stream stream) {
  RUNLM_CHECK(!(gate_b || up_b) || expert_of_row, "moe_activation_x8: biases need the rows' experts");
  RUNLM_CHECK(n_cols > 0 && n_cols % kX8Block == 0, "moe_activation_x8: n_cols=%lld; needs a multiple of 32",
              static_cast<long long>(n_cols));
  const int64_t n = int64_t(n_rows) * n_cols;
  if (n <= 0) return;
  moe_activation_x8_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gate, up, gate_b, up_b, expert_of_row, n, n_cols, act, x8_q(out_x8), x8_ds(out_x8, n_rows, n_cols));
  cudaCheckLaunch();
}

void moe_combine(const float* y, const int32_t* row_of_pair, const int32_t* experts, const float* weights,
                 const float* down_b, int m, int k, int dim, float* out, Stream stream) {
  RUNLM_CHECK(k >= 1, "moe_combine: k=%d", k);
  const int64_t n = int64_t(m) * dim;
  if (n <= 0) return;
  moe_combine_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(y, row_of_pair, experts,
                                                                                         weights, down_b, m, k, dim, out);
  cudaCheckLaunch();
}

void moe_group(const int32_t* experts, int n_pairs, int n_expert, int32_t* offsets, int32_t* perm,
               int32_t* expert_of_row, int32_t* row_of_pair, MoeChunk* chunks, int32_t* n_chunks, Stream stream) {
  RUNLM_CHECK(n_expert >= 1 && n_expert <= kMaxMoeExperts, "moe_group: %d experts; supported: 1..%d", n_expert,
              kMaxMoeExperts);
  RUNLM_CHECK((chunks == nullptr) == (n_chunks == nullptr), "moe_group: chunks and their count go together");
  moe_group_kernel<<<1, kMaxMoeExperts + 32, 0, static_cast<cudaStream_t>(stream)>>>(
      experts, n_pairs, n_expert, offsets, perm, expert_of_row, row_of_pair, chunks, n_chunks);
  cudaCheckLaunch();
}

void moe_gather_x8(const float* x, const int32_t* perm, int div, int n_rows, int64_t cols, void* out_x8,
                   Stream stream) {
  RUNLM_CHECK(div >= 1, "moe_gather_x8: div=%d", div);
  RUNLM_CHECK(cols > 0 && cols % kX8Block == 0, "moe_gather_x8: cols=%lld; needs a multiple of 32",
              static_cast<long long>(cols));
  const int64_t n = int64_t(n_rows) * cols;
  if (n <= 0) return;
  moe_gather_x8_kernel<<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, perm, div, n, cols, x8_q(out_x8), x8_ds(out_x8, n_rows, cols));
  cudaCheckLaunch();
}

void gather_rows_f16(const uint16_t* src, const int32_t* idx, int div, int n, int width, uint16_t* dst,
                     Stream stream) {
  RUNLM_CHECK(div >= 1, "gather_rows_f16: div=%d", div);
  const int64_t total = int64_t(n) * width;
  if (total <= 0) return;
  gather_rows_f16_kernel<<<blocks_for(total), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __half*>(src), idx, div, n, width, reinterpret_cast<__half*>(dst));
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
