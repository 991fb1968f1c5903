// Decode GEMV for every supported weight type and 1..16 tokens:
// y[t, r] = sum_c W[r, c] x[t, c], fp32 accumulation.
//
// Version 1: a warp owns kRows rows; lane l decodes units l, l + 32,
// ... of each (16-byte streaming loads, kUnroll units in flight before the
// first use) and dots every 4-element group with all kTok tokens' x, read as
// float4 through L1 (x is small and shared by the block's 8 warps). A decoded
// group is reused for kRows rows x kTok tokens, so x traffic through L1 is
// (unit bytes of x) / kRows per weight load. Each weight byte is read once
// for all tokens. Per-lane sums are reduced with shuffles at the end.
// At 1-2 tokens the kernel is bound by DRAM bandwidth; from ~4 tokens on the
// fp32 FMAs (kTok per weight) dominate, which is the price of fp32 x.
// Measured on the H100 (copy 3.0 TB/s), n=1: f16 80-99%, q8_0 58-92%, but
// q4_0 23-32% and q4_k/q5_k 24-37% of the copy bandwidth (hypothesis then:
// too few loads in flight while a warp decodes 32 elements per load).
// Version 2: for n <= 4 the next step's loads are issued before the current
// step is decoded (register double buffer). Measured: no change (q4_0 25-33%),
// so latency was not the limit.
// Diagnosis: a lane's unit covers 32 contiguous elements, so each float4 x
// load of a warp touches 32 different 128-byte lines (q4_0; 16 for q8_0 and
// the k-quants): 32 L1 wavefronts per load, ~8 q4_0 elements per clock per
// SM with 2 rows per warp, which is the measured ~6.5.
// Version 3 (this): 4 rows per warp at n = 1 for q4_0 and q6_k, halving the
// x wavefronts per weight (see launch_gemv for the measurements). The real fix is a layout where lane l's 16 bytes
// hold elements interleaved with the other lanes' (x loads of a warp then
// read 512 contiguous bytes), or x staged in shared memory with a skew.
#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

template <DType kT, int kRows, int kUnroll>
struct Step {
  typename Codec<kT>::Raw raw[kUnroll][kRows];
};

// Issues the 16-byte loads of units u0, u0 + 32, ... (those inside the row).
template <DType kT, int kRows, int kUnroll>
__device__ __forceinline__ void load_step(Step<kT, kRows, kUnroll>& st, const WView& w, const int64_t* rows, int u0) {
#pragma unroll
  for (int k = 0; k < kUnroll; ++k)
    if (u0 + 32 * k < w.units)
#pragma unroll
      for (int r = 0; r < kRows; ++r) st.raw[k][r] = Codec<kT>::load(w, rows[r], u0 + 32 * k);
}

// Decodes the step's units and accumulates their dot with every token's x.
template <DType kT, int kTok, int kRows, int kUnroll>
__device__ __forceinline__ void dot_step(const Step<kT, kRows, kUnroll>& st, const WView& w,
                                         const float* __restrict__ x, int u0, float (&acc)[kRows][kTok]) {
  using C = Codec<kT>;
  constexpr int kGroups = C::kUnit / 4;
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int u = u0 + 32 * k;
    if (u >= w.units) break;
    float part[kRows][kTok];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kTok; ++t) part[r][t] = C::kUnitScale ? 0.0f : acc[r][t];
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      float4 wv[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[r] = C::decode(st.raw[k][r], g);
      const float* xg = x + C::x_off(u, g);
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        const float4 xv = __ldg(reinterpret_cast<const float4*>(xg + int64_t(t) * w.cols));
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          float s = part[r][t];
          s = fmaf(wv[r].x, xv.x, s);
          s = fmaf(wv[r].y, xv.y, s);
          s = fmaf(wv[r].z, xv.z, s);
          s = fmaf(wv[r].w, xv.w, s);
          part[r][t] = s;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float sc = C::scale(st.raw[k][r]);
#pragma unroll
      for (int t = 0; t < kTok; ++t) acc[r][t] = C::kUnitScale ? fmaf(sc, part[r][t], acc[r][t]) : part[r][t];
    }
  }
}

