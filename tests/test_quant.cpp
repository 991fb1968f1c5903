// Tests for kernels/cpu/quant: exact decoding of every GGUF block format
// against a deliberately simple per-element decoder written here from the
// format description (byte offsets and bit positions, not the block structs),
// quantization error bounds and ggml's rounding rules, dot_row against
// dequantize + dot, edge-case rows and argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cpu/quant.h"
#include "dtype.h"

using namespace runlm;

namespace {

// ---- independent reference decoder ------------------------------------------

// count bits starting at bit pos of the little-endian bit string p (bit 0 is
// the lowest bit of p[0]).
int bits(const uint8_t* p, int pos, int count) {
  int v = 0;
  for (int k = 0; k < count; ++k) v |= ((p[(pos + k) / 8] >> ((pos + k) % 8)) & 1) << k;
  return v;
}

float half_at(const uint8_t* p) { return fp16_to_fp32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// Sub-block sb's 6-bit scale and min in the 12-byte k-quant scale field:
// sub-blocks 0-3 have theirs in the low 6 bits of bytes sb (scale) and sb+4
// (min); sub-blocks 4-7 have the low 4 bits in byte sb+4 (scale: low nibble,
// min: high nibble) and the top 2 bits in bits 6-7 of bytes sb-4 (scale) and
// sb (min).
void k_scale_min(const uint8_t* s, int sb, int* sc, int* m) {
  if (sb < 4) {
    *sc = bits(s, 8 * sb, 6);
    *m = bits(s, 8 * (sb + 4), 6);
  } else {
    *sc = bits(s, 8 * (sb + 4), 4) | (bits(s, 8 * (sb - 4) + 6, 2) << 4);
    *m = bits(s, 8 * (sb + 4) + 4, 4) | (bits(s, 8 * sb + 6, 2) << 4);
  }
}

// Element e of a row of type t, decoded on its own from GGUF byte offsets.
float ref_element(DType t, const uint8_t* row, int64_t e) {
  const DTypeInfo& info = dtype_info(t);
  const uint8_t* b = row + (e / info.block_size) * info.type_size;
  const int i = static_cast<int>(e % info.block_size);
  switch (t) {
    case DType::Q4_0: {  // d | qs[16]; element i: nibble i/16 of qs[i%16]
      const int q = bits(b + 2, 8 * (i % 16) + 4 * (i / 16), 4);
      return static_cast<float>(q - 8) * half_at(b);
    }
    case DType::Q4_1: {  // d | m | qs[16]
      const int q = bits(b + 4, 8 * (i % 16) + 4 * (i / 16), 4);
      return static_cast<float>(q) * half_at(b) + half_at(b + 2);
    }
    case DType::Q5_0: {  // d | qh[4] | qs[16]; 5th bit of element i is bit i of qh
      const int q = bits(b + 6, 8 * (i % 16) + 4 * (i / 16), 4) | (bits(b + 2, i, 1) << 4);
      return static_cast<float>(q - 16) * half_at(b);
    }
    case DType::Q5_1: {  // d | m | qh[4] | qs[16]
      const int q = bits(b + 8, 8 * (i % 16) + 4 * (i / 16), 4) | (bits(b + 4, i, 1) << 4);
      return static_cast<float>(q) * half_at(b) + half_at(b + 2);
    }
    case DType::Q8_0: {  // d | int8 qs[32]
      return static_cast<float>(static_cast<int8_t>(b[2 + i])) * half_at(b);
    }
    case DType::Q4_K: {  // d | dmin | scales[12] | qs[128]
      int sc, m;
      k_scale_min(b + 4, i / 32, &sc, &m);
      // 64-element chunk i/64 uses bytes 32*(i/64)..+31: low nibbles for its
      // first 32 elements, high nibbles for the next 32.
      const int q = bits(b + 16, 8 * ((i / 64) * 32 + i % 32) + 4 * ((i / 32) % 2), 4);
      return half_at(b) * static_cast<float>(sc) * static_cast<float>(q) -
             half_at(b + 2) * static_cast<float>(m);
    }
    case DType::Q5_K: {  // d | dmin | scales[12] | qh[32] | qs[128]
      int sc, m;
      k_scale_min(b + 4, i / 32, &sc, &m);
      const int lo = bits(b + 48, 8 * ((i / 64) * 32 + i % 32) + 4 * ((i / 32) % 2), 4);
      const int hi = bits(b + 16, 8 * (i % 32) + i / 32, 1);  // bit i/32 of qh[i%32]
      return half_at(b) * static_cast<float>(sc) * static_cast<float>(lo + 16 * hi) -
             half_at(b + 2) * static_cast<float>(m);
    }
    case DType::Q6_K: {  // ql[128] | qh[64] | int8 scales[16] | d
      // Halves of 128; in a half, group g = 0..3 of 32 elements: low 4 bits
      // from ql[64h + 32(g%2) + l] (low nibble for g < 2), top 2 bits from
      // bits 2g, 2g+1 of qh[32h + l].
      const int h = i / 128, g = (i % 128) / 32, l = i % 32;
      const int lo = bits(b, 8 * (64 * h + 32 * (g % 2) + l) + 4 * (g / 2), 4);
      const int hi = bits(b + 128, 8 * (32 * h + l) + 2 * g, 2);
      const int sc = static_cast<int8_t>(b[192 + i / 16]);
      return half_at(b + 208) * static_cast<float>(sc) * static_cast<float>((lo | (hi << 4)) - 32);
    }
    case DType::Q2_K: {  // scales[16] | qs[64] | d | dmin
      // Element i: sub-block i/16 (scale byte i/16: low nibble scale, high
      // nibble min); 2-bit level in bits 2((i%128)/32) of qs[32(i/128) + i%32].
      const int sc = bits(b + i / 16, 0, 4), m = bits(b + i / 16, 4, 4);
      const int q = bits(b + 16, 8 * (32 * (i / 128) + i % 32) + 2 * ((i % 128) / 32), 2);
      return half_at(b + 80) * static_cast<float>(sc) * static_cast<float>(q) -
             half_at(b + 82) * static_cast<float>(m);
    }
    case DType::Q3_K: {  // hmask[32] | qs[64] | scales[12] | d
      // 6-bit scale of sub-block j = i/16: low 4 bits are nibble j/8 of byte
      // j%8, top 2 bits are bits 2(j/4) of byte 8 + j%4; bias 32. Level: 2
      // bits as in Q2_K, minus 4 unless bit i/32 of hmask[i%32] is set.
      const int j = i / 16;
      const int sc = (bits(b + 96, 8 * (j % 8) + 4 * (j / 8), 4) | (bits(b + 96, 8 * (8 + j % 4) + 2 * (j / 4), 2) << 4)) - 32;
      const int lo = bits(b + 32, 8 * (32 * (i / 128) + i % 32) + 2 * ((i % 128) / 32), 2);
      const int hi = bits(b, 8 * (i % 32) + i / 32, 1);
      return half_at(b + 108) * static_cast<float>(sc) * static_cast<float>(lo - (hi ? 0 : 4));
    }
    case DType::IQ4_NL: {  // d | qs[16]; index nibble as Q4_0's
      const int q = bits(b + 2, 8 * (i % 16) + 4 * (i / 16), 4);
      return half_at(b) * static_cast<float>(kIq4nlValues[q]);
    }
    case DType::IQ4_XS: {  // d | scales_h (u16) | scales_l[4] | qs[128]
      // Sub-block j = i/32 of 32: 6-bit scale = nibble j%2 of scales_l[j/2]
      // | bits 2j..2j+1 of scales_h << 4, bias 32; index nibble (i%32)/16
      // of qs[16 j + i%16].
      const int j = i / 32;
      const int sc = (bits(b + 4, 8 * (j / 2) + 4 * (j % 2), 4) | (bits(b + 2, 2 * j, 2) << 4)) - 32;
      const int q = bits(b + 8, 8 * (16 * j + i % 16) + 4 * ((i % 32) / 16), 4);
      return half_at(b) * static_cast<float>(sc) * static_cast<float>(kIq4nlValues[q]);
    }
    case DType::MXFP4: {  // e | qs[16]; E2M1 code as Q4_0's nibble
      // OCP MX: E2M1 codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the
      // sign; the block scale is 2^(e - 127).
      static const float kE2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
      const int q = bits(b + 1, 8 * (i % 16) + 4 * (i / 16), 4);
      const float v = (q & 8 ? -1.f : 1.f) * kE2M1[q & 7];
      return v * std::ldexp(1.0f, static_cast<int>(b[0]) - 127);
    }
    default: ADD_FAILURE() << "no reference decoder for " << dtype_name(t); return 0.f;
  }
}

// The quantized formats ref_element knows, with the byte offsets of their
// fp16 scale fields (and of an E8M0 exponent byte, MXFP4's).
struct BlockFormat {
  DType type;
  std::vector<int> half_offsets;
  int e8m0_offset = -1;
};
const std::vector<BlockFormat> kBlockFormats = {
    {DType::Q4_0, {0}},    {DType::Q4_1, {0, 2}}, {DType::Q5_0, {0}},    {DType::Q5_1, {0, 2}},
    {DType::Q8_0, {0}},    {DType::Q4_K, {0, 2}}, {DType::Q5_K, {0, 2}}, {DType::Q6_K, {208}},
    {DType::Q2_K, {80, 82}}, {DType::Q3_K, {108}}, {DType::IQ4_NL, {0}}, {DType::IQ4_XS, {0}},
    {DType::MXFP4, {}, 0},
};

// Random bytes in every field; the fp16 scales are finite, random in [-2, 2].
std::vector<uint8_t> random_blocks(const BlockFormat& f, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(dtype_row_bytes(f.type, n));
  for (auto& c : bytes) c = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-2.f, 2.f);
  const DTypeInfo& info = dtype_info(f.type);
  for (size_t blk = 0; blk < bytes.size() / info.type_size; ++blk) {
    for (int off : f.half_offsets) {
      const uint16_t h = fp32_to_fp16(scale(rng));
      bytes[blk * info.type_size + off] = static_cast<uint8_t>(h & 0xff);
      bytes[blk * info.type_size + off + 1] = static_cast<uint8_t>(h >> 8);
    }
    // Exponents 2^-27..2^24 keep every value and dot product finite.
    if (f.e8m0_offset >= 0) bytes[blk * info.type_size + f.e8m0_offset] = static_cast<uint8_t>(100 + rng() % 52);
  }
  return bytes;
}

std::vector<float> normal_row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  return x;
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(dtype_row_bytes(t, static_cast<int64_t>(x.size())));
  quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& q, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, q.data(), y.data(), n);
  return y;
}

