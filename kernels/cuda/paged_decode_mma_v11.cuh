// Version 11 of the tensor-core paged decode (issue 7; opt-in,
// RUNLM_PAGED_DECODE_MMA=v11; sm_90a): version 7's math (paged_decode_mma_v7.cuh:
// the f16 conversion with the block scale folded in, one f32 accumulator for
// all head dims, q in K's element order, V's fragment order and v_dim) with
// every K/V byte of a 16-key tile brought into a per-warp shared-memory ring
// by TMA (cp.async.bulk.tensor, completion on an mbarrier), instead of
// 16-byte LDG into registers. Scope: K and V both 8-bit (q8_0 or fp8, any of
// the 4 pairs), head_dim 128, block_size >= 16, n_kv_heads even (the scale
// rows of a page, n_kv x 8 bytes, then stay 16-byte aligned, as TMA needs);
// elsewhere the dispatch runs what version 9 runs (mma_version_at).
//
// Why (ncu of version 9, q8_0/q8_0, B=64 L=8192, NOTES "Session 8: the
// split rule"): latency bound at DRAM 74.6%, issue 42.5%, long-scoreboard
// stalls, 12 warps an SM, 2589 GB/s against f16's 2983. Version 9 holds a
// 32-key step (8.7 KB a warp) in flight only while it waits. Here each warp
// keeps S - 1 tiles (4.6 KB each) in flight while it computes one, issued
// by one lane with 4 instructions a tile (no LSU copy instructions: version
// 6's per-lane cp.async ring was slower), and the raw tiles leave the
// registers (3-4 CTAs an SM, by shared memory: MmaV11Config).
//
// Ring (per warp, S stages; warp w takes tiles k_first + 16 (4n + w), as
// version 8): a stage holds K quants [16 keys][128 B] and V quants [16][128]
// (each 1024-byte aligned, 128-byte swizzle: 16-byte chunk c of key row r
// sits at chunk c ^ (r & 7)), K and V scale rows [16][16 B] (the f16
// scales of the head pair kvh & ~1, kvh | 1: a scale box that starts at an
// odd head, 8 bytes off a 16-byte boundary, was an illegal instruction on
// the H100), and an mbarrier
// (count 1). Lane 0 arms the barrier with the tile's 4608 bytes and issues
// the 4 boxes of tile i + S - 1 before the warp computes tile i; the warp
// waits on tile i's barrier phase, computes from shared memory, and syncs
// (__syncwarp) before the stage it just read is refilled. A 16-key tile
// starts at a multiple of 16 (k_first = k_begin rounded down to 16), so it
// is 16 rows of one page (block_size >= 16): one box of each kind.
//
// Fragments from shared memory (g = lane / 4, t = lane % 4), all reads
// conflict-free under the swizzle (checked by tools/check_v11_swizzle.py):
//   K (QK's B): lane (g, t) reads chunks 2t and 2t + 1 of key row 8j + g
//     (two LDS.128: block t of the key, 32 bytes), k-step w taking word w;
//     a quarter warp (g = 2a, 2a + 1, t = 0..3) hits chunk positions
//     (2t + i) ^ g: 8 distinct. K element order: k_elem = 32t + 4w + 2r + h
//     (q's A fragment follows it). One K scale a lane and key (block t):
//     LDS.U16 at byte 2t of the key's scale row.
//   V (PV's A): version 7's placement (lane g's 16 contiguous bytes of keys
//     8j + 2t + c, chunk g of the row, at position g ^ (2t + c): distinct
//     in a quarter warp); VL = MmaV7Layout's v_frag / v_dim as they stand;
//     the scales straight from shared memory (LDS.U16 of key 8j + 2t + c,
//     block g / 2), no shuffles.
// Keys outside [k_begin, k_end) in an edge tile are real rows of the page
// (version 7 loads key k_end - 1 instead): past k_end they may be stale or
// never written (NaN / inf quants for fp8, NaN / inf scales for both). Their
// scores are masked (-inf replaces whatever S holds), and their V quants
// and V scales are zeroed before the P V product (0 x NaN would be NaN).
#pragma once

