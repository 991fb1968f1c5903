// The paged decode kernel on tensor cores (issue 7, version 4 in
// paged_attention.cu): mma.sync m16n8k16 (f16 inputs, f32 accumulators) for
// QK^T and PV, for pools whose K or V is quantized (q8_0, q4_0, fp8; the
// partner may be f16), head_dim 64, 128, 256, up to kMmaRows query rows a
// CTA. The SIMT kernel (paged_attention.cuh) keeps every other combination.
// Same grid, split, workspace, window, -1 pages and NaN rows as the SIMT
// kernel (shared prologue and epilogue in paged_attention.cuh: DecodeCta,
// DecodeRow, merge_warps_and_store); the instantiations are in
// kernels/cuda/inst/paged_decode_mma_k<K>.cu.
// Version 5 (kVersion = 5, head_dim 64 and 128; RUNLM_PAGED_DECODE_MMA=v5)
// is version 4 with a software-pipelined key loop: the raw loads of the next
// 16-key tiles go out before a tile's conversion and mma (a register ring,
// MmaTileRaw below, with the bytes-in-flight estimate).
// Version 6 (RUNLM_PAGED_DECODE_MMA=v6, head_dim 64 and 128) streams the
// bytes through a cp.async ring in shared memory and reads the fragments
// from there: paged_decode_mma_v6.cuh (it reuses the policies below; their
// k_elem_ldsm is its K element order).
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
#pragma once

#include "cuda/paged_attention.cuh"

namespace runlm {
namespace paged {

constexpr int kMmaRows = 8;  // query rows per CTA on the tensor-core path (PV's n)

// ------------------------------------------------------------ rows of a warp

// Every tensor-core kernel (versions 4-10) gives a warp the CTA's 8 rows:
// row g = lane / 4 (QK's A row, the softmax's row) sits in the 4 lanes
// t = lane % 4. The prologue and epilogue pieces of that layout:

// The keys every valid row of the CTA attends to, [lo_max, hi_min)
// (warp-wide max / min over the 8 rows, lanes 4 apart): tiles inside need
// no mask.
__device__ __forceinline__ void rows8_common_keys(const DecodeRow& row_g, const DecodeCta& c, int& lo_max,
                                                  int& hi_min) {
  lo_max = row_g.valid ? row_g.key_lo : c.k_begin, hi_min = row_g.valid ? row_g.key_hi : c.k_end;
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    lo_max = max(lo_max, __shfl_xor_sync(0xffffffffu, lo_max, off));
    hi_min = min(hi_min, __shfl_xor_sync(0xffffffffu, hi_min, off));
  }
}

// Row g's denominator over the 4 lanes t (each lane's d holds its own keys
// only), then the warp's (m, d) of row g to shared memory; the caller stores
// O in its own fragment layout.
__device__ __forceinline__ void rows8_md_to_smem(float m, float d, int warp, int g, int t, float (*s_m)[kMmaRows],
                                                 float (*s_d)[kMmaRows]) {
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
  if (t == 0) {
    s_m[warp][g] = m;
    s_d[warp][g] = d;
  }
}

// The store of a warp that owns its rows' whole state (version 12: one warp
// a KV head, nothing to merge across warps), straight from O^T's fragments
// (o[mt][c]: row 2t + c % 2, head dim VL::v_dim(g, mt, c / 2)): the output
// O / D (no split) or the partition's (m, d, O) for the combine kernel, as
// merge_warps_and_store writes them. m: row g's running max (the same in its
// 4 lanes); d: this lane's part of row g's denominator.
template <typename VL, int HD, int NS>
__device__ __forceinline__ void rows8_store_warp(const PagedDecodeParams& p, const DecodeCta& c, int partition_size,
                                                 float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts,
                                                 float m, float d, const float (&o)[NS][4]) {
  const int g = c.lane >> 2, t = c.lane & 3;
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  d += __shfl_xor_sync(0xffffffffu, d, 2);
#pragma unroll
  for (int cc = 0; cc < 2; ++cc) {
    const int r = 2 * t + cc;  // row r's state sits in lanes 4r .. 4r + 3
    const float M = __shfl_sync(0xffffffffu, m, 4 * r);
    const float D = __shfl_sync(0xffffffffu, d, 4 * r);
    const int rho = c.chunk * kMmaRows + r;
    if (rho >= c.rows) continue;
    const int64_t rid = int64_t(c.sr.q0 + rho / c.group) * p.n_heads + c.kvh * c.group + rho % c.group;
    if (partition_size == 0) {
      float* out = p.out + rid * HD;
#pragma unroll
      for (int mt = 0; mt < NS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) out[VL::v_dim(g, mt, h)] = o[mt][cc + 2 * h] / D;  // D > 0 for a valid row
    } else {
      const int64_t at = rid * ws_parts + c.part;
#pragma unroll
      for (int mt = 0; mt < NS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) ws_o[at * HD + VL::v_dim(g, mt, h)] = o[mt][cc + 2 * h];
      if (g == 0) {
        ws_md[at * 2] = M;
        ws_md[at * 2 + 1] = D;
      }
    }
  }
}

// Row g's scores of a 16-key tile, sc[j][c] = key key0 + 8j + 2t + c (S's
// C fragment): keys outside the row's [key_lo, key_hi) become -inf. Callers
// run it only on tiles that cross a row's bounds (rows8_common_keys).
__device__ __forceinline__ void rows8_mask_tile(float (&sc)[2][2], int key0, int t, int key_lo, int key_hi) {
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int key = key0 + 8 * j + 2 * t + c;
      if (!(key >= key_lo && key < key_hi)) sc[j][c] = -INFINITY;
    }
}

