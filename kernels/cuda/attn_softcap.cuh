// The attention logit soft-cap (Gemma 2) on the GPU, shared by fa2, fa3 and
// the paged decode kernels: a score x becomes c * tanh(x / c).
//
// tanh(x) = 1 - 2 / (2^(2 x log2 e) + 1): one ex2.approx (2^-22 relative)
// and one fast division (2 ulp), so the absolute error is below 1e-6 over
// the whole range and a capped score c * tanh(x / c) is off by < 1e-4 at c =
// 72 (cap 50 in log2 units): the softmax weights move by < 1e-4 relative,
// an order below the tests' bounds (1e-3 per row in decode). tanhf is ~20
// instructions with a branch, and in the decode kernels its temporaries made
// ptxas spill in kernels that did not spill before; tanh.approx is cheaper
// still but 2^-11 relative: 0.035 of a score at cap 50, too coarse.
// Saturates to +-1 (2^large = inf: 2 / inf = 0; 2^-large = 0: 1 - 2), NaN
// stays NaN. Callers apply it before the mask (tanh(-inf) = -1 would turn
// a masked key into a visible one).
#pragma once

#include "cuda/common.cuh"

namespace runlm {

__device__ __forceinline__ float softcap_tanh(float x) {
  const float e = fast_exp2(x * (2.0f * kLog2e));
  return 1.0f - __fdividef(2.0f, e + 1.0f);
}

// c * tanh(x * inv_c), inv_c = 1 / c.
__device__ __forceinline__ float softcap_apply(float x, float c, float inv_c) { return c * softcap_tanh(x * inv_c); }

}  // namespace runlm
