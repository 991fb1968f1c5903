// Version 7 of the tensor-core paged decode (issue 7; RUNLM_PAGED_DECODE_MMA=v7,
// head_dim 64 and 128, K and V each q8_0, fp8 or q4_0): version 4's loop
// (paged_decode_mma.cuh: same grid, SeqRange, split/combine, window, -1
// pages, NaN rows, 8 rows a CTA, 32 keys a warp step, online softmax, merge)
// with every K and V byte loaded by whole 16-byte (8-byte at hd 64 / q4_0)
// loads straight into registers, in a fragment order chosen so that the
// loaded bytes convert in place, and the block scales folded into the f16
// conversion. Pairs with an f16 side run version 4 (make_plan says so).
// Version 8 (RUNLM_PAGED_DECODE_MMA=v8, same pairs): these loads and
// conversions through version 5's register ring of 16-key tiles (kRing =
// mma_v8_stages, 3-4 stages: 2-3 tiles in flight while a tile computes).
// Version 9 (v9): version 7 at 3 CTAs an SM (12 warps) where it fits 168
// registers without spills (mma_v9_min_ctas).
//
// Why (ncu of version 4, q8_0/q8_0, B=64 L=8192 hd 128): L2 throughput
// 78.7% (the busiest unit) at 65.6% DRAM, L2 hit rate 41% on a pure stream,
// stalls mostly L1TEX scoreboard; version 5's extra bytes in flight gained
// 3%, so the loads queue somewhere before the DRAM. Version 4 loads each
// lane's mma fragment share with 2-8 byte loads (~40 LDG a 16-key tile),
// whose lanes cover one 32-byte sector of each 128-byte line they touch
// (K: 8 keys x one block; V: 4 keys x one block; q4_0 half a sector): one
// L2 request per sector, 160 a tile. Here a lane loads 16-byte chunks and
// one instruction covers 64 (K) or 128 (V) contiguous bytes of each key:
// 64 requests for the same 160 sectors (hd 128 q8_0, per warp and 16-key
// tile: 4 + 4 LDG.128, 2 + 2 LDG.64 of K and V scales = 12 instructions,
// against ~40). (A key's K bytes stay at 64 an instruction: the mma
// fragments give a key to 4 lanes.)
// (Version 6 copied the same bytes through a shared-memory ring with
// cp.async and was slower for the 8-bit types; this keeps version 4's
// registers-only data path and changes the load shape and order only.)
//
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
// version 4: it multiplies the converted f16 values (HMUL2 after the exact
// conversion), and all head dims accumulate in one f32 accumulator (no
// per-block accumulators and no 32 FFMAs of scale x accumulator). Lane t's
// words lie in one block per 16-byte chunk (one scale per key, lane and
// chunk). q's A fragment is built in the same element order (k_elem).
// V (PV's A, O^T = V^T P^T, m = head dims, k = 16 keys): lane g holds keys
// 2t, 2t+1, 2t+8, 2t+9 of the tile (P^T's B fragment is S's C fragment as
// it stands, as in version 4) and the contiguous HD / 8 values of each at
// g x HD / 8 (8-bit: 16 bytes at hd 128 = one LDG.128; q4_0: 8 bytes),
// inside one 32-value block: one scale per key and lane. Value slot j of
// the lane maps to m-tile j / 2, row g + 8 (j % 2) (for q4_0 the slot order
// follows the nibbles: v_dim), so the pairing of two keys per f16x2 is
// version 4's v_frag on each loaded word, and O's rows come out permuted:
// v_dim un-permutes them on the way to shared memory.
//
// Conversion and precision: the quants convert to f16 exactly as in
// version 4 (q8_0 xor + PRMT + HSUB2 1152; fp8 cvt; q4_0 LOP3 + HSUB2 /
// HFMA2), then HMUL2 by the f16 scale (half2 of one scale for K, of the two
// keys' scales for V): one f16 rounding of q x s (2^-11 relative), where
// version 4 rounded P x s_v instead and kept q x s_k exact in f32. Not
// HFMA2(x, s, -1152 s): -1152 s is not an f16 number in general (1152 =
// 9 x 2^7), and its rounding would shift every value of a (key, block) by
// up to 0.56 s, more than the quantization error. Same tolerance (3e-3).
//
// Instructions per warp and 16 keys (hd 128, q8_0/q8_0), per lane:
//   K: 4 LDG.128 + 2 LDG.64, 16 LOP3 + 32 PRMT + 32 HSUB2 + 32 HMUL2 +
//      ~4 scale PRMT, 16 HMMA                                       ~140
//   V: 4 LDG.128 + 2 LDG.64 + 4 SHFL (scales), 16 LOP3 + 48 PRMT +
//      32 HSUB2 + 32 HMUL2 + 2 PRMT, 8 HMMA                          ~150
//   softmax ~25, addresses and table ~30 (as version 4)
// About version 4's count (~335), with ~3x fewer load instructions and
// sector requests: the L2 request side, not issue, was the limit.
#pragma once