double rel_rms_error(const std::vector<float>& x, const std::vector<float>& y, size_t begin = 0,
                     size_t end = SIZE_MAX) {
  end = std::min(end, x.size());
  double e = 0, s = 0;
  for (size_t i = begin; i < end; ++i) {
    e += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    s += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(e / s);
}

const std::vector<DType> kQuantizable = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,  DType::Q4_0,
                                         DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q2_K,  DType::Q3_K,
                                         DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS,
                                         DType::MXFP4};

// Formats with a level that decodes to exactly 0 (symmetric, no min, a 0 in
// the table): a zero element stays zero. The affine ones (a fitted min) and
// IQ4 (no 0 in its table) only get close.
bool zero_is_exact(DType t) {
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS: return false;
    default: return true;
  }
}

}  // namespace

// ---- exact decoding -------------------------------------------------------------

TEST(QuantDecode, BlockFormatsMatchPerElementReference) {
  for (const BlockFormat& f : kBlockFormats) {
    SCOPED_TRACE(dtype_name(f.type));
    const int64_t n = 16 * dtype_info(f.type).block_size;
    const std::vector<uint8_t> bytes = random_blocks(f, n, 1234 + static_cast<uint32_t>(f.type));
    const std::vector<float> y = dequantize(f.type, bytes, n);
    int64_t mismatches = 0;
    for (int64_t e = 0; e < n; ++e) {
      const float want = ref_element(f.type, bytes.data(), e);
      if (y[e] != want && mismatches++ < 5)
        ADD_FAILURE() << "element " << e << ": got " << y[e] << " want " << want;
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(QuantDecode, F16DecodesEveryHalfExactly) {
  std::vector<uint16_t> h(65536);
  for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> y(65536);
  dequantize_row(DType::F16, h.data(), y.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = fp16_to_fp32(h[i]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[i])) << "half 0x" << std::hex << i;
    } else {
      EXPECT_EQ(fp32_to_bits(y[i]), fp32_to_bits(want)) << "half 0x" << std::hex << i;
    }
  }
}

TEST(QuantDecode, Bf16AndF32DecodeExactly) {
  std::mt19937 rng(77);
  std::vector<uint16_t> h(1001);
  for (auto& v : h) v = static_cast<uint16_t>(rng());
  std::vector<float> y(h.size());
  dequantize_row(DType::BF16, h.data(), y.data(), static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    const uint32_t want = static_cast<uint32_t>(h[i]) << 16;  // bf16 is the top half of a float
    EXPECT_EQ(fp32_to_bits(y[i]), want) << "bf16 0x" << std::hex << h[i];
  }
  const std::vector<float> x = normal_row(999, 78);
  std::vector<float> z(x.size());
  dequantize_row(DType::F32, x.data(), z.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(std::memcmp(x.data(), z.data(), x.size() * sizeof(float)), 0);
}

// A type added to the dtype table as decodable must get a reference decoder.
TEST(QuantDecode, EveryDecodableTypeIsCovered) {
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const DTypeInfo* info = dtype_info_or_null(raw);
    if (!info || !info->can_decode) continue;
    bool covered = info->type == DType::F32 || info->type == DType::F16 || info->type == DType::BF16;
    for (const auto& f : kBlockFormats) covered |= f.type == info->type;
    EXPECT_TRUE(covered) << info->name << " is decodable but has no reference decoder here";
  }
}

// ---- quantization ---------------------------------------------------------------

// Relative RMS error of quantize -> dequantize on N(0,1) rows of 4096.
// Bounds come from each format's step s: round to nearest leaves an error
// uniform in [-s/2, s/2], RMS s/sqrt(12). Measured: seed 42 here, then the
// range over 200 seeds (checked once with a throwaway driver); each bound
// leaves ~15% above the worst seed.
//  - Q8_0: s = amax/127, amax of 32 normals ~ 2.2: 2.2/127/3.46 = 0.0050.
//    Measured 0.0054 (0.0052-0.0055). Bound 0.0065.
//  - Q6_K: symmetric 6 bits per 16 elements, s ~ amax/32, amax of 16 normals
//    ~ 1.9: 1.9/32/3.46 = 0.017. Measured 0.0178 (0.0170-0.0184). Bound 0.021.
//  - Q4_K: 15 steps over max - min ~ 4.2 per 32 elements: 4.2/15/3.46 =
//    0.081, lowered by the least-squares fit of scale and min. Measured 0.0709
//    (0.069-0.073). Bound 0.082.
//  - Q4_0: s = amax/8: 2.2/8/3.46 = 0.079, plus clipping at +7 steps on the
//    side opposite the block maximum. Measured 0.0873 (0.083-0.089). Bound 0.10.
//  - F16: 10 mantissa bits, ulp 2^-10..2^-11 relative: ulp/3.46 ~ 1.4e-4 to
//    2.8e-4. Measured 2.07e-4 (2.00e-4-2.14e-4). Bound 3e-4.
//  - BF16: 7 mantissa bits, ulp 2^-7..2^-8: 1.1e-3 to 2.3e-3. Measured 1.70e-3
//    (1.60e-3-1.72e-3). Bound 2.5e-3.
//  - Q4_1: 15 steps over max - min ~ 4.2 per 32: 0.081. Measured 0.0768
//    (0.0756-0.0812). Bound 0.093.
//  - Q5_0: s = amax/16: 0.040, plus clipping. Measured 0.0436 (0.0408-0.0442).
//    Bound 0.051.
//  - Q5_1: 31 steps over ~4.2: 0.039. Measured 0.0378 (0.0366-0.0389). Bound 0.045.
//  - Q5_K: as Q4_K with 31 steps: 0.039, lowered by the fit. Measured 0.0359
//    (0.0349-0.0374). Bound 0.043.
//  - Q3_K: 8 levels per 16, s ~ amax/4 ~ 1.9/4: 0.137, plus clipping at +3
//    steps. Measured 0.1531 (0.1462-0.1556). Bound 0.18.
//  - Q2_K: 4 levels and a min per 16, s ~ (max - min)/3 ~ 3.5/3: 0.34, lowered
//    by the absolute-deviation fit. Measured 0.3015 (0.2860-0.3086). Bound 0.355.
//  - IQ4_NL / IQ4_XS: 16 levels denser near 0, fitted scale: a little below
//    Q4_0's 0.079 plus no clipping side. Measured 0.0770 (0.0734-0.0787) /
//    0.0776 (0.0741-0.0792). Bounds 0.09 / 0.091.
//  - MXFP4: E2M1 levels (0, 0.5, ..., 4, 6) on a power-of-two scale that puts
//    amax in [4, 8) scale units; steps of 1-2 units at the top, and values
//    past 6 units clip. Measured 0.1148 (0.1111-0.1184). Bound 0.136.
constexpr double kQ4_0Bound = 0.10;
double rms_bound(DType t) {
  switch (t) {
    case DType::Q8_0: return 0.0065;
    case DType::Q6_K: return 0.021;
    case DType::Q5_K: return 0.043;
    case DType::Q5_1: return 0.045;
    case DType::Q5_0: return 0.051;
    case DType::Q4_K: return 0.082;
    case DType::Q4_1: return 0.093;
    case DType::Q4_0: return kQ4_0Bound;
    case DType::IQ4_NL: return 0.09;
    case DType::IQ4_XS: return 0.091;
    case DType::MXFP4: return 0.136;
    case DType::Q3_K: return 0.18;
    case DType::Q2_K: return 0.355;
    case DType::F16: return 3e-4;
    case DType::BF16: return 2.5e-3;
    default: return 0.0;  // F32: exact
  }
}
TEST(QuantRoundTrip, ErrorWithinFormatStepSize) {
  const std::vector<float> x = normal_row(4096, 42);
  for (DType t : kQuantizable) {
    if (t == DType::F32) continue;
    const std::vector<float> y = dequantize(t, quantize(t, x), 4096);
    const double err = rel_rms_error(x, y);
    EXPECT_LT(err, rms_bound(t)) << dtype_name(t);
    EXPECT_GT(err, 0.0) << dtype_name(t) << " cannot be lossless on random normals";
  }
  EXPECT_EQ(dequantize(DType::F32, quantize(DType::F32, x), 4096), x);
}

// Q4_K spends its extra bits (a fitted min per 32, 6-bit sub-scales) on
// accuracy: on the same data it must beat Q4_0 and lose to Q6_K.
TEST(QuantRoundTrip, KQuantsOrderedByBits) {
  const std::vector<float> x = normal_row(4096, 43);
  auto err = [&](DType t) { return rel_rms_error(x, dequantize(t, quantize(t, x), 4096)); };
  EXPECT_LT(err(DType::Q4_K), err(DType::Q4_0));
  EXPECT_LT(err(DType::Q6_K), err(DType::Q4_K));
  EXPECT_LT(err(DType::Q8_0), err(DType::Q6_K));
  EXPECT_LT(err(DType::Q3_K), err(DType::Q2_K));
  EXPECT_LT(err(DType::Q4_K), err(DType::Q3_K));
  EXPECT_LT(err(DType::Q5_K), err(DType::Q4_K));
  EXPECT_LT(err(DType::Q6_K), err(DType::Q5_K));
  // The non-linear table beats Q4_0's uniform levels at the same 4.5 bits.
  EXPECT_LT(err(DType::IQ4_NL), err(DType::Q4_0));
}

TEST(QuantRoundTrip, Q8_0AndQ4_0AreIdempotent) {
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(dtype_name(t));
    for (uint32_t seed : {1u, 2u, 3u}) {
      std::vector<float> x = normal_row(4096, seed);
      for (auto& v : x) v *= static_cast<float>(seed);  // vary the scale too
      const std::vector<uint8_t> q = quantize(t, x);
      const std::vector<uint8_t> q2 = quantize(t, dequantize(t, q, 4096));
      EXPECT_EQ(q, q2) << "seed " << seed;
    }
  }
}

