// KV-cache element types (-ctk / -ctv, chosen independently for K and V):
// f32, f16, bf16, q8_0 (int8, an f16 scale per 32), q4_0 (int4, an f16 scale
// per 32) and fp8 (e4m3 with an f16 scale per 32, so a block uses e4m3's
// whole range). Rows are encoded as they are written to the cache and decoded
// where attention reads them. This is the CPU reference of every format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace runlm {

enum class KvType { F32, F16, BF16, Q8_0, Q4_0, FP8 };

KvType kv_type_from_name(const std::string& name);  // Error lists the names
const char* kv_type_name(KvType t);
// Elements per block (1 for the plain types, 32 for the others).
int kv_type_block(KvType t);
// Bytes of a row of n elements (n a multiple of the block).
size_t kv_row_bytes(KvType t, int64_t n);

void kv_encode_row(KvType t, const float* x, void* dst, int64_t n);
void kv_decode_row(KvType t, const void* src, float* dst, int64_t n);

// e4m3 (fn: no infinities, max 448) <-> float, round to nearest even.
uint8_t fp8_e4m3_from_float(float x);
float fp8_e4m3_to_float(uint8_t v);

}  // namespace runlm
