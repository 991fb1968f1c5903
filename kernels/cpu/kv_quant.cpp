#include "kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common.h"
#include "dtype.h"
#include "quant.h"

namespace runlm {

namespace {

struct KvRow {
  KvType type;
  const char* name;
  int block;
  size_t block_bytes;
};
constexpr KvRow kKvTypes[] = {
    {KvType::F32, "f32", 1, 4},    {KvType::F16, "f16", 1, 2},   {KvType::BF16, "bf16", 1, 2},
    {KvType::Q8_0, "q8_0", 32, 34}, {KvType::Q4_0, "q4_0", 32, 18}, {KvType::FP8, "fp8", 32, 34},
};

const KvRow& row_of(KvType t) {
  for (const auto& r : kKvTypes)
    if (r.type == t) return r;
  fail("unknown KV type");
}

// The DType that stores a KV type with GGUF's own block format.
DType dtype_of(KvType t) {
  switch (t) {
    case KvType::F32: return DType::F32;
    case KvType::F16: return DType::F16;
    case KvType::BF16: return DType::BF16;
    case KvType::Q8_0: return DType::Q8_0;
    case KvType::Q4_0: return DType::Q4_0;
    case KvType::FP8: break;
  }
  fail("no GGUF type for KV type %s", kv_type_name(t));
}

constexpr float kFp8Max = 448.0f;

}  // namespace

KvType kv_type_from_name(const std::string& name) {
  std::string known;
  for (const auto& r : kKvTypes) {
    if (name == r.name) return r.type;
    known += std::string(known.empty() ? "" : ", ") + r.name;
  }
  fail("unknown KV cache type '%s'; known: %s", name.c_str(), known.c_str());
}

const char* kv_type_name(KvType t) { return row_of(t).name; }
int kv_type_block(KvType t) { return row_of(t).block; }

size_t kv_row_bytes(KvType t, int64_t n) {
  const KvRow& r = row_of(t);
  RUNLM_CHECK(n % r.block == 0, "KV type %s: a row of %lld elements is not a multiple of its block of %d", r.name,
              static_cast<long long>(n), r.block);
  return static_cast<size_t>(n / r.block) * r.block_bytes;
}

float fp8_e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 15, mant = v & 7;
  if (exp == 15 && mant == 7) return NAN;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)  // subnormal: mant/8 * 2^-6
                             : std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

uint8_t fp8_e4m3_from_float(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::min(std::fabs(x), kFp8Max);  // saturate: e4m3fn has no infinity
  // The 127 non-negative finite codes are increasing in value: binary search
  // for the neighbours, then round to nearest, ties to the even code.
  int lo = 0, hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_e4m3_to_float(static_cast<uint8_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  int code = lo;
  if (lo < 126) {
    const float below = fp8_e4m3_to_float(static_cast<uint8_t>(lo));
    const float above = fp8_e4m3_to_float(static_cast<uint8_t>(lo + 1));
    if (a - below > above - a || (a - below == above - a && (lo & 1))) code = lo + 1;
  }
  return static_cast<uint8_t>(sign | code);
}

void kv_encode_row(KvType t, const float* x, void* dst, int64_t n) {
  if (t != KvType::FP8) {
    quantize_row(dtype_of(t), x, dst, n);
    return;
  }
  kv_row_bytes(t, n);  // checks the block multiple
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b, out += 34) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    // The scale maps the block's largest value onto e4m3's largest, 448.
    const uint16_t d16 = fp32_to_fp16(amax / kFp8Max);
    const float d = fp16_to_fp32(d16);
    std::memcpy(out, &d16, 2);
    for (int i = 0; i < 32; ++i) out[2 + i] = fp8_e4m3_from_float(d > 0 ? x[b * 32 + i] / d : 0.0f);
  }
}

void kv_decode_row(KvType t, const void* src, float* dst, int64_t n) {
  if (t != KvType::FP8) {
    dequantize_row(dtype_of(t), src, dst, n);
    return;
  }
  kv_row_bytes(t, n);
  const uint8_t* in = static_cast<const uint8_t*>(src);
  for (int64_t b = 0; b < n / 32; ++b, in += 34) {
    uint16_t d16;
    std::memcpy(&d16, in, 2);
    const float d = fp16_to_fp32(d16);
    for (int i = 0; i < 32; ++i) dst[b * 32 + i] = fp8_e4m3_to_float(in[2 + i]) * d;
  }
}

}  // namespace runlm
