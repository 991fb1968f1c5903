// The repacked device layout of each weight type (shared by upload, GEMV,
// the GEMM's dequantization and embed_rows) and one decoder per type.
//
// Layouts (parts 256-byte aligned inside GpuMatrix::data, every row of the
// quant part 16-byte aligned so each lane reads it with 16-byte loads):
//   F32/F16/BF16  q: [rows][cols] elements (cols % 8 == 0)
//   Q8_0          q: [rows][cols] int8,   a: [rows][cols/32] f16 scales
//   Q4_0          q: [rows][cols/2] bytes (GGUF nibble order), a: f16 scales
// Every other type is repacked into "32-element units" (element e of a unit
// = byte e % 4 of 4-byte group e / 4, the Q4_0 order: group g < 4 is the low
// nibbles of quant word g, group g >= 4 the high nibbles of word g - 4), with
// the scales in parts of their own so that a lane's quant load is whole:
//   Q4_1 / Q5_1   q: nibbles [rows][cols/2], a: (d, m) f16 pairs per 32,
//                 Q5_1 b: high-bit planes, one u32 per 32 (see bit_plane)
//   Q5_0          q: nibbles, a: f16 d per 32, b: high-bit planes
//   IQ4_NL        q: nibbles (table indices), a: f16 d per 32
//   MXFP4         q: nibbles (table indices), a: E8M0 byte per 32
//   IQ4_XS        q: nibbles, a: the GGUF header per 256 (d, scales_h,
//                 scales_l: 8 bytes)
//   Q2_K          q: 2-bit planes [rows][cols/4] (8 bytes per 32, see
//                 two_bit_plane), a: GGUF scale byte per 16 (low nibble
//                 scale, high nibble min), b: (d, dmin) f16 pairs per 256
//   Q3_K          q: 2-bit planes, a: high-bit planes (u32 per 32), b: int8
//                 scale - 32 per 16, c: f16 d per 256
//   Q4_K          q: nibbles, a: (6-bit scale, 6-bit min) bytes per 32,
//                 b: (d, dmin) f16 pairs per 256
//   Q5_K          as Q4_K with b: high-bit planes, c: (d, dmin) per 256
//   Q6_K          q: nibbles (low 4 bits), a: 2-bit planes (high 2 bits),
//                 b: int8 scale per 16, c: f16 d per 256
// These are the GGUF bytes reordered (same size), except where 6-bit scales
// are unpacked to a byte each: Q3_K (114 bytes per 256 against 110), Q4_K
// (148 against 144) and Q5_K (180 against 176). The K-quants' GGUF order
// (sub-blocks interleaved in 64-element chunks, scales packed in 12 bytes)
// would cost a lane a shared header load, 6-bit unpacking and two scale pairs
// per unit; in units it is one (A, B) a unit, as Q4_1 (gemv_x8's whole-block
// dot product).
//
// A "unit" is what one lane decodes from one 16-byte load of the quant part:
// kUnit elements in kUnit/4 groups of 4 consecutive elements, group g
// starting at element x_off(unit, g) of the row. Decoders reproduce
// kernels/cpu/quant.h: values are the dequantized weights, bit for bit
// (each is one rounding of the exact level x scale + offset, as on the
// CPU). Types with one scale per unit (Q8_0, Q4_0) return unscaled levels
// and scale(): the GEMV multiplies the unit's partial dot by it once
// instead of every element.
//
// Every 32-element type (all but F32/F16/BF16/Q8_0) also gives, for the
// int8-x GEMV (gemv_x8.cu), levels(raw, g): the 4 levels of group g as
// bytes (int8 when kSignedLevels, else unsigned), and ab(raw, h): (A, B)
// with value = A * level + B for the elements of half h (groups 4h..4h+3);
// groups 0-3 and 4-7 each cover 16 consecutive x elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace runlm::gpu {

constexpr size_t kPartAlign = 256;

struct PackedLayout {
  size_t off[4] = {0, 0, 0, 0};  // q, a, b, c
  size_t bytes = 0;
  int unit = 0;                  // elements per unit
  bool ok = false;               // the type is supported
};

__host__ __device__ inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

