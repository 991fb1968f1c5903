// Decode attention over the contiguous f16 KV cache (the paged cache has
// the flash-decoding kernels of paged_attention.cu).
//
// decode_attention: one block of 8 warps per (query token, head). Warp w
// takes keys first + 4w.., four keys per step, so each lane has 4 K and 4 V
// loads in flight before the first use; lane l holds head elements
// l, l + 32, ... (kPerLane of them). Each warp keeps an online softmax
// (running max m, sum l, output o) in fp32; the 8 partial states are merged
// through shared memory at the end. The position is read on the device
// (*pos0 + token), so a captured graph replays at any position; a position
// outside [0, max_ctx) writes NaN rather than reading past the cache.
//
// out_x8 (optional): the output also quantized to int8 for gemv_x8 (the wo
// projection), so the step needs no separate quantize_x8 launch; warp w of
// the merge holds values 32w..32w+31 of the head, one x8 block, and
// quantizes it with the same warp function as quantize_x8 (bit-equal). The
// kernel lets the next (programmatic) launch start at once: the wo GEMV then
// loads its weights while attention runs, as it did during quantize_x8.
//
// decode_attention_rope (kRope): the same kernel also does the
// work of rope_and_store_kv, which was a launch of its own between the qkv
// GEMV and attention (2.5 us of a 7B Q4_0 decode layer, measured on the
// H100 by leaving it out). Query t's block rotates its own q head; the
// step's new keys (tokens 0..t, positions pos[0]..pos[t]) are rotated from
// the GEMV's f32 k and v by every block that reads them, rounded to f16 as
// the cache holds them, and kept in shared memory: so no block reads a cache
// row another block of the same launch writes. The block of token t and the
// first query head of a KV group writes that group's row pos[t] to the
// cache. Rotation and rounding are rope.cuh's, as rope_store_kernel's: the
// cache rows are bit-identical either way. Any RoPE of rope.cuh (NeoX,
// partial, per-pair factors, attention factor).
//
// softcap > 0: each score (after the scale) becomes softcap * tanh(s /
// softcap), the Gemma-2 attention logit soft-cap, as the CPU engine does.
// sinks (gpt-oss): head h's sink logit joins the max and the denominator of
// the final merge (softmax_with_sink); only the epilogue reads it.
#include <cfloat>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/rope.cuh"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

