// Small fused ops of the forward pass: embedding lookup (any weight type,
// optionally scaled), RMSNorm (a front for norm_quant.cu's kernel), q/k/v
// biases with the per-head q/k RMSNorm, RoPE fused with the KV-cache store,
// SwiGLU and GeGLU, the logit soft-cap, f32 -> f16, the residual add and a
// bias added to every row (attn_output.bias). Each is one pass over its data;
// all are memory-bound and simple, checked against kernels/cpu.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/kv_codec.cuh"
#include "cuda/rope.cuh"
#include "paged_kv.h"

namespace runlm::gpu {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int per_thread = 1) {
  const int64_t b = (n + int64_t(kThreads) * per_thread - 1) / (int64_t(kThreads) * per_thread);
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

// ---- embed_rows ---------------------------------------------------------

// One thread per (token, unit). A token id outside the table writes NaN: the
// engine validates ids on the host; NaN makes a slip visible, not silent.
template <DType kT>
__global__ void embed_kernel(WView w, const int* __restrict__ tokens, int n, float* __restrict__ out, float scale) {
  using C = Codec<kT>;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * w.units) return;
  const int t = static_cast<int>(i / w.units);
  const int u = static_cast<int>(i % w.units);
  const int tok = tokens[t];
  float* o = out + int64_t(t) * w.cols;
  if (tok < 0 || tok >= w.rows) {
    for (int g = 0; g < C::kUnit / 4; ++g)
      *reinterpret_cast<float4*>(o + C::x_off(u, g)) = make_float4(NAN, NAN, NAN, NAN);
    return;
  }
  const typename C::Raw raw = C::load(w, tok, u);
  const float sc = C::scale(raw);  // times 1 (exact) unless the model scales its embeddings
#pragma unroll
  for (int g = 0; g < C::kUnit / 4; ++g) {
    const float4 v = C::decode(raw, g);
    *reinterpret_cast<float4*>(o + C::x_off(u, g)) =
        make_float4(v.x * sc * scale, v.y * sc * scale, v.z * sc * scale, v.w * sc * scale);
  }
}

// ---- rope_and_store_kv ----------------------------------------------------