__host__ __device__ inline PackedLayout packed_layout(DType t, int64_t rows, int64_t cols) {
  PackedLayout l;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  size_t sizes[4] = {0, 0, 0, 0};
  switch (t) {
    case DType::F32: sizes[0] = n * 4; l.unit = 4; break;
    case DType::F16:
    case DType::BF16: sizes[0] = n * 2; l.unit = 8; break;
    case DType::Q8_0: sizes[0] = n; sizes[1] = n / 32 * 2; l.unit = 16; break;
    case DType::Q4_0: sizes[0] = n / 2; sizes[1] = n / 32 * 2; l.unit = 32; break;
    case DType::Q4_K: sizes[0] = n / 2; sizes[1] = n / 32 * 2; sizes[2] = n / 256 * 4; l.unit = 32; break;
    case DType::Q5_K:
      sizes[0] = n / 2; sizes[1] = n / 32 * 2; sizes[2] = n / 32 * 4; sizes[3] = n / 256 * 4; l.unit = 32; break;
    case DType::Q6_K:
      sizes[0] = n / 2; sizes[1] = n / 4; sizes[2] = n / 16; sizes[3] = n / 256 * 2; l.unit = 32; break;
    case DType::Q4_1: sizes[0] = n / 2; sizes[1] = n / 32 * 4; l.unit = 32; break;
    case DType::Q5_0: sizes[0] = n / 2; sizes[1] = n / 32 * 2; sizes[2] = n / 32 * 4; l.unit = 32; break;
    case DType::Q5_1: sizes[0] = n / 2; sizes[1] = n / 32 * 4; sizes[2] = n / 32 * 4; l.unit = 32; break;
    case DType::IQ4_NL: sizes[0] = n / 2; sizes[1] = n / 32 * 2; l.unit = 32; break;
    case DType::MXFP4: sizes[0] = n / 2; sizes[1] = n / 32; l.unit = 32; break;
    case DType::IQ4_XS: sizes[0] = n / 2; sizes[1] = n / 256 * 8; l.unit = 32; break;
    case DType::Q2_K: sizes[0] = n / 4; sizes[1] = n / 16; sizes[2] = n / 256 * 4; l.unit = 32; break;
    case DType::Q3_K:
      sizes[0] = n / 4; sizes[1] = n / 32 * 4; sizes[2] = n / 16; sizes[3] = n / 256 * 2; l.unit = 32; break;
    default: return l;
  }
  size_t off = 0;
  for (int i = 0; i < 4; ++i) {
    l.off[i] = off;
    off = align_up(off + sizes[i], kPartAlign);
  }
  l.bytes = off;
  l.ok = true;
  return l;
}

// What a kernel needs to read a repacked matrix.
struct WView {
  const uint8_t* q;
  const uint8_t* a;
  const uint8_t* b;
  const uint8_t* c;
  int64_t rows, cols;
  int units;  // units per row = cols / unit
};

// Weights are streamed once: non-coherent, no L1 allocation (keeps L1 for x).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Float of 4 bytes b[k] - bias through the exponent trick: 0x4B000000 | b is
// the float 2^23 + b exactly, so one PRMT and one FADD replace a slow I2F.
__device__ __forceinline__ float4 bytes_to_float4(uint32_t w, float bias) {
  constexpr float k2p23 = 8388608.0f;
  const float sub = k2p23 + bias;
  return make_float4(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440)) - sub,
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7441)) - sub,
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7442)) - sub,
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7443)) - sub);
}

// 8 bytes of a streamed part (a unit's 2-bit plane), as ld_stream.
__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  // Selects, not an indexed array: a run-time index would go to local memory.
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
__device__ __forceinline__ uint32_t byte_of(const uint4& v, int i) {
  return (word_of(v, i >> 2) >> (8 * (i & 3))) & 0xFF;
}

template <DType kT>
struct Codec;

template <>
struct Codec<DType::F32> {
  static constexpr int kUnit = 4;
  static constexpr bool kUnitScale = false;
  struct Raw { uint4 q; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_stream(w.q + (row * w.cols + int64_t(u) * 4) * 4)};
  }
  __device__ static int x_off(int u, int g) { return u * 4; }
  __device__ static float4 decode(const Raw& r, int g) {
    return make_float4(__uint_as_float(r.q.x), __uint_as_float(r.q.y), __uint_as_float(r.q.z),
                       __uint_as_float(r.q.w));
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
};

