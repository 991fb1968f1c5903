// The fused quantized GEMM on mma.sync m16n8k16 (sm_80+): the method is
// described in gemm_q_fused.cu's header. Included only by gemm_q_fused.cu.
#pragma once

#include "cuda/gemm_q_fused_common.cuh"

namespace runlm::gpu {

namespace {

template <DType kT, int BN>
__global__ void __launch_bounds__(kThreads, MmaTraits<kT, BN>::kMinBlocks) gemm_q_mma_sm80_kernel(MmaArgs a) {
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


}  // namespace

}  // namespace runlm::gpu
