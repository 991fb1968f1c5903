// See tensor_map.h.
#include "cuda/tensor_map.h"

#include <cuda_runtime.h>

#include "cuda/common.cuh"

namespace runlm {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    RUNLM_CHECK(f && q == cudaDriverEntryPointSuccess, "the CUDA driver has no cuTensorMapEncodeTiled (TMA)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace runlm
