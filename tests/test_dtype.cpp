#include <gtest/gtest.h>

#include "common.h"
#include "dtype.h"

using namespace runlm;

TEST(DType, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (f != f) continue;  // NaN payloads need not round trip
    EXPECT_EQ(fp32_to_fp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, Fp16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_fp16(1.0f + 1.0f / 2048), 0x3c00);      // tie -> even (1.0)
  EXPECT_EQ(fp32_to_fp16(1.0f + 3.0f / 2048), 0x3c02);      // tie -> even (up)
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);                // rounds past max -> inf
  EXPECT_EQ(fp32_to_fp16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(2.98e-08f), 0x0000);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(3.140625f)), 3.140625f);
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f818000)), 0x3f82);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_from_name("Q4_K"), DType::Q4_K);
  EXPECT_EQ(dtype_row_bytes(DType::Q4_0, 64), 36u);
  EXPECT_EQ(dtype_row_bytes(DType::Q6_K, 512), 420u);
  EXPECT_THROW(dtype_from_name("q9_9"), Error);
  EXPECT_THROW(dtype_row_bytes(DType::Q4_0, 33), Error);
  EXPECT_EQ(dtype_info_or_null(99), nullptr);
}