template <>
struct Codec<DType::F16> {
  static constexpr int kUnit = 8;
  static constexpr bool kUnitScale = false;
  struct Raw { uint4 q; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_stream(w.q + (row * w.cols + int64_t(u) * 8) * 2)};
  }
  __device__ static int x_off(int u, int g) { return u * 8 + 4 * g; }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t a = g == 0 ? r.q.x : r.q.z, b = g == 0 ? r.q.y : r.q.w;
    const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&a));
    const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&b));
    return make_float4(f0.x, f0.y, f1.x, f1.y);
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
};

template <>
struct Codec<DType::BF16> {
  static constexpr int kUnit = 8;
  static constexpr bool kUnitScale = false;
  struct Raw { uint4 q; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_stream(w.q + (row * w.cols + int64_t(u) * 8) * 2)};
  }
  __device__ static int x_off(int u, int g) { return u * 8 + 4 * g; }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t a = g == 0 ? r.q.x : r.q.z, b = g == 0 ? r.q.y : r.q.w;
    return make_float4(__uint_as_float(a << 16), __uint_as_float(a & 0xFFFF0000u), __uint_as_float(b << 16),
                       __uint_as_float(b & 0xFFFF0000u));
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
};

// Unit = half a block (16 int8 levels); value = q * d.
template <>
struct Codec<DType::Q8_0> {
  static constexpr int kUnit = 16;
  static constexpr bool kUnitScale = true;
  struct Raw { uint4 q; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const __half d = reinterpret_cast<const __half*>(w.a)[row * (w.cols / 32) + (u >> 1)];
    return {ld_stream(w.q + row * w.cols + int64_t(u) * 16), __half2float(d)};
  }
  __device__ static int x_off(int u, int g) { return u * 16 + 4 * g; }
  __device__ static float4 decode(const Raw& r, int g) {
    // int8 ^ 0x80 is the level + 128 as an unsigned byte.
    return bytes_to_float4(word_of(r.q, g) ^ 0x80808080u, 128.0f);
  }
  __device__ static float scale(const Raw& r) { return r.d; }
};

// Unit = one block: byte j holds element j (low nibble) and j + 16 (high);
// value = (q - 8) * d.
template <>
struct Codec<DType::Q4_0> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = true;
  struct Raw { uint4 q; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const __half d = reinterpret_cast<const __half*>(w.a)[row * (w.cols / 32) + u];
    return {ld_stream(w.q + row * (w.cols / 2) + int64_t(u) * 16), __half2float(d)};
  }
  __device__ static int x_off(int u, int g) { return u * 32 + (g < 4 ? 4 * g : 16 + 4 * (g - 4)); }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t w = word_of(r.q, g & 3);
    return bytes_to_float4(g < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu), 8.0f);
  }
  __device__ static float scale(const Raw& r) { return r.d; }
};

// ---- the 32-element-unit types (Q4_0 element order, see the top) -----------

__device__ __forceinline__ int unit32_x_off(int u, int g) { return u * 32 + 4 * g; }

// Levels of group g from a nibble unit: low nibbles of word g (g < 4), high
// nibbles of word g - 4.
__device__ __forceinline__ uint32_t nibble_levels(const uint4& q, int g) {
  const uint32_t w = word_of(q, g & 3);
  return (g < 4 ? w : w >> 4) & 0x0F0F0F0Fu;
}
// A bit plane (one u32 per unit): bit 8b + g is the bit of element 4g + b,
// so a group's 4 bits come out in place with one shift and one mask.
__device__ __forceinline__ uint32_t plane_bits(uint32_t p, int g) { return (p >> g) & 0x01010101u; }
// A 2-bit plane (8 bytes per unit): bits 8b + 2(g % 4) .. +1 of word g / 4
// are the level of element 4g + b.
__device__ __forceinline__ uint32_t two_bit_levels(const uint2& p, int g) {
  return ((g < 4 ? p.x : p.y) >> (2 * (g & 3))) & 0x03030303u;
}

// Values of one group: A * level + B, one rounding (fma), as the CPU's
// level * d (+ m) is once exact products are taken into account (every
// A * level below is exact in fp32 except Q6_K's, rounded once either way).
template <bool kSigned>
__device__ __forceinline__ float4 levels_to_values(uint32_t lv, float2 ab) {
  const float4 q = kSigned ? bytes_to_float4(lv ^ 0x80808080u, 128.0f) : bytes_to_float4(lv, 0.0f);
  return make_float4(fmaf(ab.x, q.x, ab.y), fmaf(ab.x, q.y, ab.y), fmaf(ab.x, q.z, ab.y), fmaf(ab.x, q.w, ab.y));
}

