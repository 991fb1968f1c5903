// Tensor element types. The numeric values are GGUF's (ggml_type) so a type
// read from a file is used as is. Every type ggml defines is listed, so a
// file with one runlm cannot decode is refused by name; DTypeInfo::can_decode
// says which ones runlm reads. Quantized types store blocks of
// block_size() elements in type_size() bytes, laid out exactly as GGUF
// defines them (see kernels/cpu/quant.h for the block structs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace runlm {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
};

struct DTypeInfo {
  DType type;
  const char* name;     // lower case, as users type it: "q4_0", "f16"
  int64_t block_size;   // elements per block (1 for plain types)
  size_t type_size;     // bytes per block
  bool can_decode;      // dequantize_row() supports it
};

// nullptr for a value that is not a known type (e.g. a corrupt file).
const DTypeInfo* dtype_info_or_null(uint32_t raw);
const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) { return dtype_info(t).name; }
// Parses "q4_0", "Q4_0", "f16"...; throws Error naming the accepted names.
DType dtype_from_name(const std::string& name);

// Bytes taken by n elements (n must be a multiple of the block size).
size_t dtype_row_bytes(DType t, int64_t n);

// ---- scalar conversions (host) -------------------------------------------

inline float fp32_from_bits(uint32_t w) {
  float f;
  std::memcpy(&f, &w, 4);
  return f;
}
inline uint32_t fp32_to_bits(float f) {
  uint32_t w;
  std::memcpy(&w, &f, 4);
  return w;
}

// IEEE half <-> float, exact for every half value; round-to-nearest-even.
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits(static_cast<uint32_t>(h) << 16); }
// Round to nearest even, NaN kept quiet (as torch and ggml do).
inline uint16_t fp32_to_bf16(float f) {
  uint32_t u = fp32_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 64);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace runlm
