// The repacked device layout of each weight type (shared by upload, GEMV,
// the GEMM's dequantization and embed_rows) and one decoder per type.
//
// Layouts (parts 256-byte aligned inside GpuMatrix::data, every row of the
// quant part 16-byte aligned so each lane reads it with 16-byte loads):
//   F32/F16/BF16  q: [rows][cols] elements (cols % 8 == 0)
//   Q8_0          q: [rows][cols] int8,   a: [rows][cols/32] f16 scales
//   Q4_0          q: [rows][cols/2] bytes (GGUF nibble order), a: f16 scales
//   Q4_K / Q5_K   q: [rows][cols/256] GGUF blocks as is (144 / 176 bytes,
//                 both multiples of 16)
//   Q6_K          q: ql [rows][nb][128], a: qh [rows][nb][64],
//                 b: scales [rows][nb][16] int8, c: d [rows][nb] f16
//                 (the 210-byte block is not a multiple of 16, so it is split)
//
// A "unit" is what one lane decodes from one 16-byte load of the quant part:
// kUnit elements in kUnit/4 groups of 4 consecutive elements, group g
// starting at element x_off(unit, g) of the row. Decoders reproduce
// kernels/cpu/quant.h: values are the dequantized weights up to fp32 rounding
// (fma instead of mul+sub). Types with one scale per unit (Q8_0, Q4_0) return
// unscaled levels and scale(): the GEMV multiplies the unit's partial dot by
// it once instead of every element.
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
    case DType::Q4_K: sizes[0] = n / 256 * 144; l.unit = 32; break;
    case DType::Q5_K: sizes[0] = n / 256 * 176; l.unit = 32; break;
    case DType::Q6_K:
      sizes[0] = n / 2; sizes[1] = n / 4; sizes[2] = n / 16; sizes[3] = n / 256 * 2; l.unit = 32; break;
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

// 6-bit scale j and min j of a k-quant header (kernels/cpu/quant.cpp
// unpack_k_scales); s = header bytes 4..15 as words y, z, w of h.
__device__ __forceinline__ void k_scale_min(const uint4& h, int j, float* sc, float* mn) {
  const uint4 s = make_uint4(h.y, h.z, h.w, 0);
  if (j < 4) {
    *sc = static_cast<float>(byte_of(s, j) & 63);
    *mn = static_cast<float>(byte_of(s, j + 4) & 63);
  } else {
    *sc = static_cast<float>((byte_of(s, j + 4) & 0xF) | ((byte_of(s, j - 4) >> 6) << 4));
    *mn = static_cast<float>((byte_of(s, j + 4) >> 4) | ((byte_of(s, j) >> 6) << 4));
  }
}

// Unit j (0..7) of a super-block covers chunk c = j/2, bytes l0 = 16*(j%2)
// .. +16 of the chunk's 32 qs bytes: elements 64c + l0 + [0,16) (low
// nibbles, sub-block 2c) and 64c + 32 + l0 + [0,16) (high, sub-block 2c+1).
struct KRaw {
  uint4 q;
  uint4 qh;  // Q5_K only
  float d1, m1, d2, m2;
  int c2;    // 2c: the qh bit of the low half (Q5_K)
};

__device__ __forceinline__ void k_fill_scales(KRaw& r, const uint4& h, int c) {
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x & 0xFFFF)));
  const float dmin = __half2float(__ushort_as_half(static_cast<unsigned short>(h.x >> 16)));
  float sc, mn;
  k_scale_min(h, 2 * c, &sc, &mn);
  r.d1 = d * sc;
  r.m1 = dmin * mn;
  k_scale_min(h, 2 * c + 1, &sc, &mn);
  r.d2 = d * sc;
  r.m2 = dmin * mn;
  r.c2 = 2 * c;
}

__device__ __forceinline__ int k_x_off(int u, int g) {
  const int j = u & 7, c = j >> 1, l0 = (j & 1) * 16;
  return (u >> 3) * 256 + 64 * c + l0 + (g < 4 ? 4 * g : 32 + 4 * (g - 4));
}

template <>
struct Codec<DType::Q4_K> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  using Raw = KRaw;
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int j = u & 7, c = j >> 1, l0 = (j & 1) * 16;
    const uint8_t* blk = w.q + (row * (w.cols / 256) + (u >> 3)) * 144;
    Raw r;
    r.q = ld_stream(blk + 16 + 32 * c + l0);
    // The header is shared by the 8 lanes of a super-block: keep it in L1.
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
    k_fill_scales(r, h, c);
    return r;
  }
  __device__ static int x_off(int u, int g) { return k_x_off(u, g); }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t w = word_of(r.q, g & 3);
    const float4 q = bytes_to_float4(g < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu), 0.0f);
    const float d = g < 4 ? r.d1 : r.d2, m = g < 4 ? r.m1 : r.m2;
    return make_float4(fmaf(d, q.x, -m), fmaf(d, q.y, -m), fmaf(d, q.z, -m), fmaf(d, q.w, -m));
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
};

