// What the GPU kernel tests share: skipping without a device, CUDA error
// checks, device buffers poisoned on creation (so a kernel that skips an
// output is caught) and random, never-zero inputs. CUDA builds only.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "engine.h"

namespace runlm::test {

#define REQUIRE_GPU()                                                                       \
  do {                                                                                      \
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)"; \
  } while (0)

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Device buffer, filled with 0xFF bytes (NaN as f32 and f16, -1 as int32) on
// creation and by poison().
struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) {
    ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    poison();
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void poison() { ck(cudaMemset(p, 0xFF, n ? n : 1), "cudaMemset"); }
  template <typename T>
  T* as() const { return static_cast<T*>(p); }
  template <typename T>
  void put(const std::vector<T>& v) {
    ck(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "H2D");
  }
  template <typename T>
  std::vector<T> get(size_t count) const {
    std::vector<T> v(count);
    ck(cudaDeviceSynchronize(), "sync");
    ck(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return v;
  }
};

template <typename T>
std::unique_ptr<DevBuf> upload(const std::vector<T>& v) {
  auto b = std::make_unique<DevBuf>(v.size() * sizeof(T));
  b->put(v);
  return b;
}

// n normal values (standard deviation `scale`), zeros replaced by 1e-3.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(rng);
    if (x == 0.0f) x = 1e-3f;
  }
  return v;
}

}  // namespace runlm::test
