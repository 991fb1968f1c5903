// The partial softmax-attention state of flash-decoding and its merge
// (FlashInfer's state_t::merge), shared by the host tests and the CUDA
// kernels so that one tested function does every merge: inside a CTA (key
// lanes), and across KV partitions (the combine kernel).
//
// A state over a set of keys K is (m, d, o) with m = max_k s_k (log2 units:
// the kernels fold log2(e) into q so that exp2 is one instruction),
// d = sum_k 2^(s_k - m) and o = sum_k 2^(s_k - m) v_k (unnormalised); the
// attention output is o / d. The empty state is (-inf, 0, 0).
#pragma once

#include <cmath>

#ifdef __CUDACC__
#define RUNLM_HD __host__ __device__ __forceinline__
#else
#define RUNLM_HD inline
#endif

namespace runlm {

// Merges state b into a: updates (m, d) of a and returns through scale_a and
// scale_b the factors for o (o_a = o_a * scale_a + o_b * scale_b, per
// element, done by the caller so any layout of o works). Either state may be
// empty (m = -inf): its scale is 0, and merging two empty states stays empty
// with no NaN (exp2(-inf - -inf) is never evaluated).
RUNLM_HD void attn_state_merge(float& m_a, float& d_a, float m_b, float d_b, float& scale_a, float& scale_b) {
  const float m = fmaxf(m_a, m_b);
  if (m == -INFINITY) {  // both empty
    scale_a = 1.0f;
    scale_b = 0.0f;
    return;
  }
  scale_a = exp2f(m_a - m);  // 0 when a is empty
  scale_b = exp2f(m_b - m);
  d_a = d_a * scale_a + d_b * scale_b;
  m_a = m;
}

// Joins an attention sink (gpt-oss: a learned logit per query head that
// takes a share of the softmax and has no value; ggml_soft_max_ext's sinks)
// to the final state of a row, in the state's log2 units (sink * log2(e)):
// (m, d) become the state over the keys and the sink, and the return value
// is the factor for o (o * factor / d is then the row's output). A row
// that saw no key (-inf, 0) gets m = sink, d = 1 and factor 0: output 0.
RUNLM_HD float attn_state_add_sink(float& m, float& d, float sink) {
  const float m_new = fmaxf(m, sink);
  const float scale = exp2f(m - m_new);  // 0 when m = -inf
  d = d * scale + exp2f(sink - m_new);
  m = m_new;
  return scale;
}

}  // namespace runlm
