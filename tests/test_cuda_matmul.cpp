// The CUDA engine's weight-type table (src/cuda_matmul.h): which GEMV and
// which GEMM path each weight type takes. Host code, no device needed; only
// in a CUDA build.
#include <gtest/gtest.h>

#ifdef RUNLM_CUDA
#include "common.h"
#include "cuda_matmul.h"

using namespace runlm;

TEST(CudaMatmul, EveryGpuWeightTypeHasOneRow) {
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                         DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  for (DType t : types) {
    const WeightPaths& p = weight_paths(t);
    EXPECT_EQ(p.type, t) << dtype_name(t);
    // int8 x exactly where the gemv_x8 kernel has an instance.
    EXPECT_EQ(p.gemv == GemvPath::X8, gpu::gemv_x8_supports(t)) << dtype_name(t);
  }
  EXPECT_EQ(weight_paths(DType::F16).gemm, GemmPath::CublasF16);
  EXPECT_EQ(weight_paths(DType::Q4_0).gemm, GemmPath::Fused);
  EXPECT_EQ(weight_paths(DType::Q8_0).gemm, GemmPath::Fused);
  EXPECT_EQ(weight_paths(DType::Q6_K).gemm, GemmPath::DequantCublas);
}

TEST(CudaMatmul, UnsupportedTypeIsNamed) {
  try {
    weight_paths(DType::Q5_0);
    FAIL() << "no error for q5_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight type q5_0 unsupported on the GPU"), std::string::npos) << e.what();
  }
}
#else
TEST(CudaMatmul, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (RUNLM_CUDA off)"; }
#endif
