// CPU reference for every GGUF block format: exact dequantization (as ggml
// defines it) and quantization for the types runlm writes. These are the
// ground truth that GPU kernels are tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../../src/dtype.h"

namespace runlm {

// ---- block layouts (byte-exact with GGUF) --------------------------------
constexpr int kQK = 32;     // elements per block of the *_0/*_1 formats
constexpr int kQK_K = 256;  // elements per super-block of the k-quants
constexpr int kKScaleBytes = 12;

#pragma pack(push, 1)
struct BlockQ4_0 { uint16_t d; uint8_t qs[kQK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[kQK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[kQK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[kQK]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qs[kQK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[kKScaleBytes]; uint8_t qh[kQK_K / 8]; uint8_t qs[kQK_K / 2]; };
struct BlockQ6_K { uint8_t ql[kQK_K / 2]; uint8_t qh[kQK_K / 4]; int8_t scales[kQK_K / 16]; uint16_t d; };
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "GGUF block sizes");

// Decodes n elements (a multiple of the block size) of type t at src into
// dst. Supports every type with DTypeInfo::can_decode; others throw Error.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Encodes n floats into type t (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K;
// others throw Error naming the supported list). Rounding follows ggml's
// reference quantizers so files are interchangeable with llama.cpp's.
void quantize_row(DType t, const float* src, void* dst, int64_t n);
bool can_quantize(DType t);

// Dot product of a row of type t with an f32 vector, accumulated in f32.
// Equivalent to dequantize_row followed by a dot, without the buffer.
float dot_row(DType t, const void* row, const float* x, int64_t n);

}  // namespace runlm
