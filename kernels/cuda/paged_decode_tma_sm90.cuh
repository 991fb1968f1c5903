// The TMA paged decode kernel (sm_90a): one CTA per (sequence, group of 8
// KV heads, row chunk, partition) instead of one per KV head. A producer
// warp brings each 16-key tile of all 8 heads into a CTA-wide shared-memory
// ring by TMA (one page's 16 whole 1 KB quant rows of K and of V, and their
// 64-byte scale rows: 34816 bytes a stage), and 8 consumer warps, one a KV
// head, compute it with the quantized-load kernel's math
// (paged_decode_mma_sm80.cuh: the f16 conversion with the block scale
// folded in) on swizzled fragment reads from shared memory. Scope: K and V
// each q8_0, fp8 or q4_0 (9 pairs), head_dim 128, block_size >= 16,
// n_kv_heads a multiple of 8; elsewhere the selector picks mma_quant_sm80.
//
// Why (docs/kernels.md, TMA decode): the register-load
// kernel and a per-warp TMA ring both stopped at ~75% of DRAM (2.5 TB/s of
// q8_0 bytes, f16 streams at 88%) with neither issue nor L2 saturated. What
// they shared is the request pattern: 8 CTAs of a sequence, one a KV head,
// each read a 128-byte piece of every 1 KB token row and an 8-byte piece of
// every 64-byte scale row at unrelated times (a scale sector is fetched by 4
// CTAs: L2 moves ~1.2x the DRAM bytes). Here a page's K quants (16 KB), V
// quants and both scale rows (1 KB each) are read once, whole and together,
// by one CTA.
//
// Ring (S stages, each 1024-byte aligned; 34816 bytes for an 8-bit pair,
// 18432 for q4_0): K quants [8 heads][16 keys][row] and V quants the same,
// K scale rows [16 keys][8 heads x 4] f16 and V scale rows the same. 8-bit
// rows are 128 bytes in the 128-byte swizzle (chunk c of key row r at
// c ^ (r & 7)); q4_0 rows are 64 bytes, unswizzled (TmaRows says why).
// Per stage a full mbarrier (count 1: the producer's arrive with the
// stage's bytes) and an empty one (count 8: each consumer warp arrives once
// it has read the stage). The depth S is TmaStage::S (a launch parameter).
// Producer (warp 8): the warp walks the tiles, lane j reading the page of
// tile n0 + j of each 32-tile batch (one table load a batch, handed out by
// shuffles); lane 0 waits for the stage to be empty, arms it and issues 4
// boxes: K and V quants of the 8 heads x 16 rows (4-D maps whose head
// dimension lies inside the slot one, so the box lands head-major), and the
// two scale rows (the 8 heads' 32 scales x 16 rows). (q4_0 loads alone take
// 217 us at B=64 L=8192; one bulk copy a page and pool, or 512-byte TMA
// rows, were no faster: the consumers bound it, not the boxes.)
// Consumers: warp w is KV head 8 * blockIdx.y + w with the chunk's 8 rows of
// its group (row g = lane / 4, as every tensor-core kernel), walks every
// tile of the CTA's keys, and stores its own rows at the end (no cross-warp
// merge: each warp owns its head), straight from the O fragments. It takes
// two tiles a step (tiles_per_step): both tiles' K and V reads and QK
// products, the two stages released, then both softmax and P V steps; with
// 8 consumer warps an SM one tile's chain (loads, conversion, mma, the
// softmax's shuffles) left the SM mostly waiting. For the same reason the
// QK products of a key row run as two accumulator chains (even and odd
// k-steps), and the softmax's running max is lazy (rows8_softmax_step_lazy:
// no shuffles unless a score passes it by 8).
// Edge tiles: keys outside [k_begin, k_end) are real page rows, possibly
// stale or never written: masked scores, zeroed V quants and scales.
#pragma once

#include <cuda.h>  // CUtensorMap

#include "cuda/sm90.cuh"
#include "cuda/paged_decode_mma_common.cuh"

