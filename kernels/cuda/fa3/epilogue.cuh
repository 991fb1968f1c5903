// fa3 epilogue: normalise a consumer thread's O rows by 1/l (after joining
// the head's sink to the row state, kSinks) and store them
// (and the lse) straight from registers. Rows past the sequence's end are
// skipped: in a varlen batch they belong to the next sequence, so a TMA
// store of the whole tile would overwrite its output.
#pragma once

#include "cuda/common.cuh"
#include "cuda/fa3/kernel_traits.cuh"
#include "cuda/fa3/softmax.cuh"

namespace runlm {
namespace fa3 {

template <typename T, int D, int BN, bool kSinks>
__device__ __forceinline__ void epilogue_store(const Args& a, const TileRange& r, int head, int wgc, float (&o)[D / 2],
                                               OnlineSoftmax<BN>& sm) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  float inv[2], lse[2];
  sm.template finish<kSinks>(inv, lse, kSinks ? a.sinks[head] * kLog2e : 0.0f);
  T* og = static_cast<T*>(a.out) + (int64_t(r.q_start) * a.n_heads + head) * D;
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int i = r.m0 + wgc * 64 + warp * 16 + g + 8 * hr;
    if (i >= r.sq) continue;
    T* orow = og + int64_t(i) * a.n_heads * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + 8 * dt + 2 * t4) =
          ElemTraits<T>::pack2(o[4 * dt + 2 * hr] * inv[hr], o[4 * dt + 2 * hr + 1] * inv[hr]);
    if (a.lse && t4 == 0) a.lse[int64_t(head) * a.total_q + r.q_start + i] = lse[hr];
  }
}

}  // namespace fa3
}  // namespace runlm
