// check_kv_types (src/kv_types.h): the KV cache types each engine takes,
// one check for the CPU and the CUDA engine; refusals name the combination
// and what is supported. Pure host code: runs in every build.
#include <gtest/gtest.h>

#include <string>

#include "common.h"
#include "kv_types.h"

using namespace runlm;

namespace {

std::string refusal(Device d, KvType k, KvType v, KvLayout layout, int head_dim) {
  try {
    check_kv_types(d, k, v, layout, head_dim);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KvTypes, CpuTakesEveryTypeEitherLayout) {
  const KvType all[] = {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q4_0, KvType::FP8};
  for (KvLayout layout : {KvLayout::Contiguous, KvLayout::Paged})
    for (KvType k : all)
      for (KvType v : all) EXPECT_EQ(refusal(Device::Cpu, k, v, layout, 64), "") << kv_type_name(k) << kv_type_name(v);
}

TEST(KvTypes, CpuRefusesQuantizedBlocksThatCannotFollowHeadDim) {
  EXPECT_NE(refusal(Device::Cpu, KvType::Q8_0, KvType::F32, KvLayout::Contiguous, 4).find("head_dim=4"),
            std::string::npos);
  EXPECT_EQ(refusal(Device::Cpu, KvType::F16, KvType::F32, KvLayout::Contiguous, 4), "");
}

TEST(KvTypes, CudaTakesThePagedTypesAndF16Contiguous) {
  const KvType gpu[] = {KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q4_0, KvType::FP8};
  for (KvType k : gpu)
    for (KvType v : gpu) EXPECT_EQ(refusal(Device::Cuda, k, v, KvLayout::Paged, 128), "");
  EXPECT_EQ(refusal(Device::Cuda, KvType::F16, KvType::F16, KvLayout::Contiguous, 8), "");
}

TEST(KvTypes, CudaRefusalsNameTheCombination) {
  EXPECT_NE(refusal(Device::Cuda, KvType::F32, KvType::F16, KvLayout::Paged, 128)
                .find("KV cache type f32 (K=f32 V=f16) unsupported on the GPU"),
            std::string::npos);
  EXPECT_NE(refusal(Device::Cuda, KvType::Q8_0, KvType::Q8_0, KvLayout::Contiguous, 128)
                .find("K=q8_0 V=q8_0 need the paged KV cache (--kv paged)"),
            std::string::npos);
  EXPECT_NE(refusal(Device::Cuda, KvType::F16, KvType::BF16, KvLayout::Paged, 8).find("bf16 with head_dim=8"),
            std::string::npos);
}
