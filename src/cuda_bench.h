// Device memory for the GPU bench commands (bench-attn, bench-decode,
// bench-matmul): a buffer freed with its scope whose allocation failure
// names the size. CUDA builds only.
#pragma once

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "common.h"

namespace runlm {

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t n) {
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(n, 1));
    if (e != cudaSuccess) fail("cudaMalloc of %zu bytes: %s", n, cudaGetErrorString(e));
  }
  ~DevMem() { cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

}  // namespace runlm
#endif
