// Q2_K and Q3_K, the 2- and 3-bit k-quants (Q2_K, Q3_K_S/M/L files):
// decoding bit-exact with ggml's dequantize_row_q2_K / q3_K, and encoding
// as ggml's quantize_row_q2_K_ref / q3_K_ref (what llama-quantize runs
// without an importance matrix).
//
// Both split a super-block of 256 into 16 sub-blocks of 16 with a scale
// each. Levels are stored 2 bits at a time: byte l of the 32-byte group g
// (g = 0, 1 for elements 0-127, 128-255) holds, in bits 2s..2s+1, the level
// of element 128 g + 32 s + l (s = 0..3).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant_blocks.h"

namespace runlm::quant_detail {

namespace {

// ---- Q2_K: x = d * (scale & 15) * q - dmin * (scale >> 4), q in 0..3 --------

void decode_q2_k(const BlockQ2_K& __restrict b, float* __restrict y) {
  const float d = half_to_float(b.d);
  const float min = half_to_float(b.dmin);
  for (int g = 0; g < 2; ++g) {
    const uint8_t* q = b.qs + 32 * g;
    for (int s = 0; s < 4; ++s) {
      const int shift = 2 * s;
      for (int h = 0; h < 2; ++h) {  // two sub-blocks of 16 per 32 bytes
        const uint8_t sc = b.scales[8 * g + 2 * s + h];
        const float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
        float* out = y + 128 * g + 32 * s + 16 * h;
        for (int l = 0; l < 16; ++l) out[l] = dl * static_cast<float>((q[16 * h + l] >> shift) & 3) - ml;
      }
    }
  }
}

void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int g = 0; g < 2; ++g)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* Lg = L + 128 * g;
      qs[32 * g + l] = static_cast<uint8_t>(Lg[l] | (Lg[l + 32] << 2) | (Lg[l + 64] << 4) | (Lg[l + 96] << 6));
    }
}

void quantize_q2_k_block(const float* x, BlockQ2_K& y) {
  constexpr float kQ4Scale = 15.f;
  uint8_t L[kQK_K];
  uint8_t Laux[16];
  float weights[16];
  float mins[kQK_K / 16], scales[kQK_K / 16];
  float max_scale = 0, max_min = 0;  // scales and mins are >= 0 here
  for (int j = 0; j < kQK_K / 16; ++j) {
    for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
    // Least absolute deviation (use_mad): 2-bit levels are too coarse for
    // squared error to pick good scales.
    scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  if (max_scale > 0) {
    const float iscale = kQ4Scale / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) y.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
    y.d = fp32_to_fp16(max_scale / kQ4Scale);
  } else {
    std::memset(y.scales, 0, sizeof(y.scales));
    y.d = fp32_to_fp16(0.f);
  }
  if (max_min > 0) {
    const float iscale = kQ4Scale / max_min;
    for (int j = 0; j < kQK_K / 16; ++j)
      y.scales[j] = static_cast<uint8_t>(y.scales[j] | (nearest_int(iscale * mins[j]) << 4));
    y.dmin = fp32_to_fp16(max_min / kQ4Scale);
  } else {
    y.dmin = fp32_to_fp16(0.f);
  }
  // Requantize against the stored scales; a sub-block whose scale rounded to
  // 0 keeps the levels of the search.
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = half_to_float(y.d) * static_cast<float>(y.scales[j] & 0xF);
    if (d == 0.f) continue;
    const float dm = half_to_float(y.dmin) * static_cast<float>(y.scales[j] >> 4);
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int((x[16 * j + ii] + dm) / d);
      L[16 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(3, l)));
    }
  }
  pack_2bit(L, y.qs);
}

// ---- Q3_K: x = d * (scale - 32) * (q - 4), q in 0..7 --------------------------