// O^T's C fragments scaled per column: elements 0 and 2 are column 2t (row
// 2t of the CTA), 1 and 3 column 2t + 1. Versions 7 and 10 keep O as m16
// tiles, versions 4-6 as [block][2 tiles].
template <int N>
__device__ __forceinline__ void rescale_o_tiles(float (&o)[N][4], float c0, float c1) {
#pragma unroll
  for (int mt = 0; mt < N; ++mt) {
    o[mt][0] *= c0;
    o[mt][1] *= c1;
    o[mt][2] *= c0;
    o[mt][3] *= c1;
  }
}
template <int NB>
__device__ __forceinline__ void rescale_o_blocks(float (&o)[NB][2][4], float c0, float c1) {
#pragma unroll
  for (int b = 0; b < NB; ++b) rescale_o_tiles(o[b], c0, c1);
}

// The row-g max over the tile's 4 lanes t.
__device__ __forceinline__ float rows8_tile_max(float mx) {
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}
// Moves row g's running max to m_new (>= m): d scaled, and O rescaled
// through rescale_o(c0, c1), the factors of O^T's columns 2t and 2t + 1
// (rows whose factors live in lanes 8t and 8t + 4). Every lane of the warp
// takes part (shuffles); rows whose max did not move get factor 1.
template <typename RescaleO>
__device__ __forceinline__ void rows8_move_max(float m_new, int t, float& m, float& d, RescaleO&& rescale_o) {
  const float ms = m_new == -INFINITY ? 0.0f : m_new;
  const float corr = fast_exp2(m - ms);  // m = -inf: 0 (d and o are 0 then anyway)
  d *= corr;
  const float c0 = __shfl_sync(0xffffffffu, corr, 8 * t);
  const float c1 = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
  rescale_o(c0, c1);
  m = m_new;
}
// The probabilities pr of the tile's scores under the running max m
// (masked keys: 2^-inf = 0), added into d.
__device__ __forceinline__ void rows8_probs(const float (&sc)[2][2], float m, float& d, float (&pr)[2][2]) {
  const float ms = m == -INFINITY ? 0.0f : m;  // nothing live yet: keep exp2 away from -inf - -inf
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      pr[j][c] = fast_exp2(sc[j][c] - ms);
      d += pr[j][c];
    }
}

