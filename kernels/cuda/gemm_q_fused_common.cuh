// Shared pieces of the fused quantized GEMM kernels (gemm_q_fused.cu, whose
// header describes the method): tile constants and traits, the matrix set
// of a launch, the cp.async loaders of quants, scales and x, the A-fragment
// decode and the split-K epilogue. Included only by gemm_q_fused.cu (its
// kernels live in gemm_q_mma_sm80.cuh and gemm_q_wgmma_sm90.cuh).
#pragma once

#include <climits>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/mma_sm80.cuh"

namespace runlm::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kBM = 128;               // weight rows per CTA
constexpr int kBK = 128;               // columns per k-tile (stage)
constexpr int kBlocks = kBK / 32;      // quant blocks per row per stage
constexpr int kSmemBudget = 220 * 1024;  // per SM, H100 (228 KB less the per-CTA reserve)
constexpr int kColAlign = 64;          // cols % 64 == 0: 4-byte aligned scale rows

template <DType kT>
struct QuantTile;
template <>
struct QuantTile<DType::Q4_0> {
  static constexpr int kRowBytes = kBK / 2;  // shared bytes per row per stage
  static constexpr int kChunkCols = 32;      // columns per 16-byte chunk
};
template <>
struct QuantTile<DType::Q8_0> {
  static constexpr int kRowBytes = kBK;
  static constexpr int kChunkCols = 16;
};

template <DType kT, int BN>
struct MmaTraits {
  static constexpr int kWarpsN = BN >= 64 ? 2 : 1;
  static constexpr int kWarpsM = kThreads / 32 / kWarpsN;
  static constexpr int kMT = kBM / (16 * kWarpsM);  // m16 tiles per warp
  static constexpr int kWN = BN / kWarpsN;          // tokens per warp
  static constexpr int kNT = kWN / 8;               // n8 tiles per warp
  static constexpr int kMinBlocks = BN >= 128 ? 1 : 2;
  static constexpr int kQBytes = kBM * QuantTile<kT>::kRowBytes;
  static constexpr int kSBytes = kBM * kBlocks * 2;
  static constexpr int kXBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kQBytes + kSBytes + kXBytes;
  static constexpr int kStagesFit = kSmemBudget / kMinBlocks / kStageBytes;
  static constexpr int kStages = kStagesFit < 4 ? kStagesFit : 4;
  static constexpr int kSmem = kStages * kStageBytes;
  static_assert(kStages >= 2, "gemm_q_mma: a stage ring needs 2 stages");
  static_assert(kWN % 8 == 0 && kMT >= 1, "gemm_q_mma: warp tile");
};

// One weight matrix of a launch. A launch runs 1 to kMaxMats matrices of one
// type and cols that read the same x (q/k/v, gate/up: gemm_fused_q_multi),
// their row tiles concatenated in order, so several 4096-row matrices give
// the grid of one matrix of their summed rows (more tiles, fewer column
// slices or stream-K cuts) in one launch. Each keeps its own y.
constexpr int kMaxMats = kMaxGemvOuts;
struct MatView {
  const uint8_t* q;  // [rows][cols/2] (q4_0) or [rows][cols] (q8_0)
  const __half* d;   // [rows][cols/32]
  float* y;          // [n][rows]
  int rows;
};
struct MatSet {
  MatView m[kMaxMats];
  int tile1, tile2;  // first row tile of matrices 1 and 2 (INT_MAX where absent)
  // The matrix of (launch) row tile rt, and rt made its own. Compares and
  // selects: an index computed at run time into kernel parameters would
  // copy them to local memory.
  __device__ __forceinline__ MatView pick(int& rt) const {
    if (rt >= tile2) {
      rt -= tile2;
      return m[2];
    }
    if (rt >= tile1) {
      rt -= tile1;
      return m[1];
    }
    return m[0];
  }
};

