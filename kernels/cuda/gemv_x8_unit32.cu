// gemv_x8 (gemv_x8_kernel.cuh) instantiated for the 32-element block types other than Q4_0 / Q8_0, in a file of its own
// so that the type groups compile in parallel.
#include "cuda/gemv_x8_kernel.cuh"

namespace runlm::gpu {

template void launch_x8<DType::Q4_1>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q5_0>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::Q5_1>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::IQ4_NL>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::IQ4_XS>(const GemvOut*, int, const X8View&, int, cudaStream_t);
template void launch_x8<DType::MXFP4>(const GemvOut*, int, const X8View&, int, cudaStream_t);

}  // namespace runlm::gpu
