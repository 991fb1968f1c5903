// CPU reference for the GGUF block formats: dequantization, quantization and
// the row dot product used by the CPU matmul. This file holds the 32-element
// formats (Q4_0 .. Q8_0), Q4_K..Q6_K and the dispatch; Q2_K/Q3_K live in
// quant_q2_q3_k.cpp and the table-valued IQ4_NL/IQ4_XS/MXFP4 in
// quant_iq4_mxfp4.cpp (shared helpers: quant_blocks.h).
//
// Decoding reproduces ggml's dequantize_row_* bit for bit: every decoder keeps
// ggml's order of float operations (e.g. Q6_K is (d * scale) * q, not
// d * (scale * q)), so GPU kernels can be checked against it exactly.
// Quantization follows ggml's quantize_row_*_ref, including its search for the
// scales (make_qkx2_quants for Q4_K and Q5_K, make_qx_quants for Q6_K) and its rounding
// (nearest_int is round-half-even through the 1.5 * 2^23 trick, roundf is
// half away from zero), so the bytes match llama.cpp's for the same input.
//
// dot_row decodes one block into a stack buffer (the same decoders) and dots
// it with x in 8 float lanes. Versions, measured single-threaded on a
// 4096-wide row, SSE2 baseline, in Gelem/s for q8_0 / q4_0 / q4_k / q6_k:
//  v1: plain float loops and one accumulator chain: 3.1 / 2.9 / 6.1 / 1.4.
//  v1b: fused decode-and-dot per format, scaling block sums: no better
//      (GCC left most of those loops scalar), dropped.
//  v2 (this): lanes as GCC vector types, fresh lanes per block added to the
//      total, vectorisable decoders (Q5 high bits spread by table, Q6_K one
//      scale per loop, branch-free half -> float): 6.5 / 5.6 / 6.1 / 3.5.
#include "quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "../../src/common.h"
#include "quant_blocks.h"

namespace runlm {

using namespace quant_detail;

static_assert(std::endian::native == std::endian::little,
              "GGUF blocks are little endian and are read in place");

void unpack_k_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    mn[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

namespace {

constexpr const char* kQuantizable =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4";

// ---- k-quant 6-bit scale packing -------------------------------------------
// The inverse of unpack_k_scales (quant.h).
inline void pack_k_scales(const uint8_t* sc, const uint8_t* mn, uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = sc[j];
    s[j + 4] = mn[j];
  }
  for (int j = 4; j < 8; ++j) {
    s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
    s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
    s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
  }
}

// Q5_0/Q5_1 keep the 5th bit of element j in bit j of a 32-bit qh. Shifting
// by a different amount per element does not vectorise before AVX2, so the
// bits are spread to one byte each (0 or 0x10) through a table of 8 bytes per
// qh byte.
struct BitSpreadTable {
  uint64_t v[256];
  constexpr BitSpreadTable() : v() {
    for (int i = 0; i < 256; ++i)
      for (int k = 0; k < 8; ++k)
        if ((i >> k) & 1) v[i] |= uint64_t{0x10} << (8 * k);
  }
};
constexpr BitSpreadTable kBitSpread;

inline void spread_qh(const uint8_t* qh, uint8_t* hi) {
  for (int i = 0; i < 4; ++i) std::memcpy(hi + 8 * i, &kBitSpread.v[qh[i]], 8);
}

// ---- block decoders (ggml's dequantize_row_*, one block) -------------------

void decode_q4_0(const BlockQ4_0& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < kQK / 2; ++j) y[j] = static_cast<float>((b.qs[j] & 0xF) - 8) * d;
  for (int j = 0; j < kQK / 2; ++j) y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
}

void decode_q4_1(const BlockQ4_1& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(b.qs[j] & 0xF) * d + m;
    y[j + kQK / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
  }
}

void decode_q5_0(const BlockQ5_0& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  uint8_t hi[kQK];
  spread_qh(b.qh, hi);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>(((b.qs[j] & 0xF) | hi[j]) - 16) * d;
    y[j + kQK / 2] = static_cast<float>(((b.qs[j] >> 4) | hi[j + kQK / 2]) - 16) * d;
  }
}

void decode_q5_1(const BlockQ5_1& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  const float m = half_to_float(b.m);
  uint8_t hi[kQK];
  spread_qh(b.qh, hi);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = static_cast<float>((b.qs[j] & 0xF) | hi[j]) * d + m;
    y[j + kQK / 2] = static_cast<float>((b.qs[j] >> 4) | hi[j + kQK / 2]) * d + m;
  }
}

