// Decode GEMV for every supported weight type and 1..16 tokens:
// y[t, r] = sum_c W[r, c] x[t, c], fp32 accumulation.
//
// The loop: a warp owns kRows rows; lane l decodes units l, l + 32,
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
// For n <= 4 the next step's loads are issued before the current
// step is decoded (register double buffer). Measured: no change (q4_0 25-33%),
// so latency was not the limit.
// Diagnosis: a lane's unit covers 32 contiguous elements, so each float4 x
// load of a warp touches 32 different 128-byte lines (q4_0; 16 for q8_0 and
// the k-quants): 32 L1 wavefronts per load, ~8 q4_0 elements per clock per
// SM with 2 rows per warp, which is the measured ~6.5.
// 4 rows per warp at n = 1 for q4_0 and q6_k, halving the
// x wavefronts per weight (see launch_gemv for the measurements). The real fix is a layout where lane l's 16 bytes
// hold elements interleaved with the other lanes' (x loads of a warp then
// read 512 contiguous bytes), or x staged in shared memory with a skew.
// x in shared memory (XShared: quantized types at every n, f32/f16/bf16 from
// n = 2; f32/f16/bf16 keep XGlobal at n = 1 where it already reaches 80-99%): x
// is staged once per block in shared memory, in column chunks of up to 48 KB
// for all tokens, each float4 at a swizzled slot (x_swizzle) so that the 8
// lanes of every quarter-warp read 8 different bank groups: a warp's float4
// x read costs 4 shared-memory wavefronts instead of 32 L1 ones, and the
// weight layout (shared with the GEMM and embed_rows) stays as it is. Two
// barriers per chunk; the first step's weight loads are issued before the
// staging so DRAM stays busy across it. 4 rows per warp, so that each x read
// serves 4 rows: at n = 8 one float4 x read per token feeds 16 FMAs x 4 rows
// and shared memory (128 B/clk/SM) stays under the FMA rate.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/gemv_common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/launch_pdl.h"

namespace runlm::gpu {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Shared memory a block may use without the opt-in attribute.
constexpr int kSmemDefault = 48 * 1024;

// Few tokens: DRAM-bound, so the next step's loads are issued before the
// current step is decoded (register double buffer); many tokens: the FMAs
// dominate and the registers are better spent on accumulators.
template <int kTok>
constexpr bool kPrefetchOf = kTok <= 4;
// Two steps in flight need 2 x kUnroll x kRows raw units in registers: only
// the small ones (f32/f16/bf16/q8_0/q4_0, <= 20 bytes) unroll.
template <DType kT, int kTok>
constexpr int kUnrollOf = kTok <= 2 && sizeof(typename Codec<kT>::Raw) <= 20 ? 2 : 1;

// Where the x of a step comes from: global memory through L1 (XGlobal), or
// the swizzled shared-memory chunk (XShared).
struct XGlobal {
  const float* __restrict__ x;
  int64_t cols;
  template <DType kT>
  __device__ __forceinline__ float4 get(int u, int g, int t) const {
    return __ldg(reinterpret_cast<const float4*>(x + Codec<kT>::x_off(u, g) + int64_t(t) * cols));
  }
};

// Shared-memory slot of float4 number q of a staged x chunk: q XOR a few of
// its own higher bits, chosen per type from the lane -> x_off pattern so that
// lanes 8i..8i+7 (one 128-bit shared-memory phase) hit 8 distinct 16-byte
// bank groups for every group g. A permutation inside aligned groups of 8
// float4 (the XOR changes bits 0-2 only and reads bits >= 3), so a chunk of
// whole steps maps onto itself. Worked out from Codec::x_off (l = lane):
//   F16/BF16   q = 2l + g                        -> XOR bit 3
//   Q8_0       q = 4l + g                        -> XOR bits 3-4
//   Q4_0, K    q = 8l + g                        -> XOR bits 3-5
//   F32        q = l                             -> none
template <DType kT>
__device__ __forceinline__ int x_swizzle(int q) {
  if constexpr (kT == DType::F16 || kT == DType::BF16) return q ^ ((q >> 3) & 1);
  else if constexpr (kT == DType::Q8_0) return q ^ ((q >> 3) & 3);
  else if constexpr (kT == DType::Q4_0 || kT == DType::Q4_K || kT == DType::Q5_K || kT == DType::Q6_K)
    return q ^ ((q >> 3) & 7);
  else return q;
}

struct XShared {
  const float4* __restrict__ xs;  // [kTok][e4] float4, swizzled
  int e4;                         // float4 per token in the chunk
  int c0;                         // first unit of the chunk
  template <DType kT>
  __device__ __forceinline__ float4 get(int u, int g, int t) const {
    return xs[t * e4 + x_swizzle<kT>(Codec<kT>::x_off(u - c0, g) >> 2)];
  }
};

// Decodes the step's units and accumulates their dot with every token's x.
template <DType kT, int kTok, int kRows, int kUnroll, typename X>
__device__ __forceinline__ void dot_step(const Step<kT, kRows, kUnroll>& st, const WView& w, const X& x, int u0,
                                         float (&acc)[kRows][kTok]) {
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
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        const float4 xv = x.template get<kT>(u, g, t);
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

// XGlobal: x through L1.
template <DType kT, int kTok, int kRows>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvTargets tg, const float* __restrict__ x) {
  constexpr bool kPrefetch = kPrefetchOf<kTok>;
  constexpr int kUnroll = kUnrollOf<kT, kTok>;
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

  const XGlobal xg{x, w.cols};
  stream_units<kT, kRows, kUnroll, kPrefetch>(
      w, rows, lane, [&](const Step<kT, kRows, kUnroll>& st, int u0) { dot_step<kT, kTok>(st, w, xg, u0, acc); });
  reduce_store<kTok>(acc, w, row0, lane, y);
}

// XShared: x staged in shared memory per column chunk of chunk_units
// units (a multiple of the step, 32 x kUnroll units); the dynamic shared
// memory holds kTok x chunk_units x kUnit floats.
template <DType kT, int kTok, int kRows>
__global__ void __launch_bounds__(kThreads)
    gemv_smem_kernel(GemvTargets tg, const float* __restrict__ x, int chunk_units) {
  using C = Codec<kT>;
  int blk = blockIdx.x;
  const int ti = target_of(tg, blk);
  const WView w = view_of(tg, ti);
  float* __restrict__ y = y_of(tg, ti);
  extern __shared__ float4 xs[];  // [kTok][e4]: float4 q of token t at t * e4 + x_swizzle(q)
  constexpr bool kPrefetch = kPrefetchOf<kTok>;
  constexpr int kUnroll = kUnrollOf<kT, kTok>;
  constexpr int kStep = 32 * kUnroll;
  const int e4 = chunk_units * (C::kUnit / 4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blk) * kWarps + warp) * kRows;
  // No early return: every warp takes part in the staging barriers. Rows
  // past the end re-read the last valid row and are not stored.
  int64_t rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = min(row0 + r, w.rows - 1);