// One online-softmax step of row g over a 16-key tile (the keys sit in the
// 4 lanes t): the row max, then, when any row's max grew (rare after the
// first keys, so warp-uniformly skipped), d and O rescaled
// (rows8_move_max); last the probabilities pr added into d. O's fragment
// layout is the kernel's, hence the callback.
template <typename RescaleO>
__device__ __forceinline__ void rows8_softmax_step(const float (&sc)[2][2], int t, float& m, float& d,
                                                   float (&pr)[2][2], RescaleO&& rescale_o) {
  const float mx = rows8_tile_max(fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])));
  const float m_new = fmaxf(m, mx);
  if (__any_sync(0xffffffffu, m_new != m)) rows8_move_max(m_new, t, m, d, rescale_o);
  rows8_probs(sc, m, d, pr);
}

// rows8_softmax_step with a lazy max (version 12): the running max m only
// moves when a score passes m + kLazyMaxSlack (log2 units), found by a vote
// on each lane's own scores, so a tile normally costs no shuffle and no
// dependent max chain; the probabilities are then at most 2^kLazyMaxSlack
// (f16 holds them; O and d accumulate in f32 with the same m, which is all
// the combine and the final O / d need). The first tile (m = -inf) and any
// tile that passes the slack take the exact path.
constexpr float kLazyMaxSlack = 8.0f;
template <typename RescaleO>
__device__ __forceinline__ void rows8_softmax_step_lazy(const float (&sc)[2][2], int t, float& m, float& d,
                                                        float (&pr)[2][2], RescaleO&& rescale_o) {
  const float mx = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1]));
  if (__any_sync(0xffffffffu, mx > m + kLazyMaxSlack))  // m = -inf: any finite score
    rows8_move_max(fmaxf(m, rows8_tile_max(mx)), t, m, d, rescale_o);
  rows8_probs(sc, m, d, pr);
}

// ------------------------------------------------------------ f16x2 helpers