void decode_q8_0(const BlockQ8_0& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// qs holds 4 chunks of 64 elements in 32 bytes each: low nibbles are the
// chunk's first 32 elements (sub-block 2c), high nibbles the next 32 (2c+1).
void decode_q4_k(const BlockQ4_K& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  uint8_t sc[8], mn[8];
  unpack_k_scales(b.scales, sc, mn);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = b.qs + 32 * c;
    float* out = y + 64 * c;
    const float d1 = d * sc[2 * c], m1 = dmin * mn[2 * c];
    const float d2 = d * sc[2 * c + 1], m2 = dmin * mn[2 * c + 1];
    for (int l = 0; l < 32; ++l) out[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) out[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

// As Q4_K; the 5th bit of element e is bit e/32 of qh[e%32].
void decode_q5_k(const BlockQ5_K& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  const float dmin = half_to_float(b.dmin);
  uint8_t sc[8], mn[8];
  unpack_k_scales(b.scales, sc, mn);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* q = b.qs + 32 * c;
    float* out = y + 64 * c;
    const float d1 = d * sc[2 * c], m1 = dmin * mn[2 * c];
    const float d2 = d * sc[2 * c + 1], m2 = dmin * mn[2 * c + 1];
    const int lo_bit = 2 * c, hi_bit = 2 * c + 1;
    for (int l = 0; l < 32; ++l)
      out[l] = d1 * static_cast<float>((q[l] & 0xF) + (((b.qh[l] >> lo_bit) & 1) << 4)) - m1;
    for (int l = 0; l < 32; ++l)
      out[32 + l] = d2 * static_cast<float>((q[l] >> 4) + (((b.qh[l] >> hi_bit) & 1) << 4)) - m2;
  }
}

// Level of element 32*g + l (g = 0..3, l = 0..31) of a Q6_K half: low 4 bits
// from ql[l + 32*(g&1)] (low nibble for g < 2, high for g >= 2), top 2 bits
// from bits 2g, 2g+1 of qh[l].
inline int q6_level(const uint8_t* ql, const uint8_t* qh, int g, int l) {
  return (((ql[l + 32 * (g & 1)] >> (4 * (g >> 1))) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
}

// Two halves of 128 elements with 64 ql, 32 qh bytes and 8 int8 scales (one
// per 16 elements) each. ggml computes (d * scale) * q; so does this.
void decode_q6_k(const BlockQ6_K& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    const int8_t* sc = b.scales + 8 * half;
    float* out = y + 128 * half;
    for (int g = 0; g < 4; ++g) {
      for (int s = 0; s < 2; ++s) {
        const float ds = d * static_cast<float>(sc[2 * g + s]);
        for (int l = 16 * s; l < 16 * s + 16; ++l) out[32 * g + l] = ds * static_cast<float>(q6_level(ql, qh, g, l));
      }
    }
  }
}

void convert_f16(const uint16_t* __restrict h, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = half_to_float(h[i]);
}
void convert_bf16(const uint16_t* __restrict h, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(h[i]);
}

// ---- dot products -------------------------------------------------------------

// Plain 16-bit types: convert a chunk into a stack buffer, then dot.
template <void (*Convert)(const uint16_t*, float*, int64_t)>
float dot_16bit(const void* src, const float* x, int64_t n) {
  constexpr int64_t kChunk = 256;
  const uint16_t* h = static_cast<const uint16_t*>(src);
  Lanes s;
  float buf[kChunk];
  float tail = 0.f;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    Convert(h + i, buf, len);
    const int64_t body = len - len % kLanes;
    for (int64_t j = 0; j < body; j += kLanes) s.mul_add(buf + j, x + i + j);
    for (int64_t j = body; j < len; ++j) tail += buf[j] * x[i + j];
  }
  return s.sum() + tail;
}

float dot_f32(const float* a, const float* x, int64_t n) {
  Lanes s;
  const int64_t body = n - n % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) s.mul_add(a + i, x + i);
  float tail = 0.f;
  for (int64_t i = body; i < n; ++i) tail += a[i] * x[i];
  return s.sum() + tail;
}

// ---- quantizers (ggml's quantize_row_*_ref) ---------------------------------

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

// The scale is signed so that the largest-magnitude element maps to -8, the
// one level the asymmetric range [-8, 7] has no mirror for.
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // Truncation of x + 8.5 is rounding to nearest of x + 8 (x + 8.5 >= 0).
      const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Asymmetric 4-bit: levels 0..15 between the block's min and max.
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Q5_0 is Q4_0 with 32 levels: the largest-magnitude element maps to -16.
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
      const int q1 = std::min(31, static_cast<int>(x[j + kQK / 2] * id + 16.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

// Q5_1 is Q4_1 with 32 levels. ggml does not clamp to 31 here: (max - min)
// * id + 0.5 stays below 31.5 in float, so the level fits.
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min = x[0], max = x[0];
    for (int j = 1; j < kQK; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
      const int q1 = static_cast<uint8_t>((x[j + kQK / 2] - min) * id + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + kQK / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof(qh));
  }
}

}  // namespace

// Declared in quant_blocks.h (Q2_K uses it too, with use_mad).
float quant_detail::make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                                     bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  auto err = [use_mad](float diff) { return use_mad ? std::fabs(diff) : diff * diff; };
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * err(diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * Laux[i] + this_min - x[i];
        cur_error += weights[i] * err(diff);
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

namespace {

// The fit Q4_K and Q5_K share (ggml's quantize_row_q4_K/q5_K_ref): each
// sub-block of 32 gets an asymmetric fit with levels 0..nmax, the 8 scales
// and mins are rounded to 6 bits against the block's largest, and every
// element is then requantized against the stored (rounded) scales. Writes
// the levels L[256], the packed scales and the block's d and dmin. The
// scale search tries nstep + 1 inverse scales, 0.1 apart from rmin.
void fit_k_block(const float* x, int nmax, float rmin, int nstep, uint8_t* L, uint8_t* packed_scales, uint16_t* d_out,
                 uint16_t* dmin_out) {
  uint8_t Laux[32];
  float weights[32];
  float mins[kQK_K / 32], scales[kQK_K / 32];
  float max_scale = 0, max_min = 0;  // scales and mins are >= 0 here
  for (int j = 0; j < kQK_K / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    // Weights favour large elements, floored by the sub-block's RMS.
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < kQK_K / 32; ++j) {
    // The uint8 wrap happens before the clamp, as in ggml.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  pack_k_scales(ls, lm, packed_scales);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);
  // A sub-block whose scale rounded to 0 keeps the levels found above.
  const float dd = half_to_float(*d_out);
  const float dm_all = half_to_float(*dmin_out);
  for (int j = 0; j < kQK_K / 32; ++j) {
    const float d = dd * ls[j];
    if (d == 0.f) continue;
    const float dm = dm_all * lm[j];
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    fit_k_block(x, 15, -1.f, 20, L, y[i].scales, &y[i].d, &y[i].dmin);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        y[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + l + 32] << 4));
  }
}

// As Q4_K with 5-bit levels (nmax 31) and a narrower scale search (16
// steps of 0.1 from -0.5, against Q4_K's 21 from -1).
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    fit_k_block(x, 31, -0.5f, 15, L, y[i].scales, &y[i].d, &y[i].dmin);
    // Chunk c of 64: low nibbles of the first 32 in qs[32c..], high nibbles
    // of the next 32; the 5th bits go to bits 2c and 2c+1 of qh.
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 32; ++j) {
        const int l1 = L[64 * c + j], l2 = L[64 * c + j + 32];
        y[i].qh[j] |= static_cast<uint8_t>(((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1)));
        y[i].qs[32 * c + j] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
      }
    }
  }
}

