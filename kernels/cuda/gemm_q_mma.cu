// gemm_q_mma: fused prefill GEMM for Q4_0 and Q8_0 weights on tensor cores:
// y[t, r] = sum_c W[r, c] * x[t, c], W in the repacked device layout
// (gpu_codec.cuh), x f16 [n_tokens, cols], y f32 [n_tokens, rows]. No f16
// copy of W: raw quant bytes and f16 scales stream through a cp.async ring
// in shared memory and are dequantized straight into A fragments in
// registers.
//
// Versions (measured on the H100: kernels/cuda/NOTES.md, "Fused quantized
// prefill GEMM"):
//   1 gemm_q_mma_kernel: mma.sync m16n8k16 (sm_80+), described first below.
//   2 gemm_q_wgmma_kernel: wgmma m64nBNk16 with A from registers (sm_90a;
//     the default where it runs), see "version 2" further down.
//   3 gemm_q_wgmma_v3_kernel: version 2 with the decode of quant block b + 1
//     overlapping the wgmmas of block b (A double buffered per block,
//     wait_group 1) and an L2 prefetch hint on the quants; sm_90a, selected
//     by version = 3 only until measured. See "version 3" further down.
//   4 gemm_q_wgmma_v4_kernel (n_tokens > 64; below, as auto): version 3's
//     loop on 256-row tiles (4 warpgroups, 512 threads) over a persistent
//     stream-K grid; sm_90a, auto's choice past 64 tokens in launches of
//     many row tiles (auto_version). See "version 4" further down.
//   5 gemm_q_wgmma_v5_kernel (n_tokens > 64, cols % 256 == 0; version = 5
//     only): warp-specialized, producer warpgroups decode into an f16 A tile
//     in shared memory, consumers issue the wgmmas. Measured no faster end
//     to end (shared-memory bound). See "version 5" further down.
// Every version takes 1 to 3 matrices of one type and cols reading the same
// x in one launch (gemm_fused_q_multi; MatSet below).
//
// Tile: a CTA computes kBM = 128 weight rows (the mma M side) x BN tokens
// (N side, BN in {16, 32, 64, 128} picked from n_tokens) over a range of
// k-tiles of kBK = 128 columns (4 quant blocks). 8 warps: BN <= 32 as 8 x 1
// warps of 16 rows x BN tokens, BN >= 64 as 4 x 2 warps of 32 rows x BN/2
// (halves the x reads from shared memory per mma; the two N-warps decode the
// same A fragments, which the ALU budget allows at those sizes).
//
// Dequantization in registers, not into a shared f16 tile: a thread's A
// fragment of a 32-block needs, per row, 4 consecutive quant bytes once the
// k order inside the block is permuted (any permutation applied to both A
// and B leaves the sum unchanged): logical k 2t, 2t+1 (a0/a1, b0) is
// physical element 4t, 4t+1 and logical 8+2t, 9+2t (a2/a3, b1) is 4t+2,
// 4t+3. So A is one 4-byte shared load per row (Q4_0: low nibbles give k16
// step 0, high nibbles step 1 of the block, GGUF nibble order) and B one
// 8-byte load x[token][4t .. 4t+3] per n8 tile (no ldmatrix: it would give
// the natural order). Levels become f16 exactly through the exponent trick
// (0x6400 | q is 1024 + q), minus the offset (exact), times the f16 scale in
// one f16 multiply: the exact product rounded once, bit-identical to the
// cuBLAS path's dequantization (level * d in f32, exact, rounded to f16).
// Scaling the accumulators per 32-block instead would need a partial
// accumulator per block (an extra FMA per output per block).
//
// Shared memory per stage (swizzled so every load above is conflict free):
//   quants [kBM][kBK/2 or kBK] bytes, 16-byte chunk c of row r at
//          c ^ ((r >> 1) & 3) (Q4_0, 64-byte rows) or c ^ (r & 7) (Q8_0)
//   scales [kBM][4] f16 (cp.async 4 bytes: rows of the scale part are only
//          4-byte aligned when cols % 64 == 0, the requirement below)
//   x      [BN][kBK] f16, chunk c of token j at c ^ ((j & 3) << 1)
// Rows past `rows`, tokens past n_tokens and columns past cols are zero
// filled by cp.async (zero scale, zero x: no NaN from garbage); only valid
// outputs are stored. cols % 64 == 0 is required (the tail k-tile may be
// half full); gemm_fused_q says so otherwise.
//
// Split-K: with few row tiles (4096 rows = 32 tiles) the grid is also split
// over k into S slices so about one wave of CTAs fills the SMs. Each slice
// writes its fp32 tile to the scratch in fragment order (16-byte coalesced);
// the last CTA of a tile to finish (atomic ticket) sums the S partials in
// slice order (deterministic, whichever CTA is last) and writes y.
//
// Prediction (H100 SXM: 3.0 TB/s; dense f16 ~990 TFLOP/s by wgmma, mma.sync
// ~600, ~6 cycles per m16n8k16 per SM sub-partition), written before the
// measurement (kernels/cuda/NOTES.md has the measured table: small n came in
// ~2x slower than this, 256-512 tokens at 240-440 TFLOP/s).
// Q4_0 = 0.5625 B/weight, Q8_0 = 1.0625; FLOP = 2 rows cols n.
//   shape (rows x cols)   Q4_0 MB  Q8_0 MB  GFLOP at n = 16 / 64 / 128 / 256 / 512
//   4096 x 4096              9.4     17.8   0.54 / 2.1 / 4.3 / 8.6 / 17.2
//   11008 x 4096, 4096 x 11008  25.4  47.9   1.44 / 5.8 / 11.5 / 23.1 / 46.2
// The A decode costs ~16-18 instructions per k16 step per 16 rows (4-byte
// loads, byte_perm, lop3, hsub2, hmul2 per pair).
// Version 1: next to 2 (BN=16) to 16 (BN=128) mma per warp and k16 plus the
// B loads, issue slots, not DRAM, bound everything past ~32 tokens, and at
// BN >= 64 both N-warps decode the same A. Large shapes, Q4_0:
//   n = 16: weight-bound, ~11 us (~2.3 TB/s; Q8_0 ~20 us)
//   n = 64: issue-bound, ~15 us (the dequant + cuBLAS path: ~45 us)
//   n = 128..512: ~300-350 TFLOP/s (33 / 70 / 140 us)
// Version 2: a warp decodes only its 16 rows and issues one wgmma per k16,
// so per CTA and k16 ~34 issue cycles against 16 (BN=16) to 128 (BN=128)
// tensor cycles:
//   n = 16: weight-bound, ~11 us Q4_0, ~20 us Q8_0
//   n = 64: tensor ~9 us at 65% of peak against the 10 us weight read:
//           ~11-12 us Q4_0 (~4x today), ~20 us Q8_0
//   n = 128..512: decode and wgmma alternate per k-tile at BN=128 (one CTA
//           a SM; ~20% of the tensor time lost): ~450-550 TFLOP/s (23 / 46
//           / 92 us). Dequant + cuBLAS (27.5 us + ~600 TFLOP/s) ~ 57 / 66 /
//           99 us: the fused path should win up to ~512 tokens, hence the
//           default threshold 256 (gpu_ops.h) with margin.
// 4096 x 4096: about a third of these times, split-K included.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/fa3/sm90.cuh"
#include "cuda/mma_sm80.cuh"
#include "cuda/tensor_map.h"
#include "cuda/wgmma_rs_f16.cuh"

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
// around src from DRAM in one request (version 3's quant rows).
[[maybe_unused]] __device__ __forceinline__ void cp_async_16_pf256(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
[[maybe_unused]] __device__ __forceinline__ float4 lds128f(uint32_t addr) {  // version 4's fixup
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

// Byte offset of chunk c (8 f16, c < 16) of token j in version 2's x tile:
// two column blocks of [BN][64] f16 in the 128-byte swizzle that wgmma's
// K-major descriptors read (fa3's K tiles, kernel_traits.cuh).
template <int BN>
__device__ __forceinline__ uint32_t x_swz128(int j, int c) {
  return static_cast<uint32_t>((c >> 3) * BN * 128 + j * 128 + (((c & 7) ^ (j & 7)) << 4));
}

// Issues the cp.async copies of k-tile kt into one stage of kRows weight
// rows with kThr threads (kWg: version 2's x layout; kPrefetch: quants with
// the L2::256B hint, version 3; version 4 passes its 256 rows and 512
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

// The end of both versions: the accumulators of one thread (kMT m16 tiles x
// kNT n8 tiles in the mma C layout: c0, c1 at (row, tok), (row, tok + 1),
// c2, c3 at row + 8; tiles 16 rows and 8 tokens apart from row0, tok0) go
// to y, through the split-K reduction when the columns are split.
// kThr threads own the accumulators, tid is this one's index among them and
// sync() a barrier over exactly them (version 5: the two consumer
// warpgroups, the producer has left).
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

template <DType kT, int BN>
__global__ void __launch_bounds__(kThreads, MmaTraits<kT, BN>::kMinBlocks) gemm_q_mma_kernel(MmaArgs a) {
  using Tr = MmaTraits<kT, BN>;
  constexpr int kMT = Tr::kMT, kNT = Tr::kNT, kStages = Tr::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s0 = smem_u32(smem);
  auto sq_of = [&](int st) { return s0 + st * Tr::kStageBytes; };
  auto ss_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kQBytes; };
  auto sx_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kQBytes + Tr::kSBytes; };

  int rt = blockIdx.x;  // launch row tile -> its matrix's
  const MatView w = a.w.pick(rt);
  const int m0 = rt * kBM, n0 = blockIdx.y * BN, split = blockIdx.z;
  const int kt0 = split * a.k_tiles_per_split;
  const int kt1 = min(a.k_tiles, kt0 + a.k_tiles_per_split);
  const int nk = kt1 - kt0;  // >= 1 (the host sizes splits so none is empty)

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp % Tr::kWarpsM, wn = warp / Tr::kWarpsM;
  const int arow = wm * kMT * 16 + g;  // tile row of a0 for m-tile 0 (a1 is + 8)
  const int xtok = wn * Tr::kWN + g;   // tile token of b for n-tile 0
  const uint32_t xkey = (g & 3) << 1, qkey = kT == DType::Q4_0 ? (g >> 1) & 3 : g;

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

  // Prologue: stages 0 .. kStages-2. Every step commits a group (maybe
  // empty) so wait_group counts stay uniform.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load_stage<kT, BN>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + st);
    cp_async_commit();
  }

  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kStages - 2>();
    // Makes k-tile i visible to all warps, and tells the loads below that
    // every warp has finished reading stage (i - 1) % kStages, the one they
    // refill: one barrier per k-tile.
    __syncthreads();
    {
      const int j = i + kStages - 1, st = j % kStages;
      if (j < nk) load_stage<kT, BN>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + j);
      cp_async_commit();
    }
    const int st = i % kStages;
    const uint32_t sq = sq_of(st), ss = ss_of(st), sx = sx_of(st);

    // The 4 scales of rows arow (+ 8) of each m-tile, as f16 pairs {d, d} per block.
    uint2 sc[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      sc[mt][0] = lds64(ss + (arow + mt * 16) * kBlocks * 2);
      sc[mt][1] = lds64(ss + (arow + mt * 16 + 8) * kBlocks * 2);
    }
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      uint32_t af[kMT][2][4];  // [m-tile][k16 step][a0..a3]
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const int r = arow + mt * 16;
        const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
        const __half2 da = bits_h2(__byte_perm(blk < 2 ? sc[mt][0].x : sc[mt][0].y, 0, wsel));
        const __half2 db = bits_h2(__byte_perm(blk < 2 ? sc[mt][1].x : sc[mt][1].y, 0, wsel));
        if constexpr (kT == DType::Q4_0) {
          const uint32_t off = ((blk ^ qkey) << 4) + 4 * t;
          uint32_t pa[2][2], pb[2][2];
          decode_q4(lds32(sq + r * 64 + off), da, pa);
          decode_q4(lds32(sq + (r + 8) * 64 + off), db, pb);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            af[mt][s][0] = pa[s][0];
            af[mt][s][1] = pb[s][0];
            af[mt][s][2] = pa[s][1];
            af[mt][s][3] = pb[s][1];
          }
        } else {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const uint32_t off = (((2 * blk + s) ^ qkey) << 4) + 4 * t;
            uint32_t pa[2], pb[2];
            decode_q8(lds32(sq + r * 128 + off), da, pa);
            decode_q8(lds32(sq + (r + 8) * 128 + off), db, pb);
            af[mt][s][0] = pa[0];
            af[mt][s][1] = pb[0];
            af[mt][s][2] = pa[1];
            af[mt][s][3] = pb[1];
          }
        }
      }
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        // b0 = x[token][16s + 4t, +1], b1 = x[token][16s + 4t + 2, +3] of this block.
        const uint32_t xoff = (((4 * blk + 2 * s) ^ xkey) << 4) + (t >> 1) * 16 + (t & 1) * 8;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint2 b = lds64(sx + (xtok + nt * 8) * kBK * 2 + xoff);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) mma_16816<false>(acc[mt][nt], af[mt][s], b.x, b.y);
        }
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be left; drained before exit
  finish_tile<kMT, kNT>(a, w, acc, m0 + arow, n0 + wn * Tr::kWN + 2 * t, split);
}

