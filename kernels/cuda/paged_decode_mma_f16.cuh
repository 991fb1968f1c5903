// The tensor-core paged decode kernel for the plain pools (K and V both
// f16, or both bf16), head_dim 64 and 128; the SIMT kernel
// (paged_decode_simt.cuh) runs every other head_dim and the mixed f16/bf16
// pairs.
// The quantized-load kernel's loop and load scheme (paged_decode_mma_sm80.cuh: same grid,
// SeqRange, split/combine, window, -1 pages, NaN rows, 8 rows a CTA, online
// softmax, merge through shared memory) with nothing to convert: the loaded
// 16-bit words are the mma operands.
//
// Why (docs/kernels.md, paged decode, "What limits it"): the SIMT kernel spends ~88
// warp instructions a key and KV head (16 threads a key, butterfly
// reductions, the softmax replicated over 16 lanes) and reaches 2906-2922
// GB/s at B=64 L=8192 (0.95x cuDNN), latency / issue limited. Here a warp
// spends ~8 instructions a key (below), so the loads are nearly all it does.
//
// Fragment layouts (mma_sm80.cuh; g = lane / 4, t = lane % 4):
//   A 16x16: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C 16x8:  c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
//
// K (QK's B, S = Q K^T, n = 8 keys): lane (g, t) owns key g of the n-tile
// and a quarter of its row: the 16-byte chunks t, t + 4, t + 8, t + 12 of
// the key's 256 bytes (hd 128; t and t + 4 of 128 at hd 64), so one LDG.128
// of the warp reads 8 keys x 64 contiguous bytes (two whole sectors a key).
// K-step j (16 dims) takes the lane's words 2j (b0) and 2j + 1 (b1) as
// loaded: which head dim sits at which k position is free (a dot product),
// so q's A fragment is built in the same element order (k_elem) and K needs
// no instruction between the load and the mma.
// V (PV's A, O^T = V^T P^T, m = head dims, k = 16 keys): lane g holds keys
// 2t, 2t+1, 2t+8, 2t+9 of the tile (P^T's B fragment is S's C fragment as it
// stands) and the chunks g and g + 8 of each (hd 128; chunk g at hd 64), so
// one LDG.128 reads 4 keys x 128 contiguous bytes. Word w of a key holds
// m-tile w's rows g (low half) and g + 8 (high half); an A register pairs
// two keys at one dim: one PRMT (0x5410 / 0x7632) per register, the only
// data instruction of the path. O's rows come out permuted; v_dim
// un-permutes them on the way to shared memory.
//
// bf16 (mma .bf16, f32 accumulators): K and V go in as stored (exact). q is
// rounded to bf16 (2^-9 relative, 4x f16's 2^-11): a score moves by
// <= 2^-9 sum_i |q_i k_i|, ~1.2e-3 with the tests' inputs (~3e-4 for f16;
// row_tolerance in the tests). P is split into hi + lo bf16 (hi = bf16(p),
// lo = bf16(p - hi): ~2^-17 relative together) and PV runs twice, so P's
// rounding (2^-9, the largest term otherwise) does not reach the output;
// the weight error is then ~8e-4, below f16's ~1.2e-3 (q 2.4e-4 + P
// 2^-10), and the f16 tolerance (3e-3) stays. Cost: 8 HMMA and ~6
// instructions more per 16 keys.
//
// Registers and bytes in flight (hd 128): a 16-key tile is 32 K + 32 V
// words (64 registers, 8 KB a warp); O takes 32; q's A fragments live in
// shared memory (4 LDS.128 a tile: with q in registers ptxas spilled 4 bytes
// at the 168 cap). kU = 1: a warp loads one tile, then computes it; mode
// "mma" caps it for 3 CTAs an SM (12 warps, 96 KB in flight an SM while
// they wait), "mma4" for 4 (16 warps, 128 KB). kU = 2 (mode "mma2"): 32
// keys a warp step as the quantized-load kernel (128 raw registers, 2 CTAs an SM, 8 warps x
// 16 KB). hd 64 takes half of all that: kU = 2 at 4 CTAs an SM in every
// mode. ptxas (CUDA 13.0), registers / spill bytes, f16 and bf16:
//   sm_90a: hd 128 mma 144 / 148, mma2 210 / 210, mma4 128 / 126; hd 64
//           128 / 128; no spills.
//   sm_80:  hd 128 mma 146 / 148, mma2 220 / 198, hd 64 128 / 128, no
//           spills; mma4 128 with 8 / 16 spill bytes (an A/B mode only).
//
// Instructions per warp and 16 keys (hd 128, f16), per lane:
//   K: 8 LDG.128, 4 LDS.128 (q), 16 HMMA (8 k-steps x 2 n-tiles)    28
//   V: 8 LDG.128, 32 PRMT (8 m-tiles x 4 registers), 8 HMMA          48
//   softmax ~25 (the generic kernel's: 4 EX2, max over 4 lanes, a vote), the
//   mask only on edge tiles; addresses and page table ~20            ~45
// ~121 = ~7.6 per key and KV head, against ~88 for the SIMT kernel
// (bf16: + 8 HMMA + ~6 for P's split: ~135). At B=64 L=8192 (4.19M
// key x KV head pairs, 132 SMs, 4 issue slots a clock): ~60k clocks =
// 0.03 ms of issue against a 0.69 ms memory floor (2.15 GB at 3.1 TB/s).
// Tensor work: 24 HMMA (f16) per 16 keys -> 6.3M HMMA, ~0.05 ms.
#pragma once

