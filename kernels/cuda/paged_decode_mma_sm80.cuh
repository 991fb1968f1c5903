// The paged decode kernel on tensor cores (paged_attention.cu): mma.sync m16n8k16 (f16 inputs, f32 accumulators) for
// QK^T and PV, for pools whose K or V is quantized (q8_0, q4_0, fp8; the
// partner may be f16), head_dim 64, 128, 256, up to kMmaRows query rows a
// CTA. The SIMT kernel (paged_decode_common.cuh) keeps every other combination.
// Same grid, split, workspace, window, -1 pages and NaN rows as the SIMT
// kernel (shared prologue and epilogue in paged_decode_common.cuh: DecodeCta,
// DecodeRow, merge_warps_and_store); the instantiations are in
// kernels/cuda/inst/paged_decode_mma_k<K>.cu.
//
// Fragment layouts (kernels/cuda/mma_sm80.cuh), g = lane / 4, t = lane % 4:
//   A 16x16: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C 16x8:  c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
//
// QK: S = Q K^T, A = Q (rows; 8 real rows, rows 8..15 are zero registers),
// B = K^T (head dims x 8 keys). A k-step of 16 dims must lie in one 32-value
// block (its scale multiplies the f32 accumulator of the block's two
// k-steps), and every lane t feeds every k-step, so lane t holds 8 values of
// each block of its key: q8_0 / fp8 bytes 8t..8t+7 (one 8-byte load),
// q4_0 bytes 4t..4t+3 (4 bytes: elements 4t..4t+3 and 16+4t..19+4t), f16
// elements 8t..8t+7 (16 bytes). Which element sits at which k position is
// free (a dot product), so q's A fragment is loaded in the same order
// (k_elem) and the bytes are converted in place: no shuffles.
// PV: O^T = V^T P^T, A = V^T (16 head dims x 16 keys), B = P^T (16 keys x 8
// rows), C = O^T: 8 rows fill n exactly, so O takes HD / 16 x 4 registers,
// and S's C fragment (row g, keys 2t, 2t+1 of each 8-key tile) is P^T's B
// fragment as it stands. An m-tile of 16 dims lies in one block (the V scale
// of a key and block multiplies that key's probability in P^T), so lane g
// holds 4 dims of each block of a key: q8_0 / fp8 bytes 4g..4g+3, q4_0
// bytes 2g, 2g+1, f16 elements 4g..4g+3 (v_elem gives the order); an f16x2
// of A pairs two keys at one dim, so the conversion interleaves two keys'
// bytes (one PRMT per two pairs).
//
// Conversions (all exact: int8, int4 levels and e4m3 values are f16
// numbers): q8_0 xor 0x80 + PRMT into the mantissa of 1024 + HSUB2 1152;
// q4_0 LOP3 (mask | 0x6400) + HSUB2 1032 (low nibbles) or HFMA2 x/16 - 72
// (high nibbles); fp8 cvt.rn.f16x2.e4m3x2. q is rounded to f16 once (2^-11
// relative), P (times the V scale) once per key before the PV mma.
//
// Instructions per warp per 16 keys, hd 128, q8_0 K and V (the kernel's
// unit: 2 K n-tiles, one PV k-step):
//   K:  8 LDG.64 + 4 LDG.64 (scales of the 4 keys of the lane's C columns),
//       16 LOP3 + 32 PRMT + 32 HSUB2 (64 values), 16 HMMA, 16 F2F (scales),
//       16 FFMA (scale x block accumulator)                      ~140
//   softmax: 3 FMNMX + 2 SHFL/FMNMX (row max over the 4 t lanes), a vote,
//       4 FADD + 4 MUFU.EX2 + 4 FADD (d), 2 F2FP (pack P); the rescale of
//       O (32 FMUL + 2 SHFL) only when a row max grows           ~25
//   V:  16 LDG.32 + 4 LDG.64 (scales), 16 LOP3 + 48 PRMT + 32 HSUB2,
//       8 PRMT + 8 HMUL2 (scaled P), 8 HMMA                      ~140
//   addresses and page table (2 table loads per 16 keys)          ~30
// ~335 warp instructions per 16 keys = ~21 per key and KV head, against
// ~88 for the SIMT kernel (175 per thread, 16 threads a key). At B=64,
// L=8192, 8 KV heads: 4.19M (key, KV head) pairs / 132 SMs x 21 / 4 issue
// slots per clock = ~167k clocks = ~0.09 ms at 1.75 GHz, against memory
// floors of 0.39 ms (q8_0, fp8: 1.14 GB) and 0.21 ms (q4_0: 0.60 GB) at
// 2.9 TB/s: bytes, not instructions, bound it. q4_0 is cheaper per key
// (4-byte K, 2-byte V loads; 9-10 instructions per 8 values), fp8 too
// (one cvt per pair). Tensor work: 24 HMMA per 16 keys -> ~0.05 ms.
//
// The quantized-load kernel (paged_decode_mma_quant_kernel, K and V both
// quantized at head_dim 64 and 128, each q8_0, fp8 or q4_0): the generic kernel's loop
// (above: same grid, SeqRange, split/combine, window, -1
// pages, NaN rows, 8 rows a CTA, 32 keys a warp step, online softmax, merge)
// with every K and V byte loaded by whole 16-byte (8-byte at hd 64 / q4_0)
// loads straight into registers, in a fragment order chosen so that the
// loaded bytes convert in place, and the block scales folded into the f16
// conversion. Pairs with an f16 side run the generic kernel (make_plan says so).
// At hd 128 it runs 3 CTAs an SM (12 warps) where it fits 168
// registers without spills (quant_kernel_min_ctas).
//
// Why (ncu of the generic kernel, q8_0/q8_0, B=64 L=8192 hd 128): L2 throughput
// 78.7% (the busiest unit) at 65.6% DRAM, L2 hit rate 41% on a pure stream,
// stalls mostly L1TEX scoreboard; a register ring of tiles in flight gained
// 3%, so the loads queue somewhere before the DRAM. The generic kernel loads each
// lane's mma fragment share with 2-8 byte loads (~40 LDG a 16-key tile),
// whose lanes cover one 32-byte sector of each 128-byte line they touch
// (K: 8 keys x one block; V: 4 keys x one block; q4_0 half a sector): one
// L2 request per sector, 160 a tile. Here a lane loads 16-byte chunks and
// one instruction covers 64 (K) or 128 (V) contiguous bytes of each key:
// 64 requests for the same 160 sectors (hd 128 q8_0, per warp and 16-key
// tile: 4 + 4 LDG.128, 2 + 2 LDG.64 of K and V scales = 12 instructions,
// against ~40). (A key's K bytes stay at 64 an instruction: the mma
// fragments give a key to 4 lanes.)
// Fragment layouts (mma_sm80.cuh; g = lane / 4, t = lane % 4):
//   A 16x16: a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8..2t+9, n = g)
//   C 16x8:  c0,c1 (g, 2t..2t+1), c2,c3 (g+8, 2t..2t+1)
//
// K (QK's B, S = Q K^T, n = 8 keys): lane (g, t) owns key g of the n-tile
// and a quarter of its head row: 8-bit types 16-byte chunks t and t + 4 at
// hd 128 (chunk t at hd 64), q4_0 the 16 (hd 128) or 8 (hd 64) bytes at
// t x share. So one instruction reads 8 keys x 64 contiguous bytes (whole
// sectors) and the next one the next 64. K-step j (16 dims) takes word j
// of the lane's bytes (8-bit: bytes 4j..4j+3 -> b0, b1; q4_0: word j / 2's
// low or high nibbles). A k-step then spans 4 different 32-value blocks
// (one a lane t), so the scale cannot multiply a block accumulator as in
// the generic kernel: it multiplies the converted f16 values (HMUL2 after the exact
// conversion), and all head dims accumulate in one f32 accumulator (no
// per-block accumulators and no 32 FFMAs of scale x accumulator). Lane t's
// words lie in one block per 16-byte chunk (one scale per key, lane and
// chunk). q's A fragment is built in the same element order (k_elem).
// V (PV's A, O^T = V^T P^T, m = head dims, k = 16 keys): lane g holds keys
// 2t, 2t+1, 2t+8, 2t+9 of the tile (P^T's B fragment is S's C fragment as
// it stands, as in the generic kernel) and the contiguous HD / 8 values of each at
// g x HD / 8 (8-bit: 16 bytes at hd 128 = one LDG.128; q4_0: 8 bytes),
// inside one 32-value block: one scale per key and lane. Value slot j of
// the lane maps to m-tile j / 2, row g + 8 (j % 2) (for q4_0 the slot order
// follows the nibbles: v_dim), so the pairing of two keys per f16x2 is
// the generic kernel's v_frag on each loaded word, and O's rows come out permuted:
// v_dim un-permutes them on the way to shared memory.
//
// Conversion and precision: the quants convert to f16 exactly as in
// the generic kernel (q8_0 xor + PRMT + HSUB2 1152; fp8 cvt; q4_0 LOP3 + HSUB2 /
// HFMA2), then HMUL2 by the f16 scale (half2 of one scale for K, of the two
// keys' scales for V): one f16 rounding of q x s (2^-11 relative), where
// the generic kernel rounded P x s_v instead and kept q x s_k exact in f32. Not
// HFMA2(x, s, -1152 s): -1152 s is not an f16 number in general (1152 =
// 9 x 2^7), and its rounding would shift every value of a (key, block) by
// up to 0.56 s, more than the quantization error. Same tolerance (3e-3).
//
// Instructions per warp and 16 keys (hd 128, q8_0/q8_0), per lane:
//   K: 4 LDG.128 + 2 LDG.64, 16 LOP3 + 32 PRMT + 32 HSUB2 + 32 HMUL2 +
//      ~4 scale PRMT, 16 HMMA                                       ~140
//   V: 4 LDG.128 + 2 LDG.64 + 4 SHFL (scales), 16 LOP3 + 48 PRMT +
//      32 HSUB2 + 32 HMUL2 + 2 PRMT, 8 HMMA                          ~150
//   softmax ~25, addresses and table ~30 (as the generic kernel)
// About the generic kernel's count (~335), with ~3x fewer load instructions and
// sector requests: the L2 request side, not issue, was the limit.
#pragma once

