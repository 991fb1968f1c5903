// Device memory for the CUDA engine: a typed buffer freed with its owner,
// and the CUDA error check that names the failing step.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "common.h"

namespace runlm {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in %s: %s", what, cudaGetErrorString(e));
}

// A device buffer freed with the engine.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { allocate(n); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }
  void allocate(size_t n) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if (cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      cudaGetLastError();
      fail("out of GPU memory: needed %zu bytes, free %zu bytes", n * sizeof(T), free_b);
    }
    n_ = n;
  }
  // Grows (contents not kept) to at least n elements.
  void reserve(size_t n) {
    if (n <= n_ && ptr_) return;
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    allocate(n);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

}  // namespace runlm