// ---- version 2: wgmma (sm_90a) ------------------------------------------------
//
// Same tiles, ring and epilogue; the two warpgroups own 64 rows each and
// issue one wgmma m64nBNk16 per k16 step with A from registers (each warp
// decodes only its own 16 rows: no decode twice, no B loads, one mma
// instruction instead of BN/8). A is in the natural k order (B is read by
// the descriptor as stored), so a row's bytes 2t, 2t+1 and 2t+8, 2t+9 of
// a 16-byte chunk come from two 4-byte loads and a byte_perm each. Each
// warpgroup waits for its k-tile's wgmmas before decoding the next: keeping
// them in flight across the decode (A double buffered, wgmma_wait<1>) made
// ptxas serialize every wgmma (C7513: A registers defined while wgmmas are
// in flight), so decode/wgmma overlap comes from the other warpgroup and the
// other CTA on the SM instead. The ring is then version 1's.
template <DType kT, int BN>
struct WgTraits {
  static constexpr int kMinBlocks = BN >= 128 ? 1 : 2;
  static constexpr int kQBytes = kBM * QuantTile<kT>::kRowBytes;
  static constexpr int kSBytes = kBM * kBlocks * 2;
  static constexpr int kXBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kXBytes + kQBytes + kSBytes;  // x first: 1024-byte aligned blocks
  static constexpr int kStagesFit = (kSmemBudget / kMinBlocks - 1024) / kStageBytes;
  static constexpr int kStages = kStagesFit < 4 ? kStagesFit : 4;
  static constexpr int kSmem = kStages * kStageBytes + 1024;  // + alignment slack
  static_assert(kStages >= 2, "gemm_q_wgmma: a stage ring needs 2 stages");
  static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0, "gemm_q_wgmma: 1024-byte aligned x tiles");
};

// Dequantizes quant block blk (32 columns, 2 k16 steps) of this warp's 16
// rows into wgmma A fragments f0 (k16 step 0) and f1 (step 1), a0..a3 each
// (versions 2 and 3).
template <DType kT>
__device__ __forceinline__ void decode_block_wg(uint32_t sq, int arow, int blk, uint32_t qkey, uint32_t wofs,
                                                uint32_t psel, __half2 da, __half2 db, uint32_t (&f0)[4],
                                                uint32_t (&f1)[4]) {
  if constexpr (kT == DType::Q4_0) {
    const __half2 bias = __float2half2_rn(1032.0f);
    const uint32_t ra = sq + arow * 64 + ((blk ^ qkey) << 4) + wofs, rb = ra + 8 * 64;
    const uint32_t xa0 = __byte_perm(lds32(ra), 0, psel), xa1 = __byte_perm(lds32(ra + 8), 0, psel);
    const uint32_t xb0 = __byte_perm(lds32(rb), 0, psel), xb1 = __byte_perm(lds32(rb + 8), 0, psel);
    f0[0] = level_pair(xa0 & 0x000F000Fu, bias, da);  // low nibbles: elements 0..15 of the block
    f0[1] = level_pair(xb0 & 0x000F000Fu, bias, db);
    f0[2] = level_pair(xa1 & 0x000F000Fu, bias, da);
    f0[3] = level_pair(xb1 & 0x000F000Fu, bias, db);
    f1[0] = level_pair((xa0 >> 4) & 0x000F000Fu, bias, da);  // high nibbles: 16..31
    f1[1] = level_pair((xb0 >> 4) & 0x000F000Fu, bias, db);
    f1[2] = level_pair((xa1 >> 4) & 0x000F000Fu, bias, da);
    f1[3] = level_pair((xb1 >> 4) & 0x000F000Fu, bias, db);
  } else {
    const __half2 bias = __float2half2_rn(1152.0f);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint32_t ra = sq + arow * 128 + (((2 * blk + s) ^ qkey) << 4) + wofs, rb = ra + 8 * 128;
      uint32_t(&f)[4] = s == 0 ? f0 : f1;
      f[0] = level_pair(__byte_perm(lds32(ra), 0, psel) ^ 0x00800080u, bias, da);
      f[1] = level_pair(__byte_perm(lds32(rb), 0, psel) ^ 0x00800080u, bias, db);
      f[2] = level_pair(__byte_perm(lds32(ra + 8), 0, psel) ^ 0x00800080u, bias, da);
      f[3] = level_pair(__byte_perm(lds32(rb + 8), 0, psel) ^ 0x00800080u, bias, db);
    }
  }
}