__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xFFFF)));
}

// 16-entry int8 tables as 4 little-endian words (IQ4: kIq4nlValues, MXFP4:
// kMxfp4Values of kernels/cpu/quant.h; gpu_weights.cu checks them).
struct Iq4nlTable {
  static constexpr uint32_t w[4] = {0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u};
};
struct Mxfp4Table {
  static constexpr uint32_t w[4] = {0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu};
};

// The table values of the 8 indices in w's nibbles: .x those of the low
// nibbles of bytes 0-3 (group g), .y those of the high nibbles (group g+4).
// PRMT picks bytes by 3-bit selectors: one lookup among entries 0-7, one
// among 8-15, then bit 3 of each index picks between them; 9 instructions
// for 8 values.
template <typename Table>
__device__ __forceinline__ uint2 table16_lookup(uint32_t w) {
  constexpr uint32_t kT[4] = {Table::w[0], Table::w[1], Table::w[2], Table::w[3]};
  const uint32_t pick = 0x32103210u | ((w & 0x88888888u) >> 1);
  uint32_t r[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t sel = (w >> (16 * i)) & 0x7777u;
    const uint32_t lo = __byte_perm(kT[0], kT[1], sel), hi = __byte_perm(kT[2], kT[3], sel);
    r[i] = __byte_perm(lo, hi, (pick >> (16 * i)) & 0xFFFFu);
  }
  return make_uint2(__byte_perm(r[0], r[1], 0x6420), __byte_perm(r[0], r[1], 0x7531));
}

// Shared shape of the 32-element-unit codecs: decode() from levels/ab.
template <typename C>
struct Unit32Decode {
  __device__ static int x_off(int u, int g) { return unit32_x_off(u, g); }
  template <typename Raw>
  __device__ static float4 decode(const Raw& r, int g) {
    return levels_to_values<C::kSignedLevels>(C::levels(r, g), C::ab(r, g >> 2));
  }
  template <typename Raw>
  __device__ static float scale(const Raw&) { return 1.0f; }
};

__device__ __forceinline__ uint4 ld_nibble_unit(const WView& w, int64_t row, int u) {
  return ld_stream(w.q + row * (w.cols / 2) + int64_t(u) * 16);
}
__device__ __forceinline__ int64_t unit_index(const WView& w, int64_t row, int u) { return row * (w.cols / 32) + u; }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* part, int64_t i) {
  return __ldg(reinterpret_cast<const uint32_t*>(part) + i);
}
__device__ __forceinline__ uint32_t ld_u16(const uint8_t* part, int64_t i) {
  return __ldg(reinterpret_cast<const unsigned short*>(part) + i);
}

// value = q * d + m.
template <>
struct Codec<DType::Q4_1> : Unit32Decode<Codec<DType::Q4_1>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; uint32_t dm; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_nibble_unit(w, row, u), ld_u32(w.a, unit_index(w, row, u))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g); }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(half_bits_to_float(r.dm), half_bits_to_float(r.dm >> 16)); }
};

// value = (q - 16) * d, q = nibble | high bit << 4.
template <>
struct Codec<DType::Q5_0> : Unit32Decode<Codec<DType::Q5_0>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; uint32_t hb; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {ld_nibble_unit(w, row, u), ld_u32(w.b, i), half_bits_to_float(ld_u16(w.a, i))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g) | plane_bits(r.hb, g) << 4; }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(r.d, -16.0f * r.d); }
};

// value = q * d + m, q = nibble | high bit << 4.
template <>
struct Codec<DType::Q5_1> : Unit32Decode<Codec<DType::Q5_1>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; uint32_t hb, dm; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {ld_nibble_unit(w, row, u), ld_u32(w.b, i), ld_u32(w.a, i)};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g) | plane_bits(r.hb, g) << 4; }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(half_bits_to_float(r.dm), half_bits_to_float(r.dm >> 16)); }
};

// value = (d sc) * q - (dmin m): the unit is GGUF sub-block u % 8 with its
// 6-bit scale and min unpacked (a: scale byte, min byte), (d, dmin) per 256.
__device__ __forceinline__ float2 k_unit_ab(uint32_t sm, uint32_t dd) {
  return make_float2(half_bits_to_float(dd) * static_cast<float>(sm & 0xFF),
                     -(half_bits_to_float(dd >> 16) * static_cast<float>((sm >> 8) & 0xFF)));
}