#include <cuda_bf16.h>

#include "cuda/paged_decode_mma_common.cuh"

namespace runlm {
namespace paged {

// ------------------------------------------------------------ 16-bit operands

// (lo, hi) -> bf16x2 bits, lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}
// The two floats of a bf16x2 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float bf16_lo(uint32_t x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t x) { return __uint_as_float(x & 0xffff0000u); }

__device__ __forceinline__ void mma_rows8_bf16(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The element type of a plain pool: kBf16 picks the mma, q's and P's packing.
template <bool kBf16>
struct MmaPlain {
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    return kBf16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
  }
  __device__ __forceinline__ static void qk(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    if constexpr (kBf16) mma_rows8_bf16(d, a0, a2, b0, b1);
    else mma_rows8(d, a0, a2, b0, b1);
  }
  __device__ __forceinline__ static void pv(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1) {
    if constexpr (kBf16) mma_16816_bf16(d, a0, a1, a2, a3, b0, b1);
    else mma_16816_f16(d, a0, a1, a2, a3, b0, b1);
  }
};

// The f16 kernel's placement of a plain head row (HD 16-bit values, HD / 8
// chunks of 16 bytes) in the lanes.
template <int HD>
struct MmaPlainLayout {
  static_assert(HD == 64 || HD == 128, "mma_f16: head_dim 64, 128");
  static constexpr int kSteps = HD / 16;       // QK k-steps = PV m-tiles
  static constexpr int kKLoads = HD / 32;      // 16-byte loads of lane t's quarter of a K row
  static constexpr int kKWords = 4 * kKLoads;  // = 2 kSteps
  static constexpr int kVLoads = HD / 64;      // 16-byte loads of lane g's eighth of a V row
  static constexpr int kVWords = 4 * kVLoads;  // = kSteps
  // 16-byte chunks first + stride i of a row, i < N, into words 4i..4i+3.
  template <int N>
  __device__ __forceinline__ static void load_chunks(const uint8_t* row, int first, int stride, uint32_t (&w)[4 * N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      uint32_t x[4];
      ldg_words<4>(row + 16 * (first + stride * i), x);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * i + k] = x[k];
    }
  }
  // K: lane t's load i is chunk t + 4i (one instruction: 8 keys x 64 contiguous bytes).
  __device__ __forceinline__ static void k_load(const uint8_t* row, int t, uint32_t (&w)[kKWords]) {
    load_chunks<kKLoads>(row, t, 4, w);
  }
  // Element of k-step j's register r (0: b0 = word 2j, 1: b1 = word 2j + 1), half h.
  __device__ __forceinline__ static int k_elem(int t, int j, int r, int h) {
    const int w = 2 * j + r;
    return 8 * (t + 4 * (w / 4)) + 2 * (w % 4) + h;
  }
  // V: lane g's load i is chunk g + 8i (one instruction: 4 keys x 128 contiguous bytes).
  __device__ __forceinline__ static void v_load(const uint8_t* row, int g, uint32_t (&w)[kVWords]) {
    load_chunks<kVLoads>(row, g, 8, w);
  }
  // Head dim of lane g's m-tile mt (its word mt), row g + 8 h (half h).
  __device__ __forceinline__ static int v_dim(int g, int mt, int h) {
    return 8 * (g + 8 * (mt / 4)) + 2 * (mt % 4) + h;
  }
};

// A 16-key tile's words as loaded: K of keys 8j + g (lane t's quarter), V of
// keys {2t, 2t+1, 2t+8, 2t+9} (lane g's eighth). hd 128: 64 registers.
template <int HD>
struct MmaPlainTileRaw {
  uint32_t kw[2][MmaPlainLayout<HD>::kKWords];
  uint32_t vw[4][MmaPlainLayout<HD>::kVWords];
};

// grid, workspace and results as paged_decode_mma_sm80_kernel. Each
// warp walks kU 16-key tiles of every CTA step (kWarps x 16 kU keys), all
// loads of a step issued before their first use; kMinCtas: CTAs an SM the
// register cap allows (header comment).
template <bool kBf16, int HD, int kU, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    paged_decode_mma_f16_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                                  int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  using L = MmaPlainLayout<HD>;
  using T = MmaPlain<kBf16>;
  constexpr int R = kMmaRows;
  constexpr int NS = HD / 16;  // k-steps of QK, m-tiles of PV
  static_assert(kU == 1 || kU == 2, "mma_f16: 1 or 2 tiles a warp step");

