// Paged decode attention on the GPU: PagedDecodeParams
// (src/paged_kv.h) over a paged KV pool (K and V each f16, bf16, q8_0, q4_0
// or fp8), GQA-aware and split
// along the KV length (flash-decoding) with a combine step. The kernels are
// in kernels/cuda/paged_attention.cu; the CPU reference is
// paged_decode_attention_ref (kernels/cpu/ops.h). Plain C++ header so the
// engine and the tests include it without nvcc.
//
// Every pointer in the params (q, out, cu_q, kv pools, block tables,
// seq_lens) is device memory. Launches are asynchronous on `stream` and CUDA
// graph capturable: no allocation and no synchronisation inside, and the
// grid is sized from the host bounds (n_seqs, max_q_per_seq, max_seq_len),
// so a captured graph replays for any device-side lengths within them.
// A sequence whose device-side length breaks the bounds (seq_len >
// max_seq_len, or fewer keys than query tokens) gets NaN rows rather than a
// read past its table.
#pragma once

#include <cstddef>
#include <vector>

#include "paged_kv.h"

namespace runlm {

// Device workspace bytes the launch needs at most for these bounds (the
// split partial states); 0 when it never splits. Allocate once for the
// largest batch and reuse.
size_t paged_decode_workspace_bytes(int n_seqs, int total_q, int n_heads, int head_dim, int max_seq_len);

// Supported: k_type and v_type each f16, bf16, q8_0, q4_0 or fp8; head_dim
// 8, 16, 32, 64, 128, 256 (32, 64, 128, 256 when either type is quantized);
// block_size a power of two in 8..256; n_heads a multiple of n_kv_heads;
// max_q_per_seq 1..16; window, softcap (finite, >= 0) and sinks on every kernel.
// Anything else throws runlm::Error naming it.
void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream);

// The decode kernels (kernels/cuda/paged_attention.cu describes each).
// Auto: the one select_decode_kernel picks. ContiguousRope is the engine's
// kernel for its contiguous f16 cache (decode_attention_rope,
// kernels/cuda/decode_attention.cu: RoPE, the K/V store and attention in one
// launch); paged launches never run it.
enum class DecodeKernel { Auto, Simt, MmaSm80, MmaQuantSm80, MmaF16, TmaSm90, ContiguousRope };

const char* decode_kernel_name(DecodeKernel k);

// Which kernel a launch with these params runs on the current device, and
// why (a short reason for logs and bench reports).
struct DecodeKernelChoice {
  DecodeKernel kernel = DecodeKernel::Simt;
  const char* reason = "";
};
DecodeKernelChoice select_decode_kernel(const PagedDecodeParams& p);

// The engine's decode attention, one decision point for both cache
// layouts: the contiguous f16 cache (paged = false) runs ContiguousRope, a
// paged pool what select_decode_kernel picks for p (a probe: only the
// types, head_dim, block_size, head counts and pool pointers are read).
DecodeKernelChoice select_engine_decode_kernel(bool paged, const PagedDecodeParams& p);

// Every kernel that has an instance for these params on the current device
// (what select_decode_kernel may pick on some device, plus the SIMT kernel,
// which runs everything): the tests force each in turn.
std::vector<DecodeKernel> decode_kernels_for(const PagedDecodeParams& p);

// Whether a kernel runs QK and PV on tensor cores: q and the probabilities
// are then rounded to f16 (bf16 pools: q to bf16, P kept to ~2^-17 as two
// bf16 parts) before the products (tests set their tolerance from it).
bool decode_kernel_uses_tensor_cores(DecodeKernel k);
bool paged_decode_uses_tensor_cores(const PagedDecodeParams& p);  // of the selected kernel

// As above with the KV partition chosen by the caller (tests and benches):
// partition_size 0 = no split (one CTA per sequence, KV head and row chunk
// reads the whole range), > 0 = keys per partition (a power of two >= 256),
// -1 = automatic (what the overload above does); `kernel` other than Auto
// forces a kernel (tests and benches; an error where it has no instance for
// the params). Throws if the workspace is too small for the choice.
void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream,
                            int partition_size, DecodeKernel kernel = DecodeKernel::Auto);

// The partition size the automatic choice picks for these params and kernel
// on the current device (0 = no split); for the bench's report.
int paged_decode_auto_partition(const PagedDecodeParams& p, DecodeKernel kernel = DecodeKernel::Auto);

}  // namespace runlm
