// The grouped expert GEMV (moe_ops.h grouped_expert_gemv_x8) of steps of
// several tokens: batched decode and prefill.
//
// Why: the per-pair expert GEMV (gemv_experts.cu) reads an expert's rows
// once per (token, slot) pair that chose it, so at 256 sequences of a
// 128-expert top-8 model each expert is read ~16 times a step; the GEMM
// path it replaces dequantized every active expert to f16 and ran one
// cuBLAS call per expert and matrix (3 x 128 launches a layer at ~16 rows
// each) after a host read of the per-expert counts.
// Here moe_group cuts each expert's grouped rows into chunks of at most 16
// pairs on the device, and a warp computes one weight row against all of a
// chunk's x rows: gemv_x8's loop at the chunk's token count (the same
// Codec loads, X8Dot products and warp reduction, gemv_x8_kernel.cuh), the
// weights read once per chunk. x is int8 in the grouped order (moe_gather_x8
// for gate/up, moe_activation_x8 over grouped rows for down), so a chunk's
// x rows are consecutive and y lands in the grouped order that moe_combine
// reads through row_of_pair. The launch is sized by moe_chunk_bound; the
// real chunk count stays in device memory (graph-capturable, no host sync).
// The per-type instantiations live in gemv_expert_groups_kquant.cu and
// gemv_expert_groups_unit32.cu (Q4_0 / Q8_0 here) so that they compile in
// parallel.
#include "cuda/gemv_expert_groups_kernel.cuh"

namespace runlm::gpu {

#define RUNLM_EXPERT_GROUPS_EXTERN(T)                                                                              \
  extern template void launch_expert_groups_x8<T>(const ExpertTargets&, const X8View&, const MoeChunk*,          \
                                                   const int32_t*, dim3, cudaStream_t);
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q2_K)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q3_K)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q4_K)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q5_K)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q6_K)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q4_1)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q5_0)
RUNLM_EXPERT_GROUPS_EXTERN(DType::Q5_1)
RUNLM_EXPERT_GROUPS_EXTERN(DType::IQ4_NL)
RUNLM_EXPERT_GROUPS_EXTERN(DType::IQ4_XS)
RUNLM_EXPERT_GROUPS_EXTERN(DType::MXFP4)
#undef RUNLM_EXPERT_GROUPS_EXTERN

template void launch_expert_groups_x8<DType::Q4_0>(const ExpertTargets&, const X8View&, const MoeChunk*,
                                                   const int32_t*, dim3, cudaStream_t);
template void launch_expert_groups_x8<DType::Q8_0>(const ExpertTargets&, const X8View&, const MoeChunk*,
                                                   const int32_t*, dim3, cudaStream_t);

void grouped_expert_gemv_x8(const ExpertGemvOut* outs, int n_outs, const void* x8, int x_rows,
                            const MoeChunk* chunks, const int32_t* n_chunks, int max_chunks, Stream stream) {
  const char* who = "grouped_expert_gemv_x8";
  const ExpertTargets tg = make_expert_targets(outs, n_outs, who);
  const DType type = outs[0].w->type;
  const int64_t rows = outs[0].w->rows, cols = outs[0].w->cols;
  RUNLM_CHECK(gemv_x8_supports(type), "%s: weight type %s has no int8-x GEMV", who, dtype_name(type));
  RUNLM_CHECK(cols % kQBlock == 0, "%s: %lld columns; needs a multiple of 32", who, static_cast<long long>(cols));
  RUNLM_CHECK(x_rows >= 1 && max_chunks >= 1 && max_chunks <= x_rows, "%s: %d chunks over %d rows of x", who,
              max_chunks, x_rows);
  const int64_t row_blocks = (rows + kGroupRowsPerCta - 1) / kGroupRowsPerCta;
  RUNLM_CHECK(row_blocks <= 65535, "%s: %lld rows; supported: up to %d", who, static_cast<long long>(rows),
              65535 * kGroupRowsPerCta);
  const dim3 grid(static_cast<unsigned>(max_chunks), static_cast<unsigned>(row_blocks), static_cast<unsigned>(n_outs));
  const X8View x = x8_view(x8, x_rows, cols);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case DType::Q4_0: launch_expert_groups_x8<DType::Q4_0>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q8_0: launch_expert_groups_x8<DType::Q8_0>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q4_1: launch_expert_groups_x8<DType::Q4_1>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q5_0: launch_expert_groups_x8<DType::Q5_0>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q5_1: launch_expert_groups_x8<DType::Q5_1>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q2_K: launch_expert_groups_x8<DType::Q2_K>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q3_K: launch_expert_groups_x8<DType::Q3_K>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q4_K: launch_expert_groups_x8<DType::Q4_K>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q5_K: launch_expert_groups_x8<DType::Q5_K>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::Q6_K: launch_expert_groups_x8<DType::Q6_K>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::IQ4_NL: launch_expert_groups_x8<DType::IQ4_NL>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::IQ4_XS: launch_expert_groups_x8<DType::IQ4_XS>(tg, x, chunks, n_chunks, grid, s); break;
    case DType::MXFP4: launch_expert_groups_x8<DType::MXFP4>(tg, x, chunks, n_chunks, grid, s); break;
    default: fail("%s: weight type %s unsupported", who, dtype_name(type));
  }
  cudaCheckLaunch();
}

}  // namespace runlm::gpu
