// Prefill GEMM: y[t, r] = W[r, :] . x[t, :] on tensor cores (f16 in, fp32
// accumulation and output).
//
// Dequantization + cuBLAS (gemm_cublas; see dequant_f16_kernel): quantized, f32 and bf16 weights are first dequantized to
// an f16 copy in the caller's scratch (rows x cols x 2 bytes, one pass over
// W), then cublasGemmEx runs f16 x f16 -> f32 with CUBLAS_COMPUTE_32F; f16
// weights go to cuBLAS directly. The scratch pass costs one extra read of W
// and a write+read of the f16 copy (27.5 us for 4096 x 11008 Q4_0 on the
// H100): small next to the matrix product at 512 tokens, but it is what made
// Q4_0 steps of 16-256 tokens slower than F16.
//
// The fused path (gemm(), this dispatch): Q4_0 and Q8_0 with n_tokens <=
// kGemmFusedMaxTokens (256) go to the fused kernels of gemm_q_fused.cu
// (quant tiles dequantized in registers into wgmma (sm_90) or mma.sync
// operands, no f16 copy; cols % 64 == 0 and an H100-sized shared memory
// required, else dequantization + cuBLAS). Their scratch use is split-K
// partials, within gemm_scratch_bytes. Measured on the H100
// (docs/performance.md): 1.1-3.8x faster than dequantization + cuBLAS up to
// 128 tokens, even at 256, cuBLAS ahead at 512.
//
// cuBLAS handle: one per device, created on first use with a preallocated
// workspace (cublasSetWorkspace) so cuBLAS never allocates inside a CUDA
// graph capture. The first gemm call on a device must therefore happen
// outside a capture (the engine's warm-up does that).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

void cublas_check(cublasStatus_t s, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error at %s:%d: %s", file, line, cublasGetStatusString(s));
}
#define cublasCheck(call) cublas_check((call), __FILE__, __LINE__)

struct CublasState {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

cublasHandle_t cublas_for(cudaStream_t stream) {
  static std::mutex mu;
  static CublasState states[kMaxDevices];
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  RUNLM_CHECK(dev >= 0 && dev < kMaxDevices, "gemm: device %d beyond %d", dev, kMaxDevices);
  std::lock_guard<std::mutex> lock(mu);
  CublasState& st = states[dev];
  if (!st.handle) {
    cublasCheck(cublasCreate(&st.handle));
    cudaCheck(cudaMalloc(&st.workspace, kCublasWorkspaceBytes));
    cublasCheck(cublasSetMathMode(st.handle, CUBLAS_DEFAULT_MATH));
  }
  cublasCheck(cublasSetStream(st.handle, stream));
  cublasCheck(cublasSetWorkspace(st.handle, st.workspace, kCublasWorkspaceBytes));
  return st.handle;
}

// kLanes threads per (row, unit), each decoding two of the unit's 4-value
// groups and storing them as one 16-byte f16 store, so consecutive threads
// write consecutive 16 bytes (a warp 512 contiguous bytes). The lanes of a
// unit load the same 16 bytes (one L1 transaction). One
// thread per unit storing 8 bytes per group at a 64-byte stride (Q4_0):
// a quarter of each sector per store, and pp512 spent more time in this
// pass than in the matrix products (Q4_0 pp512 34.6 ms vs F16 13.9 ms).
template <DType kT>
__global__ void dequant_f16_kernel(WView w, __half* __restrict__ out) {
  using C = Codec<kT>;
  constexpr int kGroups = C::kUnit / 4;
  constexpr int kLanes = kGroups >= 2 ? kGroups / 2 : 1;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t unit = i / kLanes;
  if (unit >= w.rows * w.units) return;
  const int part = static_cast<int>(i % kLanes);
  const int64_t row = unit / w.units;
  const int u = static_cast<int>(unit % w.units);
  const typename C::Raw raw = C::load(w, row, u);
  const float sc = C::scale(raw);
  __half* dst = out + row * w.cols;
  // Scale applied per element, as the CPU decoder does ((q - 8) * d).
  auto pack = [sc](float4 v) {
    const __half2 a = __floats2half2_rn(v.x * sc, v.y * sc), b = __floats2half2_rn(v.z * sc, v.w * sc);
    return make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  };
  if constexpr (kGroups == 1) {
    *reinterpret_cast<uint2*>(dst + C::x_off(u, 0)) = pack(C::decode(raw, 0));
  } else {
    const int g0 = 2 * part, g1 = g0 + 1;
    const uint2 a = pack(C::decode(raw, g0)), b = pack(C::decode(raw, g1));
    const int o0 = C::x_off(u, g0), o1 = C::x_off(u, g1);
    if (o1 == o0 + 4 && o0 % 8 == 0) {  // adjacent and 16-byte aligned (cols % 8 == 0)
      *reinterpret_cast<uint4*>(dst + o0) = make_uint4(a.x, a.y, b.x, b.y);
    } else {  // not so in this type's unit
      *reinterpret_cast<uint2*>(dst + o0) = a;
      *reinterpret_cast<uint2*>(dst + o1) = b;
    }
  }
}

template <DType kT>
void launch_dequant(const WView& v, __half* out, cudaStream_t s) {
  constexpr int kGroups = Codec<kT>::kUnit / 4;
  constexpr int kLanes = kGroups >= 2 ? kGroups / 2 : 1;
  constexpr int kThreads = 256;
  const int64_t n = v.rows * v.units * kLanes;
  dequant_f16_kernel<kT><<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(v, out);
  cudaCheckLaunch();
}

}  // namespace

