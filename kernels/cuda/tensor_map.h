// cuTensorMapEncodeTiled for the TMA kernels (fa3, paged decode version
// 11), one copy: through the runtime's driver entry point, so that runlm
// does not call into libcuda directly (a CPU-only machine can still load a
// CUDA build and run its CPU tests).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

namespace runlm {

// The driver's cuTensorMapEncodeTiled (looked up once; fails with a clear
// message where the driver has none).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_fn();

}  // namespace runlm
