// The GPU engine's operations (everything but attention, see
// src/attention.h): weight upload in a GPU-friendly repacking of each GGUF
// type, quantized matrix-vector products for decode (1-16 tokens, each
// weight byte read once with 16-byte loads), the prefill GEMM, and fused
// elementwise ops. Plain C++ header: callable from .cpp files; the kernels
// live in kernels/cuda/*.cu. All launches are asynchronous on `stream` and
// graph-capturable (no allocation, no synchronisation inside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cpu/kv_quant.h"
#include "cpu/ops.h"  // QMatrix
#include "dtype.h"

namespace runlm::gpu {

using Stream = void*;  // cudaStream_t

// A weight matrix in device memory: rows x cols in its GGUF type, repacked
// (scales apart from quants, rows 16-byte aligned) so kernels use 16-byte
// loads. bytes is within a few percent of the GGUF size.
struct GpuMatrix {
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  void* data = nullptr;  // one device allocation holding every part
  size_t bytes = 0;
};

// The weight types upload_matrix takes (every type kernels/cpu decodes).
constexpr const char* kGpuWeightTypes =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4";
// Whether upload_matrix takes type t (gpu_codec.cuh has a layout for it).
bool gemv_supports(DType t);
// Copies and repacks a host matrix; throws runlm::Error naming the type when
// unsupported, and on allocation failure with the bytes needed and free.
GpuMatrix upload_matrix(const QMatrix& host);
// Why upload_matrix would refuse this matrix, or "" when it can take it.
std::string upload_unsupported_reason(const QMatrix& host);
void free_matrix(GpuMatrix& m);

// Decode: y[t, r] = sum_c W[r, c] * x[t, c] for t < n_tokens (1..16), x and y
// f32 row-major ([n_tokens, cols], [n_tokens, rows]); fp32 accumulation.
// Each weight byte is read once for all n_tokens.
void gemv(const GpuMatrix& w, const float* x, float* y, int n_tokens, Stream stream);
// The types gemv / gemv_multi (f32 x) take: f32, f16, bf16, q8_0, q4_0,
// q4_k, q5_k, q6_k (every quantized type has gemv_x8).
bool gemv_f32x_supports(DType t);

// Several matrices of one type and width that read the same x (q/k/v,
// gate/up) in one launch: out i gets y_i = W_i x as gemv() would.
struct GemvOut {
  const GpuMatrix* w;
  float* y;
};
constexpr int kMaxGemvOuts = 3;
void gemv_multi(const GemvOut* outs, int n_outs, const float* x, int n_tokens, Stream stream);

// ---- decode GEMV with int8 activations (kernels/cuda/gemv_x8.cu) ------------
//
// Every quantized weight type against activations quantized to int8 with one f32
// scale per 32 values (llama.cpp's q8_1 scheme), summed with integer dot
// products (dp4a): about a quarter of the instructions per weight of
// decoding to f32, which is what bounded these types (see gemv_x8.cu). The
// price is x's rounding: ~0.5% relative error per dot product on
// Gaussian-like activations (step amax/127, amax ~2 sigma over 32 values).
bool gemv_x8_supports(DType t);
// Bytes of the quantized x of n_tokens rows of cols (cols % 32 == 0).
size_t x8_bytes(int n_tokens, int64_t cols);
// x f32 [n_tokens, cols] -> x8 (device memory of x8_bytes).
void quantize_x8(const float* x, int n_tokens, int64_t cols, void* x8, Stream stream);
// The producers of x8 fused into the ops before the GEMVs
// (kernels/cuda/norm_quant.cu), so no separate quantization pass:
// x += add (when add != nullptr, written back to x), then
// y = x / rms(x) * w per row, written as f32 (out_f32), f16 (out_f16)
// and/or int8 for gemv_x8 (out_x8, x8_bytes(n_rows, n_cols)): any subset.
// The same float operations as add_inplace + rmsnorm.
void rmsnorm_fused(float* x, const float* add, const float* w, float* out_f32, uint16_t* out_f16, void* out_x8,
                   int n_rows, int n_cols, float eps, Stream stream);
// silu(gate) * up of [n_rows, n_cols], quantized for gemv_x8 (out_x8).
void swiglu_x8(const float* gate, const float* up, void* out_x8, int n_rows, int64_t n_cols, Stream stream);
// y_i[t, r] = sum_c W_i[r, c] * x8[t, c] for each out (same type and width
// = the quantized cols), n_tokens 1..16.
void gemv_x8(const GemvOut* outs, int n_outs, const void* x8, int n_tokens, Stream stream);

// Prefill: y[t, r] = W[r, :] . x[t, :] for any n_tokens, x f16 [n_tokens,
// cols], y f32 [n_tokens, rows]; tensor cores, fp32 accumulation. `scratch`
// is device memory of at least gemm_scratch_bytes(w) (a dequantized tile
// buffer where the implementation needs one).
// Q4_0 / Q8_0 weights with n_tokens <= kGemmFusedMaxTokens (and cols %
// 64 == 0) go to gemm_fused_q below, the rest to dequantization + cuBLAS.
size_t gemm_scratch_bytes(const GpuMatrix& w);
void gemm(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch, Stream stream);
// gemm()'s other path for every type and n_tokens: W dequantized to an f16
// copy in scratch (none for f16), then cuBLAS.
void gemm_cublas(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch, Stream stream);
// Several matrices reading the same x (q/k/v, gate/up): out i gets y_i =
// W_i x as gemm() would. One fused launch (gemm_fused_q_multi) when gemm()
// would send every one to the fused kernel and they share type and cols
// (row counts may differ: GQA's k/v), else one gemm() each. scratch: at
// least the largest gemm_scratch_bytes of the matrices.
using GemmOut = GemvOut;
constexpr int kMaxGemmOuts = kMaxGemvOuts;
bool gemm_multi_fused(const GemmOut* outs, int n_outs, int n_tokens);  // whether gemm_multi makes one launch
void gemm_multi(const GemmOut* outs, int n_outs, const uint16_t* x_f16, int n_tokens, void* scratch, Stream stream);

// ---- fused quantized GEMM (kernels/cuda/gemm_q_fused.cu) --------------------
//
// gemm() for Q4_0 / Q8_0 weights without an f16 copy of W: quant tiles are
// dequantized in registers into tensor-core operands. Needs cols % 64 == 0
// (gemm_fused_supports) and the shared memory of its largest tile
// (gemm_fused_fits_device: ~200 KB, an H100's; an A100's 163 KB is short). scratch
// (scratch_bytes of device memory, may be null) holds split-K partials: with
// few row tiles the columns are split so the SMs fill; the partials are
// summed in a fixed order (deterministic). splits > 0 forces the number of
// column slices (tests), 0 picks it; either is capped by what scratch holds.
//
// The kernels (kernel = Auto: gemm_fused_kernel_for picks; tests force one):
//   MmaSm80: mma.sync m16n8k16 (sm_80+; the only one off sm_90).
//   Wgmma: wgmma with A from registers (sm_90a; auto up to 16 tokens).
//   WgmmaOverlap: Wgmma with the decode of the next quant block overlapping
//     the wgmmas (sm_90a; auto past 16 tokens).
//   WgmmaStreamK: WgmmaOverlap's loop on 256-row tiles over a stream-K
//     persistent grid (sm_90a; auto past 64 tokens where the launch has many
//     row tiles). At 64 tokens and fewer it runs what Auto runs there; with
//     it splits > 0 means splits x tiles CTAs.
enum class GemmFusedKernel { Auto, MmaSm80, Wgmma, WgmmaOverlap, WgmmaStreamK };
const char* gemm_fused_kernel_name(GemmFusedKernel k);
bool gemm_fused_supports(const GpuMatrix& w);
bool gemm_fused_fits_device(const GpuMatrix& w);
bool gemm_fused_has_wgmma();
void gemm_fused_q(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch,
                  size_t scratch_bytes, Stream stream, int splits = 0,
                  GemmFusedKernel kernel = GemmFusedKernel::Auto);
// gemm_fused_q for 1 to kMaxGemmOuts matrices of one type and cols reading
// the same x, in one launch: their row tiles are concatenated into one grid
// (stream-K units, or row tiles x token tiles x column slices), each output
// written to its own y [n_tokens, rows_i]. Kernel, splits and scratch as
// above, for the launch as a whole (auto counts the row tiles of all the
// matrices). With the same column slices (splits > 0; for WgmmaStreamK only
// where ceil(k_tiles / splits) divides k_tiles, so that every tile is cut at
// the same columns) each y is bit-equal to gemm_fused_q's alone; at splits
// 0 the slices follow the launch's tile count, so the bits may differ.
void gemm_fused_q_multi(const GemmOut* outs, int n_outs, const uint16_t* x_f16, int n_tokens, void* scratch,
                        size_t scratch_bytes, Stream stream, int splits = 0,
                        GemmFusedKernel kernel = GemmFusedKernel::Auto);
// Largest n_tokens gemm() sends to gemm_fused_q. 256, measured on the H100
// (Llama-2-7B shapes, the wgmma kernel against dequant + cuBLAS): 1.1-3.8x
// faster up to 128 tokens, 0.88-1.21x at 256, 0.77-0.85x at 512 (cuBLAS's
// higher TFLOP/s repays the dequantization pass). At 256 the two paths tie
// end to end (bench -npl 256: 10,410 against 10,384 decoded tokens/s).
constexpr int kGemmFusedMaxTokens = 256;
// gemm() for n F16 matrices of one shape over the same n_tokens, in one
// cuBLAS batched call (q/k/v, gate/up): at decode batch sizes one matrix is
// about one wave of tiles, n of them keep the SMs fuller. w, x, y are device
// arrays of n pointers (matrix data, x f16, y f32), built once by the caller
// so the call is graph-safe; gemm_batched_ok says whether the matrices qualify.
bool gemm_batched_ok(const GpuMatrix* const* ws, int n);
const void* gemm_f16_data(const GpuMatrix& w);  // the pointer gemm_batched wants for w
void gemm_batched(const void* const* w, const uint16_t* const* x, float* const* y, int n, int64_t rows, int64_t cols,
                  int n_tokens, Stream stream);

// out[r] = the index of the largest of x[r, 0..cols) (f32 [rows, cols]),
// the smallest index on a tie, NaNs skipped (0 when all are NaN): greedy
// sampling as runlm::argmax does it on the host.
void argmax_rows(const float* x, int rows, int cols, int* out, Stream stream);

// Row of an embedding table (any supported type) for each token -> f32 [n, cols],
// times scale (Gemma's sqrt(dim); 1 leaves the values exact).
void embed_rows(const GpuMatrix& table, const int* tokens, int n, float* out, Stream stream, float scale = 1.0f);

// Half-precision activations (GEMM inputs, q, the KV cache, attention
// output) are IEEE f16, as llama.cpp's CUDA backend keeps them.

// out = x / rms(x) * w per row of n_cols; writes f32 (if out_f32) and f16
// (if out_f16).
void rmsnorm(const float* x, const float* w, float* out_f32, uint16_t* out_f16, int n_rows, int n_cols, float eps,
             Stream stream);

// Rotary embedding of q [n, n_heads, head_dim] and k [n, n_kv_heads,
// head_dim] at positions pos[i] as `rope` describes it (kernels/cpu/ops.h
// RopeSpec, read on the host at the launch: adjacent or NeoX pairs, n_rot
// rotated dimensions (0: all), per-pair frequency divisors, attention
// factor), then K and V are written into the caches k_cache/v_cache
// ([n_ctx, n_kv_heads, head_dim], f16) at row pos[i]. q is left rotated in
// place (f32) and also written as f16 to q_out when q_out is non-null.
void rope_and_store_kv(float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                       int n_kv_heads, int head_dim, const RopeSpec& rope, uint16_t* k_cache, uint16_t* v_cache,
                       uint16_t* q_out, Stream stream);
// The Llama rotation (adjacent pairs, the whole head) with base theta.
void rope_and_store_kv(float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                       int n_kv_heads, int head_dim, float theta, float freq_scale, uint16_t* k_cache,
                       uint16_t* v_cache, uint16_t* q_out, Stream stream);

// The same with K/V written to cache row slots[i] (a paged pool, see
// src/paged_kv.h) instead of row pos[i]; slots == nullptr means pos. K and V
// are stored in k_type / v_type (f16, bf16, q8_0, q4_0, fp8; pages of
// block_size slots laid out as kv_pool_layout says), quantized as written,
// bit-exact with kernels/cpu/kv_quant's kv_encode_row. Types other than f16
// need head_dim % 32 == 0. k_smoothing (device, [4][n_kv_heads * head_dim]:
// shift, k_mul, q_mul, k_weight of src/k_smoothing.h) when non-null: after
// RoPE, K is stored as (k - shift) * k_mul (a q4_0 K's scale fit weighted by
// k_weight) and q (in place and q_out) is q * q_mul.
void rope_and_store_kv_slots(float* q, const float* k, const float* v, const int* pos, const int* slots, int n,
                             int n_heads, int n_kv_heads, int head_dim, const RopeSpec& rope, void* k_cache,
                             void* v_cache, KvType k_type, KvType v_type, int block_size, uint16_t* q_out,
                             Stream stream, const float* k_smoothing = nullptr);
void rope_and_store_kv_slots(float* q, const float* k, const float* v, const int* pos, const int* slots, int n,
                             int n_heads, int n_kv_heads, int head_dim, float theta, float freq_scale,
                             void* k_cache, void* v_cache, KvType k_type, KvType v_type, int block_size,
                             uint16_t* q_out, Stream stream, const float* k_smoothing = nullptr);

// Before RoPE, in place on the projections (q [n, n_heads, head_dim], k and
// v [n, n_kv_heads, head_dim], f32): each head row gets its bias added (bq
// [n_heads * head_dim], bk/bv [n_kv_heads * head_dim]; nullptr: none), then
// the q and k heads are RMS-normed over head_dim with weights q_norm / k_norm
// ([head_dim]; nullptr: none). Qwen2's biases, Qwen3's and Gemma 3's q/k norms.
void qkv_bias_head_norm(float* q, float* k, float* v, const float* bq, const float* bk, const float* bv,
                        const float* q_norm, const float* k_norm, int n, int n_heads, int n_kv_heads, int head_dim,
                        float eps, Stream stream);

// gate = silu(gate) * up, f32, and an f16 copy to out_f16 when non-null.
void swiglu(float* gate, const float* up, uint16_t* out_f16, int64_t n, Stream stream);
// gate = gelu_tanh(gate) * up (Gemma's FFN, kernels/cpu/ops.h geglu), likewise.
void geglu(float* gate, const float* up, uint16_t* out_f16, int64_t n, Stream stream);
// geglu's values quantized for gemv_x8 (as swiglu_x8).
void geglu_x8(const float* gate, const float* up, void* out_x8, int n_rows, int64_t n_cols, Stream stream);

// x = cap * tanh(x / cap) for n values, cap > 0 (the final logit soft-cap).
void softcap(float* x, int64_t n, float cap, Stream stream);

// f32 -> f16 conversion of n values.
void to_f16(const float* x, uint16_t* out, int64_t n, Stream stream);

// Decode attention over the contiguous f16 cache for n query tokens (1..16)
// of one sequence: query i (q f32 [n, n_heads, head_dim], already rotated)
// sits at position *pos0 + i (pos0 is a device pointer, so a captured CUDA
// graph replays for any position) and attends to cache rows [max(0, p - window + 1)
// (window > 0) or 0, p]. out f32 [n, n_heads, head_dim]. GQA: query head h
// reads kv head h / (n_heads / n_kv_heads). The paged cache has the
// flash-decoding kernels of paged_attention.h. out_x8 (optional,
// x8_bytes(n, n_heads * head_dim), head_dim % 32 == 0): out quantized for
// gemv_x8 as quantize_x8 would, in the same launch. softcap > 0: each
// score s (after the scale) becomes softcap * tanh(s / softcap). sinks
// (device [n_heads], nullptr: none): head h's attention sink logit joins
// its softmax (kernels/cpu/ops.h softmax_with_sink).
void decode_attention(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, int n, const int* pos0,
                      int n_heads, int n_kv_heads, int head_dim, int window, float scale, int max_ctx,
                      float* out, Stream stream, void* out_x8 = nullptr, float softcap = 0.0f,
                      const float* sinks = nullptr);

// rope_and_store_kv (f16 cache, positions pos[0] + i) and decode_attention
// in one launch: q, k, v are the projections before RoPE (q
// [n, n_heads, head_dim], k/v [n, n_kv_heads, head_dim], f32; q is not
// written). The cache rows pos[0] .. pos[0] + n - 1 are written bit-equal to
// what rope_and_store_kv writes, out (and out_x8) as decode_attention gives
// after it. head_dim even; any RoPE of rope_and_store_kv.
void decode_attention_rope(const float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                           int n_kv_heads, int head_dim, const RopeSpec& rope, uint16_t* k_cache, uint16_t* v_cache,
                           int window, float scale, int max_ctx, float* out, Stream stream, void* out_x8 = nullptr,
                           float softcap = 0.0f, const float* sinks = nullptr);
// The Llama rotation with base theta, no soft-cap.
void decode_attention_rope(const float* q, const float* k, const float* v, const int* pos, int n, int n_heads,
                           int n_kv_heads, int head_dim, float theta, float freq_scale, uint16_t* k_cache,
                           uint16_t* v_cache, int window, float scale, int max_ctx, float* out, Stream stream,
                           void* out_x8 = nullptr);

// x += y (the residual add), f32.
void add_inplace(float* x, const float* y, int64_t n, Stream stream);

// x[r, c] += bias[c] for x [n_rows, n_cols] f32 (the attention output
// projection's bias, gpt-oss), as kernels/cpu's add_rows.
void add_bias_rows(float* x, const float* bias, int n_rows, int64_t n_cols, Stream stream);

// ---- batching helpers (kernels/cuda/batch_ops.cu) ---------------------------

// Copies the K and V of sequences out of a paged pool into contiguous
// buffers, so the prefill attention backends can read them: sequence s's
// positions [0, cu_k[s+1] - cu_k[s]) go to rows [cu_k[s], cu_k[s+1]) of
// k_out/v_out ([total_k, kv_dim] f16). block_tables [n_seqs, max_blocks].
// Pools of another type (k_type / v_type: bf16, q8_0, q4_0, fp8; layout of
// src/paged_kv.h, kv_dim = n_kv_heads * head_dim, head_dim % 32 == 0) are
// decoded to f16 on the way (exact values rounded once to f16).
void gather_kv(const void* k_pool, const void* v_pool, KvType k_type, KvType v_type, const int32_t* block_tables,
               int max_blocks, const int32_t* cu_k, int n_seqs, int total_k, int block_size, int kv_dim,
               uint16_t* k_out, uint16_t* v_out, Stream stream);

// dst[i, :] = src[idx[i], :] for i < n, f32 rows of `width`.
void gather_rows(const float* src, const int32_t* idx, int n, int width, float* dst, Stream stream);

// f16 -> f32 conversion of n values.
void to_f32(const uint16_t* x, float* out, int64_t n, Stream stream);

}  // namespace runlm::gpu