namespace {

constexpr int kWarps = 8;
constexpr int kKeysPerStep = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxTokens = 16;

// The step's new K/V rows for the rope version ([token][head_dim], f16 as
// the cache holds them) and this block's rotated q.
struct NewKv {
  __half k[kMaxTokens][kMaxHeadDim], v[kMaxTokens][kMaxHeadDim];
  float q[kMaxHeadDim];
};

// kRope: q, k_new and v_new are the GEMV outputs before RoPE (see decode_attention_rope
// above); otherwise q is already rotated and the cache holds every key.
template <int kPerLane, bool kRope>
__global__ void __launch_bounds__(kWarps * 32)
    decode_attn_kernel(const float* __restrict__ q, __half* __restrict__ k_cache, __half* __restrict__ v_cache,
                       const int* __restrict__ pos0, int n_heads, int n_kv_heads, int head_dim, int window,
                       float scale, int max_ctx, float* __restrict__ out, int8_t* __restrict__ out_q,
                       float2* __restrict__ out_ds, const float* __restrict__ k_new, const float* __restrict__ v_new,
                       RopeTable rope, float softcap, const float* __restrict__ sinks) {
  allow_next_kernel();
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_o[kWarps][kMaxHeadDim];
  __shared__ std::conditional_t<kRope, NewKv, char> s_new;
  const int t = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int p = *pos0 + t;  // pos0[0] (= pos[0]) + t; the rope version reads pos[0..t] as positions too
  const int64_t row0 = (int64_t(t) * n_heads + h) * head_dim;  // of this head's output in out (and out_q)
  float* o_row = out + row0;
  // Warp w writes x8 block (row0 + 32 w) / 32 when out_q is set (head_dim %
  // 32 == 0, checked on the host; whole warps, as warp_quantize_x8 needs).
  auto store_x8 = [&](float v) {
    const int64_t i = row0 + threadIdx.x;
    if (out_q && threadIdx.x < head_dim) warp_quantize_x8(v, out_q + i, out_ds + i / kX8Block);
  };
  if (p < 0 || p >= max_ctx) {
    for (int e = threadIdx.x; e < head_dim; e += blockDim.x) o_row[e] = NAN;
    store_x8(NAN);  // NaN scale: the GEMV reading it gives NaN too
    return;
  }
  const int first = window > 0 ? max(0, p - window + 1) : 0;
  const int group = n_heads / n_kv_heads, kvh = h / group;
  const int64_t kv_stride = int64_t(n_kv_heads) * head_dim;
  const __half* kb = k_cache + int64_t(kvh) * head_dim;
  const __half* vb = v_cache + int64_t(kvh) * head_dim;
  const float* q_row = q + (int64_t(t) * n_heads + h) * head_dim;
  // Keys from new_first on are this step's (rope version): read from s_new.
  const int new_first = kRope ? p - t : p + 1;

  if constexpr (kRope) {
    const int pairs = head_dim / 2;
    for (int j = threadIdx.x; j < (t + 1) * pairs; j += blockDim.x) {
      const int u = j / pairs, i = j % pairs;
      int e0, e1;  // the pair's elements: adjacent (e1 = e0 + 1), NeoX halves, or kept dimensions
      const bool rotated = rope_pair(rope, i, e0, e1);
      const float2 cs = rotated ? rope_cos_sin(new_first + u, rope, i) : make_float2(1.0f, 0.0f);
      const int64_t src = (int64_t(u) * n_kv_heads + kvh) * head_dim;
      float2 kr = make_float2(k_new[src + e0], k_new[src + e1]);
      if (rotated) kr = rope_rotate(kr.x, kr.y, cs.x, cs.y);
      const __half2 kh = __floats2half2_rn(kr.x, kr.y);
      const __half2 vh = __floats2half2_rn(v_new[src + e0], v_new[src + e1]);
      __half* kc = k_cache + p * kv_stride + int64_t(kvh) * head_dim;
      __half* vc = v_cache + p * kv_stride + int64_t(kvh) * head_dim;
      const bool store = u == t && h % group == 0;  // one block per (token, KV head) stores the row
      if (e1 == e0 + 1) {  // adjacent: one 4-byte store each
        *reinterpret_cast<__half2*>(&s_new.k[u][e0]) = kh;
        *reinterpret_cast<__half2*>(&s_new.v[u][e0]) = vh;
        if (store) {
          *reinterpret_cast<__half2*>(kc + e0) = kh;
          *reinterpret_cast<__half2*>(vc + e0) = vh;
        }
      } else {
        s_new.k[u][e0] = __low2half(kh);
        s_new.k[u][e1] = __high2half(kh);
        s_new.v[u][e0] = __low2half(vh);
        s_new.v[u][e1] = __high2half(vh);
        if (store) {
          kc[e0] = __low2half(kh);
          kc[e1] = __high2half(kh);
          vc[e0] = __low2half(vh);
          vc[e1] = __high2half(vh);
        }
      }
      if (u == t) {
        float2 qr = make_float2(q_row[e0], q_row[e1]);
        if (rotated) qr = rope_rotate(qr.x, qr.y, cs.x, cs.y);
        s_new.q[e0] = qr.x;
        s_new.q[e1] = qr.y;
      }
    }
    __syncthreads();  // s_new is read by every warp below
  }

  float qv[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    float qe = 0.0f;
    if constexpr (kRope) qe = e < head_dim ? s_new.q[e] : 0.0f;
    else qe = e < head_dim ? q_row[e] : 0.0f;
    qv[j] = qe * scale;  // the scale folded into q once
  }
  float m = -INFINITY, l = 0.0f, o[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) o[j] = 0.0f;

  for (int base = first + warp * kKeysPerStep; base <= p; base += kWarps * kKeysPerStep) {
    float kx[kKeysPerStep][kPerLane], vx[kKeysPerStep][kPerLane];
#pragma unroll
    for (int i = 0; i < kKeysPerStep; ++i) {
      const int key = min(base + i, p);  // past p: a valid row, masked below
      // Rope version: a key of this step comes from s_new. The cache load is
      // still issued (of row min(key, new_first - 1), or 0: in bounds) and
      // its value dropped, so all loads of the step go out together, as
      // without RoPE (a branch around them serialised them: 15 us a 7B layer).
      const int row = kRope ? max(0, min(key, new_first - 1)) : key;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int e = lane + 32 * j;
        kx[i][j] = e < head_dim ? __half2float(kb[row * kv_stride + e]) : 0.0f;
        vx[i][j] = e < head_dim ? __half2float(vb[row * kv_stride + e]) : 0.0f;
      }
    }
    if constexpr (kRope) {
#pragma unroll
      for (int i = 0; i < kKeysPerStep; ++i) {
        const int key = min(base + i, p);
        if (key < new_first) continue;  // the whole warp agrees: one key per i
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int e = lane + 32 * j;
          kx[i][j] = e < head_dim ? __half2float(s_new.k[key - new_first][e]) : 0.0f;
          vx[i][j] = e < head_dim ? __half2float(s_new.v[key - new_first][e]) : 0.0f;
        }
      }
    }
    float s[kKeysPerStep];
#pragma unroll
    for (int i = 0; i < kKeysPerStep; ++i) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) acc = fmaf(qv[j], kx[i][j], acc);
      s[i] = acc;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