TEST(QuantRoundTrip, F16AndBf16KeepRepresentableValues) {
  std::mt19937 rng(5);
  std::vector<uint16_t> h16, hb16;
  while (h16.size() < 4096) {
    const uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7c00) != 0x7c00) h16.push_back(h);  // finite halves
  }
  while (hb16.size() < 4096) {
    const uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7f80) != 0x7f80) hb16.push_back(h);  // finite bf16
  }
  for (DType t : {DType::F16, DType::BF16}) {
    const std::vector<uint16_t>& h = t == DType::F16 ? h16 : hb16;
    std::vector<float> x(h.size());
    dequantize_row(t, h.data(), x.data(), static_cast<int64_t>(h.size()));
    std::vector<uint16_t> back(h.size());
    quantize_row(t, x.data(), back.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(back, h) << dtype_name(t);
  }
  // Values between two halves round to nearest even, as ggml does.
  const float between[] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 0.1f, -3.3f};
  uint16_t out[4];
  quantize_row(DType::F16, between, out, 4);
  EXPECT_EQ(out[0], 0x3c00);
  EXPECT_EQ(out[1], 0x3c02);
  EXPECT_EQ(out[2], 0x2e66);  // 0.1 -> 0.0999755859375
  EXPECT_EQ(out[3], 0xc29a);  // -3.3 -> -3.30078125
}

