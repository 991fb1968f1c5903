// Helpers shared by the block-format files (quant.cpp, quant_q2_q3_k.cpp,
// quant_iq4_mxfp4.cpp): exact half -> float, ggml's rounding, the lane-wise
// dot product over decoded blocks, and ggml's scale searches. Internal to
// kernels/cpu; callers use quant.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "quant.h"

namespace runlm::quant_detail {

constexpr int kLanes = 8;
// ggml treats a group whose largest |x| is below this as all zeros.
constexpr float kGroupMaxEps = 1e-15f;

// Exact half -> float for every half (subnormals, inf, NaN included) without
// a call or a branch per element, so F16 rows convert in a vectorised loop.
// A normal half is moved into float position and its exponent bias fixed by
// adding 224 to the exponent and multiplying by 2^-112 (exact: a power of
// two, result never subnormal). A subnormal half m * 2^-24 is read as the
// float 0.5 + m * 2^-24 minus 0.5, which is also exact. The two results are
// merged with a mask rather than ?: so that GCC vectorises it on plain SSE2.
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // drops the sign
  constexpr uint32_t kExpOffset = 0xE0u << 23;
  constexpr float kExpScale = 0x1.0p-112f;
  const float normal = fp32_from_bits((two_w >> 4) + kExpOffset) * kExpScale;
  constexpr uint32_t kMagicMask = 126u << 23;
  constexpr float kMagicBias = 0.5f;
  const float subnormal = fp32_from_bits((two_w >> 17) | kMagicMask) - kMagicBias;
  // Exponent field 0 (two_w < 2^27): the half is zero or subnormal.
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>((two_w >> 27) == 0);
  return fp32_from_bits(sign | (fp32_to_bits(subnormal) & is_subnormal) |
                        (fp32_to_bits(normal) & ~is_subnormal));
}

// ggml's nearest_int: adding 1.5 * 2^23 leaves round-half-even(f) in the low
// mantissa bits. Used instead of lrintf so results never depend on the
// rounding mode, exactly as ggml does.
inline int nearest_int(float f) {
  const float v = f + 12582912.f;
  int32_t i;
  std::memcpy(&i, &v, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// ggml's make_qkx2_quants: fits x ~ scale * L - min with L in [0, nmax] and
// min >= 0 by weighted least squares (or least absolute deviation when
// use_mad), trying nstep + 1 candidate inverse scales around
// nmax / (max - min). Returns the scale and stores min (as a positive
// offset) in *the_min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad);

// Eight float lanes as two 4-wide GCC/Clang vectors: the compiler emits SIMD
// adds for them on any target (SSE2 baseline on x86-64, NEON on arm64)
// without -ffast-math, which it would need to vectorise a plain float sum.
using F4 = float __attribute__((vector_size(16)));

struct Lanes {
  F4 lo = {}, hi = {};
  // += a[0..8) * b[0..8); memcpy is an unaligned vector load.
  void mul_add(const float* a, const float* b) {
    F4 a0, a1, b0, b1;
    std::memcpy(&a0, a, sizeof(F4));
    std::memcpy(&a1, a + 4, sizeof(F4));
    std::memcpy(&b0, b, sizeof(F4));
    std::memcpy(&b1, b + 4, sizeof(F4));
    lo += a0 * b0;
    hi += a1 * b1;
  }
  void add(const Lanes& o) {
    lo += o.lo;
    hi += o.hi;
  }
  float sum() const {
    const F4 v = lo + hi;
    return (v[0] + v[2]) + (v[1] + v[3]);
  }
};

template <typename Block, int kElems, void (*Decode)(const Block&, float*)>
void dequantize_blocks(const void* src, float* dst, int64_t nb) {
  const Block* blocks = static_cast<const Block*>(src);
  for (int64_t i = 0; i < nb; ++i) Decode(blocks[i], dst + i * kElems);
}

// Decodes a block into a stack buffer, then dots it with x. Each block sums
// into fresh lanes that are then added to the total, so consecutive blocks
// are independent and the CPU can overlap them.
template <typename Block, int kElems, void (*Decode)(const Block&, float*)>
float dot_blocks(const void* src, const float* x, int64_t nb) {
  static_assert(kElems % kLanes == 0);
  const Block* b = static_cast<const Block*>(src);
  Lanes total;
  float buf[kElems];  // one decoded block
  for (int64_t i = 0; i < nb; ++i, x += kElems) {
    Decode(b[i], buf);
    Lanes s;
    for (int j = 0; j < kElems; j += kLanes) s.mul_add(buf + j, x + j);
    total.add(s);
  }
  return total.sum();
}

// Row codecs of the formats kept in their own files; nb is the block count.
// quant_q2_q3_k.cpp:
void dequantize_q2_k(const void* src, float* dst, int64_t nb);
void dequantize_q3_k(const void* src, float* dst, int64_t nb);
float dot_q2_k(const void* row, const float* x, int64_t nb);
float dot_q3_k(const void* row, const float* x, int64_t nb);
void quantize_q2_k(const float* x, void* dst, int64_t nb);
void quantize_q3_k(const float* x, void* dst, int64_t nb);
// quant_iq4_mxfp4.cpp:
void dequantize_iq4_nl(const void* src, float* dst, int64_t nb);
void dequantize_iq4_xs(const void* src, float* dst, int64_t nb);
void dequantize_mxfp4(const void* src, float* dst, int64_t nb);
float dot_iq4_nl(const void* row, const float* x, int64_t nb);
float dot_iq4_xs(const void* row, const float* x, int64_t nb);
float dot_mxfp4(const void* row, const float* x, int64_t nb);
void quantize_iq4_nl(const float* x, void* dst, int64_t nb);
void quantize_iq4_xs(const float* x, void* dst, int64_t nb);
void quantize_mxfp4(const float* x, void* dst, int64_t nb);

}  // namespace runlm::quant_detail