#pragma unroll
      for (int i = 0; i < kKeysPerStep; ++i) s[i] += __shfl_xor_sync(0xffffffffu, s[i], off);
    if (softcap > 0.0f) {
#pragma unroll
      for (int i = 0; i < kKeysPerStep; ++i) s[i] = softcap * tanhf(s[i] / softcap);  // after the scale, as the CPU
    }
    float step_max = m;
#pragma unroll
    for (int i = 0; i < kKeysPerStep; ++i) {
      if (base + i > p) s[i] = -INFINITY;
      step_max = fmaxf(step_max, s[i]);
    }
    const float corr = expf(m - step_max);  // m = -inf on the first step: 0
    l *= corr;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) o[j] *= corr;
#pragma unroll
    for (int i = 0; i < kKeysPerStep; ++i) {
      const float pr = expf(s[i] - step_max);  // masked keys: exp(-inf) = 0
      l += pr;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) o[j] = fmaf(pr, vx[i][j], o[j]);
    }
    m = step_max;
  }

  // Merge the warps' states: M = max m_w, out = sum o_w e^(m_w - M) / sum l_w e^(m_w - M).
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e < head_dim) s_o[warp][e] = o[j];
  }
  __syncthreads();  // every warp's state is in shared memory before the merge
  float mx = sinks ? sinks[h] : -INFINITY;  // the sink joins the max and the denominator, without a value
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float denom = sinks ? expf(sinks[h] - mx) : 0.0f, f[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);  // a warp with no keys adds nothing
    denom += s_l[w] * f[w];
  }
  const float inv = 1.0f / denom;
  float last = 0.0f;  // this thread's value (head_dim <= blockDim.x: at most one)
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc = fmaf(s_o[w][e], f[w], acc);
    last = acc * inv;
    o_row[e] = last;
  }
  store_x8(last);
}

}  // namespace