template <>
struct Codec<DType::Q4_K> : Unit32Decode<Codec<DType::Q4_K>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; float2 ab; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {ld_nibble_unit(w, row, u), k_unit_ab(ld_u16(w.a, i), ld_u32(w.b, i >> 3))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g); }
  __device__ static float2 ab(const Raw& r, int) { return r.ab; }
};

// As Q4_K, q = nibble | high bit << 4 (a bit plane per unit, as Q5_1).
template <>
struct Codec<DType::Q5_K> : Unit32Decode<Codec<DType::Q5_K>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; uint32_t hb; float2 ab; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {ld_nibble_unit(w, row, u), ld_u32(w.b, i), k_unit_ab(ld_u16(w.a, i), ld_u32(w.c, i >> 3))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g) | plane_bits(r.hb, g) << 4; }
  __device__ static float2 ab(const Raw& r, int) { return r.ab; }
};

// Half h of unit u is GGUF sub-block 2u + h (16 elements) with its int8
// scale s; level q = nibble | 2 high bits << 4 (a 2-bit plane),
// value = (d s) * (q - 32) = fma(d s, q, -32 d s), one rounding either way.
template <>
struct Codec<DType::Q6_K> : Unit32Decode<Codec<DType::Q6_K>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint4 q; uint2 hi; uint32_t sc; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {ld_nibble_unit(w, row, u), ld_stream8(w.a + i * 8), ld_u16(w.b, i), half_bits_to_float(ld_u16(w.c, i >> 3))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return nibble_levels(r.q, g) | two_bit_levels(r.hi, g) << 4; }
  __device__ static float2 ab(const Raw& r, int h) {
    const float ds = r.d * static_cast<float>(static_cast<int8_t>((r.sc >> (8 * h)) & 0xFF));
    return make_float2(ds, -32.0f * ds);
  }
};

// value = d * kIq4nlValues[q].
template <>
struct Codec<DType::IQ4_NL> : Unit32Decode<Codec<DType::IQ4_NL>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = true;
  struct Raw { uint4 q; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_nibble_unit(w, row, u), half_bits_to_float(ld_u16(w.a, unit_index(w, row, u)))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) {
    const uint2 v = table16_lookup<Iq4nlTable>(word_of(r.q, g & 3));
    return g < 4 ? v.x : v.y;
  }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(r.d, 0.0f); }
};

// 2^(e - 128) (ggml's e8m0_to_fp32_half; kernels/cpu e8m0_to_float_half).
__device__ __forceinline__ float e8m0_half(uint32_t e) {
  return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

// value = kMxfp4Values[q] * 2^(e - 128).
template <>
struct Codec<DType::MXFP4> : Unit32Decode<Codec<DType::MXFP4>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = true;
  struct Raw { uint4 q; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    return {ld_nibble_unit(w, row, u), e8m0_half(__ldg(w.a + unit_index(w, row, u)))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) {
    const uint2 v = table16_lookup<Mxfp4Table>(word_of(r.q, g & 3));
    return g < 4 ? v.x : v.y;
  }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(r.d, 0.0f); }
};

// Unit j = u % 8 of a super-block is GGUF sub-block j (already in nibble
// order); value = d (ls_j - 32) * kIq4nlValues[q] (d (ls - 32) exact).
template <>
struct Codec<DType::IQ4_XS> : Unit32Decode<Codec<DType::IQ4_XS>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = true;
  struct Raw { uint4 q; float dl; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int j = u & 7;
    // The 8-byte header (d, scales_h, scales_l[4]), shared by 8 lanes.
    const uint2 h = __ldg(reinterpret_cast<const uint2*>(w.a) + (unit_index(w, row, u) >> 3));
    const uint32_t ls = ((h.y >> (4 * j)) & 0xF) | (((h.x >> (16 + 2 * j)) & 3) << 4);
    return {ld_nibble_unit(w, row, u), half_bits_to_float(h.x) * static_cast<float>(static_cast<int>(ls) - 32)};
  }
  __device__ static uint32_t levels(const Raw& r, int g) {
    const uint2 v = table16_lookup<Iq4nlTable>(word_of(r.q, g & 3));
    return g < 4 ? v.x : v.y;
  }
  __device__ static float2 ab(const Raw& r, int) { return make_float2(r.dl, 0.0f); }
};