__device__ __forceinline__ uint32_t hsub2_u32(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hmul2_u32(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t hfma2_u32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}
// (x & kMask) | kOr in one LOP3. Written as C++ the two constants give an
// AND and an OR (SASS LOP3 takes one immediate); as one PTX lop3 ptxas keeps
// one of them in a register (session 14: the q4_0 decode's hot loop had 133
// LOP3 a tile and warp, half of them the ORs).
template <uint32_t kMask, uint32_t kOr>
__device__ __forceinline__ uint32_t and_or_u32(uint32_t x) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "n"(kMask), "n"(kOr));  // 0xEA = (a & b) | c
  return r;
}
// (lo, hi) -> f16x2 bits, lo in the low half (the lower k index of a pair).
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t r;
  memcpy(&r, &h, 4);
  return r;
}
// Two e4m3 (low byte, high byte) -> f16x2 (low, high): hardware on sm_89+.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x16) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x16), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
__device__ __forceinline__ float f16_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// d += A B with A's rows 8..15 zero (a1 = a3 = 0): only 8 query rows.
__device__ __forceinline__ void mma_rows8(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Words of 4, 8 or 16 bytes, streamed (no L1 allocation).
template <int N>
__device__ __forceinline__ void ldg_words(const uint8_t* p, uint32_t (&w)[N]) {
  if constexpr (N == 4) {
    const uint4 r = ldg_stream16(p);
    w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
  } else if constexpr (N == 2) {
    const uint2 r = ldg_stream8(p);
    w[0] = r.x, w[1] = r.y;
  } else {
    static_assert(N == 1, "1, 2 or 4 words");
    w[0] = ldg_stream4(p);
  }
}

constexpr uint32_t kF16x2_1024 = 0x64006400u;  // f16 1024: its ulp is 1, so 1024 + byte is exact
constexpr uint32_t kBytes64 = 0x64646464u;     // PRMT source of the 0x64 high bytes
constexpr uint32_t kF16x2_1152 = 0x64806480u;  // 1024 + 128 (q8_0 bias after the xor)
constexpr uint32_t kF16x2_1032 = 0x64086408u;  // 1024 + 8 (q4_0 low nibbles)
constexpr uint32_t kF16x2_1_16 = 0x2C002C00u;  // 1/16 (q4_0 high nibbles sit at 16x)
constexpr uint32_t kF16x2_m72 = 0xD480D480u;   // -72 = -(1024 / 16 + 8)

// ------------------------------------------------------------ mma policies
//
// K side (QK's B): k_load reads lane t's share of one 32-value block of a
// key (kKWords words); k_frag converts it to the 4 f16x2 B registers
// {k-step 0: b0, b1; k-step 1: b0, b1}; register r's halves h = 0, 1 hold
// elements k_elem(t, r, h) of the block (q's A fragment follows it).
// V side (PV's A): v_load reads lane g's share of one block of a key
// (kVWords words); v_frag pairs two keys (x, y: keys 2t, 2t+1 or 2t+8,
// 2t+9) into 4 f16x2 registers, register q holding (x, y) at element
// v_elem(g, q) of the block; q = 2 * m-tile + (0: m = g, 1: m = g + 8).

struct MmaF16 {
  static constexpr bool kScaled = false;
  static constexpr int kBits = 16;
  static constexpr int kBlockBytes = 64;
  static constexpr int kKWords = 4, kVWords = 2;
  __device__ __forceinline__ static void k_load(const uint8_t* blk, int t, uint32_t (&w)[kKWords]) {
    ldg_words<4>(blk + 16 * t, w);
  }
  __device__ __forceinline__ static void k_frag(const uint32_t (&w)[kKWords], uint32_t (&b)[4]) {
#pragma unroll
    for (int r = 0; r < 4; ++r) b[r] = w[r];
  }
  __device__ __forceinline__ static int k_elem(int t, int r, int h) { return 8 * t + 2 * r + h; }
  // Version 6 (ldmatrix of the block's 4 chunks): word r = chunk r, bytes 4t..4t+3.
  __device__ __forceinline__ static int k_elem_ldsm(int t, int r, int h) { return 8 * r + 2 * t + h; }
  __device__ __forceinline__ static void v_load(const uint8_t* blk, int g, uint32_t (&w)[kVWords]) {
    ldg_words<2>(blk + 8 * g, w);
  }
  __device__ __forceinline__ static void v_frag(const uint32_t (&x)[kVWords], const uint32_t (&y)[kVWords],
                                                uint32_t (&a)[4]) {
    a[0] = __byte_perm(x[0], y[0], 0x5410);
    a[1] = __byte_perm(x[0], y[0], 0x7632);
    a[2] = __byte_perm(x[1], y[1], 0x5410);
    a[3] = __byte_perm(x[1], y[1], 0x7632);
  }
  __device__ __forceinline__ static int v_elem(int g, int q) { return 4 * g + q; }
};

// int8 -> f16: xor 0x80 makes the byte x + 128 in 0..255; PRMT puts it under
// 0x64 (f16 1024 + byte); HSUB2 1152 leaves x. Exact.
struct MmaQ8 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 8;
  static constexpr int kBlockBytes = 32;
  static constexpr int kKWords = 2, kVWords = 1;
  __device__ __forceinline__ static void k_load(const uint8_t* blk, int t, uint32_t (&w)[kKWords]) {
    ldg_words<2>(blk + 8 * t, w);
  }
  __device__ __forceinline__ static void k_frag(const uint32_t (&w)[kKWords], uint32_t (&b)[4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t u = w[i] ^ 0x80808080u;
      b[2 * i] = hsub2_u32(__byte_perm(u, kBytes64, 0x4140), kF16x2_1152);
      b[2 * i + 1] = hsub2_u32(__byte_perm(u, kBytes64, 0x4342), kF16x2_1152);
    }
  }
  __device__ __forceinline__ static int k_elem(int t, int r, int h) { return 8 * t + 2 * r + h; }
  // Version 6 (ldmatrix of the block's 2 chunks): word i = bytes 16i + 4t..16i + 4t + 3.
  __device__ __forceinline__ static int k_elem_ldsm(int t, int r, int h) { return (r >> 1) * 16 + 4 * t + 2 * (r & 1) + h; }
  __device__ __forceinline__ static void v_load(const uint8_t* blk, int g, uint32_t (&w)[kVWords]) {
    ldg_words<1>(blk + 4 * g, w);
  }
  __device__ __forceinline__ static void v_frag(const uint32_t (&x)[kVWords], const uint32_t (&y)[kVWords],
                                                uint32_t (&a)[4]) {
    const uint32_t u = x[0] ^ 0x80808080u, v = y[0] ^ 0x80808080u;
    const uint32_t lo = __byte_perm(u, v, 0x5140), hi = __byte_perm(u, v, 0x7362);  // x0 y0 x1 y1 | x2 y2 x3 y3
    a[0] = hsub2_u32(__byte_perm(lo, kBytes64, 0x4140), kF16x2_1152);
    a[1] = hsub2_u32(__byte_perm(lo, kBytes64, 0x4342), kF16x2_1152);
    a[2] = hsub2_u32(__byte_perm(hi, kBytes64, 0x4140), kF16x2_1152);
    a[3] = hsub2_u32(__byte_perm(hi, kBytes64, 0x4342), kF16x2_1152);
  }
  __device__ __forceinline__ static int v_elem(int g, int q) { return 4 * g + q; }
};

