// The int8-x decode GEMV kernel (see gemv_x8.cu for the design): per-type
// dot products of a weight unit with int8 x, the kernel, and its launcher,
// a template that gemv_x8.cu, gemv_x8_kquant.cu and gemv_x8_unit32.cu
// instantiate for their types.
#pragma once

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/gemv_common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/launch_pdl.h"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

constexpr int kQBlock = kX8Block;
constexpr int kX8Warps = 4;
constexpr int kX8Threads = kX8Warps * 32;

__device__ __forceinline__ uint4 ldg16(const int8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Per type: the x bytes of unit u, and the unit's contribution for one row
// and token. Codec<kT>::load reads the weights (gpu_codec.cuh).

// Every other quantized type (gpu_codec.cuh's levels / ab): a unit is two
// halves of 16 elements (groups 0-3 and 4-7), each 16 consecutive x values
// of one x block, with value = A_h * level + B_h. Per half and token:
//   sum((A l + B) d_x q_x) = d_x (A sum(l q_x) + B sum(q_x)),
// 4 IDP4A for sum(l q_x); sum(q_x) is the x block's s_x (ds.y) when the unit
// is exactly one x block with one (A, B) (kWhole), else 4 more IDP4A per half
// against 0x01010101, done once per token and shared by the warp's rows.
template <DType kT>
constexpr bool kWholeBlockOf = kT == DType::Q4_1 || kT == DType::Q5_0 || kT == DType::Q5_1 || kT == DType::Q4_K ||
                               kT == DType::Q5_K || kT == DType::IQ4_NL || kT == DType::IQ4_XS || kT == DType::MXFP4;

template <DType kT>
struct X8Dot {
  using C = Codec<kT>;
  static_assert(C::kUnit == 32, "X8Dot: 32-element units");
  static constexpr bool kWhole = kWholeBlockOf<kT>;
  struct X {
    uint4 q[2];
    float d[2];  // d_x of each half's block
    float s[2];  // d_x * sum(q_x) over the half (kWhole: s[0] over the block)
  };
  __device__ static X load_x(const X8View& x, int t, int u) {
    X v;
    const int8_t* row = x.q + int64_t(t) * x.cols;
    const float2* ds = x.ds + int64_t(t) * (x.cols / kQBlock);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int off = C::x_off(u, 4 * h);
      v.q[h] = ldg16(row + off);
      if (kWhole && h == 1) {
        v.d[1] = v.d[0];
        v.s[1] = 0.0f;
        continue;
      }
      const float2 b = __ldg(ds + off / kQBlock);
      v.d[h] = b.x;
      if (kWhole) {
        v.s[h] = b.y;
      } else {
        int n = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) n = __dp4a(static_cast<int>(word_of(v.q[h], i)), 0x01010101, n);
        v.s[h] = b.x * static_cast<float>(n);
      }
    }
    return v;
  }
  struct W {
    uint32_t lv[8];
    float2 ab[2];
  };
  __device__ static W split(const typename C::Raw& r) {
    W w;
#pragma unroll
    for (int g = 0; g < 8; ++g) w.lv[g] = C::levels(r, g);
    w.ab[0] = C::ab(r, 0);
    w.ab[1] = kWhole ? w.ab[0] : C::ab(r, 1);
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s0 = __dp4a(static_cast<int>(w.lv[i]), static_cast<int>(word_of(x.q[0], i)), s0);
      s1 = __dp4a(static_cast<int>(w.lv[4 + i]), static_cast<int>(word_of(x.q[1], i)), s1);
    }
    if (kWhole) return fmaf(w.ab[0].x, x.d[0] * static_cast<float>(s0 + s1), w.ab[0].y * x.s[0]);
    return fmaf(w.ab[0].x, x.d[0] * static_cast<float>(s0), w.ab[0].y * x.s[0]) +
           fmaf(w.ab[1].x, x.d[1] * static_cast<float>(s1), w.ab[1].y * x.s[1]);
  }
};

template <>
struct X8Dot<DType::Q4_0> {
  // x of one block: 32 int8 (elements 0-15, 16-31) and its (d, s).
  struct X {
    uint4 lo, hi;
    float2 ds;
  };
  __device__ static X load_x(const X8View& x, int t, int u) {
    const int8_t* p = x.q + int64_t(t) * x.cols + int64_t(u) * 32;
    return X{ldg16(p), ldg16(p + 16), __ldg(x.ds + int64_t(t) * (x.cols / kQBlock) + u)};
  }
  // Low and high nibbles of the block's words, shared by every token.
  struct W {
    uint32_t lo[4], hi[4];
    float d;
  };
  __device__ static W split(const Codec<DType::Q4_0>::Raw& r) {
    W w;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t v = word_of(r.q, i);
      w.lo[i] = v & 0x0F0F0F0Fu;
      w.hi[i] = (v >> 4) & 0x0F0F0F0Fu;
    }
    w.d = r.d;
    return w;
  }
  __device__ static float dot(const W& w, const X& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s = __dp4a(static_cast<int>(w.lo[i]), static_cast<int>(word_of(x.lo, i)), s);
      s = __dp4a(static_cast<int>(w.hi[i]), static_cast<int>(word_of(x.hi, i)), s);
    }
    // Levels are q - 8: sum((q - 8) q_x) d_x = d_x sum(q q_x) - 8 s_x.
    return w.d * fmaf(x.ds.x, static_cast<float>(s), -8.0f * x.ds.y);
  }
};