  float acc[kRows][kTok];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;

  Step<kT, kRows, kUnroll> cur;
  // The first step's weight loads go out before the staging below, so DRAM
  // is busy while x is copied in.
  if constexpr (kPrefetch) load_step(cur, w, rows, lane);
  wait_for_previous_kernel();  // x comes from the kernel before (launch_pdl)
  for (int c0 = 0; c0 < w.units; c0 += chunk_units) {
    const int cu = min(chunk_units, w.units - c0);
    // Every warp has finished reading the previous chunk before it is
    // overwritten.
    if (c0 > 0) __syncthreads();
    const int n4 = cu * (C::kUnit / 4);
    const float* xc = x + int64_t(c0) * C::kUnit;
#pragma unroll 1
    for (int t = 0; t < kTok; ++t)
      for (int q = threadIdx.x; q < n4; q += kThreads)
        xs[t * e4 + x_swizzle<kT>(q)] = __ldg(reinterpret_cast<const float4*>(xc + int64_t(t) * w.cols) + q);
    // The staged chunk is complete before any warp reads it.
    __syncthreads();
    const XShared xsh{xs, e4, c0};
    for (int u0 = c0 + lane; u0 < c0 + cu; u0 += kStep) {
      if constexpr (kPrefetch) {
        Step<kT, kRows, kUnroll> next;
        load_step(next, w, rows, u0 + kStep);
        dot_step<kT, kTok>(cur, w, xsh, u0, acc);
        cur = next;
      } else {
        load_step(cur, w, rows, u0);
        dot_step<kT, kTok>(cur, w, xsh, u0, acc);
      }
    }
  }
  reduce_store<kTok>(acc, w, row0, lane, y);
}