// ggml's make_qx_quants with rmse_type = 1 and no importance weights: a
// symmetric fit x ~ scale * (L - nmax), L in [0, 2 nmax), weighting each
// element by x^2 and trying 18 inverse scales around -nmax / max.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float lf = static_cast<float>(l);
    sumlx += w * x[i] * lf;
    suml2 += w * lf * lf;
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = x[i] * x[i];
      const float lf = static_cast<float>(l);
      sumlx += w * x[i] * lf;
      suml2 += w * lf * lf;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[kQK_K / 16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    // The largest scale maps to -128 so the int8 scales use their full range.
    const float iscale = -128.f / max_scale;
    y[i].d = fp32_to_fp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib)
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    const float dd = half_to_float(y[i].d);
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = dd * y[i].scales[j];
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii) {
        const int l = nearest_int(x[16 * j + ii] / d);
        L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
      }
    }
    for (int half = 0; half < 2; ++half) {
      const int8_t* Lh = L + 128 * half;
      uint8_t* ql = y[i].ql + 64 * half;
      uint8_t* qh = y[i].qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

// Checks n against t's block size; returns the number of blocks.
int64_t checked_blocks(const char* what, DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  RUNLM_CHECK(n >= 0 && n % info.block_size == 0,
              "%s: %s row of %lld elements is not a multiple of the block size %lld", what, info.name,
              static_cast<long long>(n), static_cast<long long>(info.block_size));
  return n / info.block_size;
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int64_t nb = checked_blocks("dequantize_row", t, n);
  switch (t) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: return convert_f16(static_cast<const uint16_t*>(src), dst, n);
    case DType::BF16: return convert_bf16(static_cast<const uint16_t*>(src), dst, n);
    case DType::Q4_0: return dequantize_blocks<BlockQ4_0, kQK, decode_q4_0>(src, dst, nb);
    case DType::Q4_1: return dequantize_blocks<BlockQ4_1, kQK, decode_q4_1>(src, dst, nb);
    case DType::Q5_0: return dequantize_blocks<BlockQ5_0, kQK, decode_q5_0>(src, dst, nb);
    case DType::Q5_1: return dequantize_blocks<BlockQ5_1, kQK, decode_q5_1>(src, dst, nb);
    case DType::Q8_0: return dequantize_blocks<BlockQ8_0, kQK, decode_q8_0>(src, dst, nb);
    case DType::Q4_K: return dequantize_blocks<BlockQ4_K, kQK_K, decode_q4_k>(src, dst, nb);
    case DType::Q5_K: return dequantize_blocks<BlockQ5_K, kQK_K, decode_q5_k>(src, dst, nb);
    case DType::Q6_K: return dequantize_blocks<BlockQ6_K, kQK_K, decode_q6_k>(src, dst, nb);
    case DType::Q2_K: return dequantize_q2_k(src, dst, nb);
    case DType::Q3_K: return dequantize_q3_k(src, dst, nb);
    case DType::IQ4_NL: return dequantize_iq4_nl(src, dst, nb);
    case DType::IQ4_XS: return dequantize_iq4_xs(src, dst, nb);
    case DType::MXFP4: return dequantize_mxfp4(src, dst, nb);
    default: break;
  }
  fail("dequantize_row: type %s cannot be decoded", dtype_name(t));
}

