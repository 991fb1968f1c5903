// KV-cache types on the GPU: encoding of one 32-value block by a
// warp (the K/V store), per-element decoding (gather_kv), and the register
// policies the paged decode kernel is templated on (load a thread's share of
// a key row, convert to fp32 right after the load). Formats and the page
// layout: kernels/cpu/kv_quant.h and src/paged_kv.h; the encoders are
// bit-exact with kv_encode_row (same IEEE operations in the same order, no
// FMA contraction: __fmul_rn / __fadd_rn where the CPU rounds twice).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/kv_quant.h"

namespace runlm {

// ------------------------------------------------------------ encode

__device__ __forceinline__ uint16_t kv_f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

// kv_quant.h's q4_fit_iscale / q4_fit_level with the same IEEE operations
// (no FMA contraction; the division and the rounding to nearest even exact).
__device__ __forceinline__ float q4_fit_iscale_dev(int c, float smax) {
  const float n = __fadd_rn(8.0f, __fmul_rn(0.2f, static_cast<float>(c - 8)));
  return __fdiv_rn(-n, smax);
}
__device__ __forceinline__ int q4_fit_level_dev(float iscale, float x) {
  return min(7, max(-8, __float2int_rn(__fmul_rn(iscale, x))));
}

// The warp encodes one 32-value block: lane i holds value x (element i).
// q: the block's quant bytes (32 for q8_0 / fp8, 16 for q4_0) or, for plain
// types, its 32 elements; s: the block's f16 scale (quantized types only);
// w: the lane's weight in q4_0's scale fit (kv_encode_row's weights).
__device__ __forceinline__ void kv_encode_block(KvType t, float x, int lane, uint8_t* q, uint16_t* s,
                                                float w = 1.0f) {
  if (t == KvType::F16) {
    reinterpret_cast<__half*>(q)[lane] = __float2half_rn(x);
    return;
  }
  if (t == KvType::BF16) {
    reinterpret_cast<__nv_bfloat16*>(q)[lane] = __float2bfloat16_rn(x);
    return;
  }
  float amax = fabsf(x);
  if (t == KvType::Q4_0) {
    // The signed value of largest magnitude, the first one on ties (the CPU's
    // strict `amax < |x|` scan): reduce (|x|, lane) pairs.
    float smax = x;
    int at = lane;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float a_b = __shfl_xor_sync(0xffffffffu, amax, off);
      const float x_b = __shfl_xor_sync(0xffffffffu, smax, off);
      const int at_b = __shfl_xor_sync(0xffffffffu, at, off);
      if (a_b > amax || (a_b == amax && at_b < at)) {
        amax = a_b;
        smax = x_b;
        at = at_b;
      }
    }
    if (amax == 0.0f) {  // all zero: d = 0, every level 0 (the CPU's encode_q4_0_block)
      if (lane < 16) q[lane] = 0x88;
      if (lane == 0) *s = 0;
      return;
    }
    // The least-squares scale search of the CPU's encode_q4_0_block: lanes
    // 2c and 2c + 1 evaluate candidate c (kQ4FitCandidates == 16) over the
    // block's first and second halves, in element order, and add the halves;
    // then the best candidate (largest sum(w x l)^2 / sum(w l l), the lowest
    // on ties) is reduced across the warp.
    static_assert(kQ4FitCandidates == 16, "two lanes a q4_0 scale candidate");
    const int half = lane & 1;
    const float iscale = q4_fit_iscale_dev(lane >> 1, smax);
    float sumlx = 0.0f, suml2 = 0.0f;
#pragma unroll 8
    for (int j = 0; j < 16; ++j) {
      const int src = 16 * half + j;
      const float xj = __shfl_sync(0xffffffffu, x, src), wj = __shfl_sync(0xffffffffu, w, src);
      const float l = static_cast<float>(q4_fit_level_dev(iscale, xj));
      sumlx = __fadd_rn(sumlx, __fmul_rn(__fmul_rn(wj, xj), l));
      suml2 = __fadd_rn(suml2, __fmul_rn(wj, __fmul_rn(l, l)));
    }
    // The halves' sum (the same in both lanes: IEEE addition commutes).
    sumlx = __fadd_rn(sumlx, __shfl_xor_sync(0xffffffffu, sumlx, 1));
    suml2 = __fadd_rn(suml2, __shfl_xor_sync(0xffffffffu, suml2, 1));
    // suml2 > 0: the largest value's level is at least 6 in magnitude, and w > 0.
    float r = __fdiv_rn(__fmul_rn(sumlx, sumlx), suml2);
    int c = lane >> 1;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float r_b = __shfl_xor_sync(0xffffffffu, r, off);
      const int c_b = __shfl_xor_sync(0xffffffffu, c, off);
      if (r_b > r || (r_b == r && c_b < c)) {
        r = r_b;
        c = c_b;
      }
    }
    // Every lane now holds the winner c; its sums sit in lane 2c.
    const float d = __fdiv_rn(__shfl_sync(0xffffffffu, sumlx, 2 * c), __shfl_sync(0xffffffffu, suml2, 2 * c));
    const int qv = q4_fit_level_dev(q4_fit_iscale_dev(c, smax), x) + 8;
    const int hi = __shfl_down_sync(0xffffffffu, qv, 16);  // lane j + 16: the high nibble of byte j
    if (lane < 16) q[lane] = static_cast<uint8_t>(qv | (hi << 4));
    if (lane == 0) *s = kv_f16_bits(d);
    return;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (t == KvType::Q8_0) {
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    q[lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(__fmul_rn(x, id))));  // roundf: half away from 0, as std::round
    if (lane == 0) *s = kv_f16_bits(d);
    return;
  }
  // fp8: the scale maps the block's largest value onto e4m3's largest, 448;
  // e4m3 saturates (satfinite) and rounds to nearest even, as the CPU.
  const uint16_t d16 = kv_f16_bits(amax / 448.0f);
  const float d = __half2float(__ushort_as_half(d16));
  q[lane] = __nv_cvt_float_to_fp8(d > 0.0f ? x / d : 0.0f, __NV_SATFINITE, __NV_E4M3);
  if (lane == 0) *s = d16;
}

