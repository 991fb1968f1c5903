// The fused quantized GEMM on wgmma (sm_90a): the wgmma kernel, the
// overlap kernel (decode of the next quant block overlapping the wgmmas)
// and the stream-K kernel (256-row tiles over a persistent grid). Included
// only by gemm_q_fused.cu.
#pragma once

#include "cuda/gemm_q_fused_common.cuh"
#include "cuda/sm90.cuh"
#include "cuda/wgmma_rs_f16.cuh"

namespace runlm::gpu {

namespace {

// ---- wgmma (sm_90a) -----------------------------------------------------------
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
// other CTA on the SM instead. The ring is then the mma.sync kernel's.
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
// (the wgmma and overlap kernels).
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
#if RUNLM_SM90_DEVICE
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
    sm90::fence_proxy_async_shared();  // this thread's copies, visible to wgmma's (async proxy) reads
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
    const uint64_t dx = sm90::make_desc(sx_of(st), 16, 1024);
    sm90::wgmma_fence();  // A was just written by ordinary instructions
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)  // column block kk/4, 32 bytes per k16 inside it
      WgmmaRsF16<BN>::rs(acc, af[kk], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(acc);
    fence_regs_a(af);  // the wgmmas read A until the wait
  }
  cp_async_wait<0>();
  // wgmma's m64nN accumulator is the mma C layout per warp, n8 tile i at acc[4i .. 4i+3].
  finish_tile<1, BN / 8>(a, w, *reinterpret_cast<float(*)[1][BN / 8][4]>(&acc), m0 + arow, n0 + 2 * t, split);
#endif
}

// ---- overlap: wgmma with decode and tensor work overlapped (sm_90a) ----------
//
// The wgmma kernel with one change in the warpgroup's loop: A is double buffered
// per quant block (2 k16 steps, 8 registers a buffer) instead of one tile's
// worth (32 registers), and the wgmmas of block b stay in flight while the
// warp decodes block b + 1:
//   decode b -> buf[b & 1]; wgmma.fence; 2 wgmmas; commit; wait_group 1
// wait_group 1 retires block b - 1's group, whose buffer block b + 1 then
// overwrites. kBlocks (4) is even, so buffer parity is the same in every
// k-tile and, with the block loop unrolled, each buffer is a fixed set of
// registers (no dynamic indexing, no copies: the wgmma kernel's C7513 came from
// A registers that the compiler had to move while wgmmas read them). The
// pipeline crosses the k-tile loop's back edge (block 3's group is in flight
// while block 0 of the next tile decodes), so the ring refills the stage of
// tile i - 2, not i - 1: every warpgroup's wait_group 1 after block 3 of
// tile i - 1 has retired all of tile i - 2 before the barrier of tile i.
// The lookahead is kStages - 2 tiles (the ring is up to 5 stages where
// shared memory allows, so small BN keeps 3 tiles in flight as the wgmma kernel).
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
// per SM at small BN already happens (the wgmma kernel runs 3 CTAs an SM at BN = 16 by
// registers); (d) more split-K adds fixup traffic. (a) fixes the measured
// cause (decode and wgmma alternate inside a warpgroup) in place and lowers
// the A registers from 32 to 16.
//
// Prediction for 11008 x 4096 Q4_0, written before the measurement
// (measured on the H100: n = 16 23.7 us, 64 29.7, 128 50.3, 256 104.7, 512
// 122.6): per block and SM
// sub-partition ~90 issue cycles of decode (2 warps x ~45) against 16 (BN =
// 16) .. 128 (BN = 128) x 2 tensor cycles, now concurrent: n = 16 ~12-14 us
// (DRAM, helped by the prefetch hint), n = 64 ~15-18 us, n = 128 ~25 us,
// n = 256 ~45-60 us (tensor-bound at ~70% of the wgmma rate, ~27 us a wave
// of 128 x 128 tiles against the wgmma kernel's 48; 172 tiles on 132 SMs would be
// 2 waves, the second 30% full, hence 3 column slices at BN = 128, see
// launch_fused), n = 512 ~110 us.
template <DType kT, int BN>
struct WgOverlapTraits {
  static constexpr int kMinBlocks = BN >= 128 ? 1 : 2;
  static constexpr int kStageBytes = WgTraits<kT, BN>::kStageBytes;  // the wgmma kernel's stage layout
  static constexpr int kStagesFit = (kSmemBudget / kMinBlocks - 1024) / kStageBytes;
  static constexpr int kStages = kStagesFit < 5 ? kStagesFit : 5;
  static constexpr int kSmem = kStages * kStageBytes + 1024;
  static_assert(kStages >= 3, "gemm_q_wgmma_overlap: the ring needs 3 stages (one for the in-flight wgmmas)");
};

