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
    default: ADD_FAILURE() << "no reference decoder for " << dtype_name(t); return 0.f;
  }
}

// The quantized formats ref_element knows, with the byte offsets of their
// fp16 scale fields.
struct BlockFormat {
  DType type;
  std::vector<int> half_offsets;
};
const std::vector<BlockFormat> kBlockFormats = {
    {DType::Q4_0, {0}},    {DType::Q4_1, {0, 2}}, {DType::Q5_0, {0}},   {DType::Q5_1, {0, 2}},
    {DType::Q8_0, {0}},    {DType::Q4_K, {0, 2}}, {DType::Q5_K, {0, 2}}, {DType::Q6_K, {208}},
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

const std::vector<DType> kQuantizable = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                                         DType::Q4_0, DType::Q4_K, DType::Q6_K};

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
constexpr double kQ4_0Bound = 0.10;  // the loosest format, for mixed rows below
TEST(QuantRoundTrip, ErrorWithinFormatStepSize) {
  const std::vector<float> x = normal_row(4096, 42);
  const struct {
    DType type;
    double bound;
  } cases[] = {{DType::Q8_0, 0.0065}, {DType::Q6_K, 0.021}, {DType::Q4_K, 0.082},
               {DType::Q4_0, kQ4_0Bound}, {DType::F16, 3e-4}, {DType::BF16, 2.5e-3}};
  for (const auto& c : cases) {
    const std::vector<float> y = dequantize(c.type, quantize(c.type, x), 4096);
    const double err = rel_rms_error(x, y);
    EXPECT_LT(err, c.bound) << dtype_name(c.type);
    EXPECT_GT(err, 0.0) << dtype_name(c.type) << " cannot be lossless on random normals";
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

// ---- edge cases -----------------------------------------------------------------

// A constant row is representable by every format up to the fp16 rounding of
// its scale (relative 2^-11 ~ 4.9e-4; bf16 stores the value itself with 2^-9).
TEST(QuantEdge, ConstantRow) {
  for (float c : {0.37f, -1.9f}) {
    const std::vector<float> x(512, c);
    for (DType t : kQuantizable) {
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
    if (t != DType::Q4_K) {
      for (size_t i = 0; i < x.size(); i += 3) ASSERT_EQ(y[i], 0.f) << "element " << i;
    }
    EXPECT_LT(rel_rms_error(x, y), kQ4_0Bound);
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
    EXPECT_NEAR(y[at], x[at], 1e-2 * x[at]);
    const size_t group = static_cast<size_t>(dtype_info(t).block_size);
    const size_t first = at / group * group;
    const double err = std::max(rel_rms_error(x, y, 0, first), rel_rms_error(x, y, first + group));
    EXPECT_LT(err, kQ4_0Bound);
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
  for (DType t : {DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q5_K, DType::Q2_K, DType::I32})
    EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
  try {
    quantize_row(DType::Q5_K, f.data(), buf.data(), 256);
    ADD_FAILURE() << "quantize_row to q5_k did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("q5_k"), std::string::npos) << msg;
    for (DType t : kQuantizable) EXPECT_NE(msg.find(dtype_name(t)), std::string::npos) << msg;
  }
  try {
    dequantize_row(DType::Q2_K, buf.data(), f.data(), 256);
    ADD_FAILURE() << "dequantize_row of q2_k did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q2_k"), std::string::npos) << e.what();
  }
  try {
    dot_row(DType::I32, buf.data(), f.data(), 16);
    ADD_FAILURE() << "dot_row of i32 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("i32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(static_cast<DType>(99), buf.data(), f.data(), 16), Error);
}