// Q8_0 and Q4_0 bytes follow ggml's reference formulas, checked element by
// element from byte offsets: Q8_0 d = amax/127, q = roundf(x / d) (half away
// from zero); Q4_0 d = max/-8 with the signed max (first largest |x|),
// q = min(15, trunc(x / d + 8.5)), element j < 16 in the low nibble of qs[j],
// element j >= 16 in the high nibble of qs[j - 16].
TEST(QuantSpec, Q8_0AndQ4_0BytesFollowGgmlFormulas) {
  std::vector<float> x = normal_row(2048, 11);
  x[5] = 0.f;       // a zero inside a block
  x[40] = -7.5f;    // a negative block maximum
  const std::vector<uint8_t> q8 = quantize(DType::Q8_0, x);
  const std::vector<uint8_t> q4 = quantize(DType::Q4_0, x);
  for (int64_t blk = 0; blk < 2048 / 32; ++blk) {
    const float* xb = x.data() + blk * 32;
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const uint8_t* b8 = q8.data() + blk * 34;
    const float d8 = amax / 127;
    ASSERT_EQ(b8[0] | (b8[1] << 8), fp32_to_fp16(d8)) << "q8_0 block " << blk;
    for (int j = 0; j < 32; ++j)
      ASSERT_EQ(static_cast<int8_t>(b8[2 + j]), static_cast<int>(std::round(xb[j] * (1.0f / d8))))
          << "q8_0 block " << blk << " element " << j;
    const uint8_t* b4 = q4.data() + blk * 18;
    const float d4 = max / -8;
    ASSERT_EQ(b4[0] | (b4[1] << 8), fp32_to_fp16(d4)) << "q4_0 block " << blk;
    for (int j = 0; j < 32; ++j) {
      const int want = std::min(15, static_cast<int>(xb[j] * (1.0f / d4) + 8.5f));
      ASSERT_EQ(bits(b4 + 2, 8 * (j % 16) + 4 * (j / 16), 4), want) << "q4_0 block " << blk << " element " << j;
    }
  }
}