template <int N>
__device__ __forceinline__ void fence_regs_a(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

template <DType kT, int BN>
__global__ void __launch_bounds__(kThreads, WgTraits<kT, BN>::kMinBlocks) gemm_q_wgmma_kernel(MmaArgs a) {
#if RUNLM_FA3_DEVICE
  using Tr = WgTraits<kT, BN>;
  constexpr int kStages = Tr::kStages, kSteps = kBK / 16;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t s0 = (smem_u32(smem) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  auto sx_of = [&](int st) { return s0 + st * Tr::kStageBytes; };
  auto sq_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kXBytes; };
  auto ss_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kXBytes + Tr::kQBytes; };

  int rt = blockIdx.x;  // launch row tile -> its matrix's
  const MatView w = a.w.pick(rt);
  const int m0 = rt * kBM, n0 = blockIdx.y * BN, split = blockIdx.z;
  const int kt0 = split * a.k_tiles_per_split;
  const int nk = min(a.k_tiles, kt0 + a.k_tiles_per_split) - kt0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int arow = (warp >> 2) * 64 + (warp & 3) * 16 + g;  // warpgroup's 64 rows, warp's 16
  const uint32_t qkey = kT == DType::Q4_0 ? (g >> 1) & 3 : g;
  const uint32_t psel = t & 1 ? 0x4342 : 0x4140;  // bytes 2t, 2t+1 of the word into bytes 0, 2
  const uint32_t wofs = 4 * (t >> 1);             // that word in the chunk (+ 8: bytes 2t+8, 2t+9)

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  uint32_t af[kSteps][4];

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nk) load_stage<kT, BN, true>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + st);
    cp_async_commit();
  }

  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kStages - 2>();
    fa3::fence_proxy_async_shared();  // this thread's copies, visible to wgmma's (async proxy) reads
    // k-tile i visible to all; every warpgroup has waited for its wgmmas of
    // k-tile i-1, so that stage can refill.
    __syncthreads();
    {
      const int j = i + kStages - 1, st = j % kStages;
      if (j < nk) load_stage<kT, BN, true>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + j);
      cp_async_commit();
    }
    const int st = i % kStages;
    const uint32_t sq = sq_of(st), ss = ss_of(st);
    const uint2 sca = lds64(ss + arow * kBlocks * 2), scb = lds64(ss + (arow + 8) * kBlocks * 2);
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
      const __half2 da = bits_h2(__byte_perm(blk < 2 ? sca.x : sca.y, 0, wsel));
      const __half2 db = bits_h2(__byte_perm(blk < 2 ? scb.x : scb.y, 0, wsel));
      decode_block_wg<kT>(sq, arow, blk, qkey, wofs, psel, da, db, af[2 * blk], af[2 * blk + 1]);
    }
    const uint64_t dx = fa3::make_desc(sx_of(st), 16, 1024);
    fa3::wgmma_fence();  // A was just written by ordinary instructions
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)  // column block kk/4, 32 bytes per k16 inside it
      WgmmaRsF16<BN>::rs(acc, af[kk], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
    fa3::wgmma_commit();
    fa3::wgmma_wait<0>();
    fa3::fence_regs(acc);
    fence_regs_a(af);  // the wgmmas read A until the wait
  }
  cp_async_wait<0>();
  // wgmma's m64nN accumulator is the mma C layout per warp, n8 tile i at acc[4i .. 4i+3].
  finish_tile<1, BN / 8>(a, w, *reinterpret_cast<float(*)[1][BN / 8][4]>(&acc), m0 + arow, n0 + 2 * t, split);
#endif
}

// ---- version 3: wgmma with decode and tensor work overlapped (sm_90a) --------
//
// Version 2 with one change in the warpgroup's loop: A is double buffered
// per quant block (2 k16 steps, 8 registers a buffer) instead of one tile's
// worth (32 registers), and the wgmmas of block b stay in flight while the
// warp decodes block b + 1:
//   decode b -> buf[b & 1]; wgmma.fence; 2 wgmmas; commit; wait_group 1
// wait_group 1 retires block b - 1's group, whose buffer block b + 1 then
// overwrites. kBlocks (4) is even, so buffer parity is the same in every
// k-tile and, with the block loop unrolled, each buffer is a fixed set of
// registers (no dynamic indexing, no copies: version 2's C7513 came from
// A registers that the compiler had to move while wgmmas read them). The
// pipeline crosses the k-tile loop's back edge (block 3's group is in flight
// while block 0 of the next tile decodes), so the ring refills the stage of
// tile i - 2, not i - 1: every warpgroup's wait_group 1 after block 3 of
// tile i - 1 has retired all of tile i - 2 before the barrier of tile i.
// The lookahead is kStages - 2 tiles (the ring is up to 5 stages where
// shared memory allows, so small BN keeps 3 tiles in flight as version 2).
//
// Quant copies carry an L2::256B prefetch hint: a CTA reads 64 bytes (Q4_0)
// or 128 bytes (Q8_0) of each of 128 rows per k-tile, rows cols/2 apart, so
// DRAM sees scattered 64-byte requests; with the hint L2 fetches 256 bytes,
// the next 1-3 k-tiles of the same rows, as one request.
//
// Why this option and not the others: (b) producer warps writing an f16 A
// tile for SS wgmmas moves the decode off the consumers but adds an f16 A
// round trip through shared memory (32 KB a k-tile at kBM = 128, the bank
// traffic of the x tile again) and a second barrier protocol; (c) more CTAs
// per SM at small BN already happens (v2 runs 3 CTAs an SM at BN = 16 by
// registers); (d) more split-K adds fixup traffic. (a) fixes the measured
// cause (decode and wgmma alternate inside a warpgroup) in place and lowers
// the A registers from 32 to 16.
//
// Prediction for 11008 x 4096 Q4_0, written before the measurement
// (measured on the H100: n = 16 23.7 us, 64 29.7, 128 50.3, 256 104.7, 512
// 122.6; NOTES.md): per block and SM
// sub-partition ~90 issue cycles of decode (2 warps x ~45) against 16 (BN =
// 16) .. 128 (BN = 128) x 2 tensor cycles, now concurrent: n = 16 ~12-14 us
// (DRAM, helped by the prefetch hint), n = 64 ~15-18 us, n = 128 ~25 us,
// n = 256 ~45-60 us (tensor-bound at ~70% of the wgmma rate, ~27 us a wave
// of 128 x 128 tiles against version 2's 48; 172 tiles on 132 SMs would be
// 2 waves, the second 30% full, hence 3 column slices at BN = 128, see
// launch_fused), n = 512 ~110 us.
template <DType kT, int BN>
struct Wg3Traits {
  static constexpr int kMinBlocks = BN >= 128 ? 1 : 2;
  static constexpr int kStageBytes = WgTraits<kT, BN>::kStageBytes;  // version 2's stage layout
  static constexpr int kStagesFit = (kSmemBudget / kMinBlocks - 1024) / kStageBytes;
  static constexpr int kStages = kStagesFit < 5 ? kStagesFit : 5;
  static constexpr int kSmem = kStages * kStageBytes + 1024;
  static_assert(kStages >= 3, "gemm_q_wgmma_v3: the ring needs 3 stages (one for the in-flight wgmmas)");
};

template <DType kT, int BN>
__global__ void __launch_bounds__(kThreads, Wg3Traits<kT, BN>::kMinBlocks) gemm_q_wgmma_v3_kernel(MmaArgs a) {
#if RUNLM_FA3_DEVICE
  using Tr = Wg3Traits<kT, BN>;
  using Wg = WgTraits<kT, BN>;
  constexpr int kStages = Tr::kStages, kAhead = kStages - 2;  // k-tiles in flight ahead of the one decoded
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t s0 = (smem_u32(smem) + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
  auto sx_of = [&](int st) { return s0 + st * Wg::kStageBytes; };
  auto sq_of = [&](int st) { return s0 + st * Wg::kStageBytes + Wg::kXBytes; };
  auto ss_of = [&](int st) { return s0 + st * Wg::kStageBytes + Wg::kXBytes + Wg::kQBytes; };

  int rt = blockIdx.x;  // launch row tile -> its matrix's
  const MatView w = a.w.pick(rt);
  const int m0 = rt * kBM, n0 = blockIdx.y * BN, split = blockIdx.z;
  const int kt0 = split * a.k_tiles_per_split;
  const int nk = min(a.k_tiles, kt0 + a.k_tiles_per_split) - kt0;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int arow = (warp >> 2) * 64 + (warp & 3) * 16 + g;  // warpgroup's 64 rows, warp's 16
  const uint32_t qkey = kT == DType::Q4_0 ? (g >> 1) & 3 : g;
  const uint32_t psel = t & 1 ? 0x4342 : 0x4140;  // bytes 2t, 2t+1 of the word into bytes 0, 2
  const uint32_t wofs = 4 * (t >> 1);             // that word in the chunk (+ 8: bytes 2t+8, 2t+9)

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  uint32_t fe[2][4], fo[2][4];  // A of the even / odd quant block: [k16 step][a0..a3]

#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < nk) load_stage<kT, BN, true, true>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + st);
    cp_async_commit();
  }

  for (int i = 0; i < nk; ++i) {
    cp_async_wait<kAhead - 1>();
    fa3::fence_proxy_async_shared();  // this thread's copies, visible to wgmma's (async proxy) reads
    // k-tile i visible to all; every warpgroup has retired its wgmmas of
    // k-tile i - 2 (only block 3 of i - 1 can be in flight), so that stage
    // can refill.
    __syncthreads();
    {
      const int j = i + kAhead, st = j % kStages;
      if (j < nk) load_stage<kT, BN, true, true>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kt0 + j);
      cp_async_commit();
    }
    const int st = i % kStages;
    const uint32_t sq = sq_of(st), ss = ss_of(st);
    const uint2 sca = lds64(ss + arow * kBlocks * 2), scb = lds64(ss + (arow + 8) * kBlocks * 2);
    const uint64_t dx = fa3::make_desc(sx_of(st), 16, 1024);
    static_assert(kBlocks % 2 == 0, "gemm_q_wgmma_v3: buffer parity must repeat every k-tile");
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      uint32_t(&f)[2][4] = blk & 1 ? fo : fe;
      const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
      const __half2 da = bits_h2(__byte_perm(blk < 2 ? sca.x : sca.y, 0, wsel));
      const __half2 db = bits_h2(__byte_perm(blk < 2 ? scb.x : scb.y, 0, wsel));
      decode_block_wg<kT>(sq, arow, blk, qkey, wofs, psel, da, db, f[0], f[1]);
      fa3::wgmma_fence();  // f was just written by ordinary instructions
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // k16 step kk = 2 blk + s: column block kk/4, 32 bytes per step inside it
        const int kk = 2 * blk + s;
        WgmmaRsF16<BN>::rs(acc, f[s], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
      }
      fa3::wgmma_commit();
      fa3::wgmma_wait<1>();  // block blk - 1 retired: its buffer is free for block blk + 1
      fence_regs_a(blk & 1 ? fe : fo);
    }
  }
  fa3::wgmma_wait<0>();
  fa3::fence_regs(acc);
  cp_async_wait<0>();
  finish_tile<1, BN / 8>(a, w, *reinterpret_cast<float(*)[1][BN / 8][4]>(&acc), m0 + arow, n0 + 2 * t, split);