namespace runlm {
namespace paged {

// The launch's 4 tensor maps (made by the host per launch, paged_attention.cu):
// quants 3D u8 {n_kv x 128, block_size, pages} with strides {quant row, page},
// box {128, 16, 1}, 128-byte swizzle; scales 3D u16 {n_kv x 4, block_size,
// pages} from the page's scale rows, strides {scale row, page}, box {8, 16, 1}.
struct DecodeTmaMaps {
  CUtensorMap kq, ks, vq, vs;
};

// P V of a 16-key tile whose V bytes came from a shared-memory stage
// (the TMA kernel): vw[slot] holds lane g's words of key key0 + 8 (slot
// / 2) + 2t + slot % 2 (the chunk layout's V placement), sv[slot] that key's f16
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


constexpr int kTmaHeads = 8;                       // KV heads a CTA: one consumer warp each
constexpr int kTmaThreads = 32 * (kTmaHeads + 1);  // + the producer warp
constexpr int kTmaHd = 128;
constexpr int kTmaSBytes = 16 * kTmaHeads * (kTmaHd / 32) * 2;  // a tile's 16 scale rows of the 8 heads
// Shared memory the ring may take (1 CTA an SM): 6 stages of an 8-bit pair.
constexpr int kTmaRingBudget = 6 * (2 * kTmaHeads * 16 * kTmaHd + 2 * kTmaSBytes);

// Where a lane's fragment bytes sit in one head's 16 key rows of a stage
// (g = lane / 4, t = lane % 4), for K or V of type P (head_dim 128).
//   8-bit: 128-byte rows in the 128-byte swizzle (the chunk layout's reads: K
//     chunks 2t, 2t + 1 of row 8j + g at (2t + i) ^ g, 8 distinct chunks a
//     quarter warp; V chunk g of row 8j + 2t + c at g ^ (2t + c)).
//   q4_0: 64-byte rows, no swizzle. K: lane t's block t (16 bytes at 16t:
//     the chunk layout's order, MmaChunkLayout::k_elem), a quarter warp reads rows 2a,
//     2a + 1 whole: 128 contiguous bytes, no conflict. V: lane g's 8 bytes
//     at 8g of rows 2t + c (8-byte loads; the 4 rows of a half warp share
//     banks, a 4-way conflict on 4 loads a tile, accepted: the loads are not
//     what bounds the kernel).
template <typename P>
struct TmaRows {
  static_assert(P::kScaled && (P::kBits == 8 || P::kBits == 4), "tma_sm90: q8_0, fp8, q4_0");
  static constexpr bool k8 = P::kBits == 8;
  static constexpr int kRow = kTmaHd * P::kBits / 8;  // bytes of a head's key row
  static constexpr int kHeadBytes = 16 * kRow;        // one head's rows of a tile
  static constexpr int kKWords = k8 ? 8 : 4;          // a lane's K words of a key
  static constexpr int kStepsPerWord = k8 ? 1 : 2;    // QK k-steps a K word
  using L7 = MmaChunkLayout<P, kTmaHd>;

