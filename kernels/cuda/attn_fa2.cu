// attn_fa2: FlashAttention-2 forward on mma.sync tensor cores (sm_80+).
// One CTA per (query tile of BM rows, head, sequence); its warps split the
// rows (16 * kMT each). K/V tiles of BN keys stream through a 2-stage
// cp.async ring; scores stay in registers, the softmax is online (running max
// and sum per row, base 2), normalisation is deferred to the end, and the
// log-sum-exp is written for each row.
// Q is re-read from shared memory by ldmatrix each k-step (keeps registers
// for O and S); output goes out by direct 4-byte stores.
// Versions (kernels/cuda/NOTES.md has the measurements): v1 16 rows a warp;
// v2 32 rows a warp as FA2; v3 ex2.approx and one scale per row max; v4
// (this) ldmatrix addresses from per-thread XOR offsets and P packed per
// k16 step, which took the d128 spill from 92 to 12 bytes.
// Paged K/V (attention.h; kPaged, a separate instantiation so the contiguous
// kernel is unchanged): the cp.async tile loads find each key row's pool slot
// through the sequence's block table; nothing else differs.
#include <cfloat>
#include <cstdlib>

#include "cuda/attn_kernels.h"
#include "cuda/common.cuh"
#include "cuda/mma_sm80.cuh"

namespace runlm {

namespace {

struct Fa2Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_q;
  const int32_t* cu_k;
  int total_q, n_heads, n_kv_heads, window_left;
  bool causal;
  float scale_log2;  // softmax scale * log2(e)
  const int32_t* block_tables;  // paged only: [batch, max_blocks_per_seq]
  int max_blocks_per_seq;
  int log2_bs;                  // paged only: log2(block_size)
};

// Tile shape per head dim and variant: kWarps warps of 16*kMT rows each, BN
// keys a tile. Variant 0 (default) for d64/d128: 32 rows a warp, half the
// shared-memory reads of K/V per FLOP of 16 rows, at the register limit
// (measured on H100, d128 16k: 291 vs 247 TFLOP/s for 16 rows a warp).
// Variant 1 keeps the alternative for comparison; RUNLM_FA2_VARIANT=1 picks
// it (benchmarking only).
template <int D, int V>
struct Fa2Traits;
template <>
struct Fa2Traits<64, 0> {
  static constexpr int kWarps = 4, kMT = 2, kBN = 64, kMinBlocks = 2;
};
template <>
struct Fa2Traits<64, 1> {
  static constexpr int kWarps = 8, kMT = 1, kBN = 64, kMinBlocks = 1;
};
template <>
struct Fa2Traits<128, 0> {
  static constexpr int kWarps = 4, kMT = 2, kBN = 64, kMinBlocks = 2;
};
template <>
struct Fa2Traits<128, 1> {
  static constexpr int kWarps = 8, kMT = 1, kBN = 64, kMinBlocks = 1;
};
template <>
struct Fa2Traits<256, 0> {
  static constexpr int kWarps = 8, kMT = 1, kBN = 64, kMinBlocks = 1;
};
template <>
struct Fa2Traits<256, 1> {
  static constexpr int kWarps = 8, kMT = 1, kBN = 32, kMinBlocks = 1;
};

template <int D, int V>
constexpr int fa2_bm() {
  return Fa2Traits<D, V>::kWarps * 16 * Fa2Traits<D, V>::kMT;
}
template <int D, int V>
constexpr size_t fa2_smem_bytes() {
  return size_t(fa2_bm<D, V>() + 4 * Fa2Traits<D, V>::kBN) * D * 2;  // Q + 2 stages of K and V
}

// Copies rows [0, rows) of a [R][D] tile from global (row stride in elements)
// into swizzled shared memory; rows >= valid are zero-filled.
template <int D, int R, int kThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, int64_t stride, int valid) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int row = idx / kChunks, ch = idx % kChunks;
    const bool ok = row < valid;
    const T* s = ok ? src + row * stride + ch * 8 : src;
    cp_async_16(dst + swz_offset<D>(row, ch), s, ok ? 16 : 0);
  }
}

