// attn_fa3: FlashAttention-3 style forward for sm_90a (H100/H200).
// Warp-specialised persistent kernel. Warpgroup 0 produces: one thread
// streams Q and the K/V tiles by TMA into a shared-memory ring of 2-4 stages
// guarded by mbarriers, then gives its registers away (setmaxnreg).
// Warpgroups 1 and 2 consume, 64 query rows each: S = Q K^T and O += P V on
// wgmma (A = Q from shared memory, then P from registers), online softmax in
// registers overlapped with the previous tile's P V (intra-warpgroup
// overlap), deferred normalisation, direct stores. A static persistent
// scheduler hands out query blocks heaviest-first.
// Per-warp barrier release, stages sized to shared memory, no S zeroing,
// and O rescaled in FA3's order while S's GEMM runs (mainloop.cuh).
// Paged K/V (attention.h) is a separate instantiation (kPaged): the K/V
// tensor maps span the pool and the producer warp assembles each tile from
// one TMA box per page run (mainloop.cuh); the contiguous kernel is unchanged.
// Typed pools (bf16 / q8_0 / q4_0 / fp8 K or V under f16 attention)
// are not read here: TMA copies raw tiles straight into the wgmma layout, so
// dequantizing would need a converting stage between producer and consumers.
// The table refuses them (kv_types = false, attention.cpp) and the engine
// decodes them to contiguous f16 with gather_kv first; fa2 and naive read
// them in place.
// Soft-cap (AttnParams::softcap > 0) is a template switch (kSoftcap), so the
// kernels without it compile as before: the consumers' scores are
// capped (softcap_tanh) before the mask and the online softmax (mainloop.cuh).
// Sinks (AttnParams::sinks) are one too (kSinks): the epilogue joins the
// head's sink to each row's final state (OnlineSoftmax::finish); the main
// loop is unchanged.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <numeric>

#include "cuda/attn_kernels.h"
#include "cuda/common.cuh"
#include "cuda/fa3/epilogue.cuh"
#include "cuda/fa3/kernel_traits.cuh"
#include "cuda/fa3/mainloop.cuh"
#include "cuda/sm90.cuh"
#include "cuda/fa3/softmax.cuh"
#include "cuda/fa3/tile_scheduler.cuh"
#include "cuda/tensor_map.h"