  __device__ __forceinline__ static void k_load(const uint8_t* rows, int row, int g, int t, uint32_t (&w)[kKWords]) {
    if constexpr (k8) {
      const uint4 c0 = *reinterpret_cast<const uint4*>(rows + row * kRow + 16 * ((2 * t) ^ g));
      const uint4 c1 = *reinterpret_cast<const uint4*>(rows + row * kRow + 16 * ((2 * t + 1) ^ g));
      w[0] = c0.x, w[1] = c0.y, w[2] = c0.z, w[3] = c0.w, w[4] = c1.x, w[5] = c1.y, w[6] = c1.z, w[7] = c1.w;
    } else {
      const uint4 c0 = *reinterpret_cast<const uint4*>(rows + row * kRow + 16 * t);
      w[0] = c0.x, w[1] = c0.y, w[2] = c0.z, w[3] = c0.w;
    }
  }
  // q's element for k-step j, A register r, half h (the K words' order).
  __device__ __forceinline__ static int k_elem(int t, int j, int r, int h) {
    if constexpr (k8) return 32 * t + 4 * j + 2 * r + h;
    else return L7::k_elem(t, j, r, h);
  }
  // Word w's k-steps (b0, b1 each), exact, unscaled.
  __device__ __forceinline__ static void k_frag(uint32_t w, uint32_t (&b)[2 * kStepsPerWord]) { L7::k_frag(w, b); }
  // A lane's V bytes of key row `row` (the chunk layout's V placement: lane g's HD / 8 values).
  __device__ __forceinline__ static void v_load(const uint8_t* rows, int row, int g, uint32_t (&w)[L7::kVWords]) {
    if constexpr (k8) {
      const uint4 x = *reinterpret_cast<const uint4*>(rows + row * kRow + 16 * (g ^ (row & 7)));
      w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
    } else {
      const uint2 x = *reinterpret_cast<const uint2*>(rows + row * kRow + 8 * g);
      w[0] = x.x, w[1] = x.y;
    }
  }
};

// Registers a thread: 168 (9 warps put 3 in a quarter of the register
// file, 3 x 168 x 32 <= 16384; the whole ring budget for one CTA an SM).
// A template constant: nvcc takes __maxnreg__ beside __launch_bounds__
// only as a dependent expression.
template <typename KP>
constexpr int kTmaMaxRegs = 168;

// A stage of the ring for K type KP and V type VP, offsets from its start;
// S: the ring depth, the stages that fit kTmaRingBudget, at most 8.
template <typename KP, typename VP>
struct TmaStage {
  static constexpr int kKq = 0;                                        // [8][16][K row], 8-bit swizzled
  static constexpr int kVq = kKq + kTmaHeads * TmaRows<KP>::kHeadBytes;  // [8][16][V row]
  static constexpr int kKs = kVq + kTmaHeads * TmaRows<VP>::kHeadBytes;  // [16][8 x 4] f16
  static constexpr int kVs = kKs + kTmaSBytes;                         // same
  static constexpr int kBytes = kVs + kTmaSBytes;
  static_assert(kBytes % 1024 == 0 && kVq % 1024 == 0, "tma_sm90: swizzled rows must stay 1024-byte aligned");
  static constexpr int S = kTmaRingBudget / kBytes < 8 ? kTmaRingBudget / kBytes : 8;
  static_assert(S >= 2, "tma_sm90: at least 2 stages");
  // Dynamic shared memory of a CTA with n stages: the stages, then n full
  // and n empty mbarriers, + the base's 1024-byte alignment slack.
  static constexpr int smem(int n) { return n * kBytes + 16 * n + 1024; }
  static_assert(smem(S) + 1024 <= 233472, "tma_sm90: the rings do not fit an SM's shared memory");
};

// grid: x = partition * n_chunks + chunk, y = group of 8 KV heads, z =
// sequence; kTmaThreads threads, one CTA an SM. Workspace and results as
// the other kernels'.
// Maps: make_tma_maps with 8 heads a box.
template <typename KP, typename VP>
__global__ void __launch_bounds__(kTmaThreads) __maxnreg__(kTmaMaxRegs<KP>)
    paged_decode_tma_sm90_kernel(const __grid_constant__ PagedDecodeParams p, const __grid_constant__ DecodeTmaMaps tm,
                                int partition_size, int n_chunks, int bs_shift, int n_stages, int tiles_per_step,
                                float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
#if RUNLM_SM90_DEVICE
  constexpr int HD = kTmaHd;
  constexpr int R = kMmaRows;
  constexpr int NS = HD / 16;  // k-steps of QK, m-tiles of PV
  constexpr int kScRow = kTmaHeads * (HD / 32) * 2;  // bytes of a key's scale row in a stage
  using KR = TmaRows<KP>;
  using VR = TmaRows<VP>;
  using VL = MmaChunkLayout<VP, HD>;  // v_frag, v_dim, v_block
  using L = TmaStage<KP, VP>;
  const int S = n_stages;  // the ring's depth (>= 2; the host sized the shared memory for it)

  extern __shared__ uint8_t v12_smem_raw[];
  const uint32_t raw_addr = sm90::smem_addr(v12_smem_raw);
  uint8_t* const sm = v12_smem_raw + ((1024u - (raw_addr & 1023u)) & 1023u);
  const uint32_t sbase = sm90::smem_addr(sm);
  auto full_bar = [&](int st) { return sbase + S * L::kBytes + st * 8; };
  auto empty_bar = [&](int st) { return sbase + S * L::kBytes + (S + st) * 8; };

  DecodeCta cta;
  if (!decode_cta_begin<R>(p, partition_size, n_chunks, cta)) return;  // CTA-uniform
  const int k_begin = cta.k_begin, k_end = cta.k_end;
  const int warp = cta.warp, lane = cta.lane;
  const PagedKvView& kv = p.kv;
  const int head0 = blockIdx.y * kTmaHeads;  // the CTA's first KV head

  if (threadIdx.x == 0) {
    for (int st = 0; st < S; ++st) {
      sm90::mbar_init(full_bar(st), 1);
      sm90::mbar_init(empty_bar(st), kTmaHeads);
    }
    sm90::mbar_init_fence();
  }
  __syncthreads();  // the barriers initialised before any wait or TMA; no CTA-wide barrier after this

  // Tile n: keys k_first + 16 n .. + 15, 16 rows of one page (block_size >= 16).
  const int k_first = k_begin & ~15;
  const int n_tiles = (k_end - k_first + 15) / 16;  // k_begin < k_end (decode_cta_begin)

  if (warp == kTmaHeads) {
    // ---- producer warp
    const int32_t* table = kv.block_tables + int64_t(cta.s) * kv.max_blocks_per_seq;
    const int bs_mask = kv.block_size - 1;
    int pages = 0;  // lane j: the page of tile n0 + j of the current batch
    for (int n = 0; n < n_tiles; ++n) {
      const int j = n & 31;
      if (j == 0) {
        const int key = k_first + 16 * (n + lane);
        pages = n + lane < n_tiles ? __ldg(table + (key >> bs_shift)) : 0;
      }
      const int page = __shfl_sync(0xffffffffu, pages, j);
      const int st = n % S;
      if (n >= S) sm90::mbar_wait(empty_bar(st), ((n / S) - 1) & 1);
      if (lane == 0) {
        const uint32_t bar = full_bar(st);
        const uint32_t stage = sbase + st * L::kBytes;
        const int row = (k_first + 16 * n) & bs_mask;
        sm90::mbar_arrive_expect_tx(bar, L::kBytes);
        sm90::tma_load_4d(stage + L::kKq, &tm.kq, bar, 0, row, head0, page);
        sm90::tma_load_4d(stage + L::kVq, &tm.vq, bar, 0, row, head0, page);
        sm90::tma_load_3d(stage + L::kKs, &tm.ks, bar, head0 * (HD / 32), row, page);
        sm90::tma_load_3d(stage + L::kVs, &tm.vs, bar, head0 * (HD / 32), row, page);
      }
      __syncwarp();
    }
    return;
  }

  // ---- consumer warp: KV head head0 + warp
  cta.kvh = head0 + warp;
  const int g = lane >> 2, t = lane & 3;
  const DecodeRow row_g = decode_row<R, HD>(p, cta, g);
  const int key_lo = row_g.key_lo, key_hi = row_g.key_hi;

  // q as A fragments in K's element order (KR::k_elem), log2(e) * scale folded in.
  uint32_t qa[NS][2];
  {
    const float* qp = row_g.q;
    const float qscale = p.scale * kLog2e;
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float x0 = row_g.valid ? qp[KR::k_elem(t, j, r, 0)] * qscale : 0.0f;
        const float x1 = row_g.valid ? qp[KR::k_elem(t, j, r, 1)] * qscale : 0.0f;
        qa[j][r] = pack_f16x2(x0, x1);
      }
  }