#endif
}

// ---- version 4: 256-row tiles, 4 warpgroups, stream-K (sm_90a) ---------------
//
// Version 3's warpgroup loop (A double buffered per quant block, wait_group
// 1) with two changes aimed at 128-512 tokens (BN = 128), where versions 2
// and 3 run at 240-440 TFLOP/s against cuBLAS's ~450 on the f16 copy:
//
// 1. kBM4 = 256 weight rows a CTA, 4 warpgroups of 64 rows (512 threads,
//    <= 128 registers a thread: acc 64 + A 16). Per 128-column k-tile and
//    SM (2048 tensor cycles at 2048 f16 FMA/clk), the traffic falls against
//    versions 2/3's 128-row tile (1024 tensor cycles a k-tile):
//      shared memory: wgmma B reads 64 B/clk either way (m64 per wgmma),
//        x + quant copies 50 KB -> 24 B/clk (was 41 KB -> 40), decode loads
//        16 B/clk either way: ~104 B/clk of 128 (was ~121: at the limit);
//      L2 -> SM: 24 B/clk an SM (was 41; x alone was 32): 11008 x 4096 at
//        256 tokens re-read x 86 times (180 MB) at kBM = 128, 43 times now.
//    And 4 warps a sub-partition (one per warpgroup) hide each other's
//    decode behind 3 warpgroups' wgmmas instead of 1.
// 2. Stream-K over a persistent grid: the (tile, k-tile) units are laid out
//    tile by tile (tiles row-tile major: the token tiles of one weight row
//    tile go to neighbouring CTAs, which share its quants in L2); CTA c takes the
//    contiguous range [c * per, (c + 1) * per), per = ceil(units / grid),
//    grid = SMs (one CTA an SM: ~200 KB of shared memory). No wave
//    quantization (11008 rows x 256 tokens = 86 tiles of 256 x 128 = 0.65
//    of a wave as tiles, 1.0 as units); a tile covered by one range is
//    stored directly, a tile cut by ranges is summed by the last of its
//    pieces to finish (atomic ticket per tile): pieces go to partial slot
//    2c (the CTA's first tile) or 2c + 1 (its last), and the summing CTA
//    adds them in CTA order, so the result is the same whichever finishes
//    last (deterministic). At most 2 partials a CTA (132 x 2 x 128 KB,
//    in L2); the summing CTA reads them through its idle stage ring (see
//    the epilogue).
// Each piece restarts the cp.async ring (a 2-k-tile prologue, ~2 pieces a
// CTA). n_tokens <= 64 runs what auto runs there (version 3, version 2 up
// to 16): BN <= 64 tiles are DRAM / issue bound, where 128-row tiles give
// more CTAs.
template <DType kT, int BN>
struct Wg4Traits {
  static constexpr int kWG = 4;
  static constexpr int kThr = 128 * kWG;
  static constexpr int kM = 64 * kWG;  // weight rows a CTA
  static constexpr int kQBytes = kM * QuantTile<kT>::kRowBytes;
  static constexpr int kSBytes = kM * kBlocks * 2;
  static constexpr int kXBytes = BN * kBK * 2;
  static constexpr int kStageBytes = kXBytes + kQBytes + kSBytes;  // x first: 1024-byte aligned blocks
  static constexpr int kStagesFit = (kSmemBudget - 1024) / kStageBytes;
  static constexpr int kStages = kStagesFit < 5 ? kStagesFit : 5;
  static constexpr int kSmem = kStages * kStageBytes + 1024;
  static constexpr int kNT = BN / 8;  // n8 tiles of a thread's accumulator
  static_assert(kStages >= 3, "gemm_q_wgmma_v4: the ring needs 3 stages (one for the in-flight wgmmas)");
  static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0, "gemm_q_wgmma_v4: 1024-byte aligned x tiles");
};

struct SkArgs {
  MatSet w;  // row tiles of kM rows
  const __half* x;
  float* partial;  // [2 * grid][kNT][kThr] float4: slot 2c = CTA c's first tile, 2c + 1 its last
  int* tickets;    // [tiles], zero on entry, left zero
  int cols, n;
  int k_tiles, tiles_n, units, per;  // units = tiles * k_tiles; CTA c: [c * per, min(units, (c + 1) * per))
};

template <DType kT, int BN>
__global__ void __launch_bounds__(Wg4Traits<kT, BN>::kThr, 1) gemm_q_wgmma_v4_kernel(SkArgs a) {
#if RUNLM_FA3_DEVICE
  using Tr = Wg4Traits<kT, BN>;
  constexpr int kStages = Tr::kStages, kAhead = kStages - 2, kNT = Tr::kNT, kThr = Tr::kThr;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t s0 = (smem_u32(smem) + 1023u) & ~1023u;
  auto sx_of = [&](int st) { return s0 + st * Tr::kStageBytes; };
  auto sq_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kXBytes; };
  auto ss_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kXBytes + Tr::kQBytes; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int arow = (warp >> 2) * 64 + (warp & 3) * 16 + g;  // warpgroup's 64 rows, warp's 16
  const uint32_t qkey = kT == DType::Q4_0 ? (g >> 1) & 3 : g;
  const uint32_t psel = t & 1 ? 0x4342 : 0x4140;
  const uint32_t wofs = 4 * (t >> 1);
  __shared__ int last;

  const int cta = blockIdx.x, K = a.k_tiles;
  const int u_begin = cta * a.per, u_end = min(a.units, u_begin + a.per);
  const int first_tile = u_begin / K;
  for (int u = u_begin; u < u_end;) {
    const int tile = u / K, kb = u % K, ke = min(K, kb + (u_end - u)), nk = ke - kb;
    int rt = tile / a.tiles_n;  // launch row tile -> its matrix's
    const MatView w = a.w.pick(rt);
    const int m0 = rt * Tr::kM, n0 = (tile % a.tiles_n) * BN;

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    uint32_t fe[2][4], fo[2][4];  // A of the even / odd quant block: [k16 step][a0..a3]

#pragma unroll
    for (int st = 0; st < kAhead; ++st) {
      if (st < nk) load_stage<kT, BN, true, true, Wg4Traits<kT, BN>::kM, Wg4Traits<kT, BN>::kThr>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kb + st);
      cp_async_commit();
    }
    for (int i = 0; i < nk; ++i) {
      cp_async_wait<kAhead - 1>();
      fa3::fence_proxy_async_shared();
      // k-tile i visible to all; every warpgroup has retired its wgmmas of
      // k-tile i - 2, so that stage can refill (version 3's argument).
      __syncthreads();
      {
        const int j = i + kAhead, st = j % kStages;
        if (j < nk) load_stage<kT, BN, true, true, Wg4Traits<kT, BN>::kM, Wg4Traits<kT, BN>::kThr>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kb + j);
        cp_async_commit();
      }
      const int st = i % kStages;
      const uint32_t sq = sq_of(st), ss = ss_of(st);
      const uint2 sca = lds64(ss + arow * kBlocks * 2), scb = lds64(ss + (arow + 8) * kBlocks * 2);
      const uint64_t dx = fa3::make_desc(sx_of(st), 16, 1024);
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        uint32_t(&f)[2][4] = blk & 1 ? fo : fe;
        const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
        const __half2 da = bits_h2(__byte_perm(blk < 2 ? sca.x : sca.y, 0, wsel));
        const __half2 db = bits_h2(__byte_perm(blk < 2 ? scb.x : scb.y, 0, wsel));
        decode_block_wg<kT>(sq, arow, blk, qkey, wofs, psel, da, db, f[0], f[1]);
        fa3::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int kk = 2 * blk + s;
          WgmmaRsF16<BN>::rs(acc, f[s], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
        }
        fa3::wgmma_commit();
        fa3::wgmma_wait<1>();
        fence_regs_a(blk & 1 ? fe : fo);
      }
    }
    fa3::wgmma_wait<0>();
    fa3::fence_regs(acc);
    cp_async_wait<0>();

    // Epilogue. acc is the mma C layout of this warp's 16 rows: n8 tile nt
    // at acc[4 nt .. 4 nt + 3] = (row, tok), (row, tok + 1), row + 8 likewise.
    bool store = true;
    if (nk != K) {
      const int slot = 2 * cta + (tile == first_tile ? 0 : 1);
      float4* part = reinterpret_cast<float4*>(a.partial);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        __stcg(part + (int64_t(slot) * kNT + nt) * kThr + tid,
               make_float4(acc[4 * nt], acc[4 * nt + 1], acc[4 * nt + 2], acc[4 * nt + 3]));
      __threadfence();  // release: the partial before the ticket
      __syncthreads();
      const int c_first = tile * K / a.per, c_last = ((tile + 1) * K - 1) / a.per;
      if (tid == 0) {
        last = atomicAdd(a.tickets + tile, 1) == c_last - c_first;
        if (last) a.tickets[tile] = 0;  // every piece has taken its ticket: ready for the next call
      }
      __syncthreads();
      store = last;
      if (store) {
        __threadfence();  // acquire
        // Sum in CTA order whichever piece came last: deterministic; acc is
        // the running sum 0 + p0 + p1 + ..., this piece's own partial read
        // back too (it is in L2, and the order then does not depend on
        // which piece sums). The partials come through the idle stage ring:
        // a tile's pieces (2-6 at the Llama-2-7B shapes) are 128 KB each,
        // and one SM reads ~64 B/clk from L2, so the read must keep ~64 KB
        // in flight; registers cannot (acc is 64 of 128). Each thread
        // copies its own float4s of a piece's half (8 n8 tiles: 64 KB a
        // CTA) with cp.async into its own slots of one of 3 buffers, 2
        // halves in flight, and reads only those slots back: no barrier
        // (the one before the ticket already ordered the ring's last
        // wgmma reads before these writes).
        constexpr int kHalf = kNT / 2;
        constexpr uint32_t kBuf = kHalf * kThr * 16;
        static_assert(3 * kBuf <= kStages * Tr::kStageBytes, "gemm_q_wgmma_v4: fixup buffers fit the ring");
        const int np = c_last - c_first + 1;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          auto issue = [&](int j) {  // piece c_first + j, half h -> buffer j % 3
            if (j < np) {
              const int c = c_first + j, cs = 2 * c + (tile == c * a.per / K ? 0 : 1);
              const uint32_t buf = s0 + (j % 3) * kBuf;
#pragma unroll
              for (int f = 0; f < kHalf; ++f)
                cp_async_16(buf + (f * kThr + tid) * 16, part + (int64_t(cs) * kNT + h * kHalf + f) * kThr + tid, 16);
            }
            cp_async_commit();  // maybe empty: wait_group counts stay uniform
          };
          issue(0);
          issue(1);
          for (int j = 0; j < np; ++j) {
            cp_async_wait<1>();  // piece j landed (j + 1 may be in flight)
            const uint32_t buf = s0 + (j % 3) * kBuf;
#pragma unroll
            for (int f = 0; f < kHalf; ++f) {
              const float4 p = lds128f(buf + (f * kThr + tid) * 16);
              float* o = acc + 4 * (h * kHalf + f);
              o[0] += p.x;
              o[1] += p.y;
              o[2] += p.z;
              o[3] += p.w;
            }
            issue(j + 2);  // buffer (j + 2) % 3 = (j - 1) % 3: this thread read it in iteration j - 1
          }
          cp_async_wait<0>();
        }
      }
    }
    if (store) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int tok = n0 + nt * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = m0 + arow + 8 * h;
          if (r >= w.rows) continue;
          if (tok < a.n) w.y[int64_t(tok) * w.rows + r] = acc[4 * nt + 2 * h];
          if (tok + 1 < a.n) w.y[int64_t(tok + 1) * w.rows + r] = acc[4 * nt + 2 * h + 1];
        }
      }
    }
    u += nk;
    // Every warpgroup is past its last wgmma and shared read of this piece
    // (and `last` is read) before the next piece's prologue refills the ring.
    __syncthreads();
  }
