// Host side of programmatic dependent launch (see wait_for_previous_kernel
// in common.cuh): launch_pdl starts a kernel that may overlap the tail of
// the one before it in the stream. Used for the decode GEMVs, whose weight
// loads need nothing from earlier kernels: they go out while the previous
// kernel (RMSNorm, SwiGLU, quantization) finishes, hiding the launch gap
// and the DRAM ramp-up of each matrix. launch_pdl_small does the same for
// the small decode kernels after a GEMV (RMSNorm, SwiGLU, one-token
// attention), which wait before they read or write anything a kernel before
// them touches: their launch and first loads overlap the GEMV's last wave
// instead of following its completion. Captured into CUDA graphs as
// programmatic edges. Off before sm_90 and with RUNLM_PDL=0 (for
// comparison), where they are ordinary launches; RUNLM_PDL=gemv keeps it
// for the GEMVs only (the behaviour before the small kernels took it).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/common.cuh"

namespace runlm::gpu {

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RUNLM_PDL");
    if (e && std::strcmp(e, "0") == 0) return false;
    RUNLM_CHECK(!e || !*e || std::strcmp(e, "1") == 0 || std::strcmp(e, "gemv") == 0,
                "RUNLM_PDL must be 0, 1 or gemv, got '%s'", e);
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

inline bool pdl_small_kernels_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RUNLM_PDL");
    return pdl_enabled() && !(e && std::strcmp(e, "gemv") == 0);
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch_with_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaCheck(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  launch_with_pdl(pdl_enabled(), kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
void launch_pdl_small(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  launch_with_pdl(pdl_small_kernels_enabled(), kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace runlm::gpu
