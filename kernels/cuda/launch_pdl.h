// Host side of programmatic dependent launch (see wait_for_previous_kernel
// in common.cuh): launch_pdl starts a kernel that may overlap the tail of
// the one before it in the stream. Used for the decode GEMVs, whose weight
// loads need nothing from earlier kernels: they go out while the previous
// kernel (RMSNorm, SwiGLU, quantization) finishes, hiding the launch gap
// and the DRAM ramp-up of each matrix. Captured into CUDA graphs as
// programmatic edges. Off before sm_90, where it is an ordinary launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/common.cuh"

namespace runlm::gpu {

inline bool pdl_enabled() {
  static const bool on = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  cudaCheck(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace runlm::gpu
