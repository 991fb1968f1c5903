// Small kernels the CUDA engine needs to run a batch of sequences over the
// paged KV cache: gathering a sequence's K/V into contiguous rows for the
// prefill attention backends (which read contiguous K/V), picking the rows
// whose logits are wanted, and f16 -> f32. All memory-bound, one pass.
#include <cuda_fp16.h>

#include "common.cuh"
#include "gpu_ops.h"
#include "kv_codec.cuh"
#include "paged_kv.h"

namespace runlm::gpu {

namespace {

// One block per destination row; 16-byte copies (kv_dim is a multiple of 8).
__global__ void gather_kv_kernel(const uint4* __restrict__ k_pool, const uint4* __restrict__ v_pool,
                                 const int32_t* __restrict__ tables, int max_blocks, const int32_t* __restrict__ cu_k,
                                 int n_seqs, int block_size, int row_vecs, uint4* k_out, uint4* v_out) {
  const int row = blockIdx.x;
  // The sequence owning this row: n_seqs is small, a linear search is cheap.
  int s = 0;
  while (s + 1 < n_seqs && cu_k[s + 1] <= row) ++s;
  const int pos = row - cu_k[s];
  const int32_t page = tables[int64_t(s) * max_blocks + pos / block_size];
  if (page < 0) {
    // Released by the sliding window: attention never reads it; keep it finite.
    for (int i = threadIdx.x; i < row_vecs; i += blockDim.x)
      k_out[int64_t(row) * row_vecs + i] = v_out[int64_t(row) * row_vecs + i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const int64_t slot = int64_t(page) * block_size + pos % block_size;
  for (int i = threadIdx.x; i < row_vecs; i += blockDim.x) {
    k_out[int64_t(row) * row_vecs + i] = k_pool[slot * row_vecs + i];
    v_out[int64_t(row) * row_vecs + i] = v_pool[slot * row_vecs + i];
  }
}

// Quantized or bf16 pools: decode to f16 on the way. One block per
// destination row, a thread per element. This is an extra pass over the
// prefill items' K/V (read the pool, write f16, read again in attention);
// fa2 and naive read typed pools in place and skip it; the engine keeps it
// for fa3, whose TMA copies raw tiles (docs/kernels.md).
__device__ __forceinline__ void decode_row_f16(KvType t, const uint8_t* pool, const KvPoolLayout& l, int64_t slot,
                                               int kv_dim, __half* out) {
  const uint8_t* q = pool + l.quant_offset(slot);
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(pool + l.scale_offset(slot));
  const int64_t block_bytes = l.q_row / (kv_dim / 32);  // quant bytes of a block of 32
  for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {
    const int b = e / 32;
    const float d = kv_type_quantized(t) ? __half2float(__ushort_as_half(sc[b])) : 1.0f;
    out[e] = __float2half_rn(kv_decode_elem(t, q + b * block_bytes, d, e % 32));
  }
}

__global__ void gather_kv_decode_kernel(const uint8_t* __restrict__ k_pool, const uint8_t* __restrict__ v_pool,
                                        KvType k_type, KvType v_type, KvPoolLayout lk, KvPoolLayout lv,
                                        const int32_t* __restrict__ tables, int max_blocks,
                                        const int32_t* __restrict__ cu_k, int n_seqs, int block_size, int kv_dim,
                                        __half* k_out, __half* v_out) {
  const int row = blockIdx.x;
  int s = 0;
  while (s + 1 < n_seqs && cu_k[s + 1] <= row) ++s;
  const int pos = row - cu_k[s];
  const int32_t page = tables[int64_t(s) * max_blocks + pos / block_size];
  __half* ko = k_out + int64_t(row) * kv_dim;
  __half* vo = v_out + int64_t(row) * kv_dim;
  if (page < 0) {
    // Released by the sliding window: attention never reads it; keep it finite.
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) ko[e] = vo[e] = __float2half_rn(0.0f);
    return;
  }
  const int64_t slot = int64_t(page) * block_size + pos % block_size;
  decode_row_f16(k_type, k_pool, lk, slot, kv_dim, ko);
  decode_row_f16(v_type, v_pool, lv, slot, kv_dim, vo);
}

__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ idx, int width,
                                   float* dst) {
  const int i = blockIdx.x;
  const float* s = src + int64_t(idx[i]) * width;
  for (int j = threadIdx.x; j < width; j += blockDim.x) dst[int64_t(i) * width + j] = s[j];
}

__global__ void to_f32_kernel(const __half* __restrict__ x, float* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __half2float(x[i]);
}

}  // namespace

void gather_kv(const void* k_pool, const void* v_pool, KvType k_type, KvType v_type, const int32_t* block_tables,
               int max_blocks, const int32_t* cu_k, int n_seqs, int total_k, int block_size, int kv_dim,
               uint16_t* k_out, uint16_t* v_out, Stream stream) {
  if (total_k <= 0) return;
  RUNLM_CHECK(kv_dim % 8 == 0, "gather_kv: kv_dim=%d must be a multiple of 8", kv_dim);
  if (k_type != KvType::F16 || v_type != KvType::F16) {
    for (KvType t : {k_type, v_type})
      RUNLM_CHECK(kv_type_on_gpu(t),
                  "gather_kv: KV type %s unsupported; supported: f16, bf16, q8_0, q4_0, fp8", kv_type_name(t));
    RUNLM_CHECK(kv_dim % 32 == 0, "gather_kv: kv_dim=%d must be a multiple of 32 for K=%s V=%s", kv_dim,
                kv_type_name(k_type), kv_type_name(v_type));
    // n_kv_heads does not matter to the layout of a whole row: pass kv_dim as one head.
    const KvPoolLayout lk = kv_pool_layout(k_type, block_size, 1, kv_dim);
    const KvPoolLayout lv = kv_pool_layout(v_type, block_size, 1, kv_dim);
    gather_kv_decode_kernel<<<total_k, 128, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint8_t*>(k_pool), static_cast<const uint8_t*>(v_pool), k_type, v_type, lk, lv,
        block_tables, max_blocks, cu_k, n_seqs, block_size, kv_dim, reinterpret_cast<__half*>(k_out),
        reinterpret_cast<__half*>(v_out));
    cudaCheckLaunch();
    return;
  }
  gather_kv_kernel<<<total_k, 128, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(k_pool), static_cast<const uint4*>(v_pool), block_tables, max_blocks, cu_k,
      n_seqs, block_size, kv_dim / 8, reinterpret_cast<uint4*>(k_out), reinterpret_cast<uint4*>(v_out));
  cudaCheckLaunch();
}

void gather_rows(const float* src, const int32_t* idx, int n, int width, float* dst, Stream stream) {
  if (n <= 0) return;
  gather_rows_kernel<<<n, 256, 0, static_cast<cudaStream_t>(stream)>>>(src, idx, width, dst);
  cudaCheckLaunch();
}

void to_f32(const uint16_t* x, float* out, int64_t n, Stream stream) {
  if (n <= 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
  to_f32_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(reinterpret_cast<const __half*>(x), out, n);
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