// Grid (token, slice): the gridDim.y blocks of a token split its q pairs,
// K/V pairs (or K/V blocks of 32) between them, about one per thread, so the
// loads of a token all go out at once. (One block per token
// looping over all heads: at one token, ~16 dependent round trips a loop,
// 20 us per decode call under ncu.) Each block computes the sin/cos table it
// needs (rope.cuh).
__global__ void rope_store_kernel(float* q, const float* __restrict__ k, const float* __restrict__ v,
                                  const int* __restrict__ pos, const int* __restrict__ slots, int n_heads,
                                  int n_kv_heads, int head_dim, RopeTable rope, void* k_cache, void* v_cache,
                                  KvType k_type, KvType v_type, int block_size, __half* q_out,
                                  const float* __restrict__ smooth) {
  __shared__ float cs[kMaxRopePairs][2];
  const int t = blockIdx.x;
  const int p = pos[t];
  const int pairs = head_dim / 2;
  for (int i = threadIdx.x; i < rope.n_rot / 2; i += blockDim.x) {
    const float2 c_s = rope_cos_sin(p, rope, i);
    cs[i][0] = c_s.x;
    cs[i][1] = c_s.y;
  }
  __syncthreads();  // cs is read by every thread below
  const int64_t q_row = int64_t(t) * n_heads * head_dim;
  const int first = blockIdx.y * blockDim.x, stride = gridDim.y * blockDim.x;  // this block's slice
  // K smoothing (src/k_smoothing.h): [shift, k_mul, q_mul, k_weight] x kv_dim of this layer.
  const int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
  // Pair i of a head: elements (e0, e1), rotated or kept (rope_pair).
  for (int j = threadIdx.x + first; j < n_heads * pairs; j += stride) {
    const int h = j / pairs, i = j % pairs;
    int e0, e1;
    const bool rotated = rope_pair(rope, i, e0, e1);
    float* qh = q + q_row + h * head_dim;
    float2 r = make_float2(qh[e0], qh[e1]);
    if (rotated) r = rope_rotate(r.x, r.y, cs[i][0], cs[i][1]);
    if (smooth) {
      const float* q_mul = smooth + 2 * kv_dim + (h / group) * head_dim;
      r.x *= q_mul[e0];
      r.y *= q_mul[e1];
    }
    qh[e0] = r.x;
    qh[e1] = r.y;
    if (q_out) {
      q_out[q_row + h * head_dim + e0] = __float2half_rn(r.x);
      q_out[q_row + h * head_dim + e1] = __float2half_rn(r.y);
    }
  }
  const int64_t kv_row = int64_t(t) * n_kv_heads * head_dim;
  // The cache row is the token's slot (paged cache) or its position.
  const int64_t slot = slots ? slots[t] : p;
  if (k_type == KvType::F16 && v_type == KvType::F16) {
    __half* kc = static_cast<__half*>(k_cache) + slot * n_kv_heads * head_dim;
    __half* vc = static_cast<__half*>(v_cache) + slot * n_kv_heads * head_dim;
    for (int j = threadIdx.x + first; j < n_kv_heads * pairs; j += stride) {
      const int h = j / pairs, i = j % pairs;
      int e0, e1;
      const bool rotated = rope_pair(rope, i, e0, e1);
      const int64_t o0 = h * head_dim + e0, o1 = h * head_dim + e1;
      float2 r = make_float2(k[kv_row + o0], k[kv_row + o1]);
      if (rotated) r = rope_rotate(r.x, r.y, cs[i][0], cs[i][1]);
      if (smooth) {
        r.x = (r.x - smooth[o0]) * smooth[kv_dim + o0];
        r.y = (r.y - smooth[o1]) * smooth[kv_dim + o1];
      }
      kc[o0] = __float2half_rn(r.x);
      kc[o1] = __float2half_rn(r.y);
      vc[o0] = __float2half_rn(v[kv_row + o0]);
      vc[o1] = __float2half_rn(v[kv_row + o1]);
    }
    return;
  }
  // Other types: a warp per block of 32 values along head_dim (the
  // quantization block; head_dim % 32 == 0 is checked on the host), each lane
  // one value, encoded as kv_encode_row does (kernels/cuda/kv_codec.cuh) into
  // the pool layout of src/paged_kv.h.
  const KvPoolLayout lk = kv_pool_layout(k_type, block_size, n_kv_heads, head_dim);
  const KvPoolLayout lv = kv_pool_layout(v_type, block_size, n_kv_heads, head_dim);
  uint8_t* kq = static_cast<uint8_t*>(k_cache) + lk.quant_offset(slot);
  uint8_t* vq = static_cast<uint8_t*>(v_cache) + lv.quant_offset(slot);
  uint16_t* ks = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(k_cache) + lk.scale_offset(slot));
  uint16_t* vs = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(v_cache) + lv.scale_offset(slot));
  const int lane = threadIdx.x & 31;
  const int n_blocks = n_kv_heads * head_dim / 32;
  const int warps = blockDim.x >> 5;
  const int half = rope.n_rot / 2;
  for (int b = (threadIdx.x >> 5) + blockIdx.y * warps; b < n_blocks; b += warps * gridDim.y) {
    const int e = b * 32 + lane;  // element of the row (head e / head_dim)
    const int d = e % head_dim;   // its dimension in the head
    const int64_t head = kv_row + (e - d);
    float kr = k[kv_row + e];
    if (d < rope.n_rot) {
      // Its pair (rope_pair): i, and which of the two it is.
      const int i = rope.neox ? d % half : d / 2;
      const bool second = rope.neox ? d >= half : (d & 1);
      const int e0 = rope.neox ? i : 2 * i, e1 = rope.neox ? i + half : 2 * i + 1;
      const float2 r = rope_rotate(k[head + e0], k[head + e1], cs[i][0], cs[i][1]);
      kr = second ? r.y : r.x;
    }
    if (smooth) kr = (kr - smooth[e]) * smooth[kv_dim + e];
    const float k_weight = smooth ? smooth[3 * kv_dim + e] : 1.0f;
    kv_encode_block(k_type, kr, lane, kq + b * lk.q_row / n_blocks, ks + b, k_weight);
    kv_encode_block(v_type, v[kv_row + e], lane, vq + b * lv.q_row / n_blocks, vs + b);
  }
}

// ---- q/k/v biases and per-head q/k RMSNorm -----------------------------------

