// Version 6 of the tensor-core paged decode (issue 7; RUNLM_PAGED_DECODE_MMA=v6,
// head_dim 64 and 128, every pair version 4 takes): the K/V bytes stream
// through a per-warp ring in SHARED memory filled by cp.async, and the warps
// read their mma fragments from there. Same grid, split, workspace, window,
// -1 pages, NaN rows, 8 rows a CTA, conversions and softmax as version 4
// (paged_decode_mma.cuh); instantiations in inst/paged_decode_mma_k<K>.cu.
//
// Why (versions 4 and 5 measured at 77-78% of copy for q8_0 / fp8 and 54%
// for q4_0, and the register ring of version 5 did not help):
// - Versions 4 and 5 load each lane's fragment share straight from global
//   memory: per 16-key tile and warp ~40 LDG of 2-8 bytes a lane, each
//   touching 4-8 different 128-byte lines (8 keys' rows, or 4 keys x 32
//   bytes), ~110 useful bytes an instruction; q4_0 halves the bytes but not
//   the instructions or the lines an instruction touches, and got the
//   least out of its bytes. Here a warp copies a tile with 16-byte cp.async
//   whose 32 lanes cover 512 contiguous bytes of whole key rows (4 lines;
//   hd 128 q8_0: 8 copies a lane for K and V, 1 for the scales), so the
//   global side moves 4-8x fewer, fully used requests.
// - The bytes in flight no longer live in registers: a warp keeps
//   kStages - 1 tiles in flight while it computes one, independent of its
//   compute, and the registers drop to the math (O, q, one tile's
//   fragments): `__launch_bounds__(128, 4)` = 16 warps an SM (<= 54 KB of
//   shared memory a CTA); 12 warps for the pairs with an f16 side at hd 128.
// - The scattered fragment gather moves to shared memory, which serves it
//   without bank conflicts (swizzle below): K by ldmatrix (one x4 = 4
//   chunks of 8 keys), V by 2-8 byte LDS as version 4's LDG.
//
// Ring: warp-private (no CTA barrier in the key loop): stage = K tile
// [16 keys][K row bytes], V tile [16][V row bytes], K scales [16][hd / 16 B],
// V scales [16][hd / 16 B]. A stage is written by the warp's own cp.async
// and read by the warp after cp.async.wait_group + __syncwarp (the barrier
// also orders the previous tile's reads before the copies that overwrite
// its stage).
//
// Bytes in flight (B=64, L=8192, GQA 32/8, hd 128, 16 warps an SM): q8_0 /
// fp8 3 stages of 4.35 KB -> 2 tiles a warp while computing, ~140 KB an
// SM; q4_0 4 stages of 2.3 KB -> 3 tiles, ~110 KB; Little's law asks
// ~22 KB/us x ~1.5 us = ~35 KB an SM at 2.9 TB/s.
//
// Swizzle: 16-byte chunk c of tile key k (0..15) sits at slot
// 16 c + (k ^ h(c)) (chunk-major: a chunk column of the 16 keys is 256
// contiguous bytes), h(c) = c & 7 for rows of >= 8 chunks (128 B),
// 2c ^ (c & 1) for 4, 4c for 2. Checked by brute force
// (tools/paged_v6_swizzle_check.py: every access phase, every row width the
// kernel has): conflict-free for the cp.async writes (lanes take consecutive
// chunks of a row), ldmatrix (8 keys, one chunk) and the V reads (keys
// 2t + c, 4-32 bytes of a block per key).
#pragma once

#include "cuda/mma_sm80.cuh"
#include "cuda/paged_decode_mma.cuh"

