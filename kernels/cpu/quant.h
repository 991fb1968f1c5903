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
// Q2_K: 16 sub-blocks of 16; scales[j] holds sub-block j's 4-bit scale (low
// nibble) and 4-bit min (high nibble); 2-bit levels, 4 per byte.
struct BlockQ2_K { uint8_t scales[kQK_K / 16]; uint8_t qs[kQK_K / 4]; uint16_t d, dmin; };
// Q3_K: 16 sub-blocks of 16 with signed 6-bit scales (bias 32) packed in 12
// bytes; levels are 2 low bits in qs and a high bit in hmask, minus 4.
struct BlockQ3_K { uint8_t hmask[kQK_K / 8]; uint8_t qs[kQK_K / 4]; uint8_t scales[kKScaleBytes]; uint16_t d; };
// IQ4_NL: one half scale and 32 4-bit indices into kIq4nlValues.
struct BlockIQ4_NL { uint16_t d; uint8_t qs[kQK / 2]; };
// IQ4_XS: IQ4_NL's indices in 8 sub-blocks of 32 with 6-bit scales (bias
// 32): low nibbles in scales_l, top 2 bits in scales_h.
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[kQK_K / 64]; uint8_t qs[kQK_K / 2]; };
// MXFP4 (OCP microscaling): an E8M0 exponent and 32 E2M1 values, 4 bits each.
struct BlockMXFP4 { uint8_t e; uint8_t qs[kQK / 2]; };
#pragma pack(pop)

// The 8 six-bit scales and mins of a Q4_K / Q5_K header's 12 scale bytes:
// bytes 0-3 keep scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3;
// scales/mins 4-7 keep their low nibbles in bytes 8-11 (scale low, min high)
// and their top 2 bits in the spare top bits of bytes 0-3 (scales) and 4-7
// (mins).
void unpack_k_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn);
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ2_K) == 84 &&
              sizeof(BlockQ3_K) == 110 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136 &&
              sizeof(BlockMXFP4) == 17, "GGUF block sizes");

// The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl), spaced for
// roughly normal weights: denser near zero.
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
// E2M1 values doubled (ggml's kvalues_mxfp4): index bit 3 is the sign; the
// E8M0 scale is therefore halved on decode.
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// 2^(e - 128) for an E8M0 byte e: the MXFP4 block scale times 1/2, to undo
// the doubling of kMxfp4Values (ggml's ggml_e8m0_to_fp32_half). e = 0 and 1
// give the subnormal floats 2^-128 and 2^-127.
float e8m0_to_float_half(uint8_t e);

// Decodes n elements (a multiple of the block size) of type t at src into
// dst. Supports every type with DTypeInfo::can_decode; others throw Error.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Encodes n floats into type t (every decodable type; others throw Error
// naming the supported list). Rounding and scale searches follow what
// llama-quantize runs without an importance matrix (ggml's
// quantize_row_*_ref, and quantize_iq4_nl / quantize_iq4_xs for the IQ4
// types), so the bytes equal llama.cpp's for the same input.
void quantize_row(DType t, const float* src, void* dst, int64_t n);
bool can_quantize(DType t);

// Dot product of a row of type t with an f32 vector, accumulated in f32.
// Equivalent to dequantize_row followed by a dot, without the buffer.
float dot_row(DType t, const void* row, const float* x, int64_t n);

}  // namespace runlm