#include <type_traits>

#include "cuda/paged_decode_mma.cuh"

namespace runlm {
namespace paged {

// Version 7's placement of K and V values in the lanes for policy P (MmaQ8,
// MmaFp8, MmaQ4 of paged_decode_mma.cuh, whose exact conversions it reuses)
// at head_dim HD.
template <typename P, int HD>
struct MmaV7Layout {
  static_assert(P::kScaled && (P::kBits == 8 || P::kBits == 4), "version 7: q8_0, fp8, q4_0");
  static_assert(HD == 64 || HD == 128, "version 7: head_dim 64, 128");
  static constexpr bool k8 = P::kBits == 8;
  static constexpr int NB = HD / 32;
  static constexpr int kScWords = NB / 2;     // f16 scale words of a key's head row
  static constexpr int kSteps = HD / 16;      // QK k-steps = PV m-tiles

  // ---- K: lane t's quarter of its key's head row.
  static constexpr int kKLaneBytes = HD * P::kBits / 32;                  // 8-bit 32 / 16, q4_0 16 / 8
  static constexpr int kKLoads = kKLaneBytes > 16 ? kKLaneBytes / 16 : 1;  // loads a key
  static constexpr int kKLoadBytes = kKLaneBytes / kKLoads;
  static constexpr int kKWords = kKLaneBytes / 4;
  static constexpr int kStepsPerWord = k8 ? 1 : 2;
  // Row byte of lane t's load i: 16-byte chunks t, t + 4 (so one
  // instruction's 8 keys x 4 lanes cover 64 contiguous bytes of each key:
  // whole sectors), else the lane's share at t x share.
  __device__ __forceinline__ static int k_off(int t, int i) {
    return kKLoads > 1 ? 16 * (t + 4 * i) : kKLaneBytes * t;
  }
  __device__ __forceinline__ static int k_word_byte(int t, int w) {
    constexpr int per = kKLoadBytes / 4;
    return k_off(t, w / per) + 4 * (w % per);
  }
  __device__ __forceinline__ static void k_load(const uint8_t* row, int t, uint32_t (&w)[kKWords]) {
#pragma unroll
    for (int i = 0; i < kKLoads; ++i) {
      uint32_t x[kKLoadBytes / 4];
      ldg_words<kKLoadBytes / 4>(row + k_off(t, i), x);
#pragma unroll
      for (int k = 0; k < kKLoadBytes / 4; ++k) w[i * (kKLoadBytes / 4) + k] = x[k];
    }
  }
  // Element of k-step j's register r (0: b0, 1: b1), half h, for lane t.
  __device__ __forceinline__ static int k_elem(int t, int j, int r, int h) {
    if constexpr (k8) {
      return k_word_byte(t, j) + 2 * r + h;  // P::k_frag: bytes 0, 1 -> b0, bytes 2, 3 -> b1
    } else {
      const int b = k_word_byte(t, j / 2);  // q4_0: 16 bytes a block
      return 32 * (b / 16) + P::k_elem((b % 16) / 4, 2 * (j % 2) + r, h);
    }
  }
  // Block of lane t's word w (one per 16-byte chunk).
  __device__ __forceinline__ static int k_block(int t, int w) { return k_word_byte(t, w) / (k8 ? 32 : 16); }
  // half2 of the key's scale for word w from its scale words (sw: the
  // row's NB f16 scales); word indices stay compile-time where they can.
  __device__ __forceinline__ static uint32_t k_scale(const uint32_t (&sw)[kScWords], int t, int w) {
    const int blk = k_block(t, w);
    uint32_t x = sw[0];
    if constexpr (kScWords == 2) {
      if constexpr (k8) x = sw[w / (kKWords / 2)];  // hd 128: chunk t (blocks 0, 1), chunk t + 4 (2, 3)
      else x = blk >= 2 ? sw[1] : sw[0];            // q4_0 hd 128: block t
    }
    return __byte_perm(x, 0, blk & 1 ? 0x3232 : 0x1010);
  }
  // Word w's k-steps (b0, b1 each), exact, unscaled.
  __device__ __forceinline__ static void k_frag(uint32_t w, uint32_t (&b)[2 * kStepsPerWord]) {
    if constexpr (k8) {
      const uint32_t w2[2] = {w, w};  // P::k_frag converts 2 words; the duplicate folds away
      uint32_t x[4];
      P::k_frag(w2, x);
      b[0] = x[0], b[1] = x[1];
    } else {
      const uint32_t w1[1] = {w};
      uint32_t x[4];
      P::k_frag(w1, x);
#pragma unroll
      for (int i = 0; i < 4; ++i) b[i] = x[i];
    }
  }

