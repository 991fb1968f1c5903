// The CUDA engine's weight products, with the one table that says how each
// weight type is multiplied (weight_paths): the decode GEMV reads x as int8
// (gpu::gemv_x8, every quantized type) or as f32 (gpu::gemv_multi, F32 /
// F16 / BF16);
// the prefill GEMM runs F16 straight through cuBLAS, Q4_0 / Q8_0 through the
// fused kernels (gemm_q_fused.cu: quant tiles dequantized in registers, up
// to kGemmFusedMaxTokens tokens, where the device has the shared memory) and
// the rest through a dequantization pass into f16 and cuBLAS (gemm_q.cu).
#pragma once

#include <initializer_list>
#include <vector>

#include "cuda/gpu_ops.h"
#include "cuda_device_buffer.h"
#include "cuda_weights.h"

namespace runlm {

enum class GemvPath { X8, F32 };
enum class GemmPath { CublasF16, Fused, DequantCublas };

struct WeightPaths {
  DType type;
  GemvPath gemv;
  GemmPath gemm;
};

// The row of a weight type the GPU takes (throws naming the supported ones).
const WeightPaths& weight_paths(DType t);
// The types of the table, in its order (tests check it against upload).
std::vector<DType> gpu_weight_types();

// Whether a prefill GEMM over w reads its weights once (F16, or the fused
// kernel on this device): such layers leave the GEMV for the GEMM sooner.
bool gemm_reads_weights_once(const gpu::GpuMatrix& w);

class WeightMatmul {
 public:
  // The int8 x of up to gemv_tokens rows of `widest` columns, and the
  // split-K / dequantization scratch of the largest matrix.
  void allocate(const GpuWeights& w, int gemv_tokens, int64_t widest);
  // Same-shape F16 projections of one x (q/k/v, else k/v; gate/up) become
  // batched GEMMs reading xh: the pointer table is built once, here.
  void build_groups(std::vector<GpuLayer>& layers, uint16_t* xh, float* q, float* k, float* v, float* gate,
                    float* up);
  // y_i = W_i x for up to 16 rows of x (f32, [m, cols]). Consecutive
  // matrices of one type share one launch (q/k/v, gate/up); int8-x types
  // quantize x once (x8_ready: x8() already holds it). No allocation: safe
  // inside graph capture.
  void gemv(std::initializer_list<gpu::GemvOut> outs, const float* x, int m, bool x8_ready, cudaStream_t stream);
  // y = W xh for each out (f16 xh, m rows): one batched call for an F16
  // group; else gpu::gemm_multi, which makes Q4_0 / Q8_0 matrices of one
  // type and width one fused launch and runs the rest one gemm each.
  void gemm(const GemmGroup& g, std::initializer_list<gpu::GemmOut> outs, const uint16_t* xh, int m,
            cudaStream_t stream);

  void* x8() const { return x8_.get(); }
  void* scratch() const { return scratch_.get(); }

 private:
  DeviceBuffer<uint8_t> x8_;       // x quantized for gemv_x8 ([16, widest] int8 + scales)
  DeviceBuffer<uint8_t> scratch_;  // gemm's split-K partials / f16 copy of W
  DeviceBuffer<void*> ptrs_;       // the GemmGroups' pointer arrays
};

}  // namespace runlm