template <DType kT, int kTok, int kRows>
__global__ void __launch_bounds__(kThreads) gemv_kernel(WView w, const float* __restrict__ x, float* __restrict__ y) {
  // Few tokens: DRAM-bound, so the next step's loads are issued before the
  // current step is decoded (register double buffer); many tokens: the FMAs
  // dominate and the registers are better spent on accumulators.
  constexpr bool kPrefetch = kTok <= 4;
  // Two steps in flight need 2 x kUnroll x kRows raw units in registers: only
  // the small ones (f32/f16/bf16/q8_0/q4_0, <= 20 bytes) unroll.
  constexpr int kUnroll = kTok <= 2 && sizeof(typename Codec<kT>::Raw) <= 20 ? 2 : 1;
  constexpr int kStep = 32 * kUnroll;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarps + warp) * kRows;
  if (row0 >= w.rows) return;
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, w.rows - 1);  // the tail re-reads a valid row

  float acc[kRows][kTok];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;

  if constexpr (kPrefetch) {
    Step<kT, kRows, kUnroll> cur;
    load_step(cur, w, rows, lane);
    for (int u0 = lane; u0 < w.units; u0 += kStep) {
      Step<kT, kRows, kUnroll> next;
      load_step(next, w, rows, u0 + kStep);
      dot_step<kT, kTok>(cur, w, x, u0, acc);
      cur = next;
    }
  } else {
    for (int u0 = lane; u0 < w.units; u0 += kStep) {
      Step<kT, kRows, kUnroll> cur;
      load_step(cur, w, rows, u0);
      dot_step<kT, kTok>(cur, w, x, u0, acc);
    }
  }

#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) {
      float s = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      acc[r][t] = s;
    }
  // Lane t writes token t's sums (lanes 16..31 idle): one store per value.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (row0 + r >= w.rows) break;
#pragma unroll
    for (int t = 0; t < kTok; ++t)
      if (lane == t) y[int64_t(t) * w.rows + row0 + r] = acc[r][t];
  }
}

template <DType kT, int kTok>
void launch_gemv(const WView& v, const float* x, float* y, cudaStream_t s) {
  // x is read through L1 as float4 per lane with a lane stride of one unit
  // (128 bytes for q4_0: 32 L1 wavefronts per load); rows sharing an x load
  // divide that traffic. Measured at n = 1 with 4 rows per warp: q4_0 went
  // from 24-33% to 30-56% of the copy bandwidth and q6_k from 46-70% to
  // 44-76%, but q4_k/q5_k fell (25-41% -> 17-35%: their large raw units cut
  // occupancy) and q8_0 was unchanged, so only q4_0 and q6_k take 4.
  constexpr int kRows = kTok == 1 && (kT == DType::Q4_0 || kT == DType::Q6_K) ? 4 : 2;
  const int64_t blocks = (v.rows + kWarps * kRows - 1) / (kWarps * kRows);
  gemv_kernel<kT, kTok, kRows><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(v, x, y);
  cudaCheckLaunch();
}

template <DType kT>
void gemv_typed(const WView& v, const float* x, float* y, int n, cudaStream_t s) {
  switch (n) {
#define RUNLM_GEMV_CASE(N) \
  case N: launch_gemv<kT, N>(v, x, y, s); break;
    RUNLM_GEMV_CASE(1) RUNLM_GEMV_CASE(2) RUNLM_GEMV_CASE(3) RUNLM_GEMV_CASE(4)
    RUNLM_GEMV_CASE(5) RUNLM_GEMV_CASE(6) RUNLM_GEMV_CASE(7) RUNLM_GEMV_CASE(8)
    RUNLM_GEMV_CASE(9) RUNLM_GEMV_CASE(10) RUNLM_GEMV_CASE(11) RUNLM_GEMV_CASE(12)
    RUNLM_GEMV_CASE(13) RUNLM_GEMV_CASE(14) RUNLM_GEMV_CASE(15) RUNLM_GEMV_CASE(16)
#undef RUNLM_GEMV_CASE
    default: fail("gemv: n_tokens=%d unsupported; supported: 1..16", n);
  }
}

}  // namespace

void gemv(const GpuMatrix& w, const float* x, float* y, int n_tokens, Stream stream) {
  RUNLM_CHECK(w.data != nullptr, "gemv: matrix not uploaded");
  RUNLM_CHECK(n_tokens >= 1 && n_tokens <= 16, "gemv: n_tokens=%d unsupported; supported: 1..16", n_tokens);
  const WView v = make_view(w);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool ok = RUNLM_GPU_TYPE_SWITCH(w.type, KT, gemv_typed<KT>(v, x, y, n_tokens, s));
  RUNLM_CHECK(ok, "gemv: weight type %s unsupported; supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k",
              dtype_name(w.type));
}

}  // namespace runlm::gpu