// The k-quant scale choice of ggml: the largest sub-block scale (and min) maps
// to the top of its 6-bit range in Q4_K, and to -128 in Q6_K's int8 scales.
TEST(QuantSpec, KQuantScalesUseFullRange) {
  const std::vector<float> x = normal_row(4096, 12);
  const std::vector<uint8_t> q4k = quantize(DType::Q4_K, x);
  const std::vector<uint8_t> q6k = quantize(DType::Q6_K, x);
  for (int64_t blk = 0; blk < 16; ++blk) {
    const uint8_t* b = q4k.data() + blk * 144;
    int max_sc = 0, max_m = 0;
    for (int sb = 0; sb < 8; ++sb) {
      int sc, m;
      k_scale_min(b + 4, sb, &sc, &m);
      max_sc = std::max(max_sc, sc);
      max_m = std::max(max_m, m);
    }
    EXPECT_EQ(max_sc, 63) << "q4_k block " << blk;
    EXPECT_EQ(max_m, 63) << "q4_k block " << blk;  // normals: every sub-block has a negative min
    EXPECT_GT(half_at(b), 0.f);
    EXPECT_GT(half_at(b + 2), 0.f);
    const uint8_t* b6 = q6k.data() + blk * 210;
    int min_sc = 0;
    for (int g = 0; g < 16; ++g) min_sc = std::min(min_sc, static_cast<int>(static_cast<int8_t>(b6[192 + g])));
    EXPECT_EQ(min_sc, -128) << "q6_k block " << blk;
  }
}

// After fitting its scales, ggml requantizes every element against the
// stored (rounded) scales, so each element gets the level nearest to it among
// those its sub-block can represent; float rounding at exact midpoints is
// allowed for with a slack of 1e-3 of the step.
TEST(QuantSpec, KQuantLevelsAreNearestForStoredScales) {
  const std::vector<float> x = normal_row(4096, 13);
  for (DType t : {DType::Q4_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> q = quantize(t, x);
    const std::vector<float> y = dequantize(t, q, 4096);
    int64_t checked = 0, not_nearest = 0;
    for (int64_t e = 0; e < 4096; ++e) {
      const uint8_t* b = q.data() + (e / 256) * dtype_info(t).type_size;
      const int i = static_cast<int>(e % 256);
      float step, offset;  // level l decodes to step * l - offset
      int levels;
      if (t == DType::Q4_K) {
        int sc, m;
        k_scale_min(b + 4, i / 32, &sc, &m);
        step = half_at(b) * static_cast<float>(sc);
        offset = half_at(b + 2) * static_cast<float>(m);
        levels = 16;
      } else {
        step = half_at(b + 208) * static_cast<float>(static_cast<int8_t>(b[192 + i / 16]));
        offset = 32 * step;
        levels = 64;
      }
      if (step == 0.f) continue;
      double best = INFINITY;
      for (int l = 0; l < levels; ++l)
        best = std::min(best, std::fabs(static_cast<double>(step) * l - offset - x[e]));
      ++checked;
      if (std::fabs(static_cast<double>(y[e]) - x[e]) > best + 1e-3 * std::fabs(step)) ++not_nearest;
    }
    EXPECT_GT(checked, 4000);
    EXPECT_EQ(not_nearest, 0) << "of " << checked;
  }
}

// ---- known answers: hand-built blocks ---------------------------------------------

namespace {
void put_half(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}
}  // namespace

// Q2_K with d = 1, dmin = 0.25, every sub-block scale 1 and min 2 (scale byte
// 0x21), every qs byte 0b11'10'01'00: element e has level (e % 128) / 32,
// so decodes to level - 0.5.
TEST(QuantKnownAnswer, Q2_K) {
  std::vector<uint8_t> b(84);
  std::fill(b.begin(), b.begin() + 16, 0x21);
  std::fill(b.begin() + 16, b.begin() + 80, 0xE4);
  put_half(&b[80], 1.0f);
  put_half(&b[82], 0.25f);
  const std::vector<float> y = dequantize(DType::Q2_K, b, 256);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], static_cast<float>((e % 128) / 32) - 0.5f) << e;
}