// load_tile for paged K/V: row r of the tile is the sequence's key n0 + r, at
// pool slot table[(n0 + r) >> log2_bs] * block_size + ((n0 + r) & (block_size - 1)),
// src is the pool's slot 0 (this kv head), stride its row length. Rows >=
// valid (past the sequence's last key) are zero-filled and their table
// entries never read: the tail of the last page may hold anything, and P = 0
// times a NaN there would still be NaN. Rows whose page is -1 (released by
// the sliding window: no query sees them) are zero-filled too. Every thread
// copies the same chunk column ch of rows r0, r0 + kRowStep, ...; called once
// for K and once for V (the second reads the same table entries from L1).
// Interleaving K and V per row, one table read a thread per tile plus
// shuffles, or 32-bit offsets all spilled as much or more at d128 (ptxas,
// NOTES.md).
template <int D, int R, int kThreads, typename T>
__device__ __forceinline__ void load_tile_paged(uint32_t dst, const T* src, int stride, const int32_t* table,
                                                int log2_bs, int n0, int valid) {
  constexpr int kChunks = D / 8;
  constexpr int kIters = R * kChunks / kThreads, kRowStep = kThreads / kChunks;
  static_assert(R * kChunks % kThreads == 0 && kThreads % kChunks == 0, "chunks split evenly over the threads");
  const int ch = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int row = r0 + i * kRowStep;
    const T* s = src;
    int bytes = 0;
    if (row < valid) {
      const int j = n0 + row;
      const int page = __ldg(table + (j >> log2_bs));
      if (page >= 0) {
        s = src + (int64_t((page << log2_bs) | (j & ((1 << log2_bs) - 1))) * stride + ch * 8);
        bytes = 16;
      }
    }
    cp_async_16(dst + swz_offset<D>(row, ch), s, bytes);
  }
}

