// gemv_x8 (gemv_x8_kernel.cuh) instantiated for the K-quants, in a file of its own
// so that the type groups compile in parallel.
#include "cuda/gemv_x8_kernel.cuh"

namespace runlm::gpu {

template void launch_x8<DType::Q2_K>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q3_K>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q4_K>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q5_K>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q6_K>(const GemvOut*, int, const X8View&, int, cudaStream_t);

}  // namespace runlm::gpu