// Sub-block j's 6-bit scale: low 4 bits in the low (j < 8) or high (j >= 8)
// nibble of scales[j % 8], top 2 bits in bits 2 (j / 4) of scales[8 + j % 4].
inline int q3_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  return (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

// The high bit of element e is bit e / 32 of hmask[e % 32]; a clear bit
// subtracts 4.
void decode_q3_k(const BlockQ3_K& __restrict b, float* __restrict y) {
  const float d_all = half_to_float(b.d);
  for (int g = 0; g < 2; ++g) {
    const uint8_t* q = b.qs + 32 * g;
    for (int s = 0; s < 4; ++s) {
      const int shift = 2 * s;
      const uint8_t m = static_cast<uint8_t>(1u << (4 * g + s));
      for (int h = 0; h < 2; ++h) {
        const float dl = d_all * static_cast<float>(q3_scale(b.scales, 8 * g + 2 * s + h));
        float* out = y + 128 * g + 32 * s + 16 * h;
        for (int l = 0; l < 16; ++l) {
          const int i = 16 * h + l;
          out[l] = dl * static_cast<float>(((q[i] >> shift) & 3) - ((b.hmask[i] & m) ? 0 : 4));
        }
      }
    }
  }
}

// ggml's make_q3_quants with do_rmse: a symmetric fit x ~ scale * L, L in
// [-nmax, nmax), weighted by x^2, then up to 5 passes that move single
// levels while that raises sumlx^2 / suml2 (lowers the weighted error).
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
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
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * static_cast<float>(l);
    suml2 += w * static_cast<float>(l) * static_cast<float>(l);  // (w * l) * l, as ggml
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * static_cast<float>(L[i]);
      if (slx > 0) {
        float sl2 = suml2 - w * static_cast<float>(L[i]) * static_cast<float>(L[i]);
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * static_cast<float>(new_l);
          sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void quantize_q3_k_block(const float* x, BlockQ3_K& y) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < kQK_K / 16; ++j) {
    scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
    const float scale = std::fabs(scales[j]);
    if (scale > amax) {
      amax = scale;
      max_scale = scales[j];
    }
  }
  std::memset(y.scales, 0, sizeof(y.scales));
  if (max_scale != 0.f) {
    // The largest scale maps to -32 so the signed 6-bit scales use their range.
    const float iscale = -32.f / max_scale;
    for (int j = 0; j < kQK_K / 16; ++j) {
      // ggml stores nearest_int in an int8_t before clamping; so does this.
      int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
      l = static_cast<int8_t>(std::max<int>(-32, std::min<int>(31, l)) + 32);
      if (j < 8) y.scales[j] = static_cast<uint8_t>(l & 0xF);
      else y.scales[j - 8] = static_cast<uint8_t>(y.scales[j - 8] | ((l & 0xF) << 4));
      l = static_cast<int8_t>(l >> 4);
      y.scales[j % 4 + 8] = static_cast<uint8_t>(y.scales[j % 4 + 8] | (l << (2 * (j / 4))));
    }
    y.d = fp32_to_fp16(1 / iscale);
  } else {
    y.d = fp32_to_fp16(0.f);
  }
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = half_to_float(y.d) * static_cast<float>(q3_scale(y.scales, j));
    if (d == 0.f) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-4, std::min(3, l)) + 4);
    }
  }
  // High bits: element e sets bit e / 32 of hmask[e % 32].
  std::memset(y.hmask, 0, sizeof(y.hmask));
  uint8_t L2[kQK_K];
  for (int e = 0; e < kQK_K; ++e) {
    int l = L[e];
    if (l > 3) {
      y.hmask[e % 32] = static_cast<uint8_t>(y.hmask[e % 32] | (1u << (e / 32)));
      l -= 4;
    }
    L2[e] = static_cast<uint8_t>(l);
  }
  pack_2bit(L2, y.qs);
}

}  // namespace

void dequantize_q2_k(const void* src, float* dst, int64_t nb) {
  dequantize_blocks<BlockQ2_K, kQK_K, decode_q2_k>(src, dst, nb);
}
void dequantize_q3_k(const void* src, float* dst, int64_t nb) {
  dequantize_blocks<BlockQ3_K, kQK_K, decode_q3_k>(src, dst, nb);
}
float dot_q2_k(const void* row, const float* x, int64_t nb) {
  return dot_blocks<BlockQ2_K, kQK_K, decode_q2_k>(row, x, nb);
}
float dot_q3_k(const void* row, const float* x, int64_t nb) {
  return dot_blocks<BlockQ3_K, kQK_K, decode_q3_k>(row, x, nb);
}
void quantize_q2_k(const float* x, void* dst, int64_t nb) {
  BlockQ2_K* y = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < nb; ++i) quantize_q2_k_block(x + i * kQK_K, y[i]);
}
void quantize_q3_k(const float* x, void* dst, int64_t nb) {
  BlockQ3_K* y = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < nb; ++i) quantize_q3_k_block(x + i * kQK_K, y[i]);
}

}  // namespace runlm::quant_detail