  int lo_max, hi_min;
  rows8_common_keys(row_g, cta, lo_max, hi_min);

  float m = -INFINITY, d = 0.0f;
  float o[NS][4];  // O^T: [m-tile][c]: dims VL::v_dim(g, mt, c / 2), rows 2t + c % 2
#pragma unroll
  for (int mt = 0; mt < NS; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[mt][c] = 0.0f;

  const int sc_head = 8 * warp;  // this head's 4 scales (8 bytes) in a key's scale row
  // A tile in two halves, so that two tiles' loads and QK products can be
  // issued before either's softmax (the softmax's warp-uniform branches end
  // the compiler's scheduling regions): tile_qk reads the stage's K (scores
  // into acc) and V (raw words and scales into registers), tile_pv does the
  // masking, the online softmax and P V.
  struct TileRegs {
    float acc[2][4];
    uint32_t vw[4][VL::kVWords], sv[4];
  };
  auto tile_qk = [&](int st, TileRegs& r) {
    const uint8_t* stage = sm + st * L::kBytes;
    const uint8_t* kq = stage + L::kKq + warp * KR::kHeadBytes;
    const uint8_t* vq = stage + L::kVq + warp * VR::kHeadBytes;
    const uint8_t* ks = stage + L::kKs + sc_head;
    const uint8_t* vs = stage + L::kVs + sc_head;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // Even and odd k-steps accumulate apart, halving the chain of
      // dependent mma (8 -> 4 + an add) that the softmax waits for.
      float acc_odd[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) r.acc[j][c] = acc_odd[c] = 0.0f;
      const int row = 8 * j + g;
      uint32_t kw[KR::kKWords];
      KR::k_load(kq, row, g, t, kw);
      const uint32_t sk = *reinterpret_cast<const uint16_t*>(ks + row * kScRow + 2 * t);
      const uint32_t s2 = __byte_perm(sk, 0, 0x1010);  // block t's scale as half2 (the lane's K bytes: block t)
#pragma unroll
      for (int w = 0; w < KR::kKWords; ++w) {
        uint32_t kb[2 * KR::kStepsPerWord];
        KR::k_frag(kw[w], kb);
#pragma unroll
        for (int i = 0; i < KR::kStepsPerWord; ++i) {
          const int ks_ = w * KR::kStepsPerWord + i;
          mma_rows8(ks_ % 2 ? acc_odd : r.acc[j], qa[ks_][0], qa[ks_][1], hmul2_u32(kb[2 * i], s2),
                    hmul2_u32(kb[2 * i + 1], s2));
        }
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) r.acc[j][c] += acc_odd[c];  // tile_pv reads c = 0, 1 (rows8)
    }
    // V of keys 8j + 2t + c (slot 2j + c).
    const int vb = VL::v_block(g);
#pragma unroll
    for (int slot = 0; slot < 4; ++slot) {
      const int row = 8 * (slot >> 1) + 2 * t + (slot & 1);
      VR::v_load(vq, row, g, r.vw[slot]);
      r.sv[slot] = *reinterpret_cast<const uint16_t*>(vs + row * kScRow + 2 * vb);
    }
  };
  auto tile_pv = [&](TileRegs& r, int key0) {
    float sc[2][2] = {{r.acc[0][0], r.acc[0][1]}, {r.acc[1][0], r.acc[1][1]}};
    rows8_softcap(sc, p.softcap);
    if (key0 < lo_max || key0 + 16 > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
    float pr[2][2];
    rows8_softmax_step_lazy(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_tiles(o, c0, c1); });
    const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
    const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);
    pv_tile_smem<VL>(o, r.vw, r.sv, p01, p89, key0, t, k_begin, k_end);
  };
  auto release = [&](int st) {
    __syncwarp();  // every lane has read the stage
    if (lane == 0) sm90::mbar_arrive(empty_bar(st));
  };

