// KV-cache element types (-ctk / -ctv, chosen independently for K and V):
// f32, f16, bf16, q8_0 (int8, an f16 scale per block), q4_0 (int4, an f16
// scale per block, chosen by least squares rather than GGUF's largest-value
// rule) and fp8 (e4m3 with an f16 scale per block, so a block uses
// e4m3's whole range). Rows are encoded as they are written to the cache and
// decoded where attention reads them. This is the CPU reference of every
// format.
//
// A row is n_kv_heads heads of head_dim values, and a block (one scale) never
// spans two heads: heads differ in magnitude, and a scale shared with a larger
// head rounds a small head's values away (stories260K has heads of
// 8). The block is 32 values (GGUF's Q8_0 / Q4_0 blocks, the GPU's layout)
// when head_dim is a multiple of 32, else the largest of 16 and 8 that
// divides head_dim; other head_dims take the plain types only. A block of L values is its f16 scale then its quants: L bytes
// (q8_0, fp8) or L / 2 (q4_0: byte j holds element j in its low nibble and
// element j + L / 2 in its high one, as GGUF's Q4_0 does for L = 32).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace runlm {

enum class KvType { F32, F16, BF16, Q8_0, Q4_0, FP8 };

KvType kv_type_from_name(const std::string& name);  // Error lists the names
const char* kv_type_name(KvType t);

// The block rule of the quantized types alone: 32, 16 or 8 values, the
// largest that divides head_dim; 0 when none does (kv_block_len turns that
// into an error).
constexpr int kv_quant_block_len(int head_dim) {
  return head_dim % 32 == 0 ? 32 : head_dim % 16 == 0 ? 16 : head_dim % 8 == 0 ? 8 : 0;
}

// Elements per block of type t in rows of heads of head_dim values: 1 for
// the plain types, kv_quant_block_len(head_dim) for the others. Error, naming
// the type, the head_dim and what is supported, when head_dim is not a
// multiple of 8 for a quantized type.
int kv_block_len(KvType t, int head_dim);
// Bytes of a row of n elements (n a multiple of the block).
size_t kv_row_bytes(KvType t, int64_t n, int head_dim);

// q4_0's least-squares scale search (kv_quant.cpp's encode_q4_0_block; the
// GPU's kv_encode_block runs the same arithmetic with two lanes a
// candidate): candidate c in [0, kQ4FitCandidates) maps the block's signed
// largest value, max, to -(8 + 0.2 (c - 8)), i.e. -6.4 ... -9.4; a value x
// gets the level q4_fit_level(iscale, x) in [-8, 7].
constexpr int kQ4FitCandidates = 16;
inline float q4_fit_iscale(int c, float max) {
  const float step = 0.2f * static_cast<float>(c - 8);
  const float n = 8.0f + step;
  return -n / max;
}
inline int q4_fit_level(float iscale, float x) {
  const float y = iscale * x;  // |y| <= 8.7: x is no larger than max
  const int l = static_cast<int>(std::nearbyint(y));  // to nearest, ties to even (the default rounding mode)
  return l < -8 ? -8 : l > 7 ? 7 : l;
}

// weights (n values, positive) when non-null steer q4_0's scale fit: it
// minimises sum(w (x - d l)^2) (K smoothing's k_weight, src/k_smoothing.h);
// the other types ignore them.
void kv_encode_row(KvType t, const float* x, void* dst, int64_t n, int head_dim, const float* weights = nullptr);
void kv_decode_row(KvType t, const void* src, float* dst, int64_t n, int head_dim);

// e4m3 (fn: no infinities, max 448) <-> float, round to nearest even.
uint8_t fp8_e4m3_from_float(float x);
float fp8_e4m3_to_float(uint8_t v);

}  // namespace runlm
