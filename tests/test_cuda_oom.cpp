// GPU out of memory at load: with most of the GPU's free memory
// taken by another allocation, loading a model that does not fit is a
// runlm::Error naming the bytes needed and free (in the engine and through
// `runlm generate --device cuda`), never a crash; the failed load gives back
// what it had taken, and the same model loads once the memory is free again.
// Skips (with the reason) where there is no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "common.h"
#include "engine.h"
#include "model.h"
#include "test_support.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>
#endif

using namespace runlm;
using namespace runlm::test;

#ifndef RUNLM_CUDA

TEST(CudaOom, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (RUNLM_CUDA off)"; }

#else

namespace {

#define REQUIRE_GPU()                                                                       \
  do {                                                                                      \
    if (!cuda_device_available()) GTEST_SKIP() << "no CUDA device (or built without CUDA)"; \
  } while (0)

size_t free_gpu_bytes() {
  size_t free_b = 0, total_b = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  return free_b;
}

// Takes GPU memory until less than `leave` bytes are free, in chunks (one
// allocation of all of it can fail on fragmentation); frees it when it dies.
class GpuHog {
 public:
  explicit GpuHog(size_t leave) {
    size_t cap = size_t{1} << 30;  // per allocation; halves when one fails
    while (cap >= (size_t{1} << 20)) {
      const size_t free_b = free_gpu_bytes();
      if (free_b < leave) break;
      // Just enough to go 1 MiB under `leave`.
      const size_t want = std::min(cap, free_b - leave + (size_t{1} << 20));
      void* p = nullptr;
      if (cudaMalloc(&p, want) == cudaSuccess) {
        ptrs_.push_back(p);
      } else {
        cudaGetLastError();  // clear the failed allocation
        cap /= 2;
      }
    }
  }
  ~GpuHog() {
    for (void* p : ptrs_) cudaFree(p);
  }
  GpuHog(const GpuHog&) = delete;
  GpuHog& operator=(const GpuHog&) = delete;

 private:
  std::vector<void*> ptrs_;
};

// A random f16 model of `layers` layers at dim 2048 (about 103 MB of
// weights per layer), vocabulary from stories260K's tokenizer.
std::string make_model(const TempPath& path, int layers) {
  const CommandResult made = run_command(std::string(RUNLM_RANDOM_MODEL_BINARY) +
                                         " --preset tiny --dim 2048 --hidden 5632 --heads 16 --kv-heads 16 --ctx 256" +
                                         " --layers " + std::to_string(layers) + " --type f16 --tokenizer " +
                                         shared_model("stories260K-tok512.model") + " -o " + path.str());
  EXPECT_EQ(made.exit_code, 0) << made.err;
  return path.str();
}

// "needed N bytes, free M bytes" (weights, buffers) or "needs N bytes (...), M
// bytes free" (the KV cache): true with both numbers found.
bool needed_and_free(const std::string& msg, size_t* needed, size_t* free_b) {
  std::smatch m;
  if (std::regex_search(msg, m, std::regex("needed ([0-9]+) bytes, free ([0-9]+) bytes")) ||
      std::regex_search(msg, m, std::regex("needs ([0-9]+) bytes .*, ([0-9]+) bytes free"))) {
    *needed = std::stoull(m[1]);
    *free_b = std::stoull(m[2]);
    return true;
  }
  return false;
}

}  // namespace

TEST(CudaOom, LoadThatDoesNotFitIsAnErrorAndFreesWhatItTook) {
  REQUIRE_GPU();
  TempPath path(".gguf");
  auto model = Model::load(make_model(path, 2));  // ~210 MB of weights
  EngineOptions eo;
  eo.device = Device::Cuda;
  eo.n_ctx = 256;
  // A first load: it fits, and the one-time state (context, cuBLAS, kernel
  // modules) is in place before free memory is measured.
  make_cuda_engine(*model, eo).reset();
  const size_t free_before = free_gpu_bytes();
  {
    GpuHog hog(64 << 20);  // 64 MiB left: a third of the weights
    const size_t free_left = free_gpu_bytes();
    ASSERT_LT(free_left, size_t{64} << 20);
    std::string msg;
    try {
      make_cuda_engine(*model, eo);
      ADD_FAILURE() << "the load succeeded with " << free_left << " bytes free";
    } catch (const Error& e) {
      msg = e.what();
    }
    std::printf("with %zu bytes free: %s\n", free_left, msg.c_str());
    EXPECT_NE(msg.find("out of GPU memory"), std::string::npos) << msg;
    size_t needed = 0, free_b = 0;
    ASSERT_TRUE(needed_and_free(msg, &needed, &free_b)) << msg;
    EXPECT_GT(needed, 0u) << msg;
    EXPECT_LE(free_b, free_left) << msg;  // the free memory of the moment, not the total
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // no sticky error left behind
  }
  // Everything the failed load took was given back (slack: the allocator's
  // 2 MiB granularity).
  EXPECT_GE(free_gpu_bytes() + (size_t{8} << 20), free_before);
  // And the same model loads and runs now.
  auto engine = make_cuda_engine(*model, eo);
  std::vector<float> logits(static_cast<size_t>(model->config().n_vocab), NAN);
  const int bos = 1;
  engine->forward(&bos, 1, 0, logits.data(), false);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// The same through the CLI, in another process: exit code 1 and the message
// on stderr. The child needs room for its own CUDA context, so 1 GiB is left
// against a ~1.65 GB model.
TEST(CudaOom, CliLoadThatDoesNotFitExitsWithTheBytes) {
  REQUIRE_GPU();
  TempPath path(".gguf");
  make_model(path, 16);
  GpuHog hog(size_t{1} << 30);
  const CommandResult r = run_command(runlm_binary() + " generate -m " + path.str() +
                                      " --device cuda -c 256 -p hi -n 4 --temp 0");
  std::printf("%s", r.err.c_str());
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out of GPU memory"), std::string::npos) << r.err;
  size_t needed = 0, free_b = 0;
  EXPECT_TRUE(needed_and_free(r.err, &needed, &free_b)) << r.err;
}

#endif  // RUNLM_CUDA