#include "cuda/paged_decode_mma_common.cuh"

namespace runlm {
namespace paged {

// ------------------------------------------------------------ the kernel

// grid, workspace and results as paged_decode_simt_kernel (paged_decode_simt.cuh),
// with kMmaRows rows a chunk. Each warp walks its own 16 x U
// keys of every CTA step (U = 2 16-key sub-tiles at hd 64 and 128, 1 at hd
// 256, whose q and O take twice the registers). Each warp keeps an online softmax state
// per row; the 4 warps merge through shared memory at the end.
template <typename KP, typename VP, int HD>
__global__ void __launch_bounds__(kThreads, 2)
    paged_decode_mma_sm80_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                            int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  static_assert(HD == 64 || HD == 128 || HD == 256, "tensor-core decode: head_dim 64, 128, 256");
  static_assert(KP::kScaled || VP::kScaled, "tensor-core decode: for pools with a quantized K or V");
  constexpr int R = kMmaRows;
  constexpr int NB = HD / 32;                  // 32-value blocks of a head row
  constexpr int U = HD <= 128 ? 2 : 1;         // 16-key sub-tiles per warp per step
  constexpr int kWarpKeys = 16 * U;
  constexpr int kStep = kWarps * kWarpKeys;    // keys per CTA step
  constexpr int kScWords = NB / 2;             // f16 scale words of a key's head row (2 per word)
  // hd 256: q (32 registers), O (64) and a step's raw bytes (~96) do not fit
  // in 255 registers together (ptxas spilled 32-56 bytes), so V's bytes and
  // scales are loaded once S is done with K's, half of the blocks at a time
  // (their latency is then covered by the softmax and other warps only).
  constexpr bool kLateV = HD == 256;
  constexpr bool kQInSmem = HD == 256;  // q's A fragments in shared memory (registers: see kLateV)