namespace runlm {
namespace paged {

template <typename KP, typename VP, int HD>
struct MmaV6Traits {
  static constexpr int NB = HD / 32;
  static constexpr int kTileKeys = 16;
  static constexpr int kKRow = HD * KP::kBits / 8, kVRow = HD * VP::kBits / 8;  // bytes of a key's head row
  static constexpr int kKChunks = kKRow / 16, kVChunks = kVRow / 16;
  static constexpr int kScBytes = NB * 2;  // f16 scales of a key's head row
  static constexpr int kVOff = kTileKeys * kKRow;
  static constexpr int kKScOff = kVOff + kTileKeys * kVRow;
  static constexpr int kVScOff = kKScOff + (KP::kScaled ? kTileKeys * kScBytes : 0);
  static constexpr int kStageBytes = kVScOff + (VP::kScaled ? kTileKeys * kScBytes : 0);
  // CTAs an SM: 4 (16 warps, <= 128 registers); 3 where K or V is f16 at
  // hd 128 (its wider rows and conversions spilled 8-76 bytes at 128).
  static constexpr int kMinCtas = HD == 128 && (!KP::kScaled || !VP::kScaled) ? 3 : 4;
  // A CTA's share of an SM's 227 KB (1 KB each reserved), less q's 2 KB.
  static constexpr int kBudget = (kMinCtas == 4 ? 54 : 72) * 1024;
  static constexpr int kFit = kBudget / (kWarps * kStageBytes);
  static constexpr int kStages = kFit >= 4 ? 4 : kFit >= 3 ? 3 : 2;
  static constexpr int kRingBytes = kWarps * kStages * kStageBytes;
  // hd 128: q's A fragments (16 registers a lane) live in shared memory
  // after the ring (one LDS.128 a block and 8 keys), else ptxas spilled
  // 4-72 bytes under the 128-register cap.
  static constexpr bool kQInSmem = HD == 128;
  static constexpr int kQBytes = kQInSmem ? NB * 32 * 16 : 0;
  // The cross-warp merge reuses the ring: o, then m and d of every warp.
  static constexpr int kMergeBytes = kWarps * kMmaRows * (HD + 2) * 4;
  static constexpr int kSmemBytes =
      kRingBytes + kQBytes > kMergeBytes ? kRingBytes + kQBytes : kMergeBytes;
  static_assert(kKChunks >= 2 && kVChunks >= 2, "rows of >= 32 bytes (head_dim 64 and 128)");
  static_assert(kStageBytes % 16 == 0, "16-byte aligned stages");
};

// Slot of chunk c of tile key k (see the swizzle above); kChunks chunks a row.
template <int kChunks>
__device__ __forceinline__ int v6_slot(int k, int c) {
  const int h = kChunks >= 8 ? (c & 7) : kChunks == 4 ? ((2 * c) ^ (c & 1)) : 4 * c;
  return 16 * c + (k ^ h);
}

template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async sizes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(src), "n"(kBytes) : "memory");
}

// Shared-memory reads of the ring carry a "memory" clobber: they must stay
// after the cp.async wait and the __syncwarp that make the copies visible.
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// kBytes (2, 4, 8) from shared memory into words (2 bytes: the low half).
template <int kBytes, int N>
__device__ __forceinline__ void lds_share(uint32_t addr, uint32_t (&w)[N]) {
  if constexpr (kBytes == 8) {
    static_assert(N == 2, "8 bytes: 2 words");
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr) : "memory");
  } else if constexpr (kBytes == 4) {
    static_assert(N == 1, "4 bytes: 1 word");
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[0]) : "r"(addr) : "memory");
  } else {
    static_assert(kBytes == 2 && N == 1, "2 bytes: 1 word");
    unsigned short h;
    asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(h) : "r"(addr) : "memory");
    w[0] = h;
  }
}

