// Decode GEMV for every quantized weight type with int8 activations. Q4_0
// and Q8_0 have dot products of their own (below); the others go through
// one generic dot (gemv_x8_kernel.cuh X8Dot) on gpu_codec.cuh's integer
// levels and per-half (A, B): 8 IDP4A per 32 weights plus the level
// extraction (1-3 LOP/SHF per 4 weights, 9 PRMT per 8 for the IQ4 / MXFP4
// table lookups) and, per unit and token, a few FFMA for the scales.
// They are instantiated in gemv_x8_kquant.cu and gemv_x8_unit32.cu.
//
// The design, as first written for Q4_0 / Q8_0:
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
#include "cuda/gemv_x8_kernel.cuh"

namespace runlm::gpu {

// Instantiated in gemv_x8_kquant.cu / gemv_x8_unit32.cu.
#define RUNLM_X8_EXTERN(T) \
  extern template void launch_x8<T>(const GemvOut*, int, const X8View&, int, cudaStream_t);
RUNLM_X8_EXTERN(DType::Q2_K)
RUNLM_X8_EXTERN(DType::Q3_K)
RUNLM_X8_EXTERN(DType::Q4_K)
RUNLM_X8_EXTERN(DType::Q5_K)
RUNLM_X8_EXTERN(DType::Q6_K)
RUNLM_X8_EXTERN(DType::Q4_1)
RUNLM_X8_EXTERN(DType::Q5_0)
RUNLM_X8_EXTERN(DType::Q5_1)
RUNLM_X8_EXTERN(DType::IQ4_NL)
RUNLM_X8_EXTERN(DType::IQ4_XS)
RUNLM_X8_EXTERN(DType::MXFP4)
#undef RUNLM_X8_EXTERN

namespace {

// One thread per value, a warp per 32-value block (warp_quantize_x8).
__global__ void quantize_x8_kernel(const float* __restrict__ x, int64_t n_values, int8_t* __restrict__ q,
                                   float2* __restrict__ ds) {
  allow_next_kernel();  // the GEMV after this may start loading its weights
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_values) return;  // whole warps: n_values is a multiple of 32
  warp_quantize_x8(x[i], q + i, ds + i / kQBlock);
}

}  // namespace

bool gemv_x8_supports(DType t) {
  switch (t) {
    case DType::Q8_0: case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::Q2_K: case DType::Q3_K: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
    case DType::IQ4_NL: case DType::IQ4_XS: case DType::MXFP4: return true;
    default: return false;
  }
}

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
    case DType::Q4_0: launch_x8<DType::Q4_0>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q8_0: launch_x8<DType::Q8_0>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q4_1: launch_x8<DType::Q4_1>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q5_0: launch_x8<DType::Q5_0>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q5_1: launch_x8<DType::Q5_1>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q2_K: launch_x8<DType::Q2_K>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q3_K: launch_x8<DType::Q3_K>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q4_K: launch_x8<DType::Q4_K>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q5_K: launch_x8<DType::Q5_K>(outs, n_outs, x, n_tokens, s); break;
    case DType::Q6_K: launch_x8<DType::Q6_K>(outs, n_outs, x, n_tokens, s); break;
    case DType::IQ4_NL: launch_x8<DType::IQ4_NL>(outs, n_outs, x, n_tokens, s); break;
    case DType::IQ4_XS: launch_x8<DType::IQ4_XS>(outs, n_outs, x, n_tokens, s); break;
    case DType::MXFP4: launch_x8<DType::MXFP4>(outs, n_outs, x, n_tokens, s); break;
    default: fail("gemv_x8: weight type %s unsupported; supported: every quantized GPU type (%s)", dtype_name(type),
                  kGpuWeightTypes);
  }
}

}  // namespace runlm::gpu