// Half h of unit u is GGUF sub-block 2u + h (16 elements): scale byte s,
// value = d (s & 15) * q - dmin (s >> 4) (both products exact).
template <>
struct Codec<DType::Q2_K> : Unit32Decode<Codec<DType::Q2_K>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint2 q; uint32_t sc; float d, dmin; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    const uint32_t dd = ld_u32(w.b, i >> 3);
    return {__ldg(reinterpret_cast<const uint2*>(w.q) + i), ld_u16(w.a, i), half_bits_to_float(dd),
            half_bits_to_float(dd >> 16)};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return two_bit_levels(r.q, g); }
  __device__ static float2 ab(const Raw& r, int h) {
    const uint32_t s = (r.sc >> (8 * h)) & 0xFF;
    return make_float2(r.d * static_cast<float>(s & 0xF), -(r.dmin * static_cast<float>(s >> 4)));
  }
};

// Half h of unit u is GGUF sub-block 2u + h: scale byte s (int8, bias
// removed), level q = 2 low bits | high bit << 2, value = d s (q - 4).
template <>
struct Codec<DType::Q3_K> : Unit32Decode<Codec<DType::Q3_K>> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  static constexpr bool kSignedLevels = false;
  struct Raw { uint2 q; uint32_t hb, sc; float d; };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int64_t i = unit_index(w, row, u);
    return {__ldg(reinterpret_cast<const uint2*>(w.q) + i), ld_u32(w.a, i), ld_u16(w.b, i),
            half_bits_to_float(ld_u16(w.c, i >> 3))};
  }
  __device__ static uint32_t levels(const Raw& r, int g) { return two_bit_levels(r.q, g) | plane_bits(r.hb, g) << 2; }
  __device__ static float2 ab(const Raw& r, int h) {
    const float dl = r.d * static_cast<float>(static_cast<int8_t>((r.sc >> (8 * h)) & 0xFF));
    return make_float2(dl, -4.0f * dl);
  }
};

// Dispatches a runtime type to F<kT>::run(args...). Unsupported types return
// false so the caller can throw with its own context.
#define RUNLM_GPU_TYPE_SWITCH(type, KT, ...)                      \
  [&]() -> bool {                                                  \
    switch (type) {                                                \
      case DType::F32: { constexpr DType KT = DType::F32; __VA_ARGS__; return true; } \
      case DType::F16: { constexpr DType KT = DType::F16; __VA_ARGS__; return true; } \
      case DType::BF16: { constexpr DType KT = DType::BF16; __VA_ARGS__; return true; } \
      case DType::Q8_0: { constexpr DType KT = DType::Q8_0; __VA_ARGS__; return true; } \
      case DType::Q4_0: { constexpr DType KT = DType::Q4_0; __VA_ARGS__; return true; } \
      case DType::Q4_K: { constexpr DType KT = DType::Q4_K; __VA_ARGS__; return true; } \
      case DType::Q5_K: { constexpr DType KT = DType::Q5_K; __VA_ARGS__; return true; } \
      case DType::Q6_K: { constexpr DType KT = DType::Q6_K; __VA_ARGS__; return true; } \
      case DType::Q4_1: { constexpr DType KT = DType::Q4_1; __VA_ARGS__; return true; } \
      case DType::Q5_0: { constexpr DType KT = DType::Q5_0; __VA_ARGS__; return true; } \
      case DType::Q5_1: { constexpr DType KT = DType::Q5_1; __VA_ARGS__; return true; } \
      case DType::Q2_K: { constexpr DType KT = DType::Q2_K; __VA_ARGS__; return true; } \
      case DType::Q3_K: { constexpr DType KT = DType::Q3_K; __VA_ARGS__; return true; } \
      case DType::IQ4_NL: { constexpr DType KT = DType::IQ4_NL; __VA_ARGS__; return true; } \
      case DType::IQ4_XS: { constexpr DType KT = DType::IQ4_XS; __VA_ARGS__; return true; } \
      case DType::MXFP4: { constexpr DType KT = DType::MXFP4; __VA_ARGS__; return true; } \
      default: return false;                                       \
    }                                                              \
  }()

struct GpuMatrix;
// Built by gpu_weights.cu from a GpuMatrix (declared in gpu_ops.h).
WView make_view(const GpuMatrix& m);

}  // namespace runlm::gpu