#include <cuda.h>  // CUtensorMap

#include "cuda/fa3/sm90.cuh"
#include "cuda/paged_decode_mma_v7.cuh"

namespace runlm {
namespace paged {

// The launch's 4 tensor maps (made by the host per launch, paged_attention.cu):
// quants 3D u8 {n_kv x 128, block_size, pages} with strides {quant row, page},
// box {128, 16, 1}, 128-byte swizzle; scales 3D u16 {n_kv x 4, block_size,
// pages} from the page's scale rows, strides {scale row, page}, box {8, 16, 1}.
struct MmaV11Maps {
  CUtensorMap kq, ks, vq, vs;
};

constexpr int kV11Hd = 128;
constexpr int kV11QBytes = 16 * kV11Hd;  // one head's quants of a 16-key tile
constexpr int kV11SBytes = 16 * 16;      // the tile's 16-byte scale rows
constexpr int kV11TxBytes = 2 * kV11QBytes + 2 * kV11SBytes;

// Stages and CTAs an SM, two configurations (RUNLM_PAGED_DECODE_V11; ptxas
// sm_90a: 123-125 registers, 0 spill bytes in both). Shared memory a CTA:
// S x 18464 bytes (4 warps x (2 x 2048 quants + 2 x 256 scales + 8 mbarrier))
// + 1024 alignment slack, and the SM reserves 1024 a CTA, of 233472:
//   0 "s4c3" (default): S = 4 at 3 CTAs (12 warps, 3 tiles in flight a warp
//     while it computes: 12 x 3 x 4608 = 166 KB an SM, against version 9's
//     <= 104 KB); 3 x (74880 + 1024) = 227712 bytes.
//   1 "s3c4": S = 3 at 4 CTAs (16 warps, 2 tiles in flight: 147 KB);
//     4 x (56416 + 1024) = 229760 bytes.
template <int kConfig>
struct MmaV11Config {
  static constexpr int kStages = kConfig == 0 ? 4 : 3;
  static constexpr int kMinCtas = kConfig == 0 ? 3 : 4;
};

// Dynamic shared memory of a CTA, offsets from its 1024-aligned base.
// After the loop the merge buffers (s_o, s_m, s_d) reuse the quants' bytes.
template <int S>
struct MmaV11Smem {
  static constexpr int kKq = 0;                                   // [warp][stage][16][128] u8, swizzled
  static constexpr int kVq = kKq + kWarps * S * kV11QBytes;       // same
  static constexpr int kKs = kVq + kWarps * S * kV11QBytes;       // [warp][stage][16][8] f16
  static constexpr int kVs = kKs + kWarps * S * kV11SBytes;       // same
  static constexpr int kBar = kVs + kWarps * S * kV11SBytes;      // [warp][stage] mbarrier
  static constexpr int kBytes = kBar + kWarps * S * 8 + 1024;     // + the base's alignment slack
  static constexpr int kSo = 0;                                   // float [kWarps][R][HD] after the loop
  static constexpr int kSm = kSo + kWarps * kMmaRows * kV11Hd * 4;
  static constexpr int kSd = kSm + kWarps * kMmaRows * 4;
  static_assert(kSd + kWarps * kMmaRows * 4 <= kBar, "version 11: the merge buffers overlap the mbarriers");
};

// Both configurations fit an SM (233472 bytes, 1024 reserved a CTA).
static_assert(MmaV11Config<0>::kMinCtas * (MmaV11Smem<MmaV11Config<0>::kStages>::kBytes + 1024) <= 233472 &&
                  MmaV11Config<1>::kMinCtas * (MmaV11Smem<MmaV11Config<1>::kStages>::kBytes + 1024) <= 233472,
              "version 11: a configuration's CTAs do not fit an SM's shared memory");

// P V of a 16-key tile whose V bytes came from a shared-memory stage
// (versions 11 and 12): vw[slot] holds lane g's words of key key0 + 8 (slot
// / 2) + 2t + slot % 2 (version 7's V placement), sv[slot] that key's f16
// scale bits. Keys outside [k_begin, k_end) are real page rows that may
// hold NaN / inf (stale or never written): their words and scales are
// zeroed first (P is 0 there, but 0 x NaN is NaN).
template <typename VL, int NS>
__device__ __forceinline__ void pv_tile_smem(float (&o)[NS][4], uint32_t (&vw)[4][VL::kVWords], uint32_t (&sv)[4],
                                             uint32_t p01, uint32_t p89, int key0, int t, int k_begin, int k_end) {
  if (key0 < k_begin || key0 + 16 > k_end) {  // warp-uniform
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
      const int key = key0 + 8 * (slot >> 1) + 2 * t + (slot & 1);
      if (key < k_begin || key >= k_end) {
        sv[slot] = 0;
#pragma unroll
        for (int w = 0; w < VL::kVWords; ++w) vw[slot][w] = 0;
      }
    }
  }
  const uint32_t s01 = __byte_perm(sv[0], sv[1], 0x5410);  // (key 2t, key 2t + 1)
  const uint32_t s89 = __byte_perm(sv[2], sv[3], 0x5410);
#pragma unroll
  for (int w = 0; w < VL::kVWords; ++w) {
    uint32_t x01[2 * VL::kMtPerWord], x89[2 * VL::kMtPerWord];
    VL::v_frag(vw[0][w], vw[1][w], x01);
    VL::v_frag(vw[2][w], vw[3][w], x89);
#pragma unroll
    for (int i = 0; i < VL::kMtPerWord; ++i)
      mma_16816_f16(o[w * VL::kMtPerWord + i], hmul2_u32(x01[2 * i], s01), hmul2_u32(x01[2 * i + 1], s01),
                    hmul2_u32(x89[2 * i], s89), hmul2_u32(x89[2 * i + 1], s89), p01, p89);
  }
}

using KernelV11Fn = void (*)(const PagedDecodeParams, const MmaV11Maps, int, int, int, float*, float*, int);

// grid, workspace and results as paged_decode_mma_kernel (version 4).
template <typename KP, typename VP, int S, int kMinCtas>
__global__ void __launch_bounds__(kThreads, kMinCtas)
    paged_decode_mma_v11_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ MmaV11Maps tm,
                                int partition_size, int n_chunks, int bs_shift, float* __restrict__ ws_o,
                                float* __restrict__ ws_md, int ws_parts) {
  static_assert(KP::kBits == 8 && VP::kBits == 8 && KP::kScaled && VP::kScaled, "version 11: q8_0 / fp8 K and V");
  static_assert(S >= 2, "version 11: at least 2 stages");
#if RUNLM_FA3_DEVICE
  constexpr int HD = kV11Hd;
  constexpr int R = kMmaRows;
  constexpr int NS = HD / 16;  // k-steps of QK (one a K word), m-tiles of PV
  using KL = MmaV7Layout<KP, HD>;  // k_frag only (the conversion of one word)
  using VL = MmaV7Layout<VP, HD>;  // v_frag, v_dim, v_block
  using L = MmaV11Smem<S>;

  extern __shared__ uint8_t v11_smem_raw[];
  // The 128-byte swizzle's pattern is taken from shared-address bits 7-9:
  // stages on 1024-byte boundaries make it row & 7.
  const uint32_t raw_addr = fa3::smem_addr(v11_smem_raw);
  uint8_t* const sm = v11_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const uint32_t sbase = fa3::smem_addr(sm);

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;  // CTA-uniform
  const int kvh = cta.kvh, s = cta.s, k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const int g = lane >> 2, t = lane & 3;
  const PagedKvView& kv = p.kv;

  // This warp's stages.
  auto kq_off = [&](int st) { return L::kKq + (warp * S + st) * kV11QBytes; };
  auto vq_off = [&](int st) { return L::kVq + (warp * S + st) * kV11QBytes; };
  auto ks_off = [&](int st) { return L::kKs + (warp * S + st) * kV11SBytes; };
  auto vs_off = [&](int st) { return L::kVs + (warp * S + st) * kV11SBytes; };
  auto bar_at = [&](int st) { return sbase + L::kBar + (warp * S + st) * 8; };
  if (lane == 0) {
#pragma unroll
    for (int st = 0; st < S; ++st) fa3::mbar_init(bar_at(st), 1);
    fa3::mbar_init_fence();  // the initialisations visible to the TMA unit
  }
  __syncwarp();  // and to the warp's other lanes before their first wait

  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_blocks_per_seq;
  const int bs_mask = kv.block_size - 1;

  // Tile n of this warp: keys tile_key(n) .. + 15, one page's rows.
  const int k_first = k_begin & ~15;
  auto tile_key = [&](int n) { return k_first + 16 * (kWarps * n + warp); };
  const int first_key = tile_key(0);
  const int n_tiles = k_end > first_key ? (k_end - first_key + 16 * kWarps - 1) / (16 * kWarps) : 0;
  // Page of tile n (n < n_tiles: a key of [k_first, k_end), never a
  // released -1 entry, as version 7's groups).
  auto page_of = [&](int n) { return __ldg(table + (min(tile_key(n), k_end - 1) >> bs_shift)); };
  // Lane 0: arm stage st's barrier with the tile's bytes and issue its 4 boxes.
  auto issue = [&](int st, int n, int page) {
    const uint32_t bar = bar_at(st);
    const int row = tile_key(n) & bs_mask;
    fa3::mbar_arrive_expect_tx(bar, kV11TxBytes);
    fa3::tma_load_3d(sbase + kq_off(st), &tm.kq, bar, kvh * HD, row, page);
    fa3::tma_load_3d(sbase + vq_off(st), &tm.vq, bar, kvh * HD, row, page);
    // Scale boxes start 16-byte aligned: the pair of heads (kvh & ~1, kvh | 1).
    fa3::tma_load_3d(sbase + ks_off(st), &tm.ks, bar, (kvh & ~1) * (HD / 32), row, page);
    fa3::tma_load_3d(sbase + vs_off(st), &tm.vs, bar, (kvh & ~1) * (HD / 32), row, page);
  };

  // The ring: tile n in stage n % S. Tiles 0 .. S - 2 go out first (before
  // q's fragments: their latency overlaps the prologue); before computing
  // tile i (the loop below) the warp refills the stage of tile i - 1
  // (computed) with tile i + S - 1. pg_next (lane 0): the page of the next tile to
  // issue, read one tile ahead so the table's latency hides behind a tile.
  int pg_next = 0;
  if (lane == 0) {
    int pgs[S - 1];
#pragma unroll
    for (int n = 0; n < S - 1; ++n) pgs[n] = n < n_tiles ? page_of(n) : 0;
    if (S - 1 < n_tiles) pg_next = page_of(S - 1);
#pragma unroll
    for (int n = 0; n < S - 1; ++n)
      if (n < n_tiles) issue(n, n, pgs[n]);
  }

  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;  // row g's keys in this CTA: [key_lo, key_hi)

  // q as A fragments in K's element order here (k_elem = 32t + 4w + 2r + h),
  // log2(e) * scale folded in.
  uint32_t qa[NS][2];  // [k-step w][a0, a2]
  {
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int w = 0; w < NS; ++w)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int e = 32 * t + 4 * w + 2 * r;
        const float x0 = row_g.valid ? qp[e] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[e + 1] * qscale : 0.0f;
        qa[w][r] = pack_f16x2(x0, x1);
      }
  }

  int lo_max, hi_min;  // keys every valid row attends to: tiles inside need no mask
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;
  float o[NS][4];  // O^T: [m-tile][c]: dims VL::v_dim(g, mt, c / 2), rows 2t + c % 2
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[mt][c] = 0.0f;

  // S, the online softmax of row g and P V of the tile in stage st.
  const int sc_half = 8 * (kvh & 1);  // this head's 8 scale bytes in a 16-byte scale row
  auto compute_tile = [&](int st, int key0) {
    const uint8_t* kq = sm + kq_off(st);
    const uint8_t* vq = sm + vq_off(st);
    const uint8_t* ks = sm + ks_off(st);
    const uint8_t* vs = sm + vs_off(st);
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = 8 * j + g;  // row & 7 = g
      const uint4 c0 = *reinterpret_cast<const uint4*>(kq + row * 128 + 16 * ((2 * t) ^ g));
      const uint4 c1 = *reinterpret_cast<const uint4*>(kq + row * 128 + 16 * ((2 * t + 1) ^ g));
      const uint32_t kw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
      const uint32_t sk = *reinterpret_cast<const uint16_t*>(ks + row * 16 + sc_half + 2 * t);
      const uint32_t s2 = __byte_perm(sk, 0, 0x1010);  // block t's scale as half2
#pragma unroll
      for (int w = 0; w < NS; ++w) {
        uint32_t kb[2];
        KL::k_frag(kw[w], kb);
        mma_rows8(acc[j], qa[w][0], qa[w][1], hmul2_u32(kb[0], s2), hmul2_u32(kb[1], s2));
      }
    }
    float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
    if (key0 < lo_max || key0 + 16 > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
    float pr[2][2];
    rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_tiles(o, c0, c1); });
    const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
    const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);

    // V of keys 8j + 2t + c (slot 2j + c): lane g's chunk g, at g ^ (2t + c).
    uint32_t vw[4][VL::kVWords], sv[4];
    const int vb = VL::v_block(g);
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
      const int row = 8 * (slot >> 1) + 2 * t + (slot & 1);  // row & 7 = 2t + c
      const uint4 x = *reinterpret_cast<const uint4*>(vq + row * 128 + 16 * (g ^ (row & 7)));
      vw[slot][0] = x.x, vw[slot][1] = x.y, vw[slot][2] = x.z, vw[slot][3] = x.w;
      sv[slot] = *reinterpret_cast<const uint16_t*>(vs + row * 16 + sc_half + 2 * vb);
    }
    pv_tile_smem<VL>(o, vw, sv, p01, p89, key0, t, k_begin, k_end);
  };

  int st = 0;           // stage of tile i
  uint32_t phase = 0;   // parity of tile i's use of that stage
  for (int i = 0; i < n_tiles; ++i) {
    if (i + S - 1 < n_tiles) {
      __syncwarp();  // every lane is done reading tile i - 1's stage before the TMA overwrites it
      if (lane == 0) {
        issue(st == 0 ? S - 1 : st - 1, i + S - 1, pg_next);
        if (i + S < n_tiles) pg_next = page_of(i + S);
      }
    }
    fa3::mbar_wait(bar_at(st), phase);
    compute_tile(st, tile_key(i));
    if (++st == S) st = 0, phase ^= 1;
  }

  // Every issued tile was waited for; the merge buffers reuse the quants'
  // bytes once every warp is done reading its ring.
  __syncthreads();
  float(*s_o)[R][HD] = reinterpret_cast<float(*)[R][HD]>(sm + L::kSo);
  float(*s_m)[R] = reinterpret_cast<float(*)[R]>(sm + L::kSm);
  float(*s_d)[R] = reinterpret_cast<float(*)[R]>(sm + L::kSd);
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) s_o[warp][2 * t + (c & 1)][VL::v_dim(g, mt, c >> 1)] = o[mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
#endif
}

// Version 11's kernel for K type k and V type v (both q8_0 or fp8, head_dim
// 128; kernels/cuda/inst/paged_decode_mma_v11.cu) in configuration config
// (MmaV11Config), nullptr for other pairs; *smem_bytes: its dynamic shared
// memory.
KernelV11Fn pick_mma_v11_kernel(KvType k, KvType v, int config, int* smem_bytes);

}  // namespace paged
}  // namespace runlm
