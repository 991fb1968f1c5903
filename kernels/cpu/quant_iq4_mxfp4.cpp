// The 4-bit formats whose codes index a table of levels instead of being
// levels themselves: IQ4_NL (32-element blocks, one half scale), IQ4_XS
// (IQ4_NL's table in 256-element super-blocks with 6-bit sub-block scales)
// and MXFP4 (32 E2M1 values with an E8M0 power-of-two scale). Decoding is
// bit-exact with ggml's dequantize_row_iq4_nl / iq4_xs / mxfp4; encoding
// follows what llama-quantize runs without an importance matrix:
// quantize_iq4_nl / quantize_iq4_xs (scale search over 15 candidates) and
// quantize_row_mxfp4_ref.
//
// In every block, byte j of qs holds element j in its low nibble and
// element j + 16 in its high nibble (per 32 elements).
#include <cmath>
#include <cstring>

#include "quant_blocks.h"

namespace runlm {

float e8m0_to_float_half(uint8_t e) {
  // e >= 2: 2^(e - 128) has the float exponent field e - 1. e = 0, 1: the
  // subnormals 2^-128 and 2^-127 (mantissa bit 21, 22).
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return fp32_from_bits(bits);
}

namespace quant_detail {

namespace {

// ---- decoders --------------------------------------------------------------

void decode_iq4_nl(const BlockIQ4_NL& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[b.qs[j] & 0xF]);
    y[j + kQK / 2] = d * static_cast<float>(kIq4nlValues[b.qs[j] >> 4]);
  }
}

// Sub-block ib's scale: low 4 bits in nibble ib % 2 of scales_l[ib / 2],
// top 2 bits in bits 2 ib of scales_h; bias 32.
inline int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
  return (((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b.scales_h >> (2 * ib)) & 3) << 4)) - 32;
}

