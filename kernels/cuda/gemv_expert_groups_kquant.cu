// The grouped expert GEMV (gemv_expert_groups_kernel.cuh) instantiated for
// the K-quants, in a file of its own so that the type groups compile in
// parallel.
#include "cuda/gemv_expert_groups_kernel.cuh"

namespace runlm::gpu {

#define RUNLM_EXPERT_GROUPS_INSTANTIATE(T)                                                                        \
  template void launch_expert_groups_x8<T>(const ExpertTargets&, const X8View&, const MoeChunk*, const int32_t*, \
                                           dim3, cudaStream_t);
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q2_K)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q3_K)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q4_K)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q5_K)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q6_K)
#undef RUNLM_EXPERT_GROUPS_INSTANTIATE

}  // namespace runlm::gpu