  __shared__ float s_m[kWarps][R], s_d[kWarps][R];
  __shared__ float s_o[kWarps][R][HD];
  __shared__ uint4 s_q[kWarps][NS / 2][32];  // q's A fragments (below)

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;
  const int kvh = cta.kvh, s = cta.s, k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const int g = lane >> 2, t = lane & 3;
  const PagedKvView& kv = p.kv;

  // This lane's row: QK's A row g, the softmax of row g.
  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;  // row g's keys in this CTA: [key_lo, key_hi)

  // q as A fragments in K's element order (L::k_elem), log2(e) * scale
  // folded in, kept in shared memory (the warp's own copy, k-steps 2i and
  // 2i + 1 a uint4 a lane): 16 registers fewer at hd 128, which is what
  // lets 3 CTAs an SM fit without spills (ptxas spilled 4 bytes with q in
  // registers), for 4 LDS.128 a tile.
  {
    uint32_t qa[NS][2];  // [k-step][a0, a2]
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float x0 = row_g.valid ? qp[L::k_elem(t, j, r, 0)] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[L::k_elem(t, j, r, 1)] * qscale : 0.0f;
        qa[j][r] = T::pack(x0, x1);
      }
#pragma unroll
    for (int i = 0; i < NS / 2; ++i)
      s_q[warp][i][lane] = make_uint4(qa[2 * i][0], qa[2 * i][1], qa[2 * i + 1][0], qa[2 * i + 1][1]);
    __syncwarp();  // the warp's q is in shared memory before its first mma
  }

  // Keys every valid row attends to: [lo_max, hi_min); tiles inside need no mask.
  int lo_max, hi_min;
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;  // row g (the same in the 4 lanes t); d: this lane's keys only
  float o[NS][4];                 // O^T: [m-tile][c]: dims L::v_dim(g, mt, c / 2), rows 2t + c % 2
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[mt][c] = 0.0f;

  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_blocks_per_seq;
  const int bs_mask = kv.block_size - 1;
  const uint8_t* k_pool = static_cast<const uint8_t*>(kv.k_pool);
  const uint8_t* v_pool = static_cast<const uint8_t*>(kv.v_pool);
  const int64_t row_bytes = int64_t(kv.n_kv_heads) * HD * 2;  // a slot of K (or V) in a page
  const int64_t page = row_bytes << bs_shift;
  const int head = kvh * HD * 2;

  // Tiles are two 8-key groups starting at multiples of 8 (k_first = k_begin
  // rounded down): a group lies in one page (block_size >= 8). Keys before
  // k_begin are written slots of its page (masked); keys at or past k_end
  // load key k_end - 1 (a real row: garbage x 0 could be NaN in P V).
  const int k_first = k_begin & ~7;
  auto group_page = [&](int key0) -> int { return __ldg(table + (min(key0, k_end - 1) >> bs_shift)); };
  using Raw = MmaPlainTileRaw<HD>;
  auto load_tile = [&](Raw& r, int key0, const int (&pgs)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t pg = int64_t(pgs[j]) * page + head;
      {
        const int row = min(key0 + 8 * j + g, k_end - 1) & bs_mask;
        L::k_load(k_pool + pg + row * row_bytes, t, r.kw[j]);
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int row = min(key0 + 8 * j + 2 * t + c, k_end - 1) & bs_mask;
        L::v_load(v_pool + pg + row * row_bytes, g, r.vw[2 * j + c]);
      }
    }
  };
  // S, the online softmax of row g, P V for one tile.
  auto compute_tile = [&](const Raw& r, int key0) {
    float acc[2][4] = {};  // S for row g, keys key0 + 8j + 2t + c
#pragma unroll
    for (int i = 0; i < NS / 2; ++i) {
      const uint4 q2 = s_q[warp][i][lane];  // k-steps 2i (x, y) and 2i + 1 (z, w)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        T::qk(acc[j], q2.x, q2.y, r.kw[j][4 * i], r.kw[j][4 * i + 1]);
        T::qk(acc[j], q2.z, q2.w, r.kw[j][4 * i + 2], r.kw[j][4 * i + 3]);
      }
    }
    float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
    rows8_softcap(sc, p.softcap);
    if (key0 < lo_max || key0 + 16 > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
    float pr[2][2];
    rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_tiles(o, c0, c1); });
    // P^T's B fragment is S's C fragment: keys 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of row g.
    const uint32_t p01 = T::pack(pr[0][0], pr[0][1]);
    const uint32_t p89 = T::pack(pr[1][0], pr[1][1]);
    // bf16: P's remainder as a second B fragment (header comment).
    uint32_t l01 = 0, l89 = 0;
    if constexpr (kBf16) {
      l01 = pack_bf16x2(pr[0][0] - bf16_lo(p01), pr[0][1] - bf16_hi(p01));
      l89 = pack_bf16x2(pr[1][0] - bf16_lo(p89), pr[1][1] - bf16_hi(p89));
    }
