// Small fused ops of the forward pass: embedding lookup (any weight type),
// RMSNorm (a front for norm_quant.cu's kernel), RoPE fused with the f16 KV-cache store,
// SwiGLU, f32 -> f16 and the residual add. Each is one pass over its data;
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
__global__ void embed_kernel(WView w, const int* __restrict__ tokens, int n, float* __restrict__ out) {
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
  const float sc = C::scale(raw);
#pragma unroll
  for (int g = 0; g < C::kUnit / 4; ++g) {
    const float4 v = C::decode(raw, g);
    *reinterpret_cast<float4*>(o + C::x_off(u, g)) = make_float4(v.x * sc, v.y * sc, v.z * sc, v.w * sc);
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
                                  int n_kv_heads, int head_dim, RopeFreqs freqs, void* k_cache, void* v_cache,
                                  KvType k_type, KvType v_type, int block_size, __half* q_out,
                                  const float* __restrict__ smooth) {
  __shared__ float cs[kMaxRopePairs][2];
  const int t = blockIdx.x;
  const int p = pos[t];
  const int pairs = head_dim / 2;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float2 c_s = rope_cos_sin(p, freqs.f[i]);
    cs[i][0] = c_s.x;
    cs[i][1] = c_s.y;
  }
  __syncthreads();  // cs is read by every thread below
  const int64_t q_row = int64_t(t) * n_heads * head_dim;
  const int first = blockIdx.y * blockDim.x, stride = gridDim.y * blockDim.x;  // this block's slice
  // K smoothing (src/k_smoothing.h): [shift, k_mul, q_mul, k_weight] x kv_dim of this layer.
  const int kv_dim = n_kv_heads * head_dim, group = n_heads / n_kv_heads;
  for (int j = threadIdx.x + first; j < n_heads * pairs; j += stride) {
    const int h = j / pairs, i = j % pairs;
    float2* e = reinterpret_cast<float2*>(q + q_row + h * head_dim + 2 * i);
    const float2 ab = *e;
    float2 r = rope_rotate(ab.x, ab.y, cs[i][0], cs[i][1]);
    if (smooth) {
      const float* q_mul = smooth + 2 * kv_dim + (h / group) * head_dim + 2 * i;
      r.x *= q_mul[0];
      r.y *= q_mul[1];
    }
    *e = r;
    if (q_out) *reinterpret_cast<__half2*>(q_out + q_row + h * head_dim + 2 * i) = __floats2half2_rn(r.x, r.y);
  }
  const int64_t kv_row = int64_t(t) * n_kv_heads * head_dim;
  // The cache row is the token's slot (paged cache) or its position.
  const int64_t slot = slots ? slots[t] : p;
  if (k_type == KvType::F16 && v_type == KvType::F16) {
    __half* kc = static_cast<__half*>(k_cache) + slot * n_kv_heads * head_dim;
    __half* vc = static_cast<__half*>(v_cache) + slot * n_kv_heads * head_dim;
    for (int j = threadIdx.x + first; j < n_kv_heads * pairs; j += stride) {
      const int h = j / pairs, i = j % pairs;
      const int64_t off = h * head_dim + 2 * i;
      float2 r = rope_rotate(k[kv_row + off], k[kv_row + off + 1], cs[i][0], cs[i][1]);
      if (smooth) {
        r.x = (r.x - smooth[off]) * smooth[kv_dim + off];
        r.y = (r.y - smooth[off + 1]) * smooth[kv_dim + off + 1];
      }
      *reinterpret_cast<__half2*>(kc + off) = __floats2half2_rn(r.x, r.y);
      *reinterpret_cast<__half2*>(vc + off) = __floats2half2_rn(v[kv_row + off], v[kv_row + off + 1]);
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
  for (int b = (threadIdx.x >> 5) + blockIdx.y * warps; b < n_blocks; b += warps * gridDim.y) {
    const int e = b * 32 + lane;      // element of the row (head e / head_dim)
    const int i = (e % head_dim) / 2;  // its RoPE pair
    const float2 r = rope_rotate(k[kv_row + (e & ~1)], k[kv_row + (e | 1)], cs[i][0], cs[i][1]);
    float kr = (e & 1) ? r.y : r.x;
    if (smooth) kr = (kr - smooth[e]) * smooth[kv_dim + e];
    const float k_weight = smooth ? smooth[3 * kv_dim + e] : 1.0f;
    kv_encode_block(k_type, kr, lane, kq + b * lk.q_row / n_blocks, ks + b, k_weight);
    kv_encode_block(v_type, v[kv_row + e], lane, vq + b * lv.q_row / n_blocks, vs + b);
  }
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

__global__ void to_f16_kernel(const float* __restrict__ x, __half* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2half_rn(x[i]);
}

__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// Grid-stride kernels need no more blocks than fill the GPU several times.
unsigned elementwise_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 4096;
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

void embed_rows(const GpuMatrix& table, const int* tokens, int n, float* out, Stream stream) {
  RUNLM_CHECK(table.data != nullptr, "embed_rows: table not uploaded");
  if (n <= 0) return;
  const WView v = make_view(table);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = blocks_for(int64_t(n) * v.units);
  const bool ok = RUNLM_GPU_TYPE_SWITCH(table.type, KT, embed_kernel<KT><<<blocks, kThreads, 0, s>>>(v, tokens, n, out);
                                        cudaCheckLaunch());
  RUNLM_CHECK(ok, "embed_rows: type %s unsupported; supported: %s", dtype_name(table.type), kGpuWeightTypes);
}

void rmsnorm(const float* x, const float* w, float* out_f32, uint16_t* out_f16, int n_rows, int n_cols, float eps,
             Stream stream) {
  // The kernel of norm_quant.cu; x is not written without an add.
  rmsnorm_fused(const_cast<float*>(x), nullptr, w, out_f32, out_f16, nullptr, n_rows, n_cols, eps, stream);
}

void rope_and_store_kv(float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                       int n_kv_heads, int head_dim, float theta, float freq_scale, uint16_t* k_cache,
                       uint16_t* v_cache, uint16_t* q_out, Stream stream) {
  rope_and_store_kv_slots(q, k, v, pos, nullptr, n, n_heads, n_kv_heads, head_dim, theta, freq_scale, k_cache,
                          v_cache, KvType::F16, KvType::F16, 1, q_out, stream, nullptr);
}

void rope_and_store_kv_slots(float* q, const float* k, const float* v, const int* pos, const int* slots, int n,
                             int n_heads, int n_kv_heads, int head_dim, float theta, float freq_scale,
                             void* k_cache, void* v_cache, KvType k_type, KvType v_type, int block_size,
                             uint16_t* q_out, Stream stream, const float* k_smoothing) {
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
  const RopeFreqs f = rope_freqs(head_dim, theta, freq_scale);
  // Slices per token: about one pair (or K/V value) per thread.
  constexpr int kRopeThreads = 128;
  const int pairs_max = std::max(n_heads, n_kv_heads) * head_dim / 2;
  const int slices = std::min(64, std::max(1, ceil_div(pairs_max, kRopeThreads)));
  rope_store_kernel<<<dim3(n, slices), kRopeThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      q, k, v, pos, slots, n_heads, n_kv_heads, head_dim, f, k_cache, v_cache, k_type, v_type, block_size,
      reinterpret_cast<__half*>(q_out), k_smoothing);
  cudaCheckLaunch();
}

void swiglu(float* gate, const float* up, uint16_t* out_f16, int64_t n, Stream stream) {
  if (n <= 0) return;
  swiglu_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      gate, up, reinterpret_cast<__half*>(out_f16), n);
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

}  // namespace runlm::gpu