template <typename T, int D, int V, bool kPaged>
__global__ void __launch_bounds__(Fa2Traits<D, V>::kWarps * 32, Fa2Traits<D, V>::kMinBlocks)
    attn_fa2_fwd(Fa2Args a) {
  using Tr = ElemTraits<T>;
  constexpr int kWarps = Fa2Traits<D, V>::kWarps, kMT = Fa2Traits<D, V>::kMT, BN = Fa2Traits<D, V>::kBN;
  constexpr int BM = fa2_bm<D, V>(), kThreads = kWarps * 32;
  constexpr int kNT = BN / 8;  // n8 tiles of S per m-tile
  constexpr int kDT = D / 8;   // n8 tiles of O per m-tile
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sK = sQ + BM * D * 2;               // [2][BN][D]
  const uint32_t sV = sK + 2 * BN * D * 2;           // [2][BN][D]

  // Heavy query tiles (late rows under causal) are launched first.
  const int m_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int q_start = a.cu_q[b], sq = a.cu_q[b + 1] - q_start;
  const int m0 = m_block * BM;
  if (m0 >= sq) return;
  const int k_start = a.cu_k[b], sk = a.cu_k[b + 1] - k_start;
  const int offset = sk - sq;  // query i sits at key position i + offset
  const int kvh = h / (a.n_heads / a.n_kv_heads);

  // Keys any row of this tile can see: [n_lo, n_hi).
  int n_hi = sk, n_lo = 0;
  if (a.causal) n_hi = min(sk, m0 + BM - 1 + offset + 1);
  if (a.window_left >= 0) n_lo = max(0, m0 + offset - a.window_left);
  const int t_lo = n_lo / BN;
  const int t_hi = n_hi > n_lo ? ceil_div(n_hi, BN) : t_lo;  // empty when nothing is visible

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // ldmatrix addresses, split into a per-thread row base and a few XOR
  // offsets: every 16-row group starts at a multiple of 8 rows, so a row's
  // swizzle key is lane & 7, and chunk 8*blk + c (c < 8) swizzles to
  // 8*blk + (c ^ (lane & 7)). Four offsets per operand then cover every
  // k-step; computing each address from scratch cost registers (spills).
  const uint32_t r7 = lane & 7;
  uint32_t xhi[4], xmid[4];  // chunk low bit from lane >> 4 (Q, V) or (lane >> 3) & 1 (K)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    xhi[j] = ((2 * j + (lane >> 4)) ^ r7) << 4;
    xmid[j] = ((2 * j + ((lane >> 3) & 1)) ^ r7) << 4;
  }
  const uint32_t q_row = sQ + (warp * kMT * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * D * 2;
  const uint32_t k_row = ((lane & 7) + (lane >> 4) * 8) * D * 2;           // + stage base
  const uint32_t v_row = ((lane & 7) + ((lane >> 3) & 1) * 8) * D * 2;     // + stage base
  const int64_t q_stride = int64_t(a.n_heads) * D, kv_stride = int64_t(a.n_kv_heads) * D;
  const T* qg = static_cast<const T*>(a.q) + (int64_t(q_start + m0) * a.n_heads + h) * D;
  // Contiguous: the sequence's first key row; paged: the pool's slot 0.
  const T* kg = static_cast<const T*>(a.k) + (int64_t(kPaged ? 0 : k_start) * a.n_kv_heads + kvh) * D;
  const T* vg = static_cast<const T*>(a.v) + (int64_t(kPaged ? 0 : k_start) * a.n_kv_heads + kvh) * D;
  const int32_t* table = kPaged ? a.block_tables + int64_t(b) * a.max_blocks_per_seq : nullptr;

  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];  // running max (base-2, scaled) and partial row sums
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.0f;
  }

  if (t_lo < t_hi) {
    load_tile<D, BM, kThreads>(sQ, qg, q_stride, sq - m0);
    if constexpr (kPaged) {
      load_tile_paged<D, BN, kThreads>(sK, kg, a.n_kv_heads * D, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
      load_tile_paged<D, BN, kThreads>(sV, vg, a.n_kv_heads * D, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
    } else {
      load_tile<D, BN, kThreads>(sK, kg + int64_t(t_lo * BN) * kv_stride, kv_stride, sk - t_lo * BN);
      load_tile<D, BN, kThreads>(sV, vg + int64_t(t_lo * BN) * kv_stride, kv_stride, sk - t_lo * BN);
    }
    cp_async_commit();
  }

  for (int t = t_lo; t < t_hi; ++t) {
    const int stage = (t - t_lo) & 1;
    if (t + 1 < t_hi) {
      // The other stage was last read in iteration t-1, which ended with a barrier.
      const int n1 = (t + 1) * BN;
      if constexpr (kPaged) {
        load_tile_paged<D, BN, kThreads>(sK + (stage ^ 1) * BN * D * 2, kg, a.n_kv_heads * D, table, a.log2_bs, n1,
                                         sk - n1);
        load_tile_paged<D, BN, kThreads>(sV + (stage ^ 1) * BN * D * 2, vg, a.n_kv_heads * D, table, a.log2_bs, n1,
                                         sk - n1);
      } else {
        load_tile<D, BN, kThreads>(sK + (stage ^ 1) * BN * D * 2, kg + int64_t(n1) * kv_stride, kv_stride, sk - n1);
        load_tile<D, BN, kThreads>(sV + (stage ^ 1) * BN * D * 2, vg + int64_t(n1) * kv_stride, kv_stride, sk - n1);
      }
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this stage's copies (and Q) are visible to all warps
    const uint32_t sKs = sK + stage * BN * D * 2, sVs = sV + stage * BN * D * 2;

    // S = Q K^T for this warp's rows.
    float s[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t qa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        ldmatrix_x4(q_row + mt * 16 * D * 2 + (kk / 4) * 128 + xhi[kk % 4], qa[mt][0], qa[mt][1], qa[mt][2],
                    qa[mt][3]);
#pragma unroll
      for (int n2 = 0; n2 < kNT / 2; ++n2) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4(sKs + k_row + n2 * 16 * D * 2 + (kk / 4) * 128 + xmid[kk % 4], b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Tr::kIsBf16>(s[mt][2 * n2], qa[mt], b0, b1);
          mma_16816<Tr::kIsBf16>(s[mt][2 * n2 + 1], qa[mt], b2, b3);
        }
      }
    }

    // Mask only tiles that straddle a boundary (sequence end, diagonal, window edge).
    const int n0 = t * BN;
    const bool need_mask = n0 + BN > sk || (a.causal && n0 + BN - 1 > m0 + offset) ||
                           (a.window_left >= 0 && n0 < m0 + BM - 1 + offset - a.window_left);
    if (need_mask) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int pos = m0 + (warp * kMT + mt) * 16 + g + hr * 8 + offset;
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int j = n0 + nt * 8 + t4 * 2 + c;
              const bool vis = j < sk && (!a.causal || j <= pos) && (a.window_left < 0 || j >= pos - a.window_left);
              if (!vis) s[mt][nt][hr * 2 + c] = -INFINITY;
            }
        }
    }

    // Online softmax, base 2: p = 2^(s*scale_log2 - m), O and l rescaled by 2^(m_old - m).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;  // raw scores first, scaled once (scale > 0 keeps the order)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][hr * 2], s[mt][nt][hr * 2 + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(m_run[mt][hr], mx * a.scale_log2);
        // A row with nothing visible yet keeps max -inf: subtract 0 instead of -inf.
        const float m_use = mx == -INFINITY ? 0.0f : mx;
        const float corr = fast_exp2(m_run[mt][hr] - m_use);
        m_run[mt][hr] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const float p0 = fast_exp2(fmaf(s[mt][nt][hr * 2], a.scale_log2, -m_use));
          const float p1 = fast_exp2(fmaf(s[mt][nt][hr * 2 + 1], a.scale_log2, -m_use));
          s[mt][nt][hr * 2] = p0;
          s[mt][nt][hr * 2 + 1] = p1;
          sum += p0 + p1;
        }
        l_run[mt][hr] = l_run[mt][hr] * corr + sum;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) {
          o[mt][dt][hr * 2] *= corr;
          o[mt][dt][hr * 2 + 1] *= corr;
        }
      }
    }

    // O += P V. P is packed one k16 step at a time, so S's registers die as
    // the loop advances (packing all of P first spilled at d128). The C
    // layout of two adjacent n8 tiles is the A layout of one k16 step.