// One warp per head row of the step: the q heads, then the k heads, then the
// v heads of each token. bias added (when given), then q and k heads
// RMS-normed with their weight (when given): the CPU engine's order.
__global__ void qkv_bias_norm_kernel(float* q, float* k, float* v, const float* __restrict__ bq,
                                     const float* __restrict__ bk, const float* __restrict__ bv,
                                     const float* __restrict__ q_norm, const float* __restrict__ k_norm, int n,
                                     int n_heads, int n_kv_heads, int head_dim, float eps) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_token = n_heads + 2 * n_kv_heads;
  if (warp >= int64_t(n) * per_token) return;  // whole warps leave together
  const int t = static_cast<int>(warp / per_token);
  int h = static_cast<int>(warp % per_token);
  float* row;
  const float *bias, *norm;
  if (h < n_heads) {
    row = q + (int64_t(t) * n_heads + h) * head_dim;
    bias = bq ? bq + h * head_dim : nullptr;
    norm = q_norm;
  } else if ((h -= n_heads) < n_kv_heads) {
    row = k + (int64_t(t) * n_kv_heads + h) * head_dim;
    bias = bk ? bk + h * head_dim : nullptr;
    norm = k_norm;
  } else {
    h -= n_kv_heads;
    row = v + (int64_t(t) * n_kv_heads + h) * head_dim;
    bias = bv ? bv + h * head_dim : nullptr;
    norm = nullptr;
  }
  float ss = 0.0f;
  for (int e = lane; e < head_dim; e += 32) {
    float x = row[e];
    if (bias) x += bias[e];
    row[e] = x;
    ss = fmaf(x, x, ss);
  }
  if (!norm) return;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int e = lane; e < head_dim; e += 32) row[e] = row[e] * inv * norm[e];
}

// ---- elementwise ------------------------------------------------------------

__global__ void swiglu_kernel(float* gate, const float* __restrict__ up, __half* out_f16, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    const float r = g / (1.0f + expf(-g)) * up[i];  // expf, not __expf: matches the CPU to ~1 ulp
    gate[i] = r;
    if (out_f16) out_f16[i] = __float2half_rn(r);
  }
}

// gelu_tanh(gate) * up, the tanh approximation as kernels/cpu/ops.h geglu.
__device__ __forceinline__ float geglu_value(float g, float u) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCoef = 0.044715f;
  return 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * g * (1.0f + kCoef * g * g))) * u;
}

__global__ void geglu_kernel(float* gate, const float* __restrict__ up, __half* out_f16, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float r = geglu_value(gate[i], up[i]);
    gate[i] = r;
    if (out_f16) out_f16[i] = __float2half_rn(r);
  }
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = cap * tanhf(x[i] / cap);
}

__global__ void to_f16_kernel(const float* __restrict__ x, __half* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void add_bias_rows_kernel(float* x, const float* __restrict__ bias, int64_t n, int64_t cols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += bias[i % cols];
}

// Grid-stride kernels need no more blocks than fill the GPU several times.
unsigned elementwise_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

void embed_rows(const GpuMatrix& table, const int* tokens, int n, float* out, Stream stream, float scale) {
  RUNLM_CHECK(table.data != nullptr, "embed_rows: table not uploaded");
  if (n <= 0) return;
  const WView v = make_view(table);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = blocks_for(int64_t(n) * v.units);
  const bool ok = RUNLM_GPU_TYPE_SWITCH(table.type, KT, embed_kernel<KT><<<blocks, kThreads, 0, s>>>(v, tokens, n, out, scale);
                                        cudaCheckLaunch());
  RUNLM_CHECK(ok, "embed_rows: type %s unsupported; supported: %s", dtype_name(table.type), kGpuWeightTypes);
}

void rmsnorm(const float* x, const float* w, float* out_f32, uint16_t* out_f16, int n_rows, int n_cols, float eps,
             Stream stream) {
  // The kernel of norm_quant.cu; x is not written without an add.
  rmsnorm_fused(const_cast<float*>(x), nullptr, w, out_f32, out_f16, nullptr, n_rows, n_cols, eps, stream);
}

void rope_and_store_kv(float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                       int n_kv_heads, int head_dim, const RopeSpec& rope, uint16_t* k_cache, uint16_t* v_cache,
                       uint16_t* q_out, Stream stream) {
  rope_and_store_kv_slots(q, k, v, pos, nullptr, n, n_heads, n_kv_heads, head_dim, rope, k_cache, v_cache,
                          KvType::F16, KvType::F16, 1, q_out, stream, nullptr);
}

void rope_and_store_kv(float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                       int n_kv_heads, int head_dim, float theta, float freq_scale, uint16_t* k_cache,
                       uint16_t* v_cache, uint16_t* q_out, Stream stream) {
  rope_and_store_kv(q, k, v, pos, n, n_heads, n_kv_heads, head_dim, plain_rope(theta, freq_scale), k_cache, v_cache,
                    q_out, stream);
}

void rope_and_store_kv_slots(float* q, const float* k, const float* v, const int* pos, const int* slots, int n,
                             int n_heads, int n_kv_heads, int head_dim, float theta, float freq_scale,
                             void* k_cache, void* v_cache, KvType k_type, KvType v_type, int block_size,
                             uint16_t* q_out, Stream stream, const float* k_smoothing) {
  rope_and_store_kv_slots(q, k, v, pos, slots, n, n_heads, n_kv_heads, head_dim, plain_rope(theta, freq_scale),
                          k_cache, v_cache, k_type, v_type, block_size, q_out, stream, k_smoothing);
}

void rope_and_store_kv_slots(float* q, const float* k, const float* v, const int* pos, const int* slots, int n,
                             int n_heads, int n_kv_heads, int head_dim, const RopeSpec& rope, void* k_cache,
                             void* v_cache, KvType k_type, KvType v_type, int block_size, uint16_t* q_out,
                             Stream stream, const float* k_smoothing) {
  if (n <= 0) return;
  RUNLM_CHECK(head_dim % 2 == 0 && head_dim / 2 <= kMaxRopePairs,
              "rope_and_store_kv: head_dim=%d unsupported; supported: even, <= %d", head_dim, 2 * kMaxRopePairs);
  for (KvType t : {k_type, v_type}) {
    RUNLM_CHECK(kv_type_on_gpu(t),
                "rope_and_store_kv: KV type %s unsupported on the GPU; supported: f16, bf16, q8_0, q4_0, fp8",
                kv_type_name(t));
    RUNLM_CHECK(t == KvType::F16 || head_dim % 32 == 0,
                "rope_and_store_kv: head_dim=%d with KV type %s unsupported; types other than f16 need head_dim a "
                "multiple of 32",
                head_dim, kv_type_name(t));
  }
  RUNLM_CHECK(block_size >= 1, "rope_and_store_kv: block_size=%d", block_size);
  const RopeTable table = rope_table(head_dim, rope);
  // Slices per token: about one pair (or K/V value) per thread.
  constexpr int kRopeThreads = 128;
  const int pairs_max = std::max(n_heads, n_kv_heads) * head_dim / 2;
  const int slices = std::min(64, std::max(1, ceil_div(pairs_max, kRopeThreads)));
  rope_store_kernel<<<dim3(n, slices), kRopeThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, k, v, pos, slots, n_heads, n_kv_heads, head_dim, table, k_cache, v_cache, k_type, v_type, block_size,
      reinterpret_cast<__half*>(q_out), k_smoothing);
  cudaCheckLaunch();
}

