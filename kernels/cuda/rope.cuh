// Rotary embedding pieces shared by the kernels that rotate q and k: the
// RoPE + KV-store kernel (fused_ops.cu) and the decode attention kernel that
// rotates and stores the step's keys itself (decode_attention.cu). Sharing
// the frequency table, the angle reduction and the rotation keeps the two
// paths bit-identical, so a cache row is the same whichever kernel wrote it.
#pragma once

#include <cmath>

namespace runlm::gpu {

constexpr int kMaxRopePairs = 128;  // head_dim <= 256

// Per-pair frequencies freq_scale * theta^(-2i/head_dim), computed in double
// on the host and passed by value, so a captured graph keeps them.
struct RopeFreqs {
  double f[kMaxRopePairs];
};

inline RopeFreqs rope_freqs(int head_dim, float theta, float freq_scale) {
  RopeFreqs f{};
  for (int i = 0; i < head_dim / 2 && i < kMaxRopePairs; ++i)
    f.f[i] = static_cast<double>(freq_scale) *
             std::pow(static_cast<double>(theta), -static_cast<double>(2 * i) / head_dim);
  return f;
}

#ifdef __CUDACC__
// (cos, sin) of pos * freq. The angle is formed and reduced modulo 2 pi in
// double (at pos 32000 a float angle would be off by ~2e-3 rad), then sin/cos
// of the reduced angle in float.
__device__ __forceinline__ float2 rope_cos_sin(int pos, double freq) {
  constexpr double kTwoPi = 6.283185307179586;
  const double angle = static_cast<double>(pos) * freq;
  const double r = angle - kTwoPi * rint(angle / kTwoPi);
  float s, c;
  sincosf(static_cast<float>(r), &s, &c);
  return make_float2(c, s);
}

// The pair (a, b) rotated by the angle with cosine c and sine s. Explicit
// roundings (no fma contraction) make every caller round the same way.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}
#endif

}  // namespace runlm::gpu
