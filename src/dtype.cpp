#include "dtype.h"

#include "common.h"

namespace runlm {

namespace {
// One row per type; quantized layouts are documented in kernels/cpu/quant.h.
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "f32", 1, 4, true},       {DType::F16, "f16", 1, 2, true},
    {DType::Q4_0, "q4_0", 32, 18, true},   {DType::Q4_1, "q4_1", 32, 20, true},
    {DType::Q5_0, "q5_0", 32, 22, true},   {DType::Q5_1, "q5_1", 32, 24, true},
    {DType::Q8_0, "q8_0", 32, 34, true},   {DType::Q8_1, "q8_1", 32, 36, false},
    {DType::Q2_K, "q2_k", 256, 84, true},  {DType::Q3_K, "q3_k", 256, 110, true},
    {DType::Q4_K, "q4_k", 256, 144, true}, {DType::Q5_K, "q5_k", 256, 176, true},
    {DType::Q6_K, "q6_k", 256, 210, true}, {DType::Q8_K, "q8_k", 256, 292, false},
    {DType::IQ4_NL, "iq4_nl", 32, 18, true}, {DType::IQ4_XS, "iq4_xs", 256, 136, true},
    {DType::MXFP4, "mxfp4", 32, 17, true},
    // Known to ggml, not decoded by runlm: listed so such files fail by name.
    {DType::IQ2_XXS, "iq2_xxs", 256, 66, false}, {DType::IQ2_XS, "iq2_xs", 256, 74, false},
    {DType::IQ3_XXS, "iq3_xxs", 256, 98, false}, {DType::IQ1_S, "iq1_s", 256, 50, false},
    {DType::IQ3_S, "iq3_s", 256, 110, false},    {DType::IQ2_S, "iq2_s", 256, 82, false},
    {DType::IQ1_M, "iq1_m", 256, 56, false},     {DType::TQ1_0, "tq1_0", 256, 54, false},
    {DType::TQ2_0, "tq2_0", 256, 66, false},     {DType::NVFP4, "nvfp4", 64, 36, false},
    {DType::Q1_0, "q1_0", 128, 18, false},       {DType::Q2_0, "q2_0", 64, 18, false},
    {DType::I8, "i8", 1, 1, false},        {DType::I16, "i16", 1, 2, false},
    {DType::I32, "i32", 1, 4, false},      {DType::I64, "i64", 1, 8, false},
    {DType::F64, "f64", 1, 8, false},      {DType::BF16, "bf16", 1, 2, true},
};
}  // namespace

const DTypeInfo* dtype_info_or_null(uint32_t raw) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == raw) return &t;
  return nullptr;
}

const DTypeInfo& dtype_info(DType t) {
  const DTypeInfo* info = dtype_info_or_null(static_cast<uint32_t>(t));
  RUNLM_CHECK(info, "unknown tensor type id %u", static_cast<unsigned>(t));
  return *info;
}

DType dtype_from_name(const std::string& name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (const auto& t : kTypes) {
    if (lower == t.name) return t.type;
    if (t.can_decode) known += std::string(known.empty() ? "" : ", ") + t.name;
  }
  fail("unknown type '%s'; known types: %s", name.c_str(), known.c_str());
}

size_t dtype_row_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  RUNLM_CHECK(n % info.block_size == 0, "%s: row of %lld elements is not a multiple of the block size %lld",
              info.name, static_cast<long long>(n), static_cast<long long>(info.block_size));
  return static_cast<size_t>(n / info.block_size) * info.type_size;
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return fp32_from_bits(sign);
    // Subnormal half: normalise into a float.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400) == 0);
    mant &= 0x3ff;
    return fp32_from_bits(sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13));
  }
  if (exp == 31) return fp32_from_bits(sign | 0x7f800000 | (mant << 13));
  return fp32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t u = fp32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00;  // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00;  // overflow to inf (rounds past 65504)
  if (abs < 0x38800000) {
    // Subnormal or zero half: shift with round to nearest even.
    if (abs < 0x33000000) return sign;  // below half of the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1
    uint32_t half = mant >> (shift);
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

}  // namespace runlm