// Q3_K with d = 0.5 and every 6-bit scale 33 (scale 1): low nibbles 1 in
// bytes 0-7 (0x11), top bits 0b10 for all 16 scales in bytes 8-11 (0xAA).
// Levels as in Q2_K; with hmask all set they are 0..3, with hmask clear 4
// lower.
TEST(QuantKnownAnswer, Q3_K) {
  std::vector<uint8_t> b(110);
  std::fill(b.begin(), b.begin() + 32, 0xFF);        // hmask
  std::fill(b.begin() + 32, b.begin() + 96, 0xE4);   // qs
  std::fill(b.begin() + 96, b.begin() + 104, 0x11);  // scale low nibbles
  std::fill(b.begin() + 104, b.begin() + 108, 0xAA); // scale top bits
  put_half(&b[108], 0.5f);
  std::vector<float> y = dequantize(DType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], 0.5f * static_cast<float>((e % 128) / 32)) << e;
  std::fill(b.begin(), b.begin() + 32, 0x00);
  y = dequantize(DType::Q3_K, b, 256);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(y[e], 0.5f * static_cast<float>((e % 128) / 32 - 4)) << e;
}

// IQ4_NL with d = 2: qs[j] = j | (15 - j) << 4 decodes element j to
// 2 * table[j] and element 16 + j to 2 * table[15 - j]. IQ4_XS with d = 0.5
// and sub-block scales 32 + ib (scale ib: 0 for the first sub-block).
TEST(QuantKnownAnswer, Iq4) {
  const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<uint8_t> nl(18);
  put_half(&nl[0], 2.0f);
  for (int j = 0; j < 16; ++j) nl[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = dequantize(DType::IQ4_NL, nl, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * table[j]) << j;
    EXPECT_EQ(y[16 + j], 2.0f * table[15 - j]) << j;
  }
  std::vector<uint8_t> xs(136);
  put_half(&xs[0], 0.5f);
  uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = 32 + ib;
    xs[4 + ib / 2] = static_cast<uint8_t>(xs[4 + ib / 2] | ((ls & 0xF) << (4 * (ib % 2))));
    scales_h = static_cast<uint16_t>(scales_h | ((ls >> 4) << (2 * ib)));
  }
  xs[2] = static_cast<uint8_t>(scales_h & 0xff);
  xs[3] = static_cast<uint8_t>(scales_h >> 8);
  for (int k = 0; k < 128; ++k) xs[8 + k] = static_cast<uint8_t>((k % 16) | ((k % 16) << 4));
  const std::vector<float> z = dequantize(DType::IQ4_XS, xs, 256);
  for (int e = 0; e < 256; ++e) ASSERT_EQ(z[e], 0.5f * static_cast<float>(e / 32) * table[e % 16]) << e;
}

// MXFP4 from the OCP MX spec: E2M1 codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6
// (bit 3 the sign), times the E8M0 scale 2^(e - 127).
TEST(QuantKnownAnswer, Mxfp4) {
  const float e2m1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int e : {127, 130, 100, 1, 0}) {
    std::vector<uint8_t> b(17);
    b[0] = static_cast<uint8_t>(e);
    for (int j = 0; j < 16; ++j) b[1 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const std::vector<float> y = dequantize(DType::MXFP4, b, 32);
    for (int j = 0; j < 16; ++j) {
      const auto value = [&](int code) { return (code & 8 ? -1.f : 1.f) * e2m1[code & 7] * std::ldexp(1.0f, e - 127); };
      EXPECT_EQ(y[j], value(j)) << "e " << e << " code " << j;
      EXPECT_EQ(y[16 + j], value(15 - j)) << "e " << e << " code " << 15 - j;
    }
  }
  EXPECT_EQ(e8m0_to_float_half(0), std::ldexp(1.0f, -128));
  EXPECT_EQ(e8m0_to_float_half(254), std::ldexp(1.0f, 126));
}

// ---- quantizer rules of the new formats ----------------------------------------------