// e4m3 pairs -> f16x2 in one cvt each (e4m3 values are f16 numbers).
struct MmaFp8 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 8;
  static constexpr int kBlockBytes = 32;
  static constexpr int kKWords = 2, kVWords = 1;
  __device__ __forceinline__ static void k_load(const uint8_t* blk, int t, uint32_t (&w)[kKWords]) {
    ldg_words<2>(blk + 8 * t, w);
  }
  __device__ __forceinline__ static void k_frag(const uint32_t (&w)[kKWords], uint32_t (&b)[4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      b[2 * i] = e4m3x2_to_f16x2(w[i] & 0xffffu);
      b[2 * i + 1] = e4m3x2_to_f16x2(w[i] >> 16);
    }
  }
  __device__ __forceinline__ static int k_elem(int t, int r, int h) { return 8 * t + 2 * r + h; }
  // Version 6 (ldmatrix of the block's 2 chunks): word i = bytes 16i + 4t..16i + 4t + 3.
  __device__ __forceinline__ static int k_elem_ldsm(int t, int r, int h) { return (r >> 1) * 16 + 4 * t + 2 * (r & 1) + h; }
  __device__ __forceinline__ static void v_load(const uint8_t* blk, int g, uint32_t (&w)[kVWords]) {
    ldg_words<1>(blk + 4 * g, w);
  }
  __device__ __forceinline__ static void v_frag(const uint32_t (&x)[kVWords], const uint32_t (&y)[kVWords],
                                                uint32_t (&a)[4]) {
    const uint32_t lo = __byte_perm(x[0], y[0], 0x5140), hi = __byte_perm(x[0], y[0], 0x7362);
    a[0] = e4m3x2_to_f16x2(lo & 0xffffu);
    a[1] = e4m3x2_to_f16x2(lo >> 16);
    a[2] = e4m3x2_to_f16x2(hi & 0xffffu);
    a[3] = e4m3x2_to_f16x2(hi >> 16);
  }
  __device__ __forceinline__ static int v_elem(int g, int q) { return 4 * g + q; }
};