// As Q4_K plus the 5th bit: element 64c + l has bit 2c of qh[l], element
// 64c + 32 + l bit 2c + 1; a unit needs qh[l0 .. l0 + 16), one 16-byte load.
template <>
struct Codec<DType::Q5_K> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  using Raw = KRaw;
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int j = u & 7, c = j >> 1, l0 = (j & 1) * 16;
    const uint8_t* blk = w.q + (row * (w.cols / 256) + (u >> 3)) * 176;
    Raw r;
    r.q = ld_stream(blk + 48 + 32 * c + l0);
    r.qh = __ldg(reinterpret_cast<const uint4*>(blk + 16 + l0));
    const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
    k_fill_scales(r, h, c);
    return r;
  }
  __device__ static int x_off(int u, int g) { return k_x_off(u, g); }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t w = word_of(r.q, g & 3), hb = word_of(r.qh, g & 3);
    const uint32_t lo = g < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu);
    const uint32_t hi = ((hb >> (g < 4 ? r.c2 : r.c2 + 1)) & 0x01010101u) << 4;
    const float4 q = bytes_to_float4(lo | hi, 0.0f);
    const float d = g < 4 ? r.d1 : r.d2, m = g < 4 ? r.m1 : r.m2;
    return make_float4(fmaf(d, q.x, -m), fmaf(d, q.y, -m), fmaf(d, q.z, -m), fmaf(d, q.w, -m));
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
};

// Unit j (0..7) of a super-block: half h = j/4, a = (j/2)%2, l0 = 16*(j%2):
// ql bytes 64h + 32a + l0 + [0,16) give elements 128h + 32a + l0 + [0,16)
// (low nibbles, qh bits 2a) and 128h + 32(a+2) + l0 + [0,16) (high nibbles,
// qh bits 2a + 4), qh bytes 32h + l0 + [0,16). value = (d * scale) * (q - 32).
template <>
struct Codec<DType::Q6_K> {
  static constexpr int kUnit = 32;
  static constexpr bool kUnitScale = false;
  struct Raw {
    uint4 ql, qh;
    float ds_lo, ds_hi;
    int sh;  // 2a
  };
  __device__ static Raw load(const WView& w, int64_t row, int u) {
    const int j = u & 7, h = j >> 2, a = (j >> 1) & 1, l0 = (j & 1) * 16;
    const int64_t blk = row * (w.cols / 256) + (u >> 3);
    Raw r;
    r.ql = ld_stream(w.q + blk * 128 + 64 * h + 32 * a + l0);
    r.qh = ld_stream(w.a + blk * 64 + 32 * h + l0);
    const uint4 sc = __ldg(reinterpret_cast<const uint4*>(w.b + blk * 16));
    const float d = __half2float(reinterpret_cast<const __half*>(w.c)[blk]);
    const int s_lo = 8 * h + 2 * a + l0 / 16, s_hi = s_lo + 4;
    r.ds_lo = d * static_cast<float>(static_cast<int8_t>(byte_of(sc, s_lo)));
    r.ds_hi = d * static_cast<float>(static_cast<int8_t>(byte_of(sc, s_hi)));
    r.sh = 2 * a;
    return r;
  }
  __device__ static int x_off(int u, int g) {
    const int j = u & 7, h = j >> 2, a = (j >> 1) & 1, l0 = (j & 1) * 16;
    return (u >> 3) * 256 + 128 * h + (g < 4 ? 32 * a + l0 + 4 * g : 32 * (a + 2) + l0 + 4 * (g - 4));
  }
  __device__ static float4 decode(const Raw& r, int g) {
    const uint32_t w = word_of(r.ql, g & 3), hb = word_of(r.qh, g & 3);
    const uint32_t lo = g < 4 ? (w & 0x0F0F0F0Fu) : ((w >> 4) & 0x0F0F0F0Fu);
    const uint32_t hi = ((hb >> (g < 4 ? r.sh : r.sh + 4)) & 0x03030303u) << 4;
    const float4 q = bytes_to_float4(lo | hi, 32.0f);
    const float ds = g < 4 ? r.ds_lo : r.ds_hi;
    return make_float4(ds * q.x, ds * q.y, ds * q.z, ds * q.w);
  }
  __device__ static float scale(const Raw&) { return 1.0f; }
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
      default: return false;                                       \
    }                                                              \
  }()

struct GpuMatrix;
// Built by gpu_weights.cu from a GpuMatrix (declared in gpu_ops.h).
WView make_view(const GpuMatrix& m);

}  // namespace runlm::gpu