  __shared__ float s_m[kWarps][R], s_d[kWarps][R];
  __shared__ float s_o[kWarps][R][HD];
  __shared__ uint4 s_q[kQInSmem ? NB : 1][32];  // q's A fragments by block and lane (hd 256)

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;
  const int kvh = cta.kvh, s = cta.s, k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const int g = lane >> 2, t = lane & 3;
  const PagedKvView& kv = p.kv;

  // This lane's row: QK's A row g, the softmax of row g.
  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;  // row g's keys in this CTA: [key_lo, key_hi)

  // q as A fragments in K's element order, log2(e) * scale folded in, f16;
  // at hd 256 in shared memory (one 16-byte read per block and 16 keys).
  uint32_t qa[NB][2][2];  // [block][k-step][a0, a2]
  {
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float x0 = row_g.valid ? qp[32 * b + KP::k_elem(t, r, 0)] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[32 * b + KP::k_elem(t, r, 1)] * qscale : 0.0f;
        qa[b][r >> 1][r & 1] = pack_f16x2(x0, x1);
      }
  }
  if constexpr (kQInSmem) {
    if (warp == 0)
#pragma unroll
      for (int b = 0; b < NB; ++b) s_q[b][lane] = make_uint4(qa[b][0][0], qa[b][0][1], qa[b][1][0], qa[b][1][1]);
    __syncthreads();  // s_q is complete before any warp's first mma (no early return past this point)
  }