struct MmaArgs {
  MatSet w;
  const __half* x;     // [n][cols]
  float* partial;      // split-K: [tiles][splits][kMT*kNT][kThreads] float4
  int* tickets;        // split-K: [tiles], zero on entry, left zero
  int cols, n;
  int k_tiles, k_tiles_per_split, splits;
};

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// cp_async_16 with an L2 prefetch hint: L2 fetches the 256-byte block
// around src from DRAM in one request (the overlap kernel's quant rows).
[[maybe_unused]] __device__ __forceinline__ void cp_async_16_pf256(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
[[maybe_unused]] __device__ __forceinline__ float4 lds128f(uint32_t addr) {  // the stream-K kernel's fixup
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// Byte offset of chunk c of row r in the quant tile.
template <DType kT>
__device__ __forceinline__ uint32_t quant_swz(int r, int c) {
  if constexpr (kT == DType::Q4_0)
    return static_cast<uint32_t>(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
  else
    return static_cast<uint32_t>(r * 128 + ((c ^ (r & 7)) << 4));
}
// Byte offset of chunk c (8 f16) of token j in the x tile.
__device__ __forceinline__ uint32_t x_swz(int j, int c) {
  return static_cast<uint32_t>(j * kBK * 2 + ((c ^ ((j & 3) << 1)) << 4));
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// (level(e) * d, level(e') * d) as an f16 pair from x = the two levels'
// biased 8-bit codes in bytes 0 and 2 (bytes 1, 3 zero): 0x6400 | code is
// the f16 1024 + code exactly; subtracting 1024 + bias is exact too.
__device__ __forceinline__ uint32_t level_pair(uint32_t x, __half2 bias, __half2 d) {
  return h2_bits(__hmul2(__hsub2(bits_h2(x | 0x64006400u), bias), d));
}

// Q4_0: w = bytes 4t .. 4t+3 of a row's block: low nibbles are elements
// 4t .. 4t+3 (k16 step 0), high nibbles 16 + 4t .. (step 1). Out: [step][pair].
__device__ __forceinline__ void decode_q4(uint32_t w, __half2 d, uint32_t (&out)[2][2]) {
  const __half2 bias = __float2half2_rn(1032.0f);  // 1024 + 8
  const uint32_t x01 = __byte_perm(w, 0, 0x4140), x23 = __byte_perm(w, 0, 0x4342);
  out[0][0] = level_pair(x01 & 0x000F000Fu, bias, d);
  out[0][1] = level_pair(x23 & 0x000F000Fu, bias, d);
  out[1][0] = level_pair((x01 >> 4) & 0x000F000Fu, bias, d);
  out[1][1] = level_pair((x23 >> 4) & 0x000F000Fu, bias, d);
}
// Q8_0: w = 4 int8 levels (elements 4t .. 4t+3 of one k16 step); ^ 0x80
// makes each the level + 128 as an unsigned byte.
__device__ __forceinline__ void decode_q8(uint32_t w, __half2 d, uint32_t (&out)[2]) {
  const __half2 bias = __float2half2_rn(1152.0f);  // 1024 + 128
  out[0] = level_pair(__byte_perm(w, 0, 0x4140) ^ 0x00800080u, bias, d);
  out[1] = level_pair(__byte_perm(w, 0, 0x4342) ^ 0x00800080u, bias, d);
}

// Byte offset of chunk c (8 f16, c < 16) of token j in the wgmma kernels' x tile:
// two column blocks of [BN][64] f16 in the 128-byte swizzle that wgmma's
// K-major descriptors read (fa3's K tiles, kernel_traits.cuh).
template <int BN>
__device__ __forceinline__ uint32_t x_swz128(int j, int c) {
  return static_cast<uint32_t>((c >> 3) * BN * 128 + j * 128 + (((c & 7) ^ (j & 7)) << 4));
}

// Issues the cp.async copies of k-tile kt into one stage of kRows weight
// rows with kThr threads (kWg: the wgmma x layout; kPrefetch: quants with
// the L2::256B hint, the overlap kernel; the stream-K kernel passes its 256 rows and 512
// threads). Args: MmaArgs or SkArgs (cols, n, x).
template <DType kT, int BN, bool kWg = false, bool kPrefetch = false, int kRows = kBM, int kThr = kThreads,
          typename Args = MmaArgs>
__device__ __forceinline__ void load_stage(const Args& a, const MatView& w, uint32_t sq, uint32_t ss, uint32_t sx,
                                           int m0, int n0, int kt) {
  using QT = QuantTile<kT>;
  constexpr int kChunksRow = QT::kRowBytes / 16;
  const int k0 = kt * kBK;
  const int64_t q_row_bytes = kT == DType::Q4_0 ? a.cols / 2 : a.cols;
  const int tid = threadIdx.x;
  static_assert(kRows * kChunksRow % kThr == 0 && BN * (kBK / 8) % kThr == 0 && kRows * 2 == kThr,
                "load_stage: copies split evenly over the threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunksRow / kThr; ++it) {
    const int i = tid + it * kThr;
    const int r = i / kChunksRow, c = i % kChunksRow;
    const int row = m0 + r, col = k0 + c * QT::kChunkCols;
    const bool ok = row < w.rows && col < a.cols;
    const uint8_t* src = ok ? w.q + row * q_row_bytes + col * QT::kRowBytes / kBK : w.q;
    if constexpr (kPrefetch)
      cp_async_16_pf256(sq + quant_swz<kT>(r, c), src, ok ? 16 : 0);
    else
      cp_async_16(sq + quant_swz<kT>(r, c), src, ok ? 16 : 0);
  }
  // Scales: two 4-byte pieces (blocks 2p, 2p+1) per row.
  {
    const int r = tid >> 1, p = tid & 1;
    const int row = m0 + r, col = k0 + 64 * p;
    const bool ok = row < w.rows && col < a.cols;
    const __half* src = ok ? w.d + int64_t(row) * (a.cols / 32) + col / 32 : w.d;
    cp_async_4(ss + r * kBlocks * 2 + p * 4, src, ok ? 4 : 0);
  }
#pragma unroll
  for (int it = 0; it < BN * (kBK / 8) / kThr; ++it) {
    const int i = tid + it * kThr;
    const int j = i / (kBK / 8), c = i % (kBK / 8);
    const int tok = n0 + j, col = k0 + 8 * c;
    const bool ok = tok < a.n && col < a.cols;
    const __half* src = ok ? a.x + int64_t(tok) * a.cols + col : a.x;
    cp_async_16(sx + (kWg ? x_swz128<BN>(j, c) : x_swz(j, c)), src, ok ? 16 : 0);
  }
}

// The end of every kernel: the accumulators of one thread (kMT m16 tiles x
// kNT n8 tiles in the mma C layout: c0, c1 at (row, tok), (row, tok + 1),
// c2, c3 at row + 8; tiles 16 rows and 8 tokens apart from row0, tok0) go
// to y, through the split-K reduction when the columns are split.
// kThr threads own the accumulators, tid is this one's index among them and
// sync() a barrier over exactly them.
template <int kMT, int kNT, int kThr, typename Sync>
__device__ __forceinline__ void finish_tile_by(const MmaArgs& a, const MatView& w, float (&acc)[kMT][kNT][4], int row0,
                                               int tok0, int split, int tid, Sync sync) {
  const int tile = blockIdx.y * gridDim.x + blockIdx.x;
  if (a.splits > 1) {
    // This slice's partial tile, fragment order: thread tid's float4 of
    // (mt, nt) at [tile][split][mt * kNT + nt][tid].
    float4* part = reinterpret_cast<float4*>(a.partial) + (int64_t(tile) * a.splits) * kMT * kNT * kThr;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        __stcg(part + (int64_t(split) * kMT * kNT + mt * kNT + nt) * kThr + tid,
               make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
    // Release: the partial stores are visible device-wide before the ticket.
    __threadfence();
    sync();
    __shared__ int last;
    if (tid == 0) {
      last = atomicAdd(a.tickets + tile, 1) == a.splits - 1;
      if (last) a.tickets[tile] = 0;  // every slice has taken its ticket: ready for the next call
    }
    sync();
    if (!last) return;
    __threadfence();  // acquire: the other slices' partials (read from L2 below)
    // Sum in slice order whichever slice came last: deterministic.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int sp = 0; sp < a.splits; ++sp) {
          const float4 p = sp == split ? make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3])
                                       : __ldcg(part + (int64_t(sp) * kMT * kNT + mt * kNT + nt) * kThr + tid);
          sum.x += p.x;
          sum.y += p.y;
          sum.z += p.z;
          sum.w += p.w;
        }
        acc[mt][nt][0] = sum.x;
        acc[mt][nt][1] = sum.y;
        acc[mt][nt][2] = sum.z;
        acc[mt][nt][3] = sum.w;
      }
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int row = row0 + mt * 16, tok = tok0 + nt * 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row + 8 * h;
        if (r >= w.rows) continue;
        if (tok < a.n) w.y[int64_t(tok) * w.rows + r] = acc[mt][nt][2 * h];
        if (tok + 1 < a.n) w.y[int64_t(tok + 1) * w.rows + r] = acc[mt][nt][2 * h + 1];
      }
    }
}
template <int kMT, int kNT>
__device__ __forceinline__ void finish_tile(const MmaArgs& a, const MatView& w, float (&acc)[kMT][kNT][4], int row0,
                                            int tok0, int split) {
  finish_tile_by<kMT, kNT, kThreads>(a, w, acc, row0, tok0, split, threadIdx.x, [] { __syncthreads(); });
}


}  // namespace

}  // namespace runlm::gpu