// q4_0 (GGUF nibble order: byte j = element j low, element j + 16 high).
// (w & 0x000F000F) | 0x6400 per half is 1024 + the low nibbles of bytes 0
// and 2 (one LOP3), (w & 0x00F000F0) | 0x6400 is 1024 + 16 x the high ones;
// HSUB2 1032 / HFMA2 (x / 16 - 72) give the levels -8..7. Exact.
struct MmaQ4 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 4;
  static constexpr int kBlockBytes = 16;
  static constexpr int kKWords = 1, kVWords = 1;
  __device__ __forceinline__ static void nibbles(uint32_t w, uint32_t (&b)[4]) {
    const uint32_t w8 = w >> 8;
    b[0] = hsub2_u32(and_or_u32<0x000F000Fu, kF16x2_1024>(w), kF16x2_1032);               // bytes 0, 2 low
    b[1] = hsub2_u32(and_or_u32<0x000F000Fu, kF16x2_1024>(w8), kF16x2_1032);              // bytes 1, 3 low
    b[2] = hfma2_u32(and_or_u32<0x00F000F0u, kF16x2_1024>(w), kF16x2_1_16, kF16x2_m72);   // bytes 0, 2 high
    b[3] = hfma2_u32(and_or_u32<0x00F000F0u, kF16x2_1024>(w8), kF16x2_1_16, kF16x2_m72);  // bytes 1, 3 high
  }
  __device__ __forceinline__ static void k_load(const uint8_t* blk, int t, uint32_t (&w)[kKWords]) {
    ldg_words<1>(blk + 4 * t, w);
  }
  // Bytes 4t..4t+3: r = 0 elements (4t, 4t+2), 1 (4t+1, 4t+3), 2 and 3 the same + 16.
  __device__ __forceinline__ static void k_frag(const uint32_t (&w)[kKWords], uint32_t (&b)[4]) { nibbles(w[0], b); }
  __device__ __forceinline__ static int k_elem(int t, int r, int h) { return (r >> 1) * 16 + 4 * t + (r & 1) + 2 * h; }
  // Version 6 (ldmatrix of the block's one chunk): the same bytes 4t..4t+3.
  __device__ __forceinline__ static int k_elem_ldsm(int t, int r, int h) { return k_elem(t, r, h); }
  __device__ __forceinline__ static void v_load(const uint8_t* blk, int g, uint32_t (&w)[kVWords]) {
    w[0] = ldg_stream2(blk + 2 * g);
  }
  // Bytes 2g, 2g+1 of keys x and y as [x0 x1 y0 y1]: q = 0 element 2g, 1 2g+16, 2 2g+1, 3 2g+17.
  __device__ __forceinline__ static void v_frag(const uint32_t (&x)[kVWords], const uint32_t (&y)[kVWords],
                                                uint32_t (&a)[4]) {
    uint32_t n[4];
    nibbles(__byte_perm(x[0], y[0], 0x5410), n);
    a[0] = n[0];
    a[1] = n[2];
    a[2] = n[1];
    a[3] = n[3];
  }
  __device__ __forceinline__ static int v_elem(int g, int q) { return 2 * g + (q >> 1) + (q & 1) * 16; }
};

// ------------------------------------------------------------ the kernel

// Version 5 (the software-pipelined key loop, kVersion = 5, head_dim 64 and
// 128): a warp walks 16-key tiles (tile n: keys k_first + 16 (4n + warp) ..
// +15) through a ring of kStages register buffers of raw bytes (MmaTileRaw:
// K and V bytes and scales as loaded, before any conversion). Before tile
// n's conversion and mma it issues the loads of tile n + kStages - 1 (into
// the buffer tile n - 1 freed), and the page-table entries of the tile after
// that, so kStages - 1 tiles are in flight while the warp computes, and
// kStages while it waits. Version 4 (below, kVersion = 4) loads a 32-key
// step, then converts and multiplies it: nothing in flight while it
// computes.
//
// Bytes in flight (B=64, L=8192, GQA 32/8, hd 128; 8 warps an SM at 2 CTAs
// of 4): a tile is 16 keys x (K + V + scales) = 16 x 272 = 4.35 KB for
// q8_0 / fp8, 16 x 144 = 2.3 KB for q4_0. Version 4 holds one 8.7 KB step
// per warp in flight only while it waits (its ~670 warp instructions of
// compute per step, ~0.6-1 us, have nothing in flight): measured 17 KB/us
// an SM (2.3 TB/s). Little's law: 2.9 TB/s / 132 SMs = 22 KB/us an SM, so
// at ~1 us loaded latency ~25-30 KB must be in flight all the time. Version
// 5 with 3 stages (q8_0 / fp8 / q4_0 at hd 128, all pairs at hd 64): 2-3
// tiles a warp always, 8.7-13 KB (q8_0) = 70-104 KB an SM, 4.6-7 KB (q4_0)
// = 37-55 KB an SM; 2 stages (f16 K, or q8_0 / fp8 K with f16 V, at hd
// 128: a raw tile of 56 registers): 1-2 tiles, 35-70 KB. Steady state per
// tile and warp: max((latency + compute) / kStages, compute) against
// (latency + 2 compute) / 2 for version 4. Registers: kStages x kRawWords
// raw + ~100-110 (O 32, addresses, softmax, q 16 unless in shared memory):
// up to 255 at hd 128 (2 CTAs an SM as version 4). More CTAs an SM instead
// (3-4 at <= 168 / 128 registers) would need the ring out of registers
// (cp.async into shared memory): not tried.
template <typename KP, typename VP, int HD>
struct MmaTileRaw {
  static constexpr int NB = HD / 32, kScWords = NB / 2;
  static constexpr int kRawWords = 2 * NB * KP::kKWords + 4 * NB * VP::kVWords + (KP::kScaled ? 4 * kScWords : 0) +
                                   (VP::kScaled ? 4 * kScWords : 0);
  // 3 stages while the ring stays <= 150 registers (q8_0 / fp8 / q4_0
  // pairs at hd 128: 48 or less a tile; everything at hd 64), else 2.
  static constexpr int kStages = 3 * kRawWords <= 150 ? 3 : 2;
  uint32_t kw[2][NB][KP::kKWords];              // K of keys 8j + g, lane t's share of each block
  uint32_t vw[4][NB][VP::kVWords];              // V of keys {2t, 2t+1, 2t+8, 2t+9}, lane g's share
  uint32_t ksw[4][KP::kScaled ? kScWords : 1];  // K scales of those 4 keys
  uint32_t vsw[4][VP::kScaled ? kScWords : 1];  // V scales of those 4 keys
};