  // Keys every valid row attends to: [lo_max, hi_min); tiles inside need no mask.
  int lo_max, hi_min;
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;  // row g (the same in the 4 lanes t); d: this lane's keys only
  float o[NB][2][4];              // O^T: [block][m-tile][c]: dims v_elem(g, 2mt + c / 2), rows 2t + c % 2
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[b][mt][c] = 0.0f;

  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_blocks_per_seq;
  const int bs_mask = kv.block_size - 1;
  const uint8_t* k_pool = static_cast<const uint8_t*>(kv.k_pool);
  const uint8_t* v_pool = static_cast<const uint8_t*>(kv.v_pool);
  const int64_t k_qrow = int64_t(kv.n_kv_heads) * HD * KP::kBits / 8;
  const int64_t v_qrow = int64_t(kv.n_kv_heads) * HD * VP::kBits / 8;
  const int64_t s_row = int64_t(kv.n_kv_heads) * NB * 2;  // scale bytes of a slot (quantized pools)
  const int64_t k_page = (k_qrow + (KP::kScaled ? s_row : 0)) << bs_shift;
  const int64_t v_page = (v_qrow + (VP::kScaled ? s_row : 0)) << bs_shift;
  const int64_t k_scales = k_qrow << bs_shift, v_scales = v_qrow << bs_shift;  // scale rows' offset in a page
  const int k_head = kvh * HD * KP::kBits / 8;
  const int v_head = kvh * HD * VP::kBits / 8;
  const int sc_head = kvh * NB * 2;