// Raises gemv_smem_kernel<kT, kTok, kRows>'s dynamic shared-memory limit
// once per device (at most 64 devices): needed only where one step of x for
// all tokens exceeds 48 KB. Host-side only (no stream work), so it is also
// safe when the first call happens during a graph capture.
template <DType kT, int kTok, int kRows>
void allow_smem(int bytes) {
  static std::atomic<uint64_t> done{0};  // one per instantiation: bit d = device d done
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  RUNLM_CHECK(dev >= 0 && dev < 64, "gemv: device %d beyond 64", dev);
  const uint64_t bit = uint64_t{1} << dev;
  if (done.load(std::memory_order_acquire) & bit) return;
  cudaCheck(cudaFuncSetAttribute(gemv_smem_kernel<kT, kTok, kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 bytes));
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// The rows a CTA covers at kTok tokens (see launch_gemv).
template <DType kT, int kTok>
constexpr int kRowsOf = (kT == DType::F32 || kT == DType::F16 || kT == DType::BF16) && kTok == 1 ? 2
                        : kTok <= 8                                                             ? 4
                                                                                                : 2;

template <DType kT, int kTok>
void launch_gemv(const GemvOut* outs, int n_outs, const float* x, cudaStream_t s) {
  constexpr bool kPlain = kT == DType::F32 || kT == DType::F16 || kT == DType::BF16;
  constexpr int kRows = kRowsOf<kT, kTok>;
  const GemvTargets tg = make_targets(outs, n_outs, kWarps * kRows, "gemv");
  const unsigned blocks = static_cast<unsigned>(tg.end[n_outs - 1]);
  if constexpr (kPlain && kTok == 1) {
    // XGlobal measured 80-99% of the copy bandwidth here.
    launch_pdl(gemv_kernel<kT, kTok, kRows>, dim3(blocks), dim3(kThreads), 0, s, tg, x);
  } else {
    // 4 rows per warp: each x read from shared memory serves 4 rows (see the
    // file comment); past 8 tokens the accumulators of 4 rows (2 x 4 x kTok
    // registers with the per-unit partial sums) would spill, so 2.
    const int units = tg.w[0].units;
    constexpr int kStepUnits = 32 * kUnrollOf<kT, kTok>;
    constexpr int kStepBytes = kStepUnits * Codec<kT>::kUnit * 4 * kTok;  // x of one step, all tokens
    constexpr int kMaxSteps = kStepBytes >= kSmemDefault ? 1 : kSmemDefault / kStepBytes;
    const int steps = std::min(kMaxSteps, (units + kStepUnits - 1) / kStepUnits);
    const int chunk_units = steps * kStepUnits;
    const int smem = steps * kStepBytes;
    if constexpr (kStepBytes > kSmemDefault) allow_smem<kT, kTok, kRows>(kStepBytes);
    launch_pdl(gemv_smem_kernel<kT, kTok, kRows>, dim3(blocks), dim3(kThreads), static_cast<size_t>(smem), s, tg, x,
               chunk_units);
  }
}

void gemv_outs(const GemvOut* outs, int n_outs, const float* x, int n_tokens, Stream stream) {
  RUNLM_CHECK(n_outs >= 1 && n_outs <= kMaxGemvOuts, "gemv: %d matrices; supported: 1..%d", n_outs, kMaxGemvOuts);
  RUNLM_CHECK(n_tokens >= 1 && n_tokens <= 16, "gemv: n_tokens=%d unsupported; supported: 1..16", n_tokens);
  const DType type = outs[0].w->type;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  // The types this f32-x kernel is instantiated for; the others (and these
  // quantized ones too) have the int8-x GEMV (gemv_x8.cu), which the engine
  // takes for every quantized type (weight_paths, src/cuda_matmul.cpp).
  auto run = [&](auto kt) {
    constexpr DType KT = decltype(kt)::value;
    RUNLM_GEMV_TOKEN_SWITCH(n_tokens, N, launch_gemv<KT, N>(outs, n_outs, x, s));
  };
  switch (type) {
    case DType::F32: run(std::integral_constant<DType, DType::F32>{}); break;
    case DType::F16: run(std::integral_constant<DType, DType::F16>{}); break;
    case DType::BF16: run(std::integral_constant<DType, DType::BF16>{}); break;
    case DType::Q8_0: run(std::integral_constant<DType, DType::Q8_0>{}); break;
    case DType::Q4_0: run(std::integral_constant<DType, DType::Q4_0>{}); break;
    case DType::Q4_K: run(std::integral_constant<DType, DType::Q4_K>{}); break;
    case DType::Q5_K: run(std::integral_constant<DType, DType::Q5_K>{}); break;
    case DType::Q6_K: run(std::integral_constant<DType, DType::Q6_K>{}); break;
    default:
      fail("gemv (f32 x): weight type %s unsupported; supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k "
           "(every quantized type has gemv_x8)",
           dtype_name(type));
  }
}

}  // namespace

bool gemv_f32x_supports(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_K:
    case DType::Q5_K: case DType::Q6_K: return true;
    default: return false;
  }
}

void gemv(const GpuMatrix& w, const float* x, float* y, int n_tokens, Stream stream) {
  const GemvOut out{&w, y};
  gemv_outs(&out, 1, x, n_tokens, stream);
}

void gemv_multi(const GemvOut* outs, int n_outs, const float* x, int n_tokens, Stream stream) {
  gemv_outs(outs, n_outs, x, n_tokens, stream);
}

}  // namespace runlm::gpu