// MXFP4's encoder (ggml's): the exponent puts the block's largest |x| in
// [4, 8) scale units, and every element takes the nearest E2M1 value (the
// top, 6 units, for anything beyond).
TEST(QuantSpec, Mxfp4ExponentAndNearestLevel) {
  std::vector<float> x = normal_row(1024, 31);
  for (int i = 0; i < 1024; i += 97) x[i] *= 40.f;  // spread the block maxima
  x[64] = 0.f;
  const std::vector<uint8_t> q = quantize(DType::MXFP4, x);
  const std::vector<float> y = dequantize(DType::MXFP4, q, 1024);
  const float e2m1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int blk = 0; blk < 32; ++blk) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * blk + j]));
    const float scale = std::ldexp(1.0f, q[17 * blk] - 127);
    EXPECT_GE(amax / scale, 4.f) << blk;
    EXPECT_LT(amax / scale, 8.f) << blk;
    for (int j = 0; j < 32; ++j) {
      const float v = x[32 * blk + j];
      float best = INFINITY;
      for (float l : e2m1) best = std::min(best, std::fabs(std::copysign(l, v) * scale - v));
      ASSERT_EQ(std::fabs(y[32 * blk + j] - v), best) << blk << " " << j;
    }
  }
  EXPECT_EQ(y[64], 0.f);
}

// IQ4 encoders re-pick every index for the stored scale: each element
// decodes to the table value nearest to it among its sub-block's levels.
TEST(QuantSpec, Iq4IndicesAreNearestForStoredScales) {
  const std::vector<float> x = normal_row(2048, 32);
  for (DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> q = quantize(t, x);
    const std::vector<float> y = dequantize(t, q, 2048);
    int64_t not_nearest = 0;
    for (int64_t e = 0; e < 2048; ++e) {
      const uint8_t* b = q.data() + (e / dtype_info(t).block_size) * dtype_info(t).type_size;
      float step = half_at(b);
      if (t == DType::IQ4_XS) {
        const int j = static_cast<int>(e % 256) / 32;
        step *= static_cast<float>((bits(b + 4, 8 * (j / 2) + 4 * (j % 2), 4) | (bits(b + 2, 2 * j, 2) << 4)) - 32);
      }
      double best = INFINITY;
      for (int8_t v : kIq4nlValues) best = std::min(best, std::fabs(static_cast<double>(step) * v - x[e]));
      // IQ4_NL picks indices with the unrounded scale, IQ4_XS with the
      // 6-bit one: allow the fp16 rounding of the stored scale.
      if (std::fabs(static_cast<double>(y[e]) - x[e]) > best + 2e-3 * std::fabs(step) * 127) ++not_nearest;
    }
    EXPECT_EQ(not_nearest, 0);
  }
}

// Every quantizer is deterministic and row-local: a row quantizes to the same
// bytes alone or inside a longer row.
TEST(QuantSpec, QuantizersAreBlockLocal) {
  const std::vector<float> x = normal_row(1024, 33);
  for (DType t : kQuantizable) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> whole = quantize(t, x);
    const std::vector<float> half(x.begin() + 512, x.end());
    const std::vector<uint8_t> second = quantize(t, half);
    const size_t off = dtype_row_bytes(t, 512);
    EXPECT_TRUE(std::equal(second.begin(), second.end(), whole.begin() + static_cast<std::ptrdiff_t>(off)));
  }
}

// ---- edge cases -----------------------------------------------------------------

// A constant row is representable by every format up to the fp16 rounding of
// its scale (relative 2^-11 ~ 4.9e-4; bf16 stores the value itself with 2^-9).
TEST(QuantEdge, ConstantRow) {
  for (float c : {0.37f, -1.9f}) {
    const std::vector<float> x(512, c);
    for (DType t : kQuantizable) {
      if (t == DType::MXFP4) continue;  // E2M1 levels cannot hit an arbitrary value (see QuantSpec.Mxfp4*)
      const std::vector<float> y = dequantize(t, quantize(t, x), 512);
      const double tol = t == DType::BF16 ? 2.5e-3 : 1e-3;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << dtype_name(t);
        ASSERT_NEAR(y[i], c, tol * std::fabs(c)) << dtype_name(t) << " element " << i;
      }
    }
  }
}

// Zeros mixed in, and a whole zero super-block: symmetric formats decode a 0
// to exactly 0, every format decodes an all-zero group to exactly 0, and the
// rest keeps the random-data error bound.
TEST(QuantEdge, ZerosMixedIn) {
  std::vector<float> x = normal_row(1024, 21);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = 0.f;
  for (size_t i = 512; i < 768; ++i) x[i] = 0.f;
  for (DType t : kQuantizable) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> y = dequantize(t, quantize(t, x), 1024);
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
    for (size_t i = 512; i < 768; ++i) ASSERT_EQ(y[i], 0.f) << "element " << i;
    if (zero_is_exact(t)) {
      for (size_t i = 0; i < x.size(); i += 3) ASSERT_EQ(y[i], 0.f) << "element " << i;
    }
    // Zeros carry no signal, so their (nonzero) error in the affine formats
    // weighs more in the relative error: Q2_K measures 0.366 here.
    EXPECT_LT(rel_rms_error(x, y), std::max(kQ4_0Bound, 1.1 * rms_bound(t)));
  }
}

