// Paged decode attention on the GPU (issue 6): PagedDecodeParams
// (src/paged_kv.h) over a paged KV pool (K and V each f16, bf16, q8_0, q4_0
// or fp8, issue 7), GQA-aware and split
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

#include "paged_kv.h"

namespace runlm {

// Device workspace bytes the launch needs at most for these bounds (the
// split partial states); 0 when it never splits. Allocate once for the
// largest batch and reuse.
size_t paged_decode_workspace_bytes(int n_seqs, int total_q, int n_heads, int head_dim, int max_seq_len);

// Supported: k_type and v_type each f16, bf16, q8_0, q4_0 or fp8; head_dim
// 8, 16, 32, 64, 128, 256 (32, 64, 128, 256 when either type is quantized);
// block_size a power of two in 8..256; n_heads a multiple of n_kv_heads;
// max_q_per_seq 1..16. Anything else throws runlm::Error naming it.
void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream);

// As above with the KV partition chosen by the caller (tests and benches):
// partition_size 0 = no split (one CTA per sequence, KV head and row chunk
// reads the whole range), > 0 = keys per partition (a power of two >= 256),
// -1 = automatic (what the overload above does). Throws if the workspace is
// too small for the choice.
void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream,
                            int partition_size);

// Whether these params run on the tensor-core kernel (K or V quantized, the
// other f16 or quantized, head_dim 64, 128 or 256; or, with
// paged_decode_f16_mma() on, K and V both f16 or both bf16 at head_dim 64 or
// 128; RUNLM_PAGED_DECODE=simt turns it off): q and the probabilities are
// then rounded to f16 (bf16 pools: q to bf16, P kept to ~2^-17 as two bf16
// parts) before the products (tests set their tolerance from it).
bool paged_decode_uses_tensor_cores(const PagedDecodeParams& p);

// The tensor-core kernel's version: 4 (a warp loads a step of keys, then
// converts and multiplies it), 5 (software-pipelined key loop in
// registers), 6 (cp.async ring in shared memory), 7 (version 4 with
// 16-byte register loads and the scales in the conversion), 8 (7 with a
// register ring of tiles) or 9 (7 at 3 CTAs an SM); 5 to 9 at head_dim 64
// and 128 (7 to 9 with K and V both quantized), elsewhere version 4 runs.
// 11 (opt-in, sm_90: 7's math through a per-warp TMA ring in shared memory)
// for K and V both q8_0 or fp8 at head_dim 128, block_size >= 16, even
// n_kv_heads; elsewhere 11 runs what 9 runs. 12 (the default, sm_90: a CTA a
// group of 8 KV heads, a producer warp filling a CTA-wide TMA ring with whole
// page rows) for K and V each q8_0, fp8 or q4_0 at head_dim 128, block_size
// >= 16, n_kv_heads a multiple of 8; elsewhere 12 runs what 9 runs.
// From RUNLM_PAGED_DECODE_MMA=v4..v9, v11 or v12; unset: 12 (so 9 where 12
// does not apply); the setter overrides it for the process (tests run all).
int paged_decode_mma_version();
void paged_decode_set_mma_version(int version);
// The version that these params run under the version in use (after the
// fallbacks above: 4 where the version does not exist for them, version
// 9's choice where 11 or 12 does not apply); 0 when they do not run on versions
// 4-12 (the SIMT kernel or version 10). Tests check versions 11 and 12 really ran.
int paged_decode_mma_version_for(const PagedDecodeParams& p);

// Version 10, tensor cores for the plain pools (K and V both f16 or both
// bf16, head_dim 64 and 128; paged_decode_mma_f16.cuh): 0 off (the SIMT
// kernel), 1 on (16 keys a warp step, 3 CTAs an SM at hd 128),
// 2 (32 keys a warp step, 2 CTAs an SM), 3 (16 keys, 4 CTAs an SM); hd 64
// runs the same kernel (32 keys, 4 CTAs) in modes 1 to 3. From
// RUNLM_PAGED_DECODE_F16=simt|mma|mma2|mma4 (unset: 3 on sm_90 and newer,
// 1 before, 0 without a device); the setter overrides it for the process
// (tests run all).
int paged_decode_f16_mma();
void paged_decode_set_f16_mma(int mode);

// The partition size the automatic choice picks for these params on the
// current device (0 = no split); for the bench's report.
int paged_decode_auto_partition(const PagedDecodeParams& p);

}  // namespace runlm