  // ---- V: lane g's HD / 8 contiguous values of a key.
  static constexpr int kVLaneBytes = HD * P::kBits / 64;  // 8-bit 16 / 8, q4_0 8 / 4
  static constexpr int kVWords = kVLaneBytes / 4;
  static constexpr int kMtPerWord = k8 ? 2 : 4;
  __device__ __forceinline__ static void v_load(const uint8_t* row, int g, uint32_t (&w)[kVWords]) {
    ldg_words<kVWords>(row + kVLaneBytes * g, w);
  }
  __device__ __forceinline__ static int v_block(int g) { return HD * g / 256; }
  // Word w of keys x and y -> A registers a[2 * kMtPerWord]: a[2 mt + h]
  // = (x, y) at m-tile w * kMtPerWord + mt, row g + 8 h.
  __device__ __forceinline__ static void v_frag(uint32_t x, uint32_t y, uint32_t (&a)[2 * kMtPerWord]) {
    if constexpr (k8) {
      const uint32_t xs[1] = {x}, ys[1] = {y};
      P::v_frag(xs, ys, a);  // a[q] = byte q of x and y: slot 4w + q
    } else {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {  // P::v_frag pairs the low 16 bits of x and y
        const uint32_t xs[1] = {hh ? x >> 16 : x}, ys[1] = {hh ? y >> 16 : y};
        uint32_t q[4];
        P::v_frag(xs, ys, q);
#pragma unroll
        for (int i = 0; i < 4; ++i) a[4 * hh + i] = q[i];
      }
    }
  }
  // Head dim of lane g's m-tile mt, row g + 8 h.
  __device__ __forceinline__ static int v_dim(int g, int mt, int h) {
    if constexpr (k8) {
      return kVLaneBytes * g + 2 * mt + h;
    } else {
      const int b = kVLaneBytes * g + 2 * (mt / 2);  // the byte pair of m-tiles 2k, 2k + 1
      return 32 * (b / 16) + P::v_elem((b % 16) / 2, 2 * (mt % 2) + h);
    }
  }
};

// A 16-key tile's raw bytes as loaded (before any conversion): K of keys
// 8j + g (lane t's quarter and the key's scale row), V of keys {2t, 2t+1,
// 2t+8, 2t+9} (lane g's HD / 8 values) and the V scale rows of keys 8j + g
// (loaded as K's: one LDG a key, 4 requests for 8 keys; compute_tile
// shuffles each lane its keys' scales: 8 requests a tile fewer than 2-byte
// loads of keys 2t + c, which touch 4 lines for 4 keys). hd 128: 40
// registers (q8_0 / fp8 pairs), 24 (q4_0 pair).
template <typename KP, typename VP, int HD>
struct MmaV7TileRaw {
  uint32_t kw[2][MmaV7Layout<KP, HD>::kKWords];
  uint32_t ksw[2][HD / 64];
  uint32_t vw[4][MmaV7Layout<VP, HD>::kVWords];
  uint32_t vsw[2][HD / 64];
};

// Version 8's ring depth: the most stages (2-4) whose raw tiles stay <= 128
// registers (ptxas, hd 128: q8_0 / fp8 pairs 3 stages at 243 registers,
// q4_0 pair 4 at 222, 240-249 for the others, 0 spill bytes at __launch_bounds__(128, 2)).
template <typename KP, typename VP, int HD>
constexpr int mma_v8_stages() {
  constexpr int words = int(sizeof(MmaV7TileRaw<KP, VP, HD>) / 4);
  return 4 * words <= 128 ? 4 : 3 * words <= 128 ? 3 : 2;
}

// Version 9's CTAs an SM: version 7 under a 168-register cap (3 CTAs, 12
// warps) where ptxas keeps it free of spills (hd 128: 166-168 registers, 0
// spill bytes), 2 for the fp8 pairs with an 8-bit partner (fp8/fp8,
// fp8/q8_0, q8_0/fp8 spilled 4-20 bytes at 168). hd 64 needs no cap:
// version 7 there takes <= 128 registers (4 CTAs an SM) as it stands.
template <typename KP, typename VP, int HD>
constexpr int mma_v9_min_ctas() {
  constexpr bool fp8_8bit = (KP::kBits == 8 && VP::kBits == 8) &&
                            (std::is_same_v<KP, MmaFp8> || std::is_same_v<VP, MmaFp8>);
  return HD == 128 && !fp8_8bit ? 3 : 2;
}

// grid, workspace and results as paged_decode_mma_kernel (version 4).
// kRing = 0 (version 7, and 9 with kMinCtas = 3): each warp walks 32 keys
// (2 tiles of 16) of every 128-key CTA step, all loads of a step issued
// before their first use, as version 4. kRing = S >= 2 (version 8):
// 16-key tiles through a register ring of S raw tiles, S - 1 in flight
// while a tile is computed (version 5's loop on these loads).
template <typename KP, typename VP, int HD, int kRing, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    paged_decode_mma_v7_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                               int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  using KL = MmaV7Layout<KP, HD>;
  using VL = MmaV7Layout<VP, HD>;
  constexpr int R = kMmaRows;
  constexpr int NB = HD / 32;
  constexpr int NS = HD / 16;  // k-steps of QK, m-tiles of PV
  constexpr int kScWords = NB / 2;
  static_assert(kRing == 0 || kRing >= 2, "version 7: kRing 0 (version 4's step) or >= 2 stages");

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
  using Raw = MmaV7TileRaw<KP, VP, HD>;
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

