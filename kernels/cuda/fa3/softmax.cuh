// fa3 online softmax on a consumer thread's slice of the S tile. Each thread
// of a warpgroup holds 2 rows (g and g+8 of its warp's 16) of the m64 x BN
// accumulator: S[4*nt + 2*hr + c] is row hr, column 8*nt + 2*t + c. Rows are
// shared by the 4 threads of a quad, so row reductions are 2 shuffles.
// Base 2 throughout: p = 2^(s * scale * log2 e - m).
#pragma once

#include <cstdint>

#include "cuda/attn_state.h"
#include "cuda/common.cuh"

namespace runlm {
namespace fa3 {

template <int BN>
struct OnlineSoftmax {
  float m[2];  // running max of s * scale_log2 per row (-inf: nothing seen yet)
  float l[2];  // this thread's partial row sums (quad-reduced at the end)

  __device__ __forceinline__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Turns scores into probabilities in place and returns the factor each
  // row's O accumulator must be multiplied by.
  __device__ __forceinline__ void step(float (&s)[BN / 2], float scale_log2, float (&corr)[2]) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = -INFINITY;  // raw scores first, scaled once (scale > 0 keeps the order)
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * hr], s[4 * nt + 2 * hr + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(m[hr], mx * scale_log2);
      // A row that has seen no visible key keeps max -inf: subtract 0 instead.
      const float m_use = mx == -INFINITY ? 0.0f : mx;
      corr[hr] = fast_exp2(m[hr] - m_use);
      m[hr] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float p = fast_exp2(fmaf(s[4 * nt + 2 * hr + c], scale_log2, -m_use));
          s[4 * nt + 2 * hr + c] = p;
          sum += p;
        }
      }
      l[hr] = l[hr] * corr[hr] + sum;
    }
  }

  // Final row sums; returns the factor of O (1/l, 0 for rows that saw no
  // key) and writes the natural-log lse (-inf for those rows). kSinks: the
  // sink (sink_log2, the head's sink logit * log2 e) joins each row's
  // state first (attn_state_add_sink), so O's factor is 2^(m - m') / l'.
  template <bool kSinks>
  __device__ __forceinline__ void finish(float (&inv)[2], float (&lse)[2], float sink_log2) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float s = l[hr];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if constexpr (kSinks) {
        inv[hr] = attn_state_add_sink(m[hr], s, sink_log2) / s;  // s >= 1 after the join
      } else {
        inv[hr] = s > 0.0f ? 1.0f / s : 0.0f;
      }
      lse[hr] = s > 0.0f ? (m[hr] + log2f(s)) * kLn2 : -INFINITY;
    }
  }
};

}  // namespace fa3
}  // namespace runlm