  // The sub-tile's keys are 8-key groups starting at multiples of 8 (the CTA
  // range starts at k_begin rounded down to 8): a group lies in one page
  // (block_size >= 8). Keys before k_begin in the first group are written
  // slots of k_begin's page (masked); keys at or past k_end load key
  // k_end - 1 (a real row: 0 x garbage could be NaN in P V) and are masked.
  const int k_first = k_begin & ~7;
  auto group_page = [&](int key0) -> int { return __ldg(table + (min(key0, k_end - 1) >> bs_shift)); };
  int pg[U][2];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < 2; ++j) pg[u][j] = group_page(k_first + warp * kWarpKeys + 16 * u + 8 * j);

  for (int base = k_first + warp * kWarpKeys; base < k_end; base += kStep) {
    int pg_v[U][2];  // this step's pages (pg moves on to the next step's)
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) pg_v[u][j] = pg[u][j];
    // Raw bytes of the step, all in flight before the first use.
    uint32_t kw[U][2][NB][KP::kKWords];   // K of key 16u + 8j + g, lane t's share of each block
    uint32_t vw[U][4][NB][VP::kVWords];   // V of keys 16u + {2t, 2t+1, 2t+8, 2t+9}, lane g's share
    uint32_t ksw[U][4][KP::kScaled ? kScWords : 1];  // scales of those 4 keys
    uint32_t vsw[U][4][VP::kScaled ? kScWords : 1];
    // V bytes (and V scales) of keys 16u + 8j + 2t + c, blocks [b0, b1).
    auto load_v = [&](int u, int j, int c, int b0, int b1) {
      const int row = min(base + 16 * u + 8 * j + 2 * t + c, k_end - 1) & bs_mask;
      const uint8_t* vpg = v_pool + int64_t(pg_v[u][j]) * v_page;
      const uint8_t* vr = vpg + row * v_qrow + v_head;
#pragma unroll
      for (int b = b0; b < b1; ++b) VP::v_load(vr + b * VP::kBlockBytes, g, vw[u][2 * j + c][b]);
      if constexpr (VP::kScaled)
        if (b0 == 0) ldg_words<kScWords>(vpg + v_scales + row * s_row + sc_head, vsw[u][2 * j + c]);
    };
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int key0 = base + 16 * u + 8 * j;
        const uint8_t* kpg = k_pool + int64_t(pg[u][j]) * k_page;
        {
          const int row = min(key0 + g, k_end - 1) & bs_mask;
          const uint8_t* kr = kpg + row * k_qrow + k_head;
#pragma unroll
          for (int b = 0; b < NB; ++b) KP::k_load(kr + b * KP::kBlockBytes, t, kw[u][j][b]);
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int row = min(key0 + 2 * t + c, k_end - 1) & bs_mask;
          if constexpr (!kLateV) load_v(u, j, c, 0, NB);
          if constexpr (KP::kScaled) ldg_words<kScWords>(kpg + k_scales + row * s_row + sc_head, ksw[u][2 * j + c]);
        }
      }
    // Next step's pages, in flight with this step's bytes.
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) pg[u][j] = group_page(base + kStep + 16 * u + 8 * j);

    const bool edge = base < lo_max || base + kWarpKeys > hi_min;  // warp-uniform
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // S for row g, keys 16u + 8j + 2t + c.
      float acc[2][4] = {};
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        uint32_t q4[4] = {qa[b][0][0], qa[b][0][1], qa[b][1][0], qa[b][1][1]};
        if constexpr (kQInSmem) {
          const uint4 x = s_q[b][lane];
          q4[0] = x.x, q4[1] = x.y, q4[2] = x.z, q4[3] = x.w;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          uint32_t kb[4];
          KP::k_frag(kw[u][j][b], kb);
          if constexpr (KP::kScaled) {
            // The block's two k-steps into a fresh accumulator, then its
            // scale (per key: columns 2t, 2t+1) onto the row's score.
            float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_rows8(blk, q4[0], q4[1], kb[0], kb[1]);
            mma_rows8(blk, q4[2], q4[3], kb[2], kb[3]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint32_t w = ksw[u][2 * j + c][b / 2];
              acc[j][c] = fmaf(f16_bits_to_float(b % 2 ? w >> 16 : w & 0xffffu), blk[c], acc[j][c]);
            }
          } else {
            mma_rows8(acc[j], q4[0], q4[1], kb[0], kb[1]);
            mma_rows8(acc[j], q4[2], q4[3], kb[2], kb[3]);
          }
        }
      }
      float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
      if constexpr (kLateV) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int c = 0; c < 2; ++c) load_v(u, j, c, 0, NB / 2);
      }
      rows8_softcap(sc, p.softcap);
      if (edge) rows8_mask_tile(sc, base + 16 * u, t, key_lo, key_hi);
      float pr[2][2];
      rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_blocks(o, c0, c1); });
      // P^T's B fragment is S's C fragment: keys 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of row g.
      const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
      const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        if (kLateV && b == NB / 2) {  // the second half of V's blocks, once the first half's registers are free
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) load_v(u, j, c, NB / 2, NB);
        }
        uint32_t b0 = p01, b1 = p89;
        if constexpr (VP::kScaled) {
          // V's scale of (key, block) onto that key's probability (f16, one rounding).
          const int sel = b % 2 ? 0x7632 : 0x5410;
          b0 = hmul2_u32(p01, __byte_perm(vsw[u][0][b / 2], vsw[u][1][b / 2], sel));
          b1 = hmul2_u32(p89, __byte_perm(vsw[u][2][b / 2], vsw[u][3][b / 2], sel));
        }
        uint32_t x01[4], x89[4];
        VP::v_frag(vw[u][0][b], vw[u][1][b], x01);
        VP::v_frag(vw[u][2][b], vw[u][3][b], x89);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          mma_16816_f16(o[b][mt], x01[2 * mt], x01[2 * mt + 1], x89[2 * mt], x89[2 * mt + 1], b0, b1);
      }
    }
  }

  // The warp's state to shared memory: (m, d) of row g, then O^T.
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c) s_o[warp][2 * t + (c & 1)][32 * b + VP::v_elem(g, 2 * mt + (c >> 1))] = o[b][mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
}