template <>
struct X8Dot<DType::Q8_0> {
  // x of one half block: 16 int8 and the block's (d, s).
  struct X {
    uint4 q;
    float2 ds;
  };
  __device__ static X load_x(const X8View& x, int t, int u) {
    return X{ldg16(x.q + int64_t(t) * x.cols + int64_t(u) * 16), __ldg(x.ds + int64_t(t) * (x.cols / kQBlock) + (u >> 1))};
  }
  struct W {
    uint4 q;
    float d;
  };
  __device__ static W split(const Codec<DType::Q8_0>::Raw& r) { return W{r.q, r.d}; }
  __device__ static float dot(const W& w, const X& x) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s = __dp4a(static_cast<int>(word_of(w.q, i)), static_cast<int>(word_of(x.q, i)), s);
    return w.d * x.ds.x * static_cast<float>(s);
  }
};

// Rows a warp takes: 2 up to 8 tokens (x loads shared by both rows), 1
// past that (the accumulators grow). Q4_0 at one token takes 1: its rows
// are short (4 units a lane at 4096 columns), and more warps in flight beat
// sharing x (H100, 11008x4096: 80.1% of copy at 1 row, 75.3% at 2, 76.3%
// at 4; tg128 498 against 481 t/s).
// The other 32-element types take 1 row at one token as Q4_0 does (rows of
// 4096 columns are 4 units a lane for them too).
template <DType kT, int kTok>
constexpr int kRowsOf = kT != DType::Q8_0 && kTok == 1 ? 1 : kTok <= 8 ? 2 : 1;
// Few tokens: DRAM-bound, so the next step's loads are issued before this
// step's dot products (register double buffer).
template <int kTok>
constexpr bool kPrefetchOf = kTok <= 4;
constexpr int kUnroll = 2;

template <DType kT, int kTok, int kRows, int kU>
__device__ __forceinline__ void dot_step(const Step<kT, kRows, kU>& st, const WView& w, const X8View& x, int u0,
                                         float (&acc)[kRows][kTok]) {
  using D = X8Dot<kT>;
#pragma unroll
  for (int k = 0; k < kU; ++k) {
    const int u = u0 + 32 * k;
    if (u >= w.units) break;
    typename D::W wr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wr[r] = D::split(st.raw[k][r]);
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      const typename D::X xv = D::load_x(x, t, u);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][t] += D::dot(wr[r], xv);
    }
  }
}

template <DType kT, int kTok, int kRows>
__global__ void __launch_bounds__(kX8Threads) gemv_x8_kernel(GemvTargets tg, X8View x) {
  int blk = blockIdx.x;
  const int ti = target_of(tg, blk);
  const WView w = view_of(tg, ti);
  float* __restrict__ y = y_of(tg, ti);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blk) * kX8Warps + warp) * kRows;
  if (row0 >= w.rows) return;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, w.rows - 1);  // the tail re-reads a valid row

  float acc[kRows][kTok];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;

  stream_units<kT, kRows, kUnroll, kPrefetchOf<kTok>>(
      w, rows, lane, [&](const Step<kT, kRows, kUnroll>& st, int u0) { dot_step<kT, kTok>(st, w, x, u0, acc); });
  reduce_store<kTok>(acc, w, row0, lane, y);
}

template <DType kT, int kTok>
void launch_x8_n(const GemvOut* outs, int n_outs, const X8View& x, cudaStream_t s) {
  constexpr int kRows = kRowsOf<kT, kTok>;
  const GemvTargets tg = make_targets(outs, n_outs, kX8Warps * kRows, "gemv_x8");
  launch_pdl(gemv_x8_kernel<kT, kTok, kRows>, dim3(static_cast<unsigned>(tg.end[n_outs - 1])), dim3(kX8Threads), 0, s,
             tg, x);
}


// gemv_x8 for one type, every token count (1..16). Instantiated by
// gemv_x8.cu (Q4_0, Q8_0), gemv_x8_kquant.cu and gemv_x8_unit32.cu, so the
// type groups compile in parallel.
template <DType kT>
void launch_x8(const GemvOut* outs, int n_outs, const X8View& x, int n_tokens, cudaStream_t s) {
  RUNLM_GEMV_TOKEN_SWITCH(n_tokens, N, launch_x8_n<kT, N>(outs, n_outs, x, s));
}

}  // namespace runlm::gpu