#endif
}

// ---- version 5: warp-specialized, the f16 A tile in shared memory (sm_90a) ----
//
// Versions 2-4 dequantize A into registers inside the warpgroups that issue
// the wgmmas, so decode and tensor work alternate per warpgroup. Here
// producer warpgroups do all decoding into an f16 A tile in shared memory
// and the consumer warpgroups only load fragments and issue wgmmas:
//   producers (warpgroups 0, 1; thread p: row p % 128, quant block p / 128):
//     raw quants and scales come by TMA, a slot = 128 quant bytes a row (4
//     k-tiles of Q4_0, 2 of Q8_0; 128-byte swizzle) and a 16-byte scale row
//     (8 scales), kRaw - 1 slots ahead of the decode. Per k-tile i: wait
//     until the consumers freed stage i % S (empty barrier), thread 0 starts
//     the TMA of x's k-tile into the stage (expect_tx on its full barrier),
//     every thread decodes its 32 columns into the stage's A tile (rows of
//     128 bytes in the 128-byte swizzle, 4 conflict-free 16-byte stores) and
//     arrives on the full barrier (256 arrivals + the TMA bytes complete it).
//   consumers (warpgroups 2, 3: rows 0-63, 64-127): wait full, A fragments
//     by ldmatrix, 4 wgmma m64n128k16 with A from registers and x from the
//     stage, wait_group 0, release the stage (256 arrivals on empty).
// setmaxnreg: producers 56 registers, consumers 200.
// Tile 128 rows x 128 tokens x 64 columns a k-tile, a CTA an SM (512
// threads, ~215 KB of rings). The decode is versions 1-4's (exponent trick,
// exact level, one f16 rounding of level x scale): every version multiplies
// the same f16 A. Grid and split-K (finish_tile by the 256 consumer
// threads) as versions 1-3; column slices chosen for the shortest waves
// (launch_v5). Needs cols % 256 == 0 (the scale rows' TMA stride);
// elsewhere version 4 runs.
//
// Measured (H100, session 10; kernels/cuda/NOTES.md "Version 5"): correct,
// not the default. The f16 A round trip makes it shared-memory bound: per
// k-tile ~85 KB of shared traffic (raw 4.5, A written 16 and read 16, x
// written 16 and read twice 32) is ~660 cycles at 128 B/clk against 512
// tensor cycles; without the decode (a timing probe) the same pipeline ran
// at 615-711 TFLOP/s at 2048 tokens, with it 450-494 (version 4: 456-467).
// At 256 tokens it wins on 4096-row matrices by 0-10% and loses on 11008
// rows (its grid of 128 x 128 tiles: 1.3 waves), so end to end the batch
// job is unchanged (3.34 s against 3.32 s with version 4).
constexpr int kV5BK = 64;  // columns a k-tile
constexpr int kV5ColAlign = 256;

template <DType kT>
struct Wg5Traits {
  static constexpr int BN = 128;
  static constexpr int kProdThr = 256;  // two producer warpgroups: thread p decodes row p % 128, block p / 128
  static constexpr int kThr = kProdThr + 256;
  static constexpr int kABytes = kBM * kV5BK * 2;
  static constexpr int kXBytes = BN * kV5BK * 2;
  static constexpr int kStageBytes = kABytes + kXBytes;
  static constexpr int kSlotK = kT == DType::Q4_0 ? 4 : 2;  // k-tiles a raw slot
  static constexpr int kQBytes = kBM * 128;                 // a slot's quants
  static constexpr int kSBytes = kBM * 16;                  // a slot's scale rows
  static constexpr int kRawBytes = kQBytes + kSBytes;
  static constexpr int kRaw = 3;
  static constexpr int kStages = 5;
  static constexpr int kBarBytes = 8 * (2 * kStages + kRaw);
  static constexpr int kSmem = 1024 + kStages * kStageBytes + kRaw * kRawBytes + kBarBytes;
  static_assert(kSmem <= kSmemBudget, "gemm_q_wgmma_v5: rings beyond the shared-memory budget");
};

// The TMA maps of a version-5 launch: x, and each matrix's quants and scales.
struct V5Maps {
  CUtensorMap x;
  CUtensorMap q[kMaxMats];
  CUtensorMap d[kMaxMats];
};

__device__ __forceinline__ void sts128(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// Block b (32 columns) of row r of k-tile j of a raw slot (quants sq in
// the 128-byte swizzle, scale word sc = the k-tile's 2 f16 scales) as f16
// into the A tile at sa, natural column order: chunk q (8 columns) at
// q ^ (r & 7).
template <DType kT>
__device__ __forceinline__ void decode_block_v5(uint32_t sq, uint32_t sc, int r, int j, int b, uint32_t sa) {
  const uint32_t qrow = sq + r * 128, row = sa + r * 128;
  auto raw = [&](int chunk) { return lds128(qrow + ((chunk ^ (r & 7)) << 4)); };
  auto put = [&](int q, const uint32_t (&v)[4]) { sts128(row + ((q ^ (r & 7)) << 4), v[0], v[1], v[2], v[3]); };
  const __half2 d = bits_h2(__byte_perm(sc, 0, b ? 0x3232 : 0x1010));
  if constexpr (kT == DType::Q4_0) {
    // 16 bytes: low nibbles columns 0-15 of the block, high nibbles 16-31.
    const uint4 w = raw(2 * j + b);
    uint32_t o[4][2][2];
    decode_q4(w.x, d, o[0]);
    decode_q4(w.y, d, o[1]);
    decode_q4(w.z, d, o[2]);
    decode_q4(w.w, d, o[3]);
    put(4 * b + 0, {o[0][0][0], o[0][0][1], o[1][0][0], o[1][0][1]});
    put(4 * b + 1, {o[2][0][0], o[2][0][1], o[3][0][0], o[3][0][1]});
    put(4 * b + 2, {o[0][1][0], o[0][1][1], o[1][1][0], o[1][1][1]});
    put(4 * b + 3, {o[2][1][0], o[2][1][1], o[3][1][0], o[3][1][1]});
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // 16 columns a raw chunk, two f16 chunks
      const uint4 w = raw(4 * j + 2 * b + h);
      uint32_t o[4][2];
      decode_q8(w.x, d, o[0]);
      decode_q8(w.y, d, o[1]);
      decode_q8(w.z, d, o[2]);
      decode_q8(w.w, d, o[3]);
      put(4 * b + 2 * h, {o[0][0], o[0][1], o[1][0], o[1][1]});
      put(4 * b + 2 * h + 1, {o[2][0], o[2][1], o[3][0], o[3][1]});
    }
  }
}