// A 16-key tile's raw bytes as loaded (before any conversion): K of keys
// 8j + g (lane t's quarter and the key's scale row), V of keys {2t, 2t+1,
// 2t+8, 2t+9} (lane g's HD / 8 values) and the V scale rows of keys 8j + g
// (loaded as K's: one LDG a key, 4 requests for 8 keys; compute_tile
// shuffles each lane its keys' scales: 8 requests a tile fewer than 2-byte
// loads of keys 2t + c, which touch 4 lines for 4 keys). hd 128: 40
// registers (q8_0 / fp8 pairs), 24 (q4_0 pair).
template <typename KP, typename VP, int HD>
struct MmaChunkTileRaw {
  uint32_t kw[2][MmaChunkLayout<KP, HD>::kKWords];
  uint32_t ksw[2][HD / 64];
  uint32_t vw[4][MmaChunkLayout<VP, HD>::kVWords];
  uint32_t vsw[2][HD / 64];
};

// The quantized-load kernel's CTAs an SM: under a 168-register cap (3 CTAs, 12
// warps) where ptxas keeps it free of spills (hd 128: 166-168 registers, 0
// spill bytes), 2 for the fp8 pairs with an 8-bit partner (fp8/fp8,
// fp8/q8_0, q8_0/fp8 spilled 4-20 bytes at 168). hd 64 needs no cap:
// it takes <= 128 registers there (4 CTAs an SM) as it stands.
template <typename KP, typename VP, int HD>
constexpr int quant_kernel_min_ctas() {
  constexpr bool fp8_8bit = (KP::kBits == 8 && VP::kBits == 8) &&
                            (std::is_same_v<KP, MmaFp8> || std::is_same_v<VP, MmaFp8>);
  return HD == 128 && !fp8_8bit ? 3 : 2;
}