#pragma unroll
    for (int k2 = 0; k2 < kNT / 2; ++k2) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pa[mt][0] = Tr::pack2(s[mt][2 * k2][0], s[mt][2 * k2][1]);
        pa[mt][1] = Tr::pack2(s[mt][2 * k2][2], s[mt][2 * k2][3]);
        pa[mt][2] = Tr::pack2(s[mt][2 * k2 + 1][0], s[mt][2 * k2 + 1][1]);
        pa[mt][3] = Tr::pack2(s[mt][2 * k2 + 1][2], s[mt][2 * k2 + 1][3]);
      }
#pragma unroll
      for (int d2 = 0; d2 < kDT / 2; ++d2) {
        uint32_t b0, b1, b2, b3;
        ldmatrix_x4_trans(sVs + v_row + k2 * 16 * D * 2 + (d2 / 4) * 128 + xhi[d2 % 4], b0, b1, b2, b3);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_16816<Tr::kIsBf16>(o[mt][2 * d2], pa[mt], b0, b1);
          mma_16816<Tr::kIsBf16>(o[mt][2 * d2 + 1], pa[mt], b2, b3);
        }
      }
    }
    __syncthreads();  // all warps are done with this stage before it is refilled
  }

  // Epilogue: finish the row sums across the quad, normalise, store.
  T* og = static_cast<T*>(a.out) + (int64_t(q_start) * a.n_heads + h) * D;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float l = l_run[mt][hr];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: out = 0
      const int i = m0 + (warp * kMT + mt) * 16 + g + hr * 8;
      if (i < sq) {
        T* orow = og + int64_t(i) * q_stride;
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
          *reinterpret_cast<uint32_t*>(orow + dt * 8 + t4 * 2) =
              Tr::pack2(o[mt][dt][hr * 2] * inv, o[mt][dt][hr * 2 + 1] * inv);
        if (a.lse && t4 == 0)
          a.lse[int64_t(h) * a.total_q + q_start + i] = l > 0.0f ? (m_run[mt][hr] + log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
}

template <typename T, int D, int V, bool kPaged>
void launch_fa2(const AttnParams& p) {
  constexpr int BM = fa2_bm<D, V>();
  constexpr size_t smem = fa2_smem_bytes<D, V>();
  RUNLM_CHECK(p.n_heads <= 65535 && p.batch <= 65535, "fa2: n_heads=%d batch=%d unsupported; supported: <= 65535 each",
              p.n_heads, p.batch);
  if (p.max_seqlen_q == 0) return;
  cudaCheck(
      cudaFuncSetAttribute(attn_fa2_fwd<T, D, V, kPaged>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int log2_bs = 0;
  if (kPaged) {
    while ((1 << log2_bs) < p.block_size) ++log2_bs;
    RUNLM_CHECK((1 << log2_bs) == p.block_size, "fa2: paged K/V block_size=%d unsupported; supported: powers of two",
                p.block_size);
  }
  Fa2Args a{p.q,       p.k,          p.v,           p.out,         p.lse,    p.cu_seqlens_q,
            p.cu_seqlens_k, p.total_q, p.n_heads, p.n_kv_heads, p.window_left, p.causal, p.scale * kLog2e,
            p.block_tables, p.max_blocks_per_seq, log2_bs};
  dim3 grid(ceil_div(p.max_seqlen_q, BM), p.n_heads, p.batch);
  attn_fa2_fwd<T, D, V, kPaged><<<grid, Fa2Traits<D, V>::kWarps * 32, smem, static_cast<cudaStream_t>(p.stream)>>>(a);
  cudaCheckLaunch();
}

int fa2_variant() {
  static const int v = [] {
    const char* e = std::getenv("RUNLM_FA2_VARIANT");
    return e && std::atoi(e) == 1 ? 1 : 0;
  }();
  return v;
}

template <typename T, int D, bool kPaged>
void launch_fa2_variant(const AttnParams& p) {
  if (fa2_variant() == 1)
    launch_fa2<T, D, 1, kPaged>(p);
  else
    launch_fa2<T, D, 0, kPaged>(p);
}

template <typename T, int D>
void launch_fa2_dim(const AttnParams& p) {
  if (p.block_tables)
    launch_fa2_variant<T, D, true>(p);
  else
    launch_fa2_variant<T, D, false>(p);
}

template <typename T>
void launch_fa2_typed(const AttnParams& p) {
  switch (p.head_dim) {
    case 64: return launch_fa2_dim<T, 64>(p);
    case 128: return launch_fa2_dim<T, 128>(p);
    case 256: return launch_fa2_dim<T, 256>(p);
    default: fail("fa2: head_dim=%d unsupported; supported: head_dim {64,128,256}", p.head_dim);
  }
}

}  // namespace

void attn_fa2_launch(const AttnParams& p) {
  if (p.dtype == DType::BF16)
    launch_fa2_typed<__nv_bfloat16>(p);
  else
    launch_fa2_typed<__half>(p);
}

}  // namespace runlm