template <DType kT>
__global__ void __launch_bounds__(Wg5Traits<kT>::kThr, 1)
    gemm_q_wgmma_v5_kernel(const __grid_constant__ V5Maps tm, MmaArgs a) {
#if RUNLM_FA3_DEVICE
  using Tr = Wg5Traits<kT>;
  constexpr int S = Tr::kStages, R = Tr::kRaw, K = Tr::kSlotK;
  extern __shared__ __align__(1024) uint8_t smem[];
  const uint32_t s0 = (smem_u32(smem) + 1023u) & ~1023u;
  auto sa_of = [&](int st) { return s0 + st * Tr::kStageBytes; };
  auto sx_of = [&](int st) { return s0 + st * Tr::kStageBytes + Tr::kABytes; };
  const uint32_t raw0 = s0 + S * Tr::kStageBytes;
  auto sq_of = [&](int slot) { return raw0 + slot * Tr::kRawBytes; };
  auto ss_of = [&](int slot) { return raw0 + slot * Tr::kRawBytes + Tr::kQBytes; };
  const uint32_t bars = raw0 + R * Tr::kRawBytes;
  auto full = [&](int st) { return bars + 8 * st; };
  auto empty = [&](int st) { return bars + 8 * (S + st); };
  auto raw_full = [&](int slot) { return bars + 8 * (2 * S + slot); };

  int rt = blockIdx.x;  // launch row tile -> its matrix's
  const int mi = rt >= a.w.tile2 ? 2 : rt >= a.w.tile1 ? 1 : 0;
  const MatView w = a.w.pick(rt);
  const int m0 = rt * kBM, n0 = blockIdx.y * Tr::BN, split = blockIdx.z;
  const int kt0 = split * a.k_tiles_per_split;
  const int nk = min(a.k_tiles, kt0 + a.k_tiles_per_split) - kt0;
  const int wg = threadIdx.x >> 7;
  if (threadIdx.x == 0) {
    for (int st = 0; st < S; ++st) {
      fa3::mbar_init(full(st), Tr::kProdThr);
      fa3::mbar_init(empty(st), 256);
    }
    for (int slot = 0; slot < R; ++slot) fa3::mbar_init(raw_full(slot), 1);
    fa3::mbar_init_fence();
  }
  __syncthreads();

  // 512 threads leave 128 registers each; the producers need few, the
  // consumers' accumulators many: 256 x 56 + 256 x 200 = the 64K file.
  if (threadIdx.x < Tr::kProdThr) {
    fa3::regs_dealloc<56>();
    // ---- producer. Slots hold whole groups of K k-tiles from column 0 of
    // the matrix, so a slice starting mid-group uses the tail of its first.
    const CUtensorMap* tq = mi == 2 ? &tm.q[2] : mi == 1 ? &tm.q[1] : &tm.q[0];
    const CUtensorMap* td = mi == 2 ? &tm.d[2] : mi == 1 ? &tm.d[1] : &tm.d[0];
    const int g0 = kt0 / K, g_end = (kt0 + nk - 1) / K + 1;  // slot groups this CTA needs
    auto load_group = [&](int g) {  // thread 0
      const int slot = (g - g0) % R;
      fa3::mbar_arrive_expect_tx(raw_full(slot), Tr::kRawBytes);
      fa3::tma_load_2d(sq_of(slot), tq, raw_full(slot), g * 128, m0);
      // Scale rows: 8 f16 from a 16-byte aligned column (Q8_0's groups are 4 scales: every other one reads ahead).
      fa3::tma_load_2d(ss_of(slot), td, raw_full(slot), (g * K * 2) & ~7, m0);
    };
    const int tid = threadIdx.x, r = tid & (kBM - 1), b = tid / kBM;
    if (tid == 0) {
      fa3::tma_prefetch_desc(&tm.x);
      for (int g = g0; g < min(g_end, g0 + R - 1); ++g) load_group(g);
    }
    for (int i = 0; i < nk; ++i) {
      const int kt = kt0 + i, g = kt / K, j = kt % K, slot = (g - g0) % R;
      if (j == 0 || i == 0) {
        // Slot (g - 1)'s k-tiles are decoded by everyone: it takes group g + R - 1.
        fa3::named_bar_sync(1, Tr::kProdThr);
        if (tid == 0 && g + R - 1 < g_end) load_group(g + R - 1);
        fa3::mbar_wait(raw_full(slot), ((g - g0) / R) & 1);
      }
      const int st = i % S;
      if (i >= S) fa3::mbar_wait(empty(st), ((i / S) & 1) ^ 1);  // consumers done with k-tile i - S
      if (tid == 0) {
        fa3::mbar_expect_tx(full(st), Tr::kXBytes);
        fa3::tma_load_2d(sx_of(st), &tm.x, full(st), kt * kV5BK, n0);
      }
      const uint32_t sc = lds32(ss_of(slot) + 16 * r + 4 * ((g * K * 2) % 8 / 2 + j));
      decode_block_v5<kT>(sq_of(slot), sc, r, j, b, sa_of(st));
      fa3::mbar_arrive(full(st));
    }
    return;
  }

  // ---- consumers
  fa3::regs_alloc<200>();
  const int c = wg - Tr::kProdThr / 128, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  float acc[Tr::BN / 2];
#pragma unroll
  for (int i = 0; i < Tr::BN / 2; ++i) acc[i] = 0.0f;
  for (int i = 0; i < nk; ++i) {
    const int st = i % S;
    fa3::mbar_wait(full(st), (i / S) & 1);
    // A by ldmatrix (the 16 x 16 fragments of this warp's rows), x from the stage.
    const uint64_t dx = fa3::make_desc(sx_of(st), 16, 1024);
    uint32_t af[kV5BK / 16][4];
    const int arow = c * 64 + warp * 16 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < kV5BK / 16; ++kk)
      ldmatrix_x4(sa_of(st) + arow * 128 + (((2 * kk + (lane >> 4)) ^ (arow & 7)) << 4), af[kk][0], af[kk][1],
                  af[kk][2], af[kk][3]);
    fa3::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kV5BK / 16; ++kk) WgmmaRsF16<Tr::BN>::rs(acc, af[kk], dx + 2 * kk, 1);
    fa3::wgmma_commit();
    fa3::wgmma_wait<0>();
    fa3::fence_regs(acc);
    fence_regs_a(af);
    fa3::mbar_arrive(empty(st));  // A read into registers, x read by the wgmmas: the stage can refill
  }
  fa3::wgmma_wait<0>();
  fa3::fence_regs(acc);
  const int g = lane >> 2, t = lane & 3;
  // wgmma's m64nN accumulator is the mma C layout per warp, n8 tile i at acc[4i .. 4i+3].
  finish_tile_by<1, Tr::BN / 8, 256>(a, w, *reinterpret_cast<float(*)[1][Tr::BN / 8][4]>(&acc),
                                     m0 + 64 * c + 16 * warp + g, n0 + 2 * t, split, threadIdx.x - Tr::kProdThr,
                                     [] { fa3::named_bar_sync(2, 256); });
#endif
}

struct DeviceInfo {
  int sms = 0;
  int smem_optin = 0;
  bool sm90 = false;  // the sm_90a binary (wgmma) runs here
  int index = 0;
};

DeviceInfo device_info() {
  static DeviceInfo info[16];
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  RUNLM_CHECK(dev >= 0 && dev < 16, "gemm_fused_q: device %d beyond 16", dev);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& d = info[dev];
  if (d.sms == 0) {
    int major = 0, minor = 0;
    cudaCheck(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    d.sm90 = major == 9 && minor == 0;
    d.index = dev;
    cudaCheck(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return d;
}

// A launch's matrices on the host (1 to kMaxMats, one type and cols).
struct Mats {
  WView v[kMaxMats];
  float* y[kMaxMats];
  int count = 0;
  // The kernels' MatSet for row tiles of tile_rows rows; row_tiles = the
  // launch's, every matrix's concatenated. Absent entries repeat matrix 0
  // (valid pointers) behind a first tile of INT_MAX.
  MatSet set(int tile_rows, int& row_tiles) const {
    MatSet m;
    int first[kMaxMats] = {0, INT_MAX, INT_MAX};
    row_tiles = 0;
    for (int i = 0; i < kMaxMats; ++i) {
      const int j = i < count ? i : 0;
      m.m[i] = MatView{v[j].q, reinterpret_cast<const __half*>(v[j].a), y[j], static_cast<int>(v[j].rows)};
      if (i < count) {
        first[i] = row_tiles;
        row_tiles += ceil_div(static_cast<int>(v[i].rows), tile_rows);
      }
    }
    m.tile1 = first[1];
    m.tile2 = first[2];
    return m;
  }
};

// The kernel arguments of a grid of tiles x column slices (versions 1-3 and
// 5): `splits` capped by what the scratch holds (a kBM x bn f32 partial a
// tile and slice past the tickets) and by k_tiles, no empty slice; with
// more than one slice the tickets (shared with the dequantization path's
// use of the scratch) are zeroed on stream s.
MmaArgs sliced_args(const MatSet& set, const uint16_t* x, int cols, int n, int tiles, int k_tiles, int splits, int bn,
                    void* scratch, size_t scratch_bytes, cudaStream_t s) {
  const size_t ticket_bytes = align_up(size_t(tiles) * sizeof(int), kPartAlign);
  const size_t slice_bytes = size_t(tiles) * kBM * bn * sizeof(float);
  const size_t fit = scratch && scratch_bytes > ticket_bytes ? (scratch_bytes - ticket_bytes) / slice_bytes : 0;
  splits = std::max(1, std::min<int>(splits, static_cast<int>(std::min<size_t>(fit, k_tiles))));
  const int per_split = ceil_div(k_tiles, splits);
  splits = ceil_div(k_tiles, per_split);  // no empty slice
  MmaArgs a{set, reinterpret_cast<const __half*>(x), nullptr, nullptr, cols, n, k_tiles, per_split, splits};
  if (splits > 1) {
    a.tickets = static_cast<int*>(scratch);
    a.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + ticket_bytes);
    cudaCheck(cudaMemsetAsync(a.tickets, 0, size_t(tiles) * sizeof(int), s));
  }
  return a;
}

template <DType kT, int BN, int kVer>
void launch_fused(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes, int force_splits,
                  cudaStream_t s) {
  constexpr int kSmem = kVer == 3   ? Wg3Traits<kT, BN>::kSmem
                       : kVer == 2 ? WgTraits<kT, BN>::kSmem
                                   : MmaTraits<kT, BN>::kSmem;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(kSmem <= dev.smem_optin,
              "gemm_fused_q: %s BN=%d version %d needs %d bytes of shared memory per block; the device allows %d",
              dtype_name(kT), BN, kVer, kSmem, dev.smem_optin);
  auto kernel = kVer == 3   ? gemm_q_wgmma_v3_kernel<kT, BN>
                : kVer == 2 ? gemm_q_wgmma_kernel<kT, BN>
                            : gemm_q_mma_kernel<kT, BN>;
  // Set once per device and instantiation, and the occupancy queried once:
  // the first call (the engine's warm-up) is outside any graph capture.
  static bool smem_set[16] = {};
  if (!smem_set[dev.index]) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    smem_set[dev.index] = true;
  }
  static const int per_sm = [&] {
    int b = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, kSmem));
    return std::max(b, 1);
  }();

  const int cols = static_cast<int>(ms.v[0].cols);
  int tiles_m = 0;
  const MatSet set = ms.set(kBM, tiles_m);
  const int tiles_n = ceil_div(n, BN), tiles = tiles_m * tiles_n;
  const int k_tiles = ceil_div(cols, kBK);
  // Slices: about one wave of CTAs, at least 2 k-tiles a slice (so the ring
  // has something to overlap), and no more than the scratch holds.
  const int slots = dev.sms * per_sm;
  int splits = force_splits > 0 ? force_splits : std::max(1, slots / tiles);
  // Version 3 at BN = 128 (tensor-bound, one CTA an SM): the slice count
  // from 1 to 4 (or the one above) with the shortest waves, each extra slice
  // charged 10% for its fixup (a 64 KB partial a CTA, mostly in L2; a guess
  // until measured). 11008 rows: 128 tokens = 86 tiles on 132 SMs (65% busy)
  // -> 3 slices, 2 waves of 1/3 (0.8 with the charge); 256 tokens = 172
  // tiles, 2 waves (the second 30% full) -> 3 slices, 4 waves of 1/3 (1.6).
  if (kVer == 3 && BN == 128 && force_splits <= 0) {
    auto cost = [&](int sp) { return ceil_div(tiles * sp, slots) * (1.0 + 0.1 * (sp - 1)) / sp; };
    int best = splits;
    for (int sp = 1; sp <= 4; ++sp)
      if (cost(sp) < cost(best)) best = sp;
    splits = best;
  }
  splits = std::min(splits, force_splits > 0 ? k_tiles : std::max(1, k_tiles / 2));
  const MmaArgs a = sliced_args(set, x, cols, n, tiles, k_tiles, splits, BN, scratch, scratch_bytes, s);
  RUNLM_CHECK(tiles_n <= 65535 && a.splits <= 65535, "gemm_fused_q: n_tokens=%d too large for the grid", n);
  RUNLM_CHECK(tiles_m <= INT32_MAX / 2, "gemm_fused_q: %d row tiles too many for the grid", tiles_m);
  kernel<<<dim3(tiles_m, tiles_n, a.splits), kThreads, kSmem, s>>>(a);
  cudaCheckLaunch();
}