// grid, workspace and results as paged_decode_mma_sm80_kernel: each warp
// walks 32 keys (2 tiles of 16) of every 128-key CTA step, all loads of a
// step issued before their first use. kSoftcap: the soft-cap is a template
// switch here (the other decode kernels branch on p.softcap): under the
// 168-register cap a runtime branch made ptxas spill 32 bytes at hd 128
// (q8_0/q8_0) where the kernel had none.
template <typename KP, typename VP, int HD, int kMinCtas, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    paged_decode_mma_quant_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                               int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  using KL = MmaChunkLayout<KP, HD>;
  using VL = MmaChunkLayout<VP, HD>;
  constexpr int R = kMmaRows;
  constexpr int NB = HD / 32;
  constexpr int NS = HD / 16;  // k-steps of QK, m-tiles of PV
  constexpr int kScWords = NB / 2;

  __shared__ float s_m[kWarps][R], s_d[kWarps][R];
  __shared__ float s_o[kWarps][R][HD];

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;
  const int kvh = cta.kvh, s = cta.s, k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const int g = lane >> 2, t = lane & 3;
  const PagedKvView& kv = p.kv;

  // This lane's row: QK's A row g, the softmax of row g.
  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;  // row g's keys in this CTA: [key_lo, key_hi)

  // q as A fragments in K's element order (KL::k_elem), log2(e) * scale folded in.
  uint32_t qa[NS][2];  // [k-step][a0, a2]
  {
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float x0 = row_g.valid ? qp[KL::k_elem(t, j, r, 0)] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[KL::k_elem(t, j, r, 1)] * qscale : 0.0f;
        qa[j][r] = pack_f16x2(x0, x1);
      }
  }

  // Keys every valid row attends to: [lo_max, hi_min); tiles inside need no mask.
  int lo_max, hi_min;
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;
  float o[NS][4];  // O^T: [m-tile][c]: dims VL::v_dim(g, mt, c / 2), rows 2t + c % 2
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[mt][c] = 0.0f;

  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_blocks_per_seq;
  const int bs_mask = kv.block_size - 1;
  const uint8_t* k_pool = static_cast<const uint8_t*>(kv.k_pool);
  const uint8_t* v_pool = static_cast<const uint8_t*>(kv.v_pool);
  const int64_t k_qrow = int64_t(kv.n_kv_heads) * HD * KP::kBits / 8;
  const int64_t v_qrow = int64_t(kv.n_kv_heads) * HD * VP::kBits / 8;
  const int64_t s_row = int64_t(kv.n_kv_heads) * NB * 2;
  const int64_t k_page = (k_qrow + s_row) << bs_shift;
  const int64_t v_page = (v_qrow + s_row) << bs_shift;
  const int64_t k_scales = k_qrow << bs_shift, v_scales = v_qrow << bs_shift;
  const int k_head = kvh * HD * KP::kBits / 8;
  const int v_head = kvh * HD * VP::kBits / 8;
  const int sc_head = kvh * NB * 2;
  // V scales: lane (g, t) needs key 8j + 2t + c's scale of block vb; lane
  // (g', t') offers word t' % 2 of key 8j + g''s scale row, so the source
  // is lane 4 (2t + c) + vb / 2 (vb / 2 < 2), and the half is vb % 2.
  const int vb = VL::v_block(g);
  const int v_src = 8 * t + vb / 2;
  const int v_half = vb & 1 ? 0x7632 : 0x5410;

  const int k_first = k_begin & ~7;
  auto group_page = [&](int key0) -> int { return __ldg(table + (min(key0, k_end - 1) >> bs_shift)); };
  using Raw = MmaChunkTileRaw<KP, VP, HD>;
  // Raw bytes of the 16-key tile at key0 (pages pgs of its two 8-key
  // groups); keys at or past k_end load key k_end - 1 (masked).
  auto load_tile = [&](Raw& r, int key0, const int (&pgs)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint8_t* kpg = k_pool + int64_t(pgs[j]) * k_page;
      const uint8_t* vpg = v_pool + int64_t(pgs[j]) * v_page;
      {
        const int row = min(key0 + 8 * j + g, k_end - 1) & bs_mask;
        KL::k_load(kpg + row * k_qrow + k_head, t, r.kw[j]);
        ldg_words<kScWords>(kpg + k_scales + row * s_row + sc_head, r.ksw[j]);
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int row = min(key0 + 8 * j + 2 * t + c, k_end - 1) & bs_mask;
        VL::v_load(vpg + row * v_qrow + v_head, g, r.vw[2 * j + c]);
      }
      {
        const int row = min(key0 + 8 * j + g, k_end - 1) & bs_mask;
        ldg_words<kScWords>(vpg + v_scales + row * s_row + sc_head, r.vsw[j]);
      }
    }
  };
  // Converts and multiplies one tile: S, the online softmax of row g, P V.
  auto compute_tile = [&](const Raw& r, int key0) {
    // S for row g, keys key0 + 8j + 2t + c: every head dim into one accumulator.
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int w = 0; w < KL::kKWords; ++w) {
        uint32_t kb[2 * KL::kStepsPerWord];
        KL::k_frag(r.kw[j][w], kb);
        const uint32_t s2 = KL::k_scale(r.ksw[j], t, w);
#pragma unroll
        for (int i = 0; i < KL::kStepsPerWord; ++i) {
          const int ks = w * KL::kStepsPerWord + i;
          mma_rows8(acc[j], qa[ks][0], qa[ks][1], hmul2_u32(kb[2 * i], s2), hmul2_u32(kb[2 * i + 1], s2));
        }
      }
    float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
    if constexpr (kSoftcap) rows8_softcap(sc, p.softcap);
    if (key0 < lo_max || key0 + 16 > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
    float pr[2][2];
    rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_tiles(o, c0, c1); });
    // P^T's B fragment is S's C fragment: keys 2t, 2t+1 (b0) and 2t+8, 2t+9 (b1) of row g.
    const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
    const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);
    // V scales of the key pairs (2t, 2t+1) and (2t+8, 2t+9) as half2.
    uint32_t sv[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t offer = kScWords == 2 && (t & 1) ? r.vsw[j][kScWords - 1] : r.vsw[j][0];
#pragma unroll
      for (int c = 0; c < 2; ++c) sv[j][c] = __shfl_sync(0xffffffffu, offer, v_src + 4 * c);
    }
    const uint32_t s01 = __byte_perm(sv[0][0], sv[0][1], v_half);
    const uint32_t s89 = __byte_perm(sv[1][0], sv[1][1], v_half);