template <DType kT, int BN>
__global__ void __launch_bounds__(kThreads, WgOverlapTraits<kT, BN>::kMinBlocks) gemm_q_wgmma_overlap_kernel(MmaArgs a) {
#if RUNLM_SM90_DEVICE
  using Tr = WgOverlapTraits<kT, BN>;
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
    sm90::fence_proxy_async_shared();  // this thread's copies, visible to wgmma's (async proxy) reads
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
    const uint64_t dx = sm90::make_desc(sx_of(st), 16, 1024);
    static_assert(kBlocks % 2 == 0, "gemm_q_wgmma_overlap: buffer parity must repeat every k-tile");
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      uint32_t(&f)[2][4] = blk & 1 ? fo : fe;
      const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
      const __half2 da = bits_h2(__byte_perm(blk < 2 ? sca.x : sca.y, 0, wsel));
      const __half2 db = bits_h2(__byte_perm(blk < 2 ? scb.x : scb.y, 0, wsel));
      decode_block_wg<kT>(sq, arow, blk, qkey, wofs, psel, da, db, f[0], f[1]);
      sm90::wgmma_fence();  // f was just written by ordinary instructions
#pragma unroll
      for (int s = 0; s < 2; ++s) {  // k16 step kk = 2 blk + s: column block kk/4, 32 bytes per step inside it
        const int kk = 2 * blk + s;
        WgmmaRsF16<BN>::rs(acc, f[s], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // block blk - 1 retired: its buffer is free for block blk + 1
      fence_regs_a(blk & 1 ? fe : fo);
    }
  }
  sm90::wgmma_wait<0>();
  sm90::fence_regs(acc);
  cp_async_wait<0>();
  finish_tile<1, BN / 8>(a, w, *reinterpret_cast<float(*)[1][BN / 8][4]>(&acc), m0 + arow, n0 + 2 * t, split);
#endif
}

// ---- stream-K: 256-row tiles, 4 warpgroups (sm_90a) ---------------------------
//
// The overlap kernel's warpgroup loop (A double buffered per quant block, wait_group
// 1) with two changes aimed at 128-512 tokens (BN = 128), where the wgmma and overlap kernels
// and 3 run at 240-440 TFLOP/s against cuBLAS's ~450 on the f16 copy:
//
// 1. kBM4 = 256 weight rows a CTA, 4 warpgroups of 64 rows (512 threads,
//    <= 128 registers a thread: acc 64 + A 16). Per 128-column k-tile and
//    SM (2048 tensor cycles at 2048 f16 FMA/clk), the traffic falls against
//    their 128-row tile (1024 tensor cycles a k-tile):
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
// CTA). n_tokens <= 64 runs what auto runs there (overlap; wgmma up
// to 16): BN <= 64 tiles are DRAM / issue bound, where 128-row tiles give
// more CTAs.
template <DType kT, int BN>
struct WgStreamKTraits {
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
  static_assert(kStages >= 3, "gemm_q_wgmma_streamk: the ring needs 3 stages (one for the in-flight wgmmas)");
  static_assert(kXBytes % 1024 == 0 && kStageBytes % 1024 == 0, "gemm_q_wgmma_streamk: 1024-byte aligned x tiles");
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
__global__ void __launch_bounds__(WgStreamKTraits<kT, BN>::kThr, 1) gemm_q_wgmma_streamk_kernel(SkArgs a) {
#if RUNLM_SM90_DEVICE
  using Tr = WgStreamKTraits<kT, BN>;
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
      if (st < nk) load_stage<kT, BN, true, true, WgStreamKTraits<kT, BN>::kM, WgStreamKTraits<kT, BN>::kThr>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kb + st);
      cp_async_commit();
    }
    for (int i = 0; i < nk; ++i) {
      cp_async_wait<kAhead - 1>();
      sm90::fence_proxy_async_shared();
      // k-tile i visible to all; every warpgroup has retired its wgmmas of
      // k-tile i - 2, so that stage can refill (the overlap kernel's argument).
      __syncthreads();
      {
        const int j = i + kAhead, st = j % kStages;
        if (j < nk) load_stage<kT, BN, true, true, WgStreamKTraits<kT, BN>::kM, WgStreamKTraits<kT, BN>::kThr>(a, w, sq_of(st), ss_of(st), sx_of(st), m0, n0, kb + j);
        cp_async_commit();
      }
      const int st = i % kStages;
      const uint32_t sq = sq_of(st), ss = ss_of(st);
      const uint2 sca = lds64(ss + arow * kBlocks * 2), scb = lds64(ss + (arow + 8) * kBlocks * 2);
      const uint64_t dx = sm90::make_desc(sx_of(st), 16, 1024);
#pragma unroll
      for (int blk = 0; blk < kBlocks; ++blk) {
        uint32_t(&f)[2][4] = blk & 1 ? fo : fe;
        const uint32_t wsel = blk & 1 ? 0x3232 : 0x1010;
        const __half2 da = bits_h2(__byte_perm(blk < 2 ? sca.x : sca.y, 0, wsel));
        const __half2 db = bits_h2(__byte_perm(blk < 2 ? scb.x : scb.y, 0, wsel));
        decode_block_wg<kT>(sq, arow, blk, qkey, wofs, psel, da, db, f[0], f[1]);
        sm90::wgmma_fence();
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int kk = 2 * blk + s;
          WgmmaRsF16<BN>::rs(acc, f[s], dx + (((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), 1);
        }
        sm90::wgmma_commit();
        sm90::wgmma_wait<1>();
        fence_regs_a(blk & 1 ? fe : fo);
      }
    }
    sm90::wgmma_wait<0>();
    sm90::fence_regs(acc);
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
        static_assert(3 * kBuf <= kStages * Tr::kStageBytes, "gemm_q_wgmma_streamk: fixup buffers fit the ring");
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


}  // namespace

}  // namespace runlm::gpu