// Version 4 (BN = 128): grid = one CTA per SM unless forced (tests:
// force_splits = s > 0 gives s x tiles CTAs, s = 1 one CTA a tile, no
// partials), at least kMinPer k-tiles a CTA, and ranges lengthened until
// the partial slots they use fit the scratch (none: whole tiles).
template <DType kT>
void launch_v4(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes, int force_splits,
               cudaStream_t s) {
  constexpr int BN = 128, kMinPer = 4;
  using Tr = Wg4Traits<kT, BN>;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(Tr::kSmem <= dev.smem_optin,
              "gemm_fused_q: %s version 4 needs %d bytes of shared memory per block; the device allows %d",
              dtype_name(kT), Tr::kSmem, dev.smem_optin);
  auto kernel = gemm_q_wgmma_v4_kernel<kT, BN>;
  static bool smem_set[16] = {};
  if (!smem_set[dev.index]) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmem));
    smem_set[dev.index] = true;
  }
  const int cols = static_cast<int>(ms.v[0].cols);
  int tiles_m = 0;
  const MatSet set = ms.set(Tr::kM, tiles_m);
  const int tiles_n = ceil_div(n, BN), tiles = tiles_m * tiles_n;
  const int k_tiles = ceil_div(cols, kBK);
  const int units = tiles * k_tiles;
  const int grid0 = force_splits > 0 ? tiles * force_splits : std::min(dev.sms, ceil_div(units, kMinPer));
  const size_t ticket_bytes = align_up(size_t(tiles) * sizeof(int), kPartAlign);
  const size_t slot_bytes = size_t(Tr::kNT) * Tr::kThr * sizeof(float4);
  const size_t slots = scratch && scratch_bytes > ticket_bytes ? (scratch_bytes - ticket_bytes) / slot_bytes : 0;
  // Partial slots the kernel's indexing reaches at range length p: CTA c
  // writes slot 2c if its first tile is cut, 2c + 1 if its last tile is
  // another one and cut. (gemm() passes the matrix's own scratch: 32 MB
  // for 4096 x 4096 holds 255 slots, enough for 128 CTAs of 8 k-tiles,
  // which only ever use slot 2c.)
  auto slots_needed = [&](int p) {
    size_t need = 0;
    for (int c = 0; c * p < units; ++c) {
      const int u0 = c * p, u1 = std::min(units, u0 + p), t0 = u0 / k_tiles, t1 = (u1 - 1) / k_tiles;
      if (t0 == t1 ? u1 - u0 != k_tiles : u0 % k_tiles != 0) need = std::max(need, size_t(2 * c + 1));
      if (t1 != t0 && u1 % k_tiles != 0) need = std::max(need, size_t(2 * c + 2));
    }
    return need;
  };
  int per = ceil_div(units, std::max(1, std::min(grid0, units)));
  while (slots_needed(per) > slots) ++per;  // ends by per % k_tiles == 0 (no cut tile) at the latest
  const int grid = ceil_div(units, per);
  SkArgs a{set, reinterpret_cast<const __half*>(x), nullptr, nullptr, cols, n, k_tiles, tiles_n, units, per};
  if (per % k_tiles != 0) {  // some tile is cut: partials and tickets
    a.tickets = static_cast<int*>(scratch);
    a.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + ticket_bytes);
    cudaCheck(cudaMemsetAsync(a.tickets, 0, size_t(tiles) * sizeof(int), s));
  }
  kernel<<<grid, Tr::kThr, Tr::kSmem, s>>>(a);
  cudaCheckLaunch();
}

// A 2-D TMA map of a row-major [rows][inner] array of elem-byte elements,
// boxes of box_inner x box_rows (what is past the array reads zeros).
CUtensorMap tmap_2d(const void* base, CUtensorMapDataType type, int elem, int64_t inner, int64_t rows, int box_inner,
                    int box_rows, CUtensorMapSwizzle swizzle, const char* what) {
  RUNLM_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0 && inner * elem % 16 == 0,
              "gemm_fused_q: %s for TMA needs 16-byte aligned rows (%lld bytes a row)", what,
              static_cast<long long>(inner * elem));
  CUtensorMap m;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(inner * elem)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_inner), static_cast<cuuint32_t>(box_rows)}, estr[2] = {1, 1};
  const CUresult e = encode_tiled_fn()(&m, type, 2, const_cast<void*>(base), dims, strides, box, estr,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  RUNLM_CHECK(e == CUDA_SUCCESS, "gemm_fused_q: cuTensorMapEncodeTiled failed (%d) for %s [%lld x %lld]",
              static_cast<int>(e), what, static_cast<long long>(rows), static_cast<long long>(inner));
  return m;
}

// Version 5 (BN = 128, n_tokens > 64, cols % 256 == 0): one CTA a tile of
// 128 rows x 128 tokens and column slice, the slices (1-4) chosen for the
// shortest waves with each extra slice charged 10% for its fixup (version
// 3's rule), and no more than the scratch holds; force_splits > 0 forces
// them (tests). TMA maps: x [n][cols] f16 in boxes of 64 columns x 128
// tokens (128-byte swizzle; tokens past n read zeros), each matrix's quants
// in boxes of 128 bytes x 128 rows (128-byte swizzle) and scales in boxes of
// 8 x 128 (rows past the matrix read zeros).
template <DType kT>
void launch_v5(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes, int force_splits,
               cudaStream_t s) {
  using Tr = Wg5Traits<kT>;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(Tr::kSmem <= dev.smem_optin,
              "gemm_fused_q: %s version 5 needs %d bytes of shared memory per block; the device allows %d",
              dtype_name(kT), Tr::kSmem, dev.smem_optin);
  auto kernel = gemm_q_wgmma_v5_kernel<kT>;
  static bool smem_set[16] = {};
  if (!smem_set[dev.index]) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmem));
    smem_set[dev.index] = true;
  }
  const int cols = static_cast<int>(ms.v[0].cols);
  RUNLM_CHECK(cols % kV5ColAlign == 0, "gemm_fused_q: version 5 needs cols %% %d == 0, got %d", kV5ColAlign, cols);
  int tiles_m = 0;
  const MatSet set = ms.set(kBM, tiles_m);
  const int tiles_n = ceil_div(n, Tr::BN), tiles = tiles_m * tiles_n;
  const int k_tiles = cols / kV5BK;
  int splits = 1;
  if (force_splits > 0) {
    splits = std::min(force_splits, k_tiles);
  } else {
    auto cost = [&](int sp) { return ceil_div(tiles * sp, dev.sms) * (1.0 + 0.1 * (sp - 1)) / sp; };
    for (int sp = 2; sp <= 4 && sp * 8 <= k_tiles; ++sp)
      if (cost(sp) < cost(splits)) splits = sp;
  }
  const MmaArgs a = sliced_args(set, x, cols, n, tiles, k_tiles, splits, Tr::BN, scratch, scratch_bytes, s);
  RUNLM_CHECK(tiles_n <= 65535, "gemm_fused_q: n_tokens=%d too large for the grid", n);
  V5Maps tm;
  tm.x = tmap_2d(x, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, cols, n, kV5BK, Tr::BN, CU_TENSOR_MAP_SWIZZLE_128B, "x");
  const int64_t q_row = kT == DType::Q4_0 ? cols / 2 : cols;
  for (int i = 0; i < kMaxMats; ++i) {
    if (i >= ms.count) {  // absent: never picked; a valid copy of matrix 0's maps
      tm.q[i] = tm.q[0];
      tm.d[i] = tm.d[0];
      continue;
    }
    const MatView& m = set.m[i];
    tm.q[i] = tmap_2d(m.q, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, q_row, m.rows, 128, kBM, CU_TENSOR_MAP_SWIZZLE_128B,
                      "quants");
    tm.d[i] = tmap_2d(m.d, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, cols / 32, m.rows, 8, kBM, CU_TENSOR_MAP_SWIZZLE_NONE,
                      "scales");
  }
  kernel<<<dim3(tiles_m, tiles_n, a.splits), Tr::kThr, Tr::kSmem, s>>>(tm, a);
  cudaCheckLaunch();
}