size_t gemm_scratch_bytes(const GpuMatrix& w) {
  if (w.type == DType::F16) return 0;
  return static_cast<size_t>(w.rows) * static_cast<size_t>(w.cols) * 2;
}

void gemm(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch, Stream stream) {
  RUNLM_CHECK(w.data != nullptr, "gemm: matrix not uploaded");
  RUNLM_CHECK(n_tokens >= 1, "gemm: n_tokens=%d", n_tokens);
  if (n_tokens <= kGemmFusedMaxTokens && gemm_fused_supports(w) && gemm_fused_fits_device(w)) {
    gemm_fused_q(w, x_f16, y, n_tokens, scratch, scratch ? gemm_scratch_bytes(w) : 0, stream);
    return;
  }
  gemm_cublas(w, x_f16, y, n_tokens, scratch, stream);
}

bool gemm_multi_fused(const GemmOut* outs, int n_outs, int n_tokens) {
  if (n_outs < 2 || n_outs > kMaxGemmOuts || n_tokens > kGemmFusedMaxTokens) return false;
  for (int i = 0; i < n_outs; ++i) {
    const GpuMatrix& w = *outs[i].w;
    if (!w.data || !gemm_fused_supports(w) || !gemm_fused_fits_device(w) || w.type != outs[0].w->type ||
        w.cols != outs[0].w->cols)
      return false;
  }
  return true;
}

void gemm_multi(const GemmOut* outs, int n_outs, const uint16_t* x_f16, int n_tokens, void* scratch, Stream stream) {
  if (!gemm_multi_fused(outs, n_outs, n_tokens)) {
    for (int i = 0; i < n_outs; ++i) gemm(*outs[i].w, x_f16, outs[i].y, n_tokens, scratch, stream);
    return;
  }
  size_t scratch_bytes = 0;
  for (int i = 0; i < n_outs; ++i) scratch_bytes = std::max(scratch_bytes, gemm_scratch_bytes(*outs[i].w));
  gemm_fused_q_multi(outs, n_outs, x_f16, n_tokens, scratch, scratch ? scratch_bytes : 0, stream);
}

void gemm_cublas(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch, Stream stream) {
  RUNLM_CHECK(w.data != nullptr, "gemm: matrix not uploaded");
  RUNLM_CHECK(n_tokens >= 1, "gemm: n_tokens=%d", n_tokens);
  RUNLM_CHECK(w.rows <= INT32_MAX && w.cols <= INT32_MAX, "gemm: matrix too large");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const WView v = make_view(w);
  const void* a = v.q;
  if (w.type != DType::F16) {
    RUNLM_CHECK(scratch != nullptr, "gemm: %s weights need a scratch of %zu bytes", dtype_name(w.type),
                gemm_scratch_bytes(w));
    __half* out = static_cast<__half*>(scratch);
    const bool ok = RUNLM_GPU_TYPE_SWITCH(w.type, KT, launch_dequant<KT>(v, out, s));
    RUNLM_CHECK(ok, "gemm: weight type %s unsupported; supported: %s", dtype_name(w.type), kGpuWeightTypes);
    a = scratch;
  }
  // Column-major view: W row-major [rows][cols] is a cols x rows matrix (lda
  // = cols) used transposed; x [n][cols] is cols x n; y [n][rows] is rows x n.
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(w.rows), k = static_cast<int>(w.cols);
  cublasCheck(cublasGemmEx(cublas_for(s), CUBLAS_OP_T, CUBLAS_OP_N, m, n_tokens, k, &alpha, a, CUDA_R_16F, k, x_f16,
                           CUDA_R_16F, k, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool gemm_batched_ok(const GpuMatrix* const* ws, int n) {
  for (int i = 0; i < n; ++i)
    if (ws[i]->type != DType::F16 || ws[i]->rows != ws[0]->rows || ws[i]->cols != ws[0]->cols || !ws[i]->data)
      return false;
  return n >= 1 && ws[0]->rows <= INT32_MAX && ws[0]->cols <= INT32_MAX;
}

const void* gemm_f16_data(const GpuMatrix& w) {
  RUNLM_CHECK(w.type == DType::F16, "gemm_batched: %s weights; it takes f16", dtype_name(w.type));
  return make_view(w).q;
}

void gemm_batched(const void* const* w, const uint16_t* const* x, float* const* y, int n, int64_t rows, int64_t cols,
                  int n_tokens, Stream stream) {
  RUNLM_CHECK(n >= 1 && n_tokens >= 1 && rows <= INT32_MAX && cols <= INT32_MAX,
              "gemm_batched: n=%d n_tokens=%d rows=%lld cols=%lld", n, n_tokens, static_cast<long long>(rows),
              static_cast<long long>(cols));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const float alpha = 1.0f, beta = 0.0f;
  const int m = static_cast<int>(rows), k = static_cast<int>(cols);
  // The layout of gemm() above, n times.
  cublasCheck(cublasGemmBatchedEx(cublas_for(s), CUBLAS_OP_T, CUBLAS_OP_N, m, n_tokens, k, &alpha, w, CUDA_R_16F, k,
                                  reinterpret_cast<const void* const*>(x), CUDA_R_16F, k, &beta,
                                  reinterpret_cast<void* const*>(y), CUDA_R_32F, m, n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

}  // namespace runlm::gpu