void qkv_bias_head_norm(float* q, float* k, float* v, const float* bq, const float* bk, const float* bv,
                        const float* q_norm, const float* k_norm, int n, int n_heads, int n_kv_heads, int head_dim,
                        float eps, Stream stream) {
  if (n <= 0) return;
  RUNLM_CHECK(n_heads > 0 && n_kv_heads > 0 && head_dim > 0, "qkv_bias_head_norm: bad shape %d/%d heads of %d",
              n_heads, n_kv_heads, head_dim);
  const int64_t warps = int64_t(n) * (n_heads + 2 * n_kv_heads);
  constexpr int kWarpsPerBlock = kThreads / 32;
  qkv_bias_norm_kernel<<<static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(q, k, v, bq, bk, bv, q_norm, k_norm, n, n_heads,
                                                              n_kv_heads, head_dim, eps);
  cudaCheckLaunch();
}

void swiglu(float* gate, const float* up, uint16_t* out_f16, int64_t n, Stream stream) {
  if (n <= 0) return;
  swiglu_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gate, up, reinterpret_cast<__half*>(out_f16), n);
  cudaCheckLaunch();
}

void geglu(float* gate, const float* up, uint16_t* out_f16, int64_t n, Stream stream) {
  if (n <= 0) return;
  geglu_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gate, up, reinterpret_cast<__half*>(out_f16), n);
  cudaCheckLaunch();
}

void softcap(float* x, int64_t n, float cap, Stream stream) {
  if (n <= 0) return;
  RUNLM_CHECK(cap > 0, "softcap: cap=%g must be positive", static_cast<double>(cap));
  softcap_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, cap);
  cudaCheckLaunch();
}

void to_f16(const float* x, uint16_t* out, int64_t n, Stream stream) {
  if (n <= 0) return;
  to_f16_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, reinterpret_cast<__half*>(out), n);
  cudaCheckLaunch();
}

void add_inplace(float* x, const float* y, int64_t n, Stream stream) {
  if (n <= 0) return;
  add_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n);
  cudaCheckLaunch();
}

void add_bias_rows(float* x, const float* bias, int n_rows, int64_t n_cols, Stream stream) {
  const int64_t n = int64_t(n_rows) * n_cols;
  if (n <= 0) return;
  add_bias_rows_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, bias, n,
                                                                                                  n_cols);
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