template <DType kT, int kVer>
void launch_fused_tokens(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes,
                         int force_splits, cudaStream_t s) {
  if (n <= 16)
    launch_fused<kT, 16, kVer>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (n <= 32)
    launch_fused<kT, 32, kVer>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (n <= 64)
    launch_fused<kT, 64, kVer>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else
    launch_fused<kT, 128, kVer>(ms, x, n, scratch, scratch_bytes, force_splits, s);
}

template <DType kT>
void launch_fused_version(int ver, const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes,
                          int force_splits, cudaStream_t s) {
  // Versions 4 and 5 run from 65 tokens; below, what auto picks (3, and 2 up to 16).
  // Version 5 needs cols % 256 == 0 (its TMA maps); elsewhere version 4 runs.
  if (ver == 5 && n > 64 && ms.v[0].cols % kV5ColAlign == 0)
    launch_v5<kT>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (ver >= 4 && n > 64)
    launch_v4<kT>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (ver >= 4 && n <= 16)
    launch_fused_tokens<kT, 2>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (ver >= 3)
    launch_fused_tokens<kT, 3>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (ver == 2)
    launch_fused_tokens<kT, 2>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else
    launch_fused_tokens<kT, 1>(ms, x, n, scratch, scratch_bytes, force_splits, s);
}

// Auto on sm_90 (version 0 without RUNLM_GEMM_FUSED_VERSION), from
// GpuOpsBench.GemmFusedQuantShapes on the H100 (132 SMs), Q4_0 Llama-2-7B
// shapes, us:
//   rows x cols    n     v2     v3     v4
//   4096 x 4096   128   25.9   25.2   29.4
//                 256   37.8   33.6   33.9
//                 512   52.0   43.1   48.1
//   11008 x 4096  128   54.6   50.6   45.1
//                 256   96.9  104.8   67.3
//                 512  142.3  123.2  115.0
//   4096 x 11008  128   46.2   41.0   49.6
//                 256   78.0   64.7   68.1
//                 512  127.4  106.1  109.8
// (Q8_0 the same pattern: 11008 x 4096 at 256, v3 113.4, v4 74.1.)
// Version 2 up to 16 tokens (v3's extra stage only adds latency there:
// 1.10-1.13x v2's time), version 3 past 16, and past 64 tokens version 4
// where the launch has many row tiles: v3's 128-row tiles (all matrices of
// the launch) at least half the SMs. There v3's grid of row tiles x token
// tiles x column slices lands badly on the SMs (11008 rows = 86 tiles: 0.65
// of a wave at 128 tokens, 1.3 waves at 256, before its 3 column slices and
// their fixups), and stream-K's even split wins by 1.1-1.6x. With fewer
// (4096 rows = 32 tiles) v3's slices make a wave of 128 CTAs almost exactly
// (32 x 4, 64 x 2, 128 x 1), while stream-K cuts each 256-row tile into 2-8
// pieces: v3 ahead by 3-15%. Several 4096-row matrices in one launch
// (gemm_fused_q_multi: q/k/v = 96 tiles) are the many-tile case.
int auto_version(const Mats& ms, int n_tokens, const DeviceInfo& dev) {
  if (!dev.sm90) return 1;
  if (n_tokens <= 16) return 2;
  int row_tiles = 0;
  for (int i = 0; i < ms.count; ++i) row_tiles += ceil_div(static_cast<int>(ms.v[i].rows), kBM);
  return n_tokens > 64 && 2 * row_tiles >= dev.sms ? 4 : 3;
}

}  // namespace

bool gemm_fused_supports(const GpuMatrix& w) {
  return (w.type == DType::Q4_0 || w.type == DType::Q8_0) && w.cols % kColAlign == 0 && w.rows <= INT32_MAX &&
         w.cols <= INT32_MAX;
}

bool gemm_fused_fits_device(const GpuMatrix& w) {
  const DeviceInfo d = device_info();
  const bool q4 = w.type == DType::Q4_0;
  // Versions 2-5 all run on sm_90 (by token count and version): the largest of their tiles.
  constexpr int kWgQ4 = std::max({WgTraits<DType::Q4_0, 128>::kSmem, Wg3Traits<DType::Q4_0, 128>::kSmem,
                                  Wg4Traits<DType::Q4_0, 128>::kSmem, Wg5Traits<DType::Q4_0>::kSmem});
  constexpr int kWgQ8 = std::max({WgTraits<DType::Q8_0, 128>::kSmem, Wg3Traits<DType::Q8_0, 128>::kSmem,
                                  Wg4Traits<DType::Q8_0, 128>::kSmem, Wg5Traits<DType::Q8_0>::kSmem});
  const int smem = d.sm90 ? (q4 ? kWgQ4 : kWgQ8)
                          : (q4 ? MmaTraits<DType::Q4_0, 128>::kSmem : MmaTraits<DType::Q8_0, 128>::kSmem);
  return smem <= d.smem_optin;
}

bool gemm_fused_has_wgmma() { return device_info().sm90; }

int gemm_fused_max_tokens() {
  static const int v = [] {
    const char* e = std::getenv("RUNLM_GEMM_FUSED_MAX_TOKENS");
    return e && *e ? std::max(0, std::atoi(e)) : kGemmFusedMaxTokensDefault;
  }();
  return v;
}

void gemm_fused_q(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch,
                  size_t scratch_bytes, Stream stream, int splits, int version) {
  const GemmOut out{&w, y};
  gemm_fused_q_multi(&out, 1, x_f16, n_tokens, scratch, scratch_bytes, stream, splits, version);
}

void gemm_fused_q_multi(const GemmOut* outs, int n_outs, const uint16_t* x_f16, int n_tokens, void* scratch,
                        size_t scratch_bytes, Stream stream, int splits, int version) {
  RUNLM_CHECK(n_outs >= 1 && n_outs <= kMaxMats, "gemm_fused_q: %d matrices; supported: 1 to %d", n_outs, kMaxMats);
  RUNLM_CHECK(n_tokens >= 1, "gemm_fused_q: n_tokens=%d", n_tokens);
  RUNLM_CHECK(reinterpret_cast<uintptr_t>(x_f16) % 16 == 0, "gemm_fused_q: x must be 16-byte aligned");
  Mats ms{};
  for (int i = 0; i < n_outs; ++i) {
    const GpuMatrix& w = *outs[i].w;
    RUNLM_CHECK(w.data != nullptr, "gemm_fused_q: matrix not uploaded");
    RUNLM_CHECK(gemm_fused_supports(w),
                "gemm_fused_q: %s %lld x %lld unsupported; supported: q4_0, q8_0 with cols %% %d == 0",
                dtype_name(w.type), static_cast<long long>(w.rows), static_cast<long long>(w.cols), kColAlign);
    RUNLM_CHECK(w.type == outs[0].w->type && w.cols == outs[0].w->cols,
                "gemm_fused_q: matrices of one launch differ (%s x %lld, %s x %lld); they need one type and cols",
                dtype_name(outs[0].w->type), static_cast<long long>(outs[0].w->cols), dtype_name(w.type),
                static_cast<long long>(w.cols));
    ms.v[i] = make_view(w);
    ms.y[i] = outs[i].y;
  }
  ms.count = n_outs;
  // version 0: RUNLM_GEMM_FUSED_VERSION (read once; for measuring end to end), else auto.
  static const int env_version = [] {
    const char* e = std::getenv("RUNLM_GEMM_FUSED_VERSION");
    return e && *e ? std::atoi(e) : 0;
  }();
  if (version == 0) version = env_version;
  RUNLM_CHECK(version >= 0 && version <= 5,
              "gemm_fused_q: version %d unsupported; supported: 0 (auto), 1, 2, 3, 4, 5", version);
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(version < 2 || dev.sm90, "gemm_fused_q: version %d (wgmma) needs sm_90; this device runs version 1",
              version);
  const int ver = version != 0 ? version : auto_version(ms, n_tokens, dev);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (outs[0].w->type == DType::Q4_0)
    launch_fused_version<DType::Q4_0>(ver, ms, x_f16, n_tokens, scratch, scratch_bytes, splits, s);
  else
    launch_fused_version<DType::Q8_0>(ver, ms, x_f16, n_tokens, scratch, scratch_bytes, splits, s);
}

}  // namespace runlm::gpu