  if constexpr (kRing == 0) {
    // Version 4's step: a warp's 32 keys of every 128-key CTA step (2
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
  } else {
    // The register ring (version 8): tile n (keys k_first + 16 (4n + warp))
    // lives in buf[n % S]; before computing tile i the warp issues the loads
    // of tile i + S - 1 into the buffer tile i - 1 freed, so S - 1 tiles are
    // in flight while it converts and multiplies. pgn: the pages of the next
    // tile to load, read one tile ahead. Tiles at or past k_end are not
    // loaded (the loop stops at the first such tile).
    constexpr int S = kRing;
    auto tile_key = [&](int n) { return k_first + 16 * (kWarps * n + warp); };
    Raw buf[S];
    int pgs[S][2];
#pragma unroll
    for (int st = 0; st < S; ++st) {
      pgs[st][0] = group_page(tile_key(st));
      pgs[st][1] = group_page(tile_key(st) + 8);
    }
#pragma unroll
    for (int st = 0; st < S - 1; ++st)
      if (tile_key(st) < k_end) load_tile(buf[st], tile_key(st), pgs[st]);
    int pgn[2] = {pgs[S - 1][0], pgs[S - 1][1]};
    for (int n = 0; tile_key(n) < k_end; n += S) {
#pragma unroll
      for (int st = 0; st < S; ++st) {  // unrolled: buf's indices are constants (registers)
        const int i = n + st;
        if (tile_key(i) >= k_end) break;  // warp-uniform
        if (tile_key(i + S - 1) < k_end) load_tile(buf[(st + S - 1) % S], tile_key(i + S - 1), pgn);
        pgn[0] = group_page(tile_key(i + S));
        pgn[1] = group_page(tile_key(i + S) + 8);
        compute_tile(buf[st], tile_key(i));
      }
    }
  }

  // The warp's state to shared memory: (m, d) of row g, then O^T.
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s_o[warp][2 * t + (c & 1)][VL::v_dim(g, mt, c >> 1)] = o[mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
}

}  // namespace paged
}  // namespace runlm
