// The grouped expert GEMV (gemv_expert_groups_kernel.cuh) instantiated for
// the 32-element block types other than Q4_0 / Q8_0, in a file of its own
// so that the type groups compile in parallel.
#include "cuda/gemv_expert_groups_kernel.cuh"

namespace runlm::gpu {

#define RUNLM_EXPERT_GROUPS_INSTANTIATE(T)                                                                        \
  template void launch_expert_groups_x8<T>(const ExpertTargets&, const X8View&, const MoeChunk*, const int32_t*, \
                                           dim3, cudaStream_t);
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q4_1)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q5_0)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::Q5_1)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::IQ4_NL)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::IQ4_XS)
RUNLM_EXPERT_GROUPS_INSTANTIATE(DType::MXFP4)
#undef RUNLM_EXPERT_GROUPS_INSTANTIATE

}  // namespace runlm::gpu