float dot_row(DType t, const void* row, const float* x, int64_t n) {
  const int64_t nb = checked_blocks("dot_row", t, n);
  switch (t) {
    case DType::F32: return dot_f32(static_cast<const float*>(row), x, n);
    case DType::F16: return dot_16bit<convert_f16>(row, x, n);
    case DType::BF16: return dot_16bit<convert_bf16>(row, x, n);
    case DType::Q4_0: return dot_blocks<BlockQ4_0, kQK, decode_q4_0>(row, x, nb);
    case DType::Q4_1: return dot_blocks<BlockQ4_1, kQK, decode_q4_1>(row, x, nb);
    case DType::Q5_0: return dot_blocks<BlockQ5_0, kQK, decode_q5_0>(row, x, nb);
    case DType::Q5_1: return dot_blocks<BlockQ5_1, kQK, decode_q5_1>(row, x, nb);
    case DType::Q8_0: return dot_blocks<BlockQ8_0, kQK, decode_q8_0>(row, x, nb);
    case DType::Q4_K: return dot_blocks<BlockQ4_K, kQK_K, decode_q4_k>(row, x, nb);
    case DType::Q5_K: return dot_blocks<BlockQ5_K, kQK_K, decode_q5_k>(row, x, nb);
    case DType::Q6_K: return dot_blocks<BlockQ6_K, kQK_K, decode_q6_k>(row, x, nb);
    case DType::Q2_K: return dot_q2_k(row, x, nb);
    case DType::Q3_K: return dot_q3_k(row, x, nb);
    case DType::IQ4_NL: return dot_iq4_nl(row, x, nb);
    case DType::IQ4_XS: return dot_iq4_xs(row, x, nb);
    case DType::MXFP4: return dot_mxfp4(row, x, nb);
    default: break;
  }
  fail("dot_row: type %s cannot be decoded", dtype_name(t));
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::MXFP4: return true;
    default: return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  RUNLM_CHECK(can_quantize(t), "quantize_row: cannot quantize to %s; supported: %s", dtype_name(t),
              kQuantizable);
  const int64_t nb = checked_blocks("quantize_row", t, n);
  switch (t) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      uint16_t* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      uint16_t* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
      return;
    }
    case DType::Q8_0: return quantize_q8_0(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q4_0: return quantize_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_K: return quantize_q4_k(src, static_cast<BlockQ4_K*>(dst), nb);
    case DType::Q6_K: return quantize_q6_k(src, static_cast<BlockQ6_K*>(dst), nb);
    case DType::Q4_1: return quantize_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::Q5_0: return quantize_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1: return quantize_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q5_K: return quantize_q5_k(src, static_cast<BlockQ5_K*>(dst), nb);
    case DType::Q2_K: return quantize_q2_k(src, dst, nb);
    case DType::Q3_K: return quantize_q3_k(src, dst, nb);
    case DType::IQ4_NL: return quantize_iq4_nl(src, dst, nb);
    case DType::IQ4_XS: return quantize_iq4_xs(src, dst, nb);
    case DType::MXFP4: return quantize_mxfp4(src, dst, nb);
    default: break;
  }
  fail("quantize_row: cannot quantize to %s; supported: %s", dtype_name(t), kQuantizable);
}

}  // namespace runlm
