// attn_naive: the simple GPU reference. One CTA per (query row, head): it
// materialises that row of S = scale * q K^T in shared memory (one warp per
// key; soft-capped when p.softcap > 0), takes a max-subtracted softmax over
// it (the head's sink, when p.sinks is set, joins its max and sum) and sums
// P V, all in fp32.
// No tiling: every CTA re-reads its sequence's K and V, so it is
// memory-bound and slow on long sequences; it exists to be obviously right.
// Paged K/V (attention.h): each key row's address goes through the block
// table, with a division (any block_size); only keys < seqlen_k are read.
// Typed pools (bf16, q8_0, q4_0, fp8 K and V with dtype f16, chosen
// at run time): each value is decoded where it is read (kv_decode_elem with
// its block's scale) and rounded once to f16, so the kernel sees exactly
// gather_kv's values and matches the gather path bit for bit.
#include <cfloat>

#include "cuda/attn_kernels.h"
#include "cuda/common.cuh"
#include "cuda/kv_codec.cuh"
#include "paged_kv.h"

namespace runlm {

namespace {

constexpr int kNaiveThreads = 128;

struct NaiveArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_q;
  const int32_t* cu_k;
  int total_q, n_heads, n_kv_heads, head_dim, window_left;
  bool causal;
  float scale;
  float softcap;                // 0 = none
  const float* sinks;           // [n_heads] or nullptr: none
  const int32_t* block_tables;  // nullptr: contiguous K/V
  int max_blocks_per_seq, block_size;
  bool typed;                   // typed pools: k_type / v_type in layouts lk / lv
  KvType k_type, v_type;
  KvPoolLayout lk, lv;
};

// Element c of kv head kvh in slot `slot` of a typed pool, as gather_kv
// writes it: the exact decoded value rounded to f16.
__device__ float typed_value(const uint8_t* pool, KvType t, const KvPoolLayout& l, int64_t slot, int kvh, int d,
                             int c) {
  const uint8_t* row = pool + l.quant_offset(slot);
  float x;
  if (!kv_type_quantized(t)) {
    x = kv_decode_elem(t, row + int64_t(kvh) * d * 2, 1.0f, c);
  } else {
    const int64_t e = int64_t(kvh) * d + (c & ~31);  // first element of c's block in the row
    const uint8_t* blk = row + (t == KvType::Q4_0 ? e / 2 : e);
    const uint16_t sc = *reinterpret_cast<const uint16_t*>(pool + l.scale_offset(slot) + (e / 32) * 2);
    x = kv_decode_elem(t, blk, __half2float(__ushort_as_half(sc)), c & 31);
  }
  return __half2float(__float2half_rn(x));
}

__device__ float block_reduce(float x, bool is_max, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kNaiveThreads / 32; ++w) x = is_max ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

template <typename T>
__global__ void __launch_bounds__(kNaiveThreads) attn_naive_kernel(NaiveArgs a) {
  using Tr = ElemTraits<T>;
  extern __shared__ float smem[];  // [head_dim] q row, then [visible keys] scores
  __shared__ float scratch[kNaiveThreads / 32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q0 = a.cu_q[b], sq = a.cu_q[b + 1] - q0;
  if (i >= sq) return;
  const int k0 = a.cu_k[b], sk = a.cu_k[b + 1] - k0;
  const int d = a.head_dim;
  const int kvh = h / (a.n_heads / a.n_kv_heads);
  const int64_t row = q0 + i;
  const T* q = static_cast<const T*>(a.q) + (row * a.n_heads + h) * d;
  const int64_t kv_stride = int64_t(a.n_kv_heads) * d;
  // Key j's row (slot), contiguous or paged; its element offset (relative to
  // kvh's column) in a pool of the dtype.
  const int32_t* table = a.block_tables ? a.block_tables + int64_t(b) * a.max_blocks_per_seq : nullptr;
  auto key_slot = [&](int j) -> int64_t {
    if (!table) return int64_t(k0) + j;
    return int64_t(table[j / a.block_size]) * a.block_size + j % a.block_size;
  };
  auto key_row = [&](int j) -> int64_t { return key_slot(j) * kv_stride; };
  const T* kbase = static_cast<const T*>(a.k) + int64_t(kvh) * d;
  const T* vbase = static_cast<const T*>(a.v) + int64_t(kvh) * d;
  const uint8_t* kpool = static_cast<const uint8_t*>(a.k);
  const uint8_t* vpool = static_cast<const uint8_t*>(a.v);
  T* out = static_cast<T*>(a.out) + (row * a.n_heads + h) * d;

  // Visible keys are one contiguous range [j_lo, j_hi) (see attention.h).
  const int pos = sk - sq + i;
  const int j_lo = a.window_left >= 0 ? max(0, pos - a.window_left) : 0;
  const int j_hi = a.causal ? min(sk, pos + 1) : sk;
  const int n = max(0, j_hi - j_lo);

  float* qs = smem;
  float* s = smem + d;
  for (int c = threadIdx.x; c < d; c += kNaiveThreads) qs[c] = Tr::to_float(q[c]);
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = warp; j < n; j += kNaiveThreads / 32) {
    float acc = 0.0f;
    if (a.typed) {
      const int64_t slot = key_slot(j_lo + j);
      for (int c = lane; c < d; c += 32) acc += qs[c] * typed_value(kpool, a.k_type, a.lk, slot, kvh, d, c);
    } else {
      const T* kr = kbase + key_row(j_lo + j);
      for (int c = lane; c < d; c += 32) acc += qs[c] * Tr::to_float(kr[c]);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      const float sc = acc * a.scale;
      // Soft-cap (attention.h): the visible keys only, so no mask to order against.
      s[j] = a.softcap > 0.0f ? a.softcap * tanhf(sc / a.softcap) : sc;
    }
  }
  __syncthreads();

  if (n == 0) {  // no visible key: out = 0, lse = -inf
    for (int c = threadIdx.x; c < d; c += kNaiveThreads) out[c] = Tr::from_float(0.0f);
    if (a.lse && threadIdx.x == 0) a.lse[int64_t(h) * a.total_q + row] = a.sinks ? a.sinks[h] : -INFINITY;
    return;
  }
  // The sink (attention.h) joins the max and the sum; it has no value.
  const float sink = a.sinks ? a.sinks[h] : -INFINITY;
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j < n; j += kNaiveThreads) mx = fmaxf(mx, s[j]);
  mx = fmaxf(block_reduce(mx, true, scratch), sink);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < n; j += kNaiveThreads) {
    const float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, scratch);  // its barriers also publish s[]
  if (a.sinks) sum += expf(sink - mx);
  const float inv = 1.0f / sum;
  for (int c = threadIdx.x; c < d; c += kNaiveThreads) {
    float acc = 0.0f;
    if (a.typed) {
      for (int j = 0; j < n; ++j) acc += s[j] * typed_value(vpool, a.v_type, a.lv, key_slot(j_lo + j), kvh, d, c);
    } else {
      for (int j = 0; j < n; ++j) acc += s[j] * Tr::to_float(vbase[key_row(j_lo + j) + c]);
    }
    out[c] = Tr::from_float(acc * inv);
  }
  if (a.lse && threadIdx.x == 0) a.lse[int64_t(h) * a.total_q + row] = mx + logf(sum);
}