namespace runlm {

namespace {

using namespace fa3;
using namespace sm90;

template <typename T, int D, int BN, bool kPaged, bool kSoftcap, bool kSinks>
__global__ void __launch_bounds__(kThreads, 1)
    attn_fa3_fwd(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
                 const __grid_constant__ CUtensorMap tmV, const Args a) {
#if RUNLM_SM90_DEVICE
  using L = Layout<D, BN>;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  if (threadIdx.x == 0) {
    mbar_init(L::q_full(base), 1);
    mbar_init(L::q_empty(base), kConsumerWarps);
    for (int s = 0; s < L::kStages; ++s) {
      mbar_init(L::k_full(base, s), 1);
      mbar_init(L::k_empty(base, s), kConsumerWarps);
      mbar_init(L::v_full(base, s), 1);
      mbar_init(L::v_empty(base, s), kConsumerWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();  // barriers initialised before anyone waits on them

  const StaticTileScheduler sched{a.n_m_blocks, a.n_heads, a.batch, a.heads_per_group, a.snake};
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    regs_dealloc<kPaged ? kProducerRegsPaged : kProducerRegs>();
    // One thread produces; with paged K/V its whole warp (a lane per TMA box).
    if (threadIdx.x == 0 || (kPaged && threadIdx.x < 32)) {
      if (threadIdx.x == 0) {
        tma_prefetch_desc(&tmQ);
        tma_prefetch_desc(&tmK);
        tma_prefetch_desc(&tmV);
      }
      PipeState pipe;
      int q_iter = 0;
      for (int t = sched.get_initial_work(); sched.valid(t); t = sched.get_next_work(t)) {
        const WorkTile w = sched.tile(t);
        const TileRange r = tile_range<L::BM, L::BN>(a, w.m_block, w.batch);
        if (!r.valid || r.t_lo >= r.t_hi) continue;  // consumers skip the same blocks
        if constexpr (kPaged)
          producer_load_block_paged<D, BN>(base, &tmQ, &tmK, &tmV, a, r, w.batch, w.head, q_iter, pipe);
        else
          producer_load_block<D, BN>(base, &tmQ, &tmK, &tmV, r, w.head, w.head / a.group, q_iter, pipe);
        ++q_iter;
      }
    }
  } else {
    regs_alloc<kPaged ? kConsumerRegsPaged : kConsumerRegs>();
    const int wgc = wg - 1;
    PipeState pipe;
    int q_iter = 0;
    for (int t = sched.get_initial_work(); sched.valid(t); t = sched.get_next_work(t)) {
      const WorkTile w = sched.tile(t);
      const TileRange r = tile_range<L::BM, L::BN>(a, w.m_block, w.batch);
      if (!r.valid) continue;
      float o[D / 2];
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
      OnlineSoftmax<L::BN> sm;
      sm.init();
      if (r.t_lo < r.t_hi) {
        consumer_mma_block<T, D, BN, kPaged, kSoftcap>(base, a, r, wgc, q_iter, pipe, o, sm);
        ++q_iter;
      }
      epilogue_store<T, D, L::BN, kSinks>(a, r, w.head, wgc, o, sm);
    }
  }
#endif
}

// A rank-3 tensor map over [rows, heads, D] (innermost last in memory) with
// 64-element x 1-head x box_rows boxes and the 128-byte swizzle.
CUtensorMap make_tmap(const void* ptr, DType dt, int rows, int heads, int d, int box_rows, const char* what) {
  RUNLM_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "fa3: %s must be 16-byte aligned", what);
  CUtensorMap m;
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(rows > 0 ? rows : 1)};
  const cuuint64_t strides[2] = {cuuint64_t(d) * 2, cuuint64_t(heads) * d * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult e = encode_tiled_fn()(
      &m, dt == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(ptr), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RUNLM_CHECK(e == CUDA_SUCCESS, "fa3: cuTensorMapEncodeTiled(%s) failed: CUresult %d", what, int(e));
  return m;
}

// Heads per scheduler group (see StaticTileScheduler): as many (head,
// sequence) pairs as keep their K/V within ~24 MB of the 50 MB L2 (query
// heads of one KV head share it), at least one. Except long causal
// problems (>= 64 query blocks): there one group of all pairs (plain
// heaviest-first) balanced the triangles best, measured at d128 16k
// (616 TFLOP/s against 570 with L2-sized groups and 449 with one pair a
// group) and d256 8k-16k; shorter causal and every non-causal shape ran
// faster in L2-sized groups (docs/kernels.md).
int choose_heads_per_group(int n_heads, int n_kv_heads, int batch, int max_seqlen_k, int head_dim, bool causal,
                           int n_m_blocks) {
  const int n_hb = n_heads * batch;
  if (causal && n_m_blocks >= 64) return n_hb;
  constexpr double kBudget = 24.0 * (1 << 20);
  const double kv_bytes = 2.0 * 2.0 * max_seqlen_k * head_dim;  // K and V of one KV head, 2-byte elements
  const int kv_heads = static_cast<int>(std::max(1.0, kBudget / std::max(kv_bytes, 1.0)));
  const int64_t g = int64_t(kv_heads) * (n_heads / n_kv_heads);
  return static_cast<int>(std::min<int64_t>(n_hb, std::max<int64_t>(1, g)));
}

template <typename T, int D, int BN, bool kPaged, bool kSoftcap, bool kSinks>
void launch_fa3(const AttnParams& p) {
  using L = Layout<D, BN>;
  if (p.max_seqlen_q == 0) return;
  // Contiguous: K/V rows are the batch's keys, one box a tile. Paged: rows
  // are the pool's slots, a tile is BN / box boxes of box rows, box =
  // gcd(block_size, BN) (= min for the power-of-two BN; 16 or 8 for BN 176),
  // so no box crosses a page or a tile edge.
  int kv_rows = p.total_k, box = L::BN, log2_bs = 0;
  if (kPaged) {
    kv_rows = p.num_pages * p.block_size;
    box = std::gcd(p.block_size, L::BN);
    while ((1 << log2_bs) < p.block_size) ++log2_bs;
    RUNLM_CHECK((1 << log2_bs) == p.block_size && box % 8 == 0 && L::BN / box <= 32,
                "fa3: paged K/V block_size=%d unsupported with BN=%d; supported: powers of two >= 8", p.block_size,
                L::BN);
  }
  const CUtensorMap tq = make_tmap(p.q, p.dtype, p.total_q, p.n_heads, D, L::BM, "q");
  const CUtensorMap tk = make_tmap(p.k, p.dtype, kv_rows, p.n_kv_heads, D, box, "k");
  const CUtensorMap tv = make_tmap(p.v, p.dtype, kv_rows, p.n_kv_heads, D, box, "v");
  Args a;
  a.out = p.out;
  a.lse = p.lse;
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.total_q = p.total_q;
  a.n_heads = p.n_heads;
  a.group = p.n_heads / p.n_kv_heads;
  a.window_left = p.window_left;
  a.causal = p.causal;
  a.scale_log2 = kSoftcap ? 1.0f : p.scale * kLog2e;
  a.cap_in = kSoftcap ? p.scale / p.softcap : 0.0f;
  a.cap_out = kSoftcap ? p.softcap * kLog2e : 0.0f;
  a.sinks = p.sinks;
  a.n_m_blocks = ceil_div(p.max_seqlen_q, L::BM);
  a.batch = p.batch;
  a.heads_per_group =
      choose_heads_per_group(p.n_heads, p.n_kv_heads, p.batch, p.max_seqlen_k, D, p.causal, a.n_m_blocks);
  // Only where tile costs differ (causal, several query blocks): elsewhere
  // the order is a permutation of equal tiles and keeps the plain stride.
  a.snake = p.causal && a.n_m_blocks > 1;
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.log2_bs = log2_bs;
  a.box_rows = box;
  const int64_t tiles = int64_t(a.n_m_blocks) * p.n_heads * p.batch;
  RUNLM_CHECK(tiles < (int64_t(1) << 31), "fa3: %lld work tiles unsupported; supported: < 2^31",
              static_cast<long long>(tiles));
  int dev = 0, sms = 0;
  cudaCheck(cudaGetDevice(&dev));
  cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int grid = int(tiles < sms ? tiles : sms);
  const auto kernel = attn_fa3_fwd<T, D, BN, kPaged, kSoftcap, kSinks>;
  cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L::kAlloc)));
  kernel<<<grid, kThreads, L::kAlloc, static_cast<cudaStream_t>(p.stream)>>>(tq, tk, tv, a);
  cudaCheckLaunch();
}

// The instantiation for p's soft-cap (at tile width BN) and sinks.
template <typename T, int D, int BN, bool kPaged, bool kSoftcap>
void launch_fa3_sinks(const AttnParams& p) {
  if (p.sinks) return launch_fa3<T, D, BN, kPaged, kSoftcap, true>(p);
  return launch_fa3<T, D, BN, kPaged, kSoftcap, false>(p);
}

template <typename T, int D, int BN, bool kPaged>
void launch_fa3_cap(const AttnParams& p) {
  if (p.softcap > 0.0f) return launch_fa3_sinks<T, D, BN, kPaged, true>(p);
  return launch_fa3_sinks<T, D, BN, kPaged, false>(p);
}

template <typename T, bool kPaged>
void launch_fa3_paged(const AttnParams& p) {
  switch (p.head_dim) {
    case 64: return launch_fa3_cap<T, 64, DefaultBN<64>::value, kPaged>(p);
    case 128:
      // Causal problems of < 4096 keys keep 128-key tiles: there the wider
      // tile's extra masked work on the diagonal costs more than it saves
      // (H100: causal 512 / 1024 keys 202.9 / 311.1 TFLOP/s at 176 against
      // 228.1 / 333.1 at 128; 2048 even; 4096+ 176 wins by 3%).
      if (p.causal && p.max_seqlen_k < 4096) return launch_fa3_cap<T, 128, 128, kPaged>(p);
      // Soft-capped problems keep 128-key tiles too: the 176-key tile's
      // soft-capped consumers spilled 72 bytes (paged; ptxas -v), the 128-key
      // one none. Not timed against each other.
      if (p.softcap > 0.0f) return launch_fa3_sinks<T, 128, 128, kPaged, true>(p);
      return launch_fa3_sinks<T, 128, DefaultBN<128>::value, kPaged, false>(p);
    case 256: return launch_fa3_cap<T, 256, DefaultBN<256>::value, kPaged>(p);
    default: fail("fa3: head_dim=%d unsupported; supported: head_dim {64,128,256}", p.head_dim);
  }
}

template <typename T>
void launch_fa3_typed(const AttnParams& p) {
  if (p.block_tables)
    launch_fa3_paged<T, true>(p);
  else
    launch_fa3_paged<T, false>(p);
}

}  // namespace

void attn_fa3_launch(const AttnParams& p) {
  if (p.dtype == DType::BF16)
    launch_fa3_typed<__nv_bfloat16>(p);
  else
    launch_fa3_typed<__half>(p);
}

}  // namespace runlm