namespace {

template <bool kRope>
void launch_decode_attention(const float* q, uint16_t* k_cache, uint16_t* v_cache, int n, const int* pos0,
                             int n_heads, int n_kv_heads, int head_dim, int window, float scale, int max_ctx,
                             float* out, Stream stream, void* out_x8, const float* k_new, const float* v_new,
                             const RopeTable& rope, float softcap, const float* sinks) {
  if (n <= 0) return;
  RUNLM_CHECK(n <= kMaxTokens, "decode_attention: n=%d query tokens unsupported; supported: 1..%d", n, kMaxTokens);
  RUNLM_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
              "decode_attention: n_heads=%d not a multiple of n_kv_heads=%d", n_heads, n_kv_heads);
  RUNLM_CHECK(head_dim > 0 && head_dim <= kMaxHeadDim, "decode_attention: head_dim=%d unsupported; supported: 1..%d",
              head_dim, kMaxHeadDim);
  RUNLM_CHECK(!kRope || head_dim % 2 == 0, "decode_attention_rope: head_dim=%d unsupported; supported: even",
              head_dim);
  RUNLM_CHECK(softcap >= 0.0f, "decode_attention: softcap=%g must be >= 0", static_cast<double>(softcap));
  RUNLM_CHECK(!out_x8 || head_dim % kX8Block == 0,
              "decode_attention: int8 output needs head_dim a multiple of %d, got %d", kX8Block, head_dim);
  int8_t* out_q = out_x8 ? x8_q(out_x8) : nullptr;
  float2* out_ds = out_x8 ? x8_ds(out_x8, n, int64_t(n_heads) * head_dim) : nullptr;
  const dim3 grid(n, n_heads);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto* kc = reinterpret_cast<__half*>(k_cache);
  auto* vc = reinterpret_cast<__half*>(v_cache);
#define RUNLM_ATTN_LAUNCH(P)                                                                              \
  decode_attn_kernel<P, kRope><<<grid, kWarps * 32, 0, s>>>(q, kc, vc, pos0, n_heads, n_kv_heads, head_dim, \
                                                             window, scale, max_ctx, out, out_q, out_ds, k_new, \
                                                             v_new, rope, softcap, sinks)
  if (head_dim <= 32) RUNLM_ATTN_LAUNCH(1);
  else if (head_dim <= 64) RUNLM_ATTN_LAUNCH(2);
  else if (head_dim <= 128) RUNLM_ATTN_LAUNCH(4);
  else RUNLM_ATTN_LAUNCH(8);
#undef RUNLM_ATTN_LAUNCH
  cudaCheckLaunch();
}

}  // namespace

void decode_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int n, const int* pos0,
                      int n_heads, int n_kv_heads, int head_dim, int window, float scale, int max_ctx,
                      float* out, Stream stream, void* out_x8, float softcap, const float* sinks) {
  // The kernel writes the cache only in the rope version.
  launch_decode_attention<false>(q, const_cast<uint16_t*>(k_cache), const_cast<uint16_t*>(v_cache), n, pos0, n_heads,
                                 n_kv_heads, head_dim, window, scale, max_ctx, out, stream, out_x8, nullptr, nullptr,
                                 RopeTable{}, softcap, sinks);
}

void decode_attention_rope(const float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                           int n_kv_heads, int head_dim, const RopeSpec& rope, uint16_t* k_cache, uint16_t* v_cache,
                           int window, float scale, int max_ctx, float* out, Stream stream, void* out_x8,
                           float softcap, const float* sinks) {
  RUNLM_CHECK(head_dim % 2 == 0, "decode_attention_rope: head_dim=%d unsupported; supported: even", head_dim);
  launch_decode_attention<true>(q, k_cache, v_cache, n, pos, n_heads, n_kv_heads, head_dim, window, scale, max_ctx,
                                out, stream, out_x8, k, v, rope_table(head_dim, rope), softcap, sinks);
}

void decode_attention_rope(const float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                           int n_kv_heads, int head_dim, float theta, float freq_scale, uint16_t* k_cache,
                           uint16_t* v_cache, int window, float scale, int max_ctx, float* out, Stream stream,
                           void* out_x8) {
  decode_attention_rope(q, k, v, pos, n, n_heads, n_kv_heads, head_dim, plain_rope(theta, freq_scale), k_cache,
                        v_cache, window, scale, max_ctx, out, stream, out_x8, 0.0f);
}

}  // namespace runlm::gpu
