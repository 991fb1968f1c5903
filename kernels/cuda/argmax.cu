// Greedy sampling on the device: the index of each row's largest value, so a
// batched decode step copies back one int per sequence instead of its whole
// logits row (256 sequences x 32000 floats = 33 MB a step).
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

namespace {

constexpr int kThreads = 256;

// The better of two candidates: the larger value, the smaller index on a
// tie, NaN never (as runlm::argmax on the host: the first index of the
// largest non-NaN value).
__device__ __forceinline__ void keep_better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// One block per row: each thread scans a strided slice, then a warp and a
// block reduction.
__global__ void argmax_rows_kernel(const float* __restrict__ x, int cols, int* __restrict__ out) {
  const float* row = x + int64_t(blockIdx.x) * cols;
  float v = -INFINITY;
  int i = INT32_MAX;
  for (int c = threadIdx.x; c < cols; c += kThreads) keep_better(v, i, row[c], c);
  for (int o = 16; o > 0; o >>= 1) keep_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = i;
  }
  __syncthreads();  // every warp's best is in shared memory
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) keep_better(v, i, sv[w], si[w]);
    out[blockIdx.x] = i == INT32_MAX ? 0 : i;  // every value NaN: 0, as the host does
  }
}

}  // namespace

void argmax_rows(const float* x, int rows, int cols, int* out, Stream stream) {
  if (rows <= 0) return;
  RUNLM_CHECK(cols > 0, "argmax_rows: cols=%d", cols);
  argmax_rows_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, cols, out);
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
