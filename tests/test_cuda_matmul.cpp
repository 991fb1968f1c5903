// The CUDA engine's weight-type table (src/cuda_matmul.h): which GEMV and
// which GEMM path each weight type takes, and that it covers exactly the
// types upload_matrix takes. Host code, no device needed; only in a CUDA
// build.
#include <gtest/gtest.h>

#ifdef RUNLM_CUDA
#include <algorithm>
#include <string>
#include <vector>

#include "common.h"
#include "cuda_matmul.h"

using namespace runlm;

TEST(CudaMatmul, EveryGpuWeightTypeHasOneRow) {
  const std::vector<DType> types = gpu_weight_types();
  for (DType t : types) {
    const WeightPaths& p = weight_paths(t);
    EXPECT_EQ(p.type, t) << dtype_name(t);
    EXPECT_EQ(std::count(types.begin(), types.end(), t), 1) << dtype_name(t);
    // int8 x exactly where the gemv_x8 kernel has an instance: every
    // quantized type; f32 x for the plain ones.
    EXPECT_EQ(p.gemv == GemvPath::X8, gpu::gemv_x8_supports(t)) << dtype_name(t);
    const bool plain = t == DType::F32 || t == DType::F16 || t == DType::BF16;
    EXPECT_EQ(p.gemv, plain ? GemvPath::F32 : GemvPath::X8) << dtype_name(t);
  }
  EXPECT_EQ(weight_paths(DType::F16).gemm, GemmPath::CublasF16);
  EXPECT_EQ(weight_paths(DType::Q4_0).gemm, GemmPath::Fused);
  EXPECT_EQ(weight_paths(DType::Q8_0).gemm, GemmPath::Fused);
  EXPECT_EQ(weight_paths(DType::Q6_K).gemm, GemmPath::DequantCublas);
  EXPECT_EQ(weight_paths(DType::IQ4_XS).gemm, GemmPath::DequantCublas);
}

// The table and the upload layouts (gpu_codec.cuh packed_layout, asked
// through gemv_supports) name the same types, and they are every type the
// CPU decodes: a model the CPU runs, the GPU runs.
TEST(CudaMatmul, TableCoversExactlyTheUploadableTypes) {
  const std::vector<DType> types = gpu_weight_types();
  // kGpuWeightTypes, the list the error messages give, as names.
  std::vector<std::string> listed;
  const std::string list = gpu::kGpuWeightTypes;
  for (size_t b = 0; b < list.size();) {
    const size_t e = std::min(list.find(", ", b), list.size());
    listed.push_back(list.substr(b, e - b));
    b = e + 2;
  }
  EXPECT_EQ(listed.size(), types.size());
  int known = 0;
  for (uint32_t raw = 0; raw < 256; ++raw) {
    const DTypeInfo* info = dtype_info_or_null(raw);
    if (!info) continue;
    ++known;
    const DType t = info->type;
    const bool in_table = std::find(types.begin(), types.end(), t) != types.end();
    EXPECT_EQ(in_table, gpu::gemv_supports(t)) << dtype_name(t);
    EXPECT_EQ(in_table, info->can_decode) << dtype_name(t);
    EXPECT_EQ(in_table, std::count(listed.begin(), listed.end(), dtype_name(t)) == 1)
        << dtype_name(t) << " vs the error messages' list " << gpu::kGpuWeightTypes;
  }
  EXPECT_GT(known, 20);
  EXPECT_EQ(types.size(), 16u);
}

TEST(CudaMatmul, UnsupportedTypeIsNamed) {
  try {
    weight_paths(DType::IQ2_XXS);
    FAIL() << "no error for iq2_xxs";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("weight type iq2_xxs unsupported on the GPU"), std::string::npos) << m;
    EXPECT_NE(m.find("iq4_xs"), std::string::npos) << m;
  }
}
#else
TEST(CudaMatmul, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (RUNLM_CUDA off)"; }
#endif