// ------------------------------------------------------------ decode one element

// Element i of a block (q: the block's quants or elements, d: its scale).
// Products of a small integer (or e4m3 value) and an f16 scale are exact in
// fp32, so this equals kv_decode_row's value bit for bit.
__device__ __forceinline__ float kv_decode_elem(KvType t, const uint8_t* q, float d, int i) {
  switch (t) {
    case KvType::F16: return __half2float(reinterpret_cast<const __half*>(q)[i]);
    case KvType::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(q)[i]);
    case KvType::Q8_0: return static_cast<float>(static_cast<int8_t>(q[i])) * d;
    case KvType::Q4_0: {
      const int nib = i < 16 ? (q[i] & 15) : (q[i - 16] >> 4);
      return static_cast<float>(nib - 8) * d;
    }
    default: {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(q[i], __NV_E4M3);
      return __half2float(__half(h)) * d;
    }
  }
}

// ------------------------------------------------------------ decode policies (paged decode)

// Read-only, streamed once: skip L1 (no reuse within an SM). (An L2::256B
// prefetch hint was measured: no change, see docs/kernels.md.)
__device__ __forceinline__ uint4 ldg_stream16(const void* ptr) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(ptr));
  return r;
}
__device__ __forceinline__ uint2 ldg_stream8(const void* ptr) {
  uint2 r;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(ptr));
  return r;
}
__device__ __forceinline__ uint32_t ldg_stream4(const void* ptr) {
  uint32_t r;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(ptr));
  return r;
}
__device__ __forceinline__ uint32_t ldg_stream2(const void* ptr) {
  unsigned short r;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(r) : "l"(ptr));
  return r;
}