void decode_iq4_xs(const BlockIQ4_XS& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  for (int ib = 0; ib < kQK_K / 32; ++ib) {
    const float dl = d * static_cast<float>(iq4_xs_scale(b, ib));
    const uint8_t* qs = b.qs + 16 * ib;
    float* out = y + 32 * ib;
    for (int j = 0; j < 16; ++j) {
      out[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      out[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

void decode_mxfp4(const BlockMXFP4& __restrict b, float* __restrict y) {
  const float d = e8m0_to_float_half(b.e);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(kMxfp4Values[b.qs[j] & 0xF]) * d;
    y[j + kQK / 2] = static_cast<float>(kMxfp4Values[b.qs[j] >> 4]) * d;
  }
}

// ---- IQ4 encoder (ggml's quantize_row_iq4_nl_impl, no importance weights) ---

// Index of the table value nearest to x (ties to the lower one); the table
// is sorted.
int best_index_int8(int n, const int8_t* val, float x) {
  if (x <= val[0]) return 0;
  if (x >= val[n - 1]) return n - 1;
  int ml = 0, mu = n - 1;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) mu = mav;
    else ml = mav;
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

// Search width: llama-quantize's quantize_iq4_nl / iq4_xs try 2 * 7 + 1
// inverse scales per 32 elements.
constexpr int kIq4Tries = 7;

// Encodes super_block elements (32 for IQ4_NL, 256 for IQ4_XS) in 32-element
// sub-blocks. Each sub-block's scale is the weighted (x^2) least-squares fit
// over the levels picked with the best of 15 trial scales; with several
// sub-blocks, the scales are then stored as 6-bit multiples of a half
// super-scale and every level re-picked for its stored scale.
void quantize_iq4_impl(int super_block, const float* x, uint16_t* dh, uint8_t* q4, uint16_t* scales_h,
                       uint8_t* scales_l) {
  constexpr int kBlock = 32;
  const int8_t* values = kIq4nlValues;
  uint8_t L[kQK_K];
  float scales[kQK_K / kBlock];
  float weight[kBlock];
  std::memset(q4, 0, static_cast<size_t>(super_block / 2));
  *dh = fp32_to_fp16(0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < super_block / kBlock; ++ib) {
    const float* xb = x + ib * kBlock;
    uint8_t* Lb = L + ib * kBlock;
    for (int j = 0; j < kBlock; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < kBlock; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / static_cast<float>(values[0]);
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < kBlock; ++j) {
      const int l = best_index_int8(16, values, id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      const float w = weight[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -kIq4Tries; itry <= kIq4Tries; ++itry) {
      id = static_cast<float>(itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < kBlock; ++j) {
        const float q = values[best_index_int8(16, values, id * xb[j])];
        const float w = weight[j];
        sumqx += w * q * xb[j];
        sumq2 += w * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }

  if (super_block > kBlock) {
    *scales_h = 0;
    // The largest scale maps to -32 so the signed 6-bit scales use their range.
    const float d = -max_scale / 32;
    *dh = fp32_to_fp16(d);
    const float id = d != 0.f ? 1 / d : 0.f;
    for (int ib = 0; ib < super_block / kBlock; ++ib) {
      int l = nearest_int(id * scales[ib]);
      l = std::max(-32, std::min(31, l));
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.f ? 1 / dl : 0.f;
      uint8_t* Lb = L + ib * kBlock;
      const float* xb = x + ib * kBlock;
      for (int j = 0; j < kBlock; ++j) Lb[j] = static_cast<uint8_t>(best_index_int8(16, values, idl * xb[j]));
      l += 32;
      const uint8_t l_l = static_cast<uint8_t>(l & 0xF), l_h = static_cast<uint8_t>(l >> 4);
      if (ib % 2 == 0) scales_l[ib / 2] = l_l;
      else scales_l[ib / 2] = static_cast<uint8_t>(scales_l[ib / 2] | (l_l << 4));
      *scales_h = static_cast<uint16_t>(*scales_h | (l_h << (2 * ib)));
    }
  } else {
    *dh = fp32_to_fp16(scales[0]);
    const float id = scales[0] != 0.f ? 1 / scales[0] : 0.f;
    for (int j = 0; j < super_block; ++j) L[j] = static_cast<uint8_t>(best_index_int8(16, values, id * x[j]));
  }
  for (int i = 0; i < super_block / 32; ++i)
    for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

// ---- MXFP4 encoder (ggml's quantize_row_mxfp4_ref) --------------------------

// Nearest table level to x at scale e (first of equals: +0 before -0).
int best_index_mxfp4(float x, float e) {
  int best_index = 0;
  float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * e - x);
  for (int i = 1; i < 16; ++i) {
    const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * e - x);
    if (err < best_err) {
      best_index = i;
      best_err = err;
    }
  }
  return best_index;
}

// The exponent puts the block's largest |x| in [4, 8) times the halved scale,
// i.e. near the top E2M1 level 6 (doubled: 12).
void quantize_mxfp4_block(const float* x, BlockMXFP4& y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  // ggml converts the float exponent to uint8_t directly; going through int
  // gives the same byte for every in-range value without float -> uint8 UB.
  const uint8_t e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int>(std::floor(std::log2(amax)) - 2 + 127)) : 0;
  const float d = e8m0_to_float_half(e);
  y.e = e;
  for (int j = 0; j < kQK / 2; ++j) {
    const int x0 = best_index_mxfp4(x[j], d);
    const int x1 = best_index_mxfp4(x[j + kQK / 2], d);
    y.qs[j] = static_cast<uint8_t>(x0 | (x1 << 4));
  }
}

}  // namespace

void dequantize_iq4_nl(const void* src, float* dst, int64_t nb) {
  dequantize_blocks<BlockIQ4_NL, kQK, decode_iq4_nl>(src, dst, nb);
}
void dequantize_iq4_xs(const void* src, float* dst, int64_t nb) {
  dequantize_blocks<BlockIQ4_XS, kQK_K, decode_iq4_xs>(src, dst, nb);
}
void dequantize_mxfp4(const void* src, float* dst, int64_t nb) {
  dequantize_blocks<BlockMXFP4, kQK, decode_mxfp4>(src, dst, nb);
}
float dot_iq4_nl(const void* row, const float* x, int64_t nb) {
  return dot_blocks<BlockIQ4_NL, kQK, decode_iq4_nl>(row, x, nb);
}
float dot_iq4_xs(const void* row, const float* x, int64_t nb) {
  return dot_blocks<BlockIQ4_XS, kQK_K, decode_iq4_xs>(row, x, nb);
}
float dot_mxfp4(const void* row, const float* x, int64_t nb) {
  return dot_blocks<BlockMXFP4, kQK, decode_mxfp4>(row, x, nb);
}
void quantize_iq4_nl(const float* x, void* dst, int64_t nb) {
  BlockIQ4_NL* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < nb; ++i) {
    uint16_t d = 0;  // locals: the packed struct's fields may not be bound to pointers
    quantize_iq4_impl(kQK, x + i * kQK, &d, y[i].qs, nullptr, nullptr);
    y[i].d = d;
  }
}
void quantize_iq4_xs(const float* x, void* dst, int64_t nb) {
  BlockIQ4_XS* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < nb; ++i) {
    uint16_t d = 0, scales_h = 0;
    quantize_iq4_impl(kQK_K, x + i * kQK_K, &d, y[i].qs, &scales_h, y[i].scales_l);
    y[i].d = d;
    y[i].scales_h = scales_h;
  }
}
void quantize_mxfp4(const float* x, void* dst, int64_t nb) {
  BlockMXFP4* y = static_cast<BlockMXFP4*>(dst);
  for (int64_t i = 0; i < nb; ++i) quantize_mxfp4_block(x + i * kQK, y[i]);
}

}  // namespace quant_detail
}  // namespace runlm