  int st = 0;
  uint32_t phase = 0;
  int i = 0;
  // Two tiles a step (tiles_per_step 2; S >= 3 keeps the producer a stage
  // ahead): both tiles' K and V reads and QK products, then both softmax and
  // P V steps.
  if (tiles_per_step == 2) {
    for (; i + 2 <= n_tiles; i += 2) {
      const int st_b = st + 1 == S ? 0 : st + 1;
      const uint32_t phase_b = st + 1 == S ? phase ^ 1 : phase;
      sm90::mbar_wait(full_bar(st), phase);
      sm90::mbar_wait(full_bar(st_b), phase_b);
      TileRegs a, b;
      tile_qk(st, a);
      tile_qk(st_b, b);
      release(st);
      release(st_b);
      tile_pv(a, k_first + 16 * i);
      tile_pv(b, k_first + 16 * (i + 1));
      st = st_b + 1 == S ? 0 : st_b + 1;
      phase = st_b + 1 == S ? phase_b ^ 1 : phase_b;
    }
  }
  for (; i < n_tiles; ++i) {
    sm90::mbar_wait(full_bar(st), phase);
    TileRegs a;
    tile_qk(st, a);
    release(st);
    tile_pv(a, k_first + 16 * i);
    if (++st == S) st = 0, phase ^= 1;
  }

  rows8_store_warp<VL, HD>(p, cta, partition_size, ws_o, ws_md, ws_parts, m, d, o);
#endif
}

using KernelTmaFn = void (*)(const PagedDecodeParams, const DecodeTmaMaps, int, int, int, int, int, float*, float*,
                             int);

// The kernel for K type k and V type v (each q8_0, fp8 or q4_0, head_dim
// 128; kernels/cuda/inst/paged_decode_tma_sm90.cu), nullptr for other
// pairs; *stages: its ring depth (TmaStage::S), *stage_bytes: a stage's
// bytes (TmaStage::smem gives the dynamic shared memory of a depth).
KernelTmaFn pick_tma_sm90_kernel(KvType k, KvType v, int* stages, int* stage_bytes);

}  // namespace paged
}  // namespace runlm