// A decode policy: a thread of a key row holds 8 of its head_dim values, in
// two groups of 4 consecutive elements starting at elem4(tx, 0 / 1); load()
// reads them from the row of head kvh at byte `row` of the pool (one load of
// 16, 8 or 4 bytes), to_float() converts them to fp32 without the scale.
// Quantized types (kScaled) have one f16 scale per thread per key: the 8
// values lie in one block of 32 (block tx / 4 of the head).
struct KvF16 {
  static constexpr bool kScaled = false;
  static constexpr int kBits = 16;  // per element
  using Raw = uint4;
  __device__ __forceinline__ static int elem4(int tx, int j) { return tx * 8 + 4 * j; }
  __device__ __forceinline__ static Raw load(const uint8_t* row, int tx) { return ldg_stream16(row + tx * 16); }
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

struct KvBf16 {
  static constexpr bool kScaled = false;
  static constexpr int kBits = 16;
  using Raw = uint4;
  __device__ __forceinline__ static int elem4(int tx, int j) { return tx * 8 + 4 * j; }
  __device__ __forceinline__ static Raw load(const uint8_t* row, int tx) { return ldg_stream16(row + tx * 16); }
  // bf16 is the top half of an fp32: a shift and a mask.
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

// int8 -> fp32 without I2F (a quarter-rate conversion on sm_90): bias the
// byte to unsigned (xor 0x80), place it in the mantissa of 2^23 (one PRMT),
// subtract 2^23 + 128 (one FADD). Exact.
struct KvQ8 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 8;
  using Raw = uint2;
  __device__ __forceinline__ static int elem4(int tx, int j) { return tx * 8 + 4 * j; }
  __device__ __forceinline__ static Raw load(const uint8_t* row, int tx) { return ldg_stream8(row + tx * 8); }
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[8]) {
    constexpr float kMagic = 8388608.0f + 128.0f;
    const uint32_t w[2] = {r.x ^ 0x80808080u, r.y ^ 0x80808080u};
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(__byte_perm(w[i / 4], 0x4B00u, 0x5440u | (i % 4))) - kMagic;
  }
};

// e4m3 pairs -> f16 pairs in one cvt on sm_89+ (emulated on sm_80), then fp32.
struct KvFp8 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 8;
  using Raw = uint2;
  __device__ __forceinline__ static int elem4(int tx, int j) { return tx * 8 + 4 * j; }
  __device__ __forceinline__ static Raw load(const uint8_t* row, int tx) { return ldg_stream8(row + tx * 8); }
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[8]) {
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))),
                                                       __NV_E4M3);
      const float2 x = __half22float2(__half2(h));
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

// q4_0 keeps GGUF's nibble order (byte j of a block: element j low, j + 16
// high), so a thread reads 4 bytes and holds elements {4s..4s+3} and
// {16+4s..16+4s+3} of block tx / 4 (s = tx % 4): every byte is read once.
// Nibble -> fp32: mask the low and the high nibbles into bytes, PRMT each
// byte into the mantissa of 2^23, subtract 2^23 + 8. Exact.
struct KvQ4 {
  static constexpr bool kScaled = true;
  static constexpr int kBits = 4;
  using Raw = uint32_t;
  __device__ __forceinline__ static int elem4(int tx, int j) { return (tx / 4) * 32 + 16 * j + (tx % 4) * 4; }
  __device__ __forceinline__ static Raw load(const uint8_t* row, int tx) { return ldg_stream4(row + tx * 4); }
  __device__ __forceinline__ static void to_float(const Raw& w, float (&f)[8]) {
    constexpr float kMagic = 8388608.0f + 8.0f;
    const uint32_t nib[2] = {w & 0x0F0F0F0Fu, (w >> 4) & 0x0F0F0F0Fu};
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = __uint_as_float(__byte_perm(nib[i / 4], 0x4B00u, 0x5440u | (i % 4))) - kMagic;
  }
};

}  // namespace runlm