template <typename T>
void launch_typed(const AttnParams& p) {
  const size_t smem = sizeof(float) * (size_t(p.head_dim) + size_t(p.max_seqlen_k));
  int dev = 0, max_smem = 0;
  cudaCheck(cudaGetDevice(&dev));
  cudaCheck(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  const int max_keys = (max_smem - int(sizeof(float)) * (kNaiveThreads / 32)) / int(sizeof(float)) - p.head_dim;
  RUNLM_CHECK(p.max_seqlen_k <= max_keys, "naive: max_seqlen_k=%d unsupported; supported: max_seqlen_k <= %d",
              p.max_seqlen_k, max_keys);
  RUNLM_CHECK(p.n_heads <= 65535 && p.batch <= 65535,
              "naive: n_heads=%d batch=%d unsupported; supported: <= 65535 each", p.n_heads, p.batch);
  if (p.max_seqlen_q == 0) return;
  cudaCheck(cudaFuncSetAttribute(attn_naive_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  NaiveArgs a{p.q, p.k, p.v, p.out, p.lse, p.cu_seqlens_q, p.cu_seqlens_k, p.total_q, p.n_heads, p.n_kv_heads,
              p.head_dim, p.window_left, p.causal, p.scale, p.softcap, p.sinks, p.block_tables, p.max_blocks_per_seq,
              p.block_size, false, KvType::F16, KvType::F16, KvPoolLayout{}, KvPoolLayout{}};
  if (p.block_tables && attn_kv_typed(p)) {
    RUNLM_CHECK(p.dtype == DType::F16, "naive: paged K/V types K=%s V=%s with dtype %s unsupported; supported: dtype f16",
                kv_type_name(attn_kv_type(p, false)), kv_type_name(attn_kv_type(p, true)), dtype_name(p.dtype));
    a.typed = true;
    a.k_type = attn_kv_type(p, false);
    a.v_type = attn_kv_type(p, true);
    a.lk = kv_pool_layout(a.k_type, p.block_size, p.n_kv_heads, p.head_dim);
    a.lv = kv_pool_layout(a.v_type, p.block_size, p.n_kv_heads, p.head_dim);
  }
  dim3 grid(p.max_seqlen_q, p.n_heads, p.batch);
  attn_naive_kernel<T><<<grid, kNaiveThreads, smem, static_cast<cudaStream_t>(p.stream)>>>(a);
  cudaCheckLaunch();
}

}  // namespace

void attn_naive_launch(const AttnParams& p) {
  if (p.dtype == DType::BF16)
    launch_typed<__nv_bfloat16>(p);
  else
    launch_typed<__half>(p);
}

}  // namespace runlm
