// Decode GEMV for Q4_0 and Q8_0 weights with int8 activations.
//
// Why: the f32-activation kernels (gemv_q.cu) decode every weight to a
// float (mask, PRMT, FADD) and FMA it with x: ~3.3 instructions per weight,
// 13 per Q4_0 byte. At the H100's ~3 TB/s that is more than the SMs can
// issue (4 x 32 lanes x 132 SMs x 1.98 GHz = 33e12 lane-instructions/s
// against 3e12 B/s x 13 = 39e12): Q4_0 measured 30-56% of the copy
// bandwidth, bound by issue, not DRAM.
// Here x is quantized once per step to int8 with one f32 scale d_x per 32
// values and the sum s_x = d_x * sum(q_x) (quantize_x8), and a lane dots a
// 16-byte weight load against x with dp4a, 4 products per instruction:
//   Q4_0 block (32 weights, byte j = element j | element j+16 << 4):
//     per 4-byte word: 1 LOP (low nibbles), 1 SHF + 1 LOP (high), 2 IDP4A
//     = 5 instructions per 8 weights; per block and token one I2F and two
//     FFMA: d_w * (d_x * sum(q_w q_x) - 8 s_x).
//   Q8_0 half block (16 weights): 4 IDP4A; d_w * d_x * sum(q_w q_x).
// x (int8, 4 KB a token at 4096 columns) is read through L1 (__ldg): lane l
// reads the 32 (Q4_0) or 16 (Q8_0) x bytes of its unit, a warp 1 KB / 512 B
// contiguous per step and token, shared by every row the warp does.
//
// Grid: 4 warps a CTA, kRows rows a warp (1 or 2, kRowsOf below), so a
// 4096-row matrix is 512-1024 CTAs, and each lane keeps 2 steps of 2 units x
// kRows rows of 16 bytes in flight (64-128 bytes): ~64 KB in flight per SM,
// enough to cover DRAM latency.
#include <algorithm>
#include <cstdlib>

#include "cuda/common.cuh"
#include "cuda/gemv_common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/launch_pdl.h"
#include "cuda/x8_layout.cuh"

namespace runlm::gpu {

namespace {

constexpr int kQBlock = kX8Block;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// One thread per value, a warp per 32-value block (warp_quantize_x8).
__global__ void quantize_x8_kernel(const float* __restrict__ x, int64_t n_values, int8_t* __restrict__ q,
                                   float2* __restrict__ ds) {
  allow_next_kernel();  // the GEMV after this may start loading its weights
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_values) return;  // whole warps: n_values is a multiple of 32
  warp_quantize_x8(x[i], q + i, ds + i / kQBlock);
}

__device__ __forceinline__ uint4 ldg16(const int8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// Per type: the x bytes of unit u, and the unit's contribution for one row
// and token. Codec<kT>::load reads the weights (gpu_codec.cuh).
template <DType kT>
struct X8Dot;

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
template <DType kT, int kTok>
constexpr int kRowsOf = kT == DType::Q4_0 && kTok == 1 ? 1 : kTok <= 8 ? 2 : 1;
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
__global__ void __launch_bounds__(kThreads) gemv_x8_kernel(GemvTargets tg, X8View x) {
  int blk = blockIdx.x;
  const int ti = target_of(tg, blk);
  const WView w = view_of(tg, ti);
  float* __restrict__ y = y_of(tg, ti);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blk) * kWarps + warp) * kRows;
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
void launch_x8(const GemvOut* outs, int n_outs, const X8View& x, cudaStream_t s) {
  constexpr int kRows = kRowsOf<kT, kTok>;
  const GemvTargets tg = make_targets(outs, n_outs, kWarps * kRows, "gemv_x8");
  launch_pdl(gemv_x8_kernel<kT, kTok, kRows>, dim3(static_cast<unsigned>(tg.end[n_outs - 1])), dim3(kThreads), 0, s,
             tg, x);
}

}  // namespace

bool gemv_x8_supports(DType t) { return t == DType::Q4_0 || t == DType::Q8_0; }

size_t x8_bytes(int n_tokens, int64_t cols) {
  return x8_q_bytes(n_tokens, cols) + static_cast<size_t>(n_tokens) * static_cast<size_t>(cols / kQBlock) * sizeof(float2);
}

void quantize_x8(const float* x, int n_tokens, int64_t cols, void* x8, Stream stream) {
  RUNLM_CHECK(n_tokens >= 1 && cols > 0 && cols % kQBlock == 0, "quantize_x8: %d x %lld; needs cols %% 32 == 0",
              n_tokens, static_cast<long long>(cols));
  const int64_t n_values = int64_t(n_tokens) * cols;
  constexpr int kBlock = 128;
  quantize_x8_kernel<<<static_cast<unsigned>((n_values + kBlock - 1) / kBlock), kBlock, 0,
                       static_cast<cudaStream_t>(stream)>>>(x, n_values, x8_q(x8), x8_ds(x8, n_tokens, cols));
  cudaCheckLaunch();
}

void gemv_x8(const GemvOut* outs, int n_outs, const void* x8, int n_tokens, Stream stream) {
  RUNLM_CHECK(n_outs >= 1, "gemv_x8: no matrices");
  RUNLM_CHECK(n_tokens >= 1 && n_tokens <= 16, "gemv_x8: n_tokens=%d unsupported; supported: 1..16", n_tokens);
  const DType type = outs[0].w->type;
  const X8View x = x8_view(x8, n_tokens, outs[0].w->cols);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DType::Q4_0: RUNLM_GEMV_TOKEN_SWITCH(n_tokens, N, launch_x8<DType::Q4_0, N>(outs, n_outs, x, s)); break;
    case DType::Q8_0: RUNLM_GEMV_TOKEN_SWITCH(n_tokens, N, launch_x8<DType::Q8_0, N>(outs, n_outs, x, s)); break;
    default: fail("gemv_x8: weight type %s unsupported; supported: q4_0, q8_0", dtype_name(type));
  }
}

}  // namespace runlm::gpu