// grid, workspace and results as paged_decode_mma_kernel; dynamic shared
// memory MmaV6Traits::kSmemBytes (the host sets the attribute).
template <typename KP, typename VP, int HD>
__global__ void __launch_bounds__(kThreads, MmaV6Traits<KP, VP, HD>::kMinCtas)
    paged_decode_mma_v6_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                               int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  static_assert(HD == 64 || HD == 128, "tensor-core decode version 6: head_dim 64, 128");
  static_assert(KP::kScaled || VP::kScaled, "tensor-core decode: for pools with a quantized K or V");
  using Tr = MmaV6Traits<KP, VP, HD>;
  constexpr int R = kMmaRows;
  constexpr int NB = Tr::NB;
  constexpr int S = Tr::kStages;
  constexpr int kScWords = NB / 2 > 0 ? NB / 2 : 1;  // f16 scale words of a key's head row
  constexpr int kVShare = VP::kBits / 2;             // V bytes of a lane g's 4 dims of a block

  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t smem_base = smem_u32(smem);

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;
  const int kvh = cta.kvh, s = cta.s, k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const int g = lane >> 2, t = lane & 3;
  const PagedKvView& kv = p.kv;

  // This lane's row: QK's A row g, the softmax of row g.
  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;  // row g's keys in this CTA: [key_lo, key_hi)

  // q as A fragments in ldmatrix's K element order (k_elem_ldsm), log2(e) *
  // scale folded in, f16.
  uint32_t qa[NB][2][2];  // [block][k-step][a0, a2]
  {
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float x0 = row_g.valid ? qp[32 * b + KP::k_elem_ldsm(t, r, 0)] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[32 * b + KP::k_elem_ldsm(t, r, 1)] * qscale : 0.0f;
        qa[b][r >> 1][r & 1] = pack_f16x2(x0, x1);
      }
  }
  uint4* s_q = reinterpret_cast<uint4*>(smem + Tr::kRingBytes);  // [NB][32] (kQInSmem)
  if constexpr (Tr::kQInSmem) {
    if (warp == 0)
#pragma unroll
      for (int b = 0; b < NB; ++b) s_q[b * 32 + lane] = make_uint4(qa[b][0][0], qa[b][0][1], qa[b][1][0], qa[b][1][1]);
    __syncthreads();  // s_q is complete before any warp's first mma (no early return past this point)
  }

  // Keys every valid row attends to: [lo_max, hi_min); tiles inside need no mask.
  int lo_max, hi_min;
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;
  float o[NB][2][4];  // O^T: [block][m-tile][c]: dims v_elem(g, 2mt + c / 2), rows 2t + c % 2
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
  // Offsets inside a page are 32-bit (check_params keeps a page below 2^31
  // bytes); page ids scale to 64-bit pool offsets (mul.wide).
  const int k_qrow = kv.n_kv_heads * Tr::kKRow;
  const int v_qrow = kv.n_kv_heads * Tr::kVRow;
  const int s_row = kv.n_kv_heads * Tr::kScBytes;  // scale bytes of a slot (quantized pools)
  const int k_page = (k_qrow + (KP::kScaled ? s_row : 0)) << bs_shift;
  const int v_page = (v_qrow + (VP::kScaled ? s_row : 0)) << bs_shift;
  const int k_scales = k_qrow << bs_shift, v_scales = v_qrow << bs_shift;
  const int k_head = kvh * Tr::kKRow, v_head = kvh * Tr::kVRow;
  const int sc_head = kvh * Tr::kScBytes;

  // 8-key groups from k_begin rounded down to 8 (one page each, block_size
  // >= 8), as version 4; keys at or past k_end copy key k_end - 1 (a real
  // row) and are masked; tiles at or past k_end are not copied.
  const int k_first = k_begin & ~7;
  auto group_page = [&](int key0) -> int { return __ldg(table + (min(key0, k_end - 1) >> bs_shift)); };
  auto tile_key = [&](int n) { return k_first + Tr::kTileKeys * (kWarps * n + warp); };
  const uint32_t ring = smem_base + warp * S * Tr::kStageBytes;

  // Copies of the tile at key0 (pages pg of its two 8-key groups) into
  // stage st: lane l takes chunks l, l + 32, ... of the K tile (row-major
  // over keys, so 32 lanes cover 512 contiguous bytes of whole rows), then
  // of the V tile, then one key's scales (lanes 0-15 K, 16-31 V).
  auto issue_tile = [&](int st, int key0, const int (&pg)[2]) {
    const uint32_t sb = ring + st * Tr::kStageBytes;
#pragma unroll
    for (int it = 0; it < Tr::kTileKeys * Tr::kKChunks / 32; ++it) {
      const int i = lane + 32 * it, k = i / Tr::kKChunks, c = i % Tr::kKChunks;
      const int row = min(key0 + k, k_end - 1) & bs_mask;
      const uint8_t* src = k_pool + int64_t(k < 8 ? pg[0] : pg[1]) * k_page + (row * k_qrow + k_head + 16 * c);
      cp_async_16(sb + 16 * v6_slot<Tr::kKChunks>(k, c), src, 16);
    }
#pragma unroll
    for (int it = 0; it < Tr::kTileKeys * Tr::kVChunks / 32; ++it) {
      const int i = lane + 32 * it, k = i / Tr::kVChunks, c = i % Tr::kVChunks;
      const int row = min(key0 + k, k_end - 1) & bs_mask;
      const uint8_t* src = v_pool + int64_t(k < 8 ? pg[0] : pg[1]) * v_page + (row * v_qrow + v_head + 16 * c);
      cp_async_16(sb + Tr::kVOff + 16 * v6_slot<Tr::kVChunks>(k, c), src, 16);
    }
    const int k = lane & 15;
    const int row = min(key0 + k, k_end - 1) & bs_mask;
    if (lane < 16) {
      if constexpr (KP::kScaled)
        cp_async_small<Tr::kScBytes>(sb + Tr::kKScOff + k * Tr::kScBytes,
                                     k_pool + int64_t(k < 8 ? pg[0] : pg[1]) * k_page + (k_scales + row * s_row + sc_head));
    } else {
      if constexpr (VP::kScaled)
        cp_async_small<Tr::kScBytes>(sb + Tr::kVScOff + k * Tr::kScBytes,
                                     v_pool + int64_t(k < 8 ? pg[0] : pg[1]) * v_page + (v_scales + row * s_row + sc_head));
    }
  };

  // Converts and multiplies the tile in stage st: S = Q K^T (ldmatrix
  // fragments), the online softmax of row g, O^T += V^T P^T (version 4's
  // sub-tile body, with the bytes from shared memory).
  auto compute_tile = [&](int st, int key0) {
    const uint32_t sb = ring + st * Tr::kStageBytes;
    // Scales of keys 8j + 2t + c (index 2j + c), as version 4's ksw / vsw.
    uint32_t ksw[4][kScWords], vsw[4][kScWords];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int k = 8 * (q >> 1) + 2 * t + (q & 1);
      if constexpr (KP::kScaled) lds_share<Tr::kScBytes>(sb + Tr::kKScOff + k * Tr::kScBytes, ksw[q]);
      if constexpr (VP::kScaled) lds_share<Tr::kScBytes>(sb + Tr::kVScOff + k * Tr::kScBytes, vsw[q]);
    }
    float acc[2][4] = {};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // K of keys 8j + 0..7, every chunk of the row: lane 8i + r gives the
      // row address of key 8j + r, chunk c0 + i of each ldmatrix.
      uint32_t kc[Tr::kKChunks];
      const int r8 = lane & 7, i4 = lane >> 3;
      if constexpr (Tr::kKChunks == 2) {
        ldsm_x2(sb + 16 * v6_slot<2>(8 * j + r8, i4 & 1), kc[0], kc[1]);
      } else {
#pragma unroll
        for (int c0 = 0; c0 < Tr::kKChunks; c0 += 4)
          ldsm_x4(sb + 16 * v6_slot<Tr::kKChunks>(8 * j + r8, c0 + i4), kc[c0], kc[c0 + 1], kc[c0 + 2],
                      kc[c0 + 3]);
      }
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        uint32_t w[KP::kKWords];
#pragma unroll
        for (int x = 0; x < KP::kKWords; ++x) w[x] = kc[b * KP::kKWords + x];
        uint32_t kb[4];
        KP::k_frag(w, kb);
        uint32_t q4[4] = {qa[b][0][0], qa[b][0][1], qa[b][1][0], qa[b][1][1]};
        if constexpr (Tr::kQInSmem) {
          const uint4 x = s_q[b * 32 + lane];
          q4[0] = x.x, q4[1] = x.y, q4[2] = x.z, q4[3] = x.w;
        }
        if constexpr (KP::kScaled) {
          float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          mma_rows8(blk, q4[0], q4[1], kb[0], kb[1]);
          mma_rows8(blk, q4[2], q4[3], kb[2], kb[3]);
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const uint32_t sw = ksw[2 * j + c][b / 2];
            acc[j][c] = fmaf(f16_bits_to_float(b % 2 ? sw >> 16 : sw & 0xffffu), blk[c], acc[j][c]);
          }
        } else {
          mma_rows8(acc[j], q4[0], q4[1], kb[0], kb[1]);
          mma_rows8(acc[j], q4[2], q4[3], kb[2], kb[3]);
        }
      }
    }
    float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
    if (key0 < lo_max || key0 + Tr::kTileKeys > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
    float pr[2][2];
    rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_blocks(o, c0, c1); });
    const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
    const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      // V of keys 8j + 2t + c, lane g's share of block b (version 4's v_load bytes).
      uint32_t vw[4][VP::kVWords];
      const int byte = b * VP::kBlockBytes + g * kVShare;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int k = 8 * (q >> 1) + 2 * t + (q & 1);
        lds_share<kVShare>(sb + Tr::kVOff + 16 * v6_slot<Tr::kVChunks>(k, byte >> 4) + (byte & 15), vw[q]);
      }
      uint32_t b0 = p01, b1 = p89;
      if constexpr (VP::kScaled) {
        const int sel = b % 2 ? 0x7632 : 0x5410;
        b0 = hmul2_u32(p01, __byte_perm(vsw[0][b / 2], vsw[1][b / 2], sel));
        b1 = hmul2_u32(p89, __byte_perm(vsw[2][b / 2], vsw[3][b / 2], sel));
      }
      uint32_t x01[4], x89[4];
      VP::v_frag(vw[0], vw[1], x01);
      VP::v_frag(vw[2], vw[3], x89);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        mma_16816_f16(o[b][mt], x01[2 * mt], x01[2 * mt + 1], x89[2 * mt], x89[2 * mt + 1], b0, b1);
    }
  };

  // The ring: tile n in stage n % S. Before tile n's compute: wait for its
  // copies (S - 2 younger groups may stay pending), __syncwarp (every lane's
  // copies visible; every lane done with tile n - 1), then copy tile
  // n + S - 1 into tile n - 1's stage. One commit group per tile, empty past
  // the end, so the wait count is the same every iteration. pgn: the pages
  // of the next tile to copy, read one tile ahead.
  {
    int pgs[2];
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
      pgs[0] = group_page(tile_key(st));
      pgs[1] = group_page(tile_key(st) + 8);
      if (tile_key(st) < k_end) issue_tile(st, tile_key(st), pgs);
      cp_async_commit();
    }
  }
  int pgn[2] = {group_page(tile_key(S - 1)), group_page(tile_key(S - 1) + 8)};
  for (int n = 0; tile_key(n) < k_end; ++n) {
    cp_async_wait<S - 2>();
    __syncwarp();
    const int nx = n + S - 1;
    if (tile_key(nx) < k_end) issue_tile(nx % S, tile_key(nx), pgn);
    cp_async_commit();
    pgn[0] = group_page(tile_key(nx + 1));
    pgn[1] = group_page(tile_key(nx + 1) + 8);
    compute_tile(n % S, tile_key(n));
  }
  cp_async_wait<0>();  // nothing pending (only tiles < k_end were copied, all computed): the ring is free
  __syncthreads();     // every warp is done with its ring before the merge buffers overwrite it

  auto s_o = reinterpret_cast<float (*)[R][HD]>(smem);    // [kWarps][R][HD]
  auto s_m = reinterpret_cast<float (*)[R]>(s_o + kWarps);  // [kWarps][R]
  auto s_d = s_m + kWarps;                                  // [kWarps][R]
  // The warp's state to shared memory: (m, d) of row g, then O^T.
  rows8_md_to_smem(m, d, warp, g, t, s_m, s_d);
  // O^T through a flat index, as this kernel always stored it: indexed
  // s_o[warp][row][dim], nvcc merges the stores into STS.64/128 (a codegen
  // change to measure on its own, not part of sharing the epilogue).
  float* s_o_flat = s_o[0][0];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        s_o_flat[(warp * R + 2 * t + (c & 1)) * HD + 32 * b + VP::v_elem(g, 2 * mt + (c >> 1))] = o[b][mt][c];
  merge_warps_and_store<R, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, s_o, s_m, s_d);
}

}  // namespace paged
}  // namespace runlm