// grid, workspace and results as paged_decode_kernel (paged_attention.cuh),
// with kMmaRows rows a chunk. Version 4: each warp walks its own 16 x U
// keys of every CTA step (U = 2 16-key sub-tiles at hd 64 and 128, 1 at hd
// 256, whose q and O take twice the registers); version 5: 16-key tiles
// through a register ring (above). Each warp keeps an online softmax state
// per row; the 4 warps merge through shared memory at the end.
template <typename KP, typename VP, int HD, int kVersion>
__global__ void __launch_bounds__(kThreads, 2)
    paged_decode_mma_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks,
                            int bs_shift, float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  static_assert(HD == 64 || HD == 128 || HD == 256, "tensor-core decode: head_dim 64, 128, 256");
  static_assert(KP::kScaled || VP::kScaled, "tensor-core decode: for pools with a quantized K or V");
  static_assert(kVersion == 4 || (kVersion == 5 && HD <= 128), "tensor-core decode: version 4, or 5 at hd <= 128");
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
  // Version 5 at hd 128 with a 3-stage ring: q's 16 registers go too (the
  // ring holds 3 x 40-48).
  constexpr bool kQInSmem = HD == 256 || (kVersion == 5 && HD == 128 && MmaTileRaw<KP, VP, HD>::kStages == 3);

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
  if constexpr (kVersion == 5) {
    using Raw = MmaTileRaw<KP, VP, HD>;
    constexpr int S = Raw::kStages;
    // Tile n's first key (tiles of a warp are 64 keys apart, 16 x warp in).
    auto tile_key = [&](int n) { return k_first + 16 * (kWarps * n + warp); };
    // Raw bytes of the tile at key0 (pages pgs of its two 8-key groups), as
    // version 4 loads a sub-tile; keys at or past k_end load key k_end - 1.
    auto load_tile = [&](Raw& r, int key0, const int (&pgs)[2]) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const uint8_t* kpg = k_pool + int64_t(pgs[j]) * k_page;
        const uint8_t* vpg = v_pool + int64_t(pgs[j]) * v_page;
        {
          const int row = min(key0 + 8 * j + g, k_end - 1) & bs_mask;
          const uint8_t* kr = kpg + row * k_qrow + k_head;
#pragma unroll
          for (int b = 0; b < NB; ++b) KP::k_load(kr + b * KP::kBlockBytes, t, r.kw[j][b]);
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int row = min(key0 + 8 * j + 2 * t + c, k_end - 1) & bs_mask;
          const uint8_t* vr = vpg + row * v_qrow + v_head;
#pragma unroll
          for (int b = 0; b < NB; ++b) VP::v_load(vr + b * VP::kBlockBytes, g, r.vw[2 * j + c][b]);
          if constexpr (KP::kScaled) ldg_words<kScWords>(kpg + k_scales + row * s_row + sc_head, r.ksw[2 * j + c]);
          if constexpr (VP::kScaled) ldg_words<kScWords>(vpg + v_scales + row * s_row + sc_head, r.vsw[2 * j + c]);
        }
      }
    };
    // Converts and multiplies one tile: S, the online softmax of row g, P V
    // (version 4's sub-tile body with the bytes from the ring).
    auto compute_tile = [&](const Raw& r, int key0) {
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
          KP::k_frag(r.kw[j][b], kb);
          if constexpr (KP::kScaled) {
            float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_rows8(blk, q4[0], q4[1], kb[0], kb[1]);
            mma_rows8(blk, q4[2], q4[3], kb[2], kb[3]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const uint32_t w = r.ksw[2 * j + c][b / 2];
              acc[j][c] = fmaf(f16_bits_to_float(b % 2 ? w >> 16 : w & 0xffffu), blk[c], acc[j][c]);
            }
          } else {
            mma_rows8(acc[j], q4[0], q4[1], kb[0], kb[1]);
            mma_rows8(acc[j], q4[2], q4[3], kb[2], kb[3]);
          }
        }
      }
      float sc[2][2] = {{acc[0][0], acc[0][1]}, {acc[1][0], acc[1][1]}};
      if (key0 < lo_max || key0 + 16 > hi_min) rows8_mask_tile(sc, key0, t, key_lo, key_hi);  // warp-uniform
      float pr[2][2];
      rows8_softmax_step(sc, t, m, d, pr, [&](float c0, float c1) { rescale_o_blocks(o, c0, c1); });
      const uint32_t p01 = pack_f16x2(pr[0][0], pr[0][1]);
      const uint32_t p89 = pack_f16x2(pr[1][0], pr[1][1]);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        uint32_t b0 = p01, b1 = p89;
        if constexpr (VP::kScaled) {
          const int sel = b % 2 ? 0x7632 : 0x5410;
          b0 = hmul2_u32(p01, __byte_perm(r.vsw[0][b / 2], r.vsw[1][b / 2], sel));
          b1 = hmul2_u32(p89, __byte_perm(r.vsw[2][b / 2], r.vsw[3][b / 2], sel));
        }
        uint32_t x01[4], x89[4];
        VP::v_frag(r.vw[0][b], r.vw[1][b], x01);
        VP::v_frag(r.vw[2][b], r.vw[3][b], x89);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          mma_16816_f16(o[b][mt], x01[2 * mt], x01[2 * mt + 1], x89[2 * mt], x89[2 * mt + 1], b0, b1);
      }
    };

    // The ring: tile n lives in buf[n % S]. pgn holds the pages of the next
    // tile to load (read one tile ahead, so the table's latency hides behind
    // a tile's compute). Tiles at or past k_end are not loaded (their
    // buffers are never read: the loop stops at the first such tile).
    Raw buf[S];
    int pgs[S][2];  // pages of tiles 0 .. S - 1, all read before the first tile's loads
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
        // Tile i + S - 1 into the buffer of tile i - 1 (computed), then its
        // successor's pages, then tile i (loaded S - 1 tiles ago).
        if (tile_key(i + S - 1) < k_end) load_tile(buf[(st + S - 1) % S], tile_key(i + S - 1), pgn);
        pgn[0] = group_page(tile_key(i + S));
        pgn[1] = group_page(tile_key(i + S) + 8);
        compute_tile(buf[st], tile_key(i));
      }
    }
  } else {
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

// The tensor-core kernel for K type <K> and V type v at head_dim hd, version
// 4, 5 or 6 (5 and 6 exist at head_dim 64 and 128; 256 answers version 4;
// 6 is paged_decode_mma_v6.cuh) (kernels/cuda/inst/paged_decode_mma_k<K>.cu);
// nullptr where not instantiated (V bf16, f16/f16, head_dim 32).
// *smem_bytes: the dynamic shared memory the launch needs (0 but for 6).
KernelFn pick_mma_kernel_kf16(KvType v, int head_dim, int version, int* smem_bytes);
KernelFn pick_mma_kernel_kq8_0(KvType v, int head_dim, int version, int* smem_bytes);
KernelFn pick_mma_kernel_kq4_0(KvType v, int head_dim, int version, int* smem_bytes);
KernelFn pick_mma_kernel_kfp8(KvType v, int head_dim, int version, int* smem_bytes);

}  // namespace paged
}  // namespace runlm
