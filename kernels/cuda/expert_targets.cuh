// The expert sets one expert-GEMV launch reads (moe_ops.h ExpertGemvOut):
// expert 0's weight view of each set, the byte stride to the next expert,
// the outputs, and the view of the expert a pair or chunk names. Shared by
// the per-pair expert GEMV (gemv_experts.cu) and the grouped one
// (gemv_expert_groups.cu).
#pragma once

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/moe_ops.h"

namespace runlm::gpu {

struct ExpertTargets {
  WView w[kMaxExpertGemvOuts];  // expert 0 of each out
  size_t stride[kMaxExpertGemvOuts];
  float* y[kMaxExpertGemvOuts];
  int n_expert[kMaxExpertGemvOuts];
};

// Checks that the outs can share a launch (one type and shape).
inline ExpertTargets make_expert_targets(const ExpertGemvOut* outs, int n_outs, const char* who) {
  RUNLM_CHECK(n_outs >= 1 && n_outs <= kMaxExpertGemvOuts, "%s: %d expert sets; supported: 1..%d", who, n_outs,
              kMaxExpertGemvOuts);
  ExpertTargets t{};
  for (int i = 0; i < n_outs; ++i) {
    const GpuExperts& x = *outs[i].w;
    RUNLM_CHECK(x.data != nullptr, "%s: experts not uploaded", who);
    RUNLM_CHECK(x.type == outs[0].w->type && x.cols == outs[0].w->cols && x.rows == outs[0].w->rows,
                "%s: expert sets of one launch must share type and shape", who);
    t.w[i] = make_view(expert_matrix(x, 0));
    t.stride[i] = x.stride;
    t.y[i] = outs[i].y;
    t.n_expert[i] = x.n;
  }
  return t;
}

// Expert e's view: every part of expert e sits stride * e bytes after
// expert 0's (one upload_matrix layout per expert, upload_experts).
// Selects rather than indexes the parameter arrays (which could go to
// local memory).
__device__ __forceinline__ WView expert_view(const ExpertTargets& tg, int i, int e) {
  WView w = i == 0 ? tg.w[0] : tg.w[1];
  const size_t off = (i == 0 ? tg.stride[0] : tg.stride[1]) * static_cast<size_t>(e);
  w.q += off;
  w.a += off;
  w.b += off;
  w.c += off;
  return w;
}

__device__ __forceinline__ float* expert_y(const ExpertTargets& tg, int i) { return i == 0 ? tg.y[0] : tg.y[1]; }

// e itself, or -1 (no work) for an id outside [0, n_expert) of set i: the
// routing kernel writes none, and the output rows are then left as they are.
__device__ __forceinline__ int valid_expert(const ExpertTargets& tg, int i, int e) {
  const int n = i == 0 ? tg.n_expert[0] : tg.n_expert[1];
  return e >= 0 && e < n ? e : -1;
}

}  // namespace runlm::gpu
