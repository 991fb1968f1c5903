// Rotary embedding pieces shared by the kernels that rotate q and k: the
// RoPE + KV-store kernel (fused_ops.cu) and the decode attention kernel that
// rotates and stores the step's keys itself (decode_attention.cu). Sharing
// the frequency table, the angle reduction and the rotation keeps the two
// paths bit-identical, so a cache row is the same whichever kernel wrote it.
//
// The rotation is kernels/cpu/ops.h's rope_ext (RopeSpec): pair i of the
// first n_rot dimensions of a head turns by pos * freq_scale *
// theta^(-2i/n_rot) / factors[i], cos and sin times attn_factor; the pairs
// are adjacent (2i, 2i+1) or NeoX halves (i, i + n_rot/2); dimensions from
// n_rot on are kept as they are. YaRN (ext_factor != 0) is rope_ext's too:
// its angle blend is linear in pos, so it folds into the per-pair frequency,
// and its magnitude factor into attn_factor.
#pragma once

#include <algorithm>
#include <cmath>

#include "common.h"
#include "cpu/ops.h"  // RopeSpec

namespace runlm::gpu {

constexpr int kMaxRopePairs = 128;  // head_dim <= 256

// A layer's RoPE as the kernels take it, by value (so a captured graph keeps
// it): the per-pair frequencies freq_scale * theta^(-2i/n_rot) / factors[i],
// computed in double on the host. The per-pair divisors of rope_freqs and
// longrope are folded in here rather than read from a device array: the
// table is passed to every launch anyway, and the kernels read nothing more.
// YaRN likewise: rope_ext's angle pos * f_interp * (1 - mix_i) + pos *
// f_extrap * mix_i (f_extrap the frequency without freq_scale, mix_i its
// ramp) is pos times one frequency, and its cos/sin factor 1 + 0.1 ln(1 /
// freq_scale) multiplies attn_factor (both rounded as rope_ext rounds them).
struct RopeTable {
  double f[kMaxRopePairs];
  int n_rot = 0;   // rotated dimensions of a head (even, <= head_dim)
  int neox = 0;    // NeoX halves instead of adjacent pairs
  float attn_factor = 1.0f;
};

inline RopeTable rope_table(int head_dim, const RopeSpec& spec) {
  RopeTable t{};
  t.n_rot = spec.n_rot > 0 ? spec.n_rot : head_dim;
  RUNLM_CHECK(t.n_rot % 2 == 0 && t.n_rot <= head_dim && t.n_rot / 2 <= kMaxRopePairs,
              "RoPE: %d rotated dimensions of head_dim %d unsupported; supported: even, <= head_dim, <= %d", t.n_rot,
              head_dim, 2 * kMaxRopePairs);
  t.neox = spec.neox ? 1 : 0;
  t.attn_factor = spec.attn_factor;
  if (spec.ext_factor != 0.0f) t.attn_factor *= 1.0f + 0.1f * std::log(1.0f / spec.freq_scale);
  for (int i = 0; i < t.n_rot / 2; ++i) {
    double extrap = std::pow(static_cast<double>(spec.theta), -static_cast<double>(2 * i) / t.n_rot);
    if (spec.factors) extrap /= static_cast<double>(spec.factors[i]);
    t.f[i] = static_cast<double>(spec.freq_scale) * extrap;
    if (spec.ext_factor != 0.0f) {
      const float y =
          (static_cast<float>(i) - spec.corr_dims[0]) / std::max(0.001f, spec.corr_dims[1] - spec.corr_dims[0]);
      const float ramp_mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * spec.ext_factor;
      t.f[i] = t.f[i] * (1.0 - ramp_mix) + extrap * ramp_mix;
    }
  }
  return t;
}

// The Llama rotation: adjacent pairs over the whole head.
inline RopeSpec plain_rope(float theta, float freq_scale) {
  RopeSpec s;
  s.theta = theta;
  s.freq_scale = freq_scale;
  return s;  // n_rot 0: the whole head
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

// rope_cos_sin of rotated pair i, times the table's attn_factor (1: exact).
__device__ __forceinline__ float2 rope_cos_sin(int pos, const RopeTable& t, int i) {
  const float2 cs = rope_cos_sin(pos, t.f[i]);
  return make_float2(__fmul_rn(cs.x, t.attn_factor), __fmul_rn(cs.y, t.attn_factor));
}

// The elements (e0, e1) of pair j of a head (j < head_dim / 2): pairs below
// n_rot / 2 rotate (adjacent or NeoX, as above); the rest cover the kept
// dimensions n_rot.. two by two. Returns whether pair j rotates.
__device__ __forceinline__ bool rope_pair(const RopeTable& t, int j, int& e0, int& e1) {
  const int half = t.n_rot / 2;
  if (j >= half) {
    e0 = t.n_rot + 2 * (j - half);
    e1 = e0 + 1;
    return false;
  }
  e0 = t.neox ? j : 2 * j;
  e1 = t.neox ? j + half : 2 * j + 1;
  return true;
}

// The pair (a, b) rotated by the angle with cosine c and sine s. Explicit
// roundings (no fma contraction) make every caller round the same way.
__device__ __forceinline__ float2 rope_rotate(float a, float b, float c, float s) {
  return make_float2(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)), __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}
#endif

}  // namespace runlm::gpu