#pragma unroll
    for (int w = 0; w < VL::kVWords; ++w) {
      uint32_t x01[2 * VL::kMtPerWord], x89[2 * VL::kMtPerWord];
      VL::v_frag(r.vw[0][w], r.vw[1][w], x01);
      VL::v_frag(r.vw[2][w], r.vw[3][w], x89);
#pragma unroll
      for (int i = 0; i < VL::kMtPerWord; ++i)
        mma_16816_f16(o[w * VL::kMtPerWord + i], hmul2_u32(x01[2 * i], s01), hmul2_u32(x01[2 * i + 1], s01),
                      hmul2_u32(x89[2 * i], s89), hmul2_u32(x89[2 * i + 1], s89), p01, p89);
    }
  };

  // A warp's 32 keys of every 128-key CTA step (2
  // tiles), all loads issued before the first conversion.
  constexpr int U = 2;
  constexpr int kWarpKeys = 16 * U;
  constexpr int kStep = kWarps * kWarpKeys;
  int pg[U][2];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int j = 0; j < 2; ++j) pg[u][j] = group_page(k_first + warp * kWarpKeys + 16 * u + 8 * j);
  for (int base = k_first + warp * kWarpKeys; base < k_end; base += kStep) {
    Raw raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) load_tile(raw[u], base + 16 * u, pg[u]);
    // Next step's pages, in flight with this step's bytes.
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < 2; ++j) pg[u][j] = group_page(base + kStep + 16 * u + 8 * j);
#pragma unroll
    for (int u = 0; u < U; ++u) compute_tile(raw[u], base + 16 * u);
  }

  // The warp's state to shared memory: (m, d) of row g, then O^T.
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s_o[warp][2 * t + (c & 1)][VL::v_dim(g, mt, c >> 1)] = o[mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
}

// The sm_80 tensor-core kernel for K type <K> and V type v at head_dim hd
// (kernels/cuda/inst/paged_decode_mma_sm80_k<K>.cu): the quantized-load
// kernel where K and V are both quantized at head_dim 64 or 128, the
// generic one elsewhere; nullptr where not instantiated (V bf16, f16/f16,
// head_dim 32). Static shared memory only.
KernelFn pick_mma_sm80_kernel_kf16(KvType v, int head_dim, bool softcap);
KernelFn pick_mma_sm80_kernel_kq8_0(KvType v, int head_dim, bool softcap);
KernelFn pick_mma_sm80_kernel_kq4_0(KvType v, int head_dim, bool softcap);
KernelFn pick_mma_sm80_kernel_kfp8(KvType v, int head_dim, bool softcap);

}  // namespace paged
}  // namespace runlm