#pragma unroll
    for (int mt = 0; mt < NS; ++mt) {
      // Word mt of keys (2t, 2t+1) and (2t+8, 2t+9): low halves row g, high halves row g + 8.
      const uint32_t a0 = __byte_perm(r.vw[0][mt], r.vw[1][mt], 0x5410);
      const uint32_t a1 = __byte_perm(r.vw[0][mt], r.vw[1][mt], 0x7632);
      const uint32_t a2 = __byte_perm(r.vw[2][mt], r.vw[3][mt], 0x5410);
      const uint32_t a3 = __byte_perm(r.vw[2][mt], r.vw[3][mt], 0x7632);
      T::pv(o[mt], a0, a1, a2, a3, p01, p89);
      if constexpr (kBf16) T::pv(o[mt], a0, a1, a2, a3, l01, l89);
    }
  };

  // A warp's 16 kU keys of every CTA step, all loads issued before the
  // first mma; the next step's pages are read while this step's bytes fly.
  constexpr int kWarpKeys = 16 * kU;
  constexpr int kStep = kWarps * kWarpKeys;
  int pg[kU][2];
#pragma unroll
  for (int u = 0; u < kU; ++u)
#pragma unroll
    for (int j = 0; j < 2; ++j) pg[u][j] = group_page(k_first + warp * kWarpKeys + 16 * u + 8 * j);
  for (int base = k_first + warp * kWarpKeys; base < k_end; base += kStep) {
    Raw raw[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) load_tile(raw[u], base + 16 * u, pg[u]);
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) pg[u][j] = group_page(base + kStep + 16 * u + 8 * j);
#pragma unroll
    for (int u = 0; u < kU; ++u) compute_tile(raw[u], base + 16 * u);
  }

  // The warp's state to shared memory: (m, d) of row g, then O^T.
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s_o[warp][2 * t + (c & 1)][L::v_dim(g, mt, c >> 1)] = o[mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
}

// The kernel for a plain pool (k: F16 or BF16, V the same) at head_dim hd
// (64, 128): at 128, 16 keys a warp step at 4 CTAs an SM on sm_90 (the
// fastest measured there) and 3 before (4 spills on sm_80); at 64, 32 keys
// a warp step at 4 CTAs. nullptr elsewhere (inst/paged_decode_mma_f16.cu).
KernelFn pick_mma_f16_kernel(KvType k, int head_dim, bool sm90);

}  // namespace paged
}  // namespace runlm
