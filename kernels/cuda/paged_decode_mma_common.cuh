// What the tensor-core paged decode kernels share (paged_decode_mma_sm80.cuh,
// paged_decode_mma_f16.cuh, paged_decode_tma_sm90.cuh): the 8-row softmax
// steps (rows8_*), the f16x2 arithmetic and exact conversions of q8_0,
// q4_0 and fp8 bytes to f16 fragments (the Mma* policies), and the 16-byte
// chunk placement of K and V values in the lanes (MmaChunkLayout).
#pragma once

#include <type_traits>

#include "cuda/paged_decode_common.cuh"

namespace runlm {
namespace paged {

constexpr int kMmaRows = 8;  // query rows per CTA on the tensor-core path (PV's n)

// ------------------------------------------------------------ rows of a warp

// Every tensor-core kernel  gives a warp the CTA's 8 rows:
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

// The store of a warp that owns its rows' whole state (tma_sm90: one warp
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
      const int head = int(rid % p.n_heads);
#pragma unroll
      for (int mt = 0; mt < NS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) out[VL::v_dim(g, mt, h)] = row_output(p, head, M, D, o[mt][cc + 2 * h]);
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

// Row g's scores of a 16-key tile (base 2, see softcap_log2) soft-capped in
// place when PagedDecodeParams::softcap is set; before rows8_mask_tile.
__device__ __forceinline__ void rows8_softcap(float (&sc)[2][2], float softcap) {
  if (softcap > 0.0f) {  // uniform: a launch parameter
    const SoftcapLog2 cap(softcap);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) sc[j][c] = softcap_log2(sc[j][c], cap.c, cap.inv_c);
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
// 2t of the CTA), 1 and 3 column 2t + 1. The chunk-layout kernels keep O as m16
// tiles, mma_sm80's generic kernel as [block][2 tiles].
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

// rows8_softmax_step with a lazy max (tma_sm90): the running max m only
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
// one of them in a register (the q4_0 decode's hot loop had 133
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

// The 16-byte chunk placement of K and V values in the lanes for policy P (MmaQ8,
// MmaFp8, MmaQ4 above, whose exact conversions it reuses)
// at head_dim HD.
template <typename P, int HD>
struct MmaChunkLayout {
  static_assert(P::kScaled && (P::kBits == 8 || P::kBits == 4), "chunk layout: q8_0, fp8, q4_0");
  static_assert(HD == 64 || HD == 128, "chunk layout: head_dim 64, 128");
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

}  // namespace paged
}  // namespace runlm