// One outlier 10^4 times the typical value. It is reconstructed within 1%,
// everything stays finite, and blocks not sharing a scale with it keep the
// normal error bound (in the k-quants its super-block's other sub-blocks lose
// precision: their 6/8-bit scales are relative to the outlier's).
TEST(QuantEdge, HugeOutlier) {
  std::vector<float> x = normal_row(1024, 22);
  const size_t at = 300;
  x[at] = 1e4f;
  for (DType t : kQuantizable) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> y = dequantize(t, quantize(t, x), 1024);
    for (float v : y) ASSERT_TRUE(std::isfinite(v));
    // MXFP4's top levels are 4, 6 (x scale): 1e4 = 9.77 * 1024 lands on 8192.
    EXPECT_NEAR(y[at], x[at], (t == DType::MXFP4 ? 0.25 : 1e-2) * x[at]);
    const size_t group = static_cast<size_t>(dtype_info(t).block_size);
    const size_t first = at / group * group;
    const double err = std::max(rel_rms_error(x, y, 0, first), rel_rms_error(x, y, first + group));
    EXPECT_LT(err, std::max(kQ4_0Bound, rms_bound(t)));
  }
}

// ---- dot_row --------------------------------------------------------------------

// dot_row agrees with dequantize + a double-precision dot. The tolerance is
// 1e-4 relative to sum |w_i x_i| (the scale of the float rounding), not to
// the result itself, which cancellation can make arbitrarily small.
TEST(QuantDot, MatchesDequantizeThenDot) {
  auto check = [](DType t, const void* row, int64_t n, uint32_t seed) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> x = normal_row(n, seed);
    std::vector<float> w(static_cast<size_t>(n));
    dequantize_row(t, row, w.data(), n);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(w[i]) * x[i];
      mag += std::fabs(static_cast<double>(w[i]) * x[i]);
    }
    ASSERT_GT(mag, 0.0);
    EXPECT_NEAR(dot_row(t, row, x.data(), n), ref, 1e-4 * mag);
  };
  for (const BlockFormat& f : kBlockFormats) {
    const int64_t n = 4096;
    const std::vector<uint8_t> bytes = random_blocks(f, n, 555 + static_cast<uint32_t>(f.type));
    check(f.type, bytes.data(), n, 9);
    // Real quantized data too, for the types runlm writes.
    if (can_quantize(f.type)) check(f.type, quantize(f.type, normal_row(n, 10)).data(), n, 11);
  }
  // Plain types with a length that is not a multiple of the 8 lanes or the
  // 256-element conversion chunk.
  const int64_t n = 1003;
  const std::vector<float> a = normal_row(n, 12);
  check(DType::F32, a.data(), n, 13);
  check(DType::F16, quantize(DType::F16, a).data(), n, 14);
  check(DType::BF16, quantize(DType::BF16, a).data(), n, 15);
  EXPECT_EQ(dot_row(DType::Q4_0, nullptr, nullptr, 0), 0.f);
}

// ---- bad arguments --------------------------------------------------------------

TEST(QuantArgs, RowLengthMustBeABlockMultiple) {
  std::vector<uint8_t> buf(4096);
  std::vector<float> f(1024);
  EXPECT_THROW(dequantize_row(DType::Q4_0, buf.data(), f.data(), 33), Error);
  EXPECT_THROW(dequantize_row(DType::Q6_K, buf.data(), f.data(), 255), Error);
  EXPECT_THROW(dot_row(DType::Q8_0, buf.data(), f.data(), 31), Error);
  EXPECT_THROW(dot_row(DType::Q4_K, buf.data(), f.data(), -256), Error);
  EXPECT_THROW(quantize_row(DType::Q4_K, f.data(), buf.data(), 100), Error);
  EXPECT_THROW(quantize_row(DType::Q8_0, f.data(), buf.data(), 48), Error);
  EXPECT_THROW(dequantize_row(DType::Q2_K, buf.data(), f.data(), 128), Error);
  EXPECT_THROW(dequantize_row(DType::Q3_K, buf.data(), f.data(), 257), Error);
  EXPECT_THROW(dot_row(DType::IQ4_XS, buf.data(), f.data(), 32), Error);
  EXPECT_THROW(dot_row(DType::IQ4_NL, buf.data(), f.data(), 48), Error);
  EXPECT_THROW(quantize_row(DType::MXFP4, f.data(), buf.data(), 16), Error);
  EXPECT_THROW(quantize_row(DType::Q5_K, f.data(), buf.data(), 512 + 32), Error);
  try {
    dequantize_row(DType::Q4_0, buf.data(), f.data(), 33);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("33"), std::string::npos) << e.what();
  }
}

TEST(QuantArgs, UnsupportedTypesAreNamed) {
  std::vector<uint8_t> buf(4096);
  std::vector<float> f(256, 1.f);
  for (DType t : kQuantizable) EXPECT_TRUE(can_quantize(t)) << dtype_name(t);
  for (DType t : {DType::Q8_1, DType::Q8_K, DType::IQ2_XXS, DType::IQ3_S, DType::I32})
    EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
  try {
    quantize_row(DType::IQ2_XXS, f.data(), buf.data(), 256);
    ADD_FAILURE() << "quantize_row to iq2_xxs did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("iq2_xxs"), std::string::npos) << msg;
    for (DType t : kQuantizable) EXPECT_NE(msg.find(dtype_name(t)), std::string::npos) << msg;
  }
  try {
    dequantize_row(DType::IQ3_S, buf.data(), f.data(), 256);
    ADD_FAILURE() << "dequantize_row of iq3_s did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq3_s"), std::string::npos) << e.what();
  }
  try {
    dot_row(DType::I32, buf.data(), f.data(), 16);
    ADD_FAILURE() << "dot_row of i32 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(static_cast<DType>(99), buf.data(), f.data(), 16), Error);
}
