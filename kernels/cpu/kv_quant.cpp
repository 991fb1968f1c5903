#include "kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common.h"
#include "dtype.h"
#include "quant.h"

namespace runlm {

namespace {

struct KvRow {
  KvType type;
  const char* name;
  int bits;     // bits of one value (one quant for the scaled types)
  bool scaled;  // blocks of values sharing an f16 scale
};
constexpr KvRow kKvTypes[] = {
    {KvType::F32, "f32", 32, false},  {KvType::F16, "f16", 16, false}, {KvType::BF16, "bf16", 16, false},
    {KvType::Q8_0, "q8_0", 8, true},  {KvType::Q4_0, "q4_0", 4, true}, {KvType::FP8, "fp8", 8, true},
};

const KvRow& row_of(KvType t) {
  for (const auto& r : kKvTypes)
    if (r.type == t) return r;
  fail("unknown KV type");
}

// Bytes of one block of len values: the f16 scale (scaled types), then the values.
size_t block_bytes(const KvRow& r, int len) { return (r.scaled ? 2 : 0) + static_cast<size_t>(len) * r.bits / 8; }

// The DType that stores a KV type with GGUF's own block format (blocks of 32).
DType dtype_of(KvType t) {
  switch (t) {
    case KvType::F32: return DType::F32;
    case KvType::F16: return DType::F16;
    case KvType::BF16: return DType::BF16;
    case KvType::Q8_0: return DType::Q8_0;
    case KvType::Q4_0:  // own coder: a least-squares scale
    case KvType::FP8: break;
  }
  fail("no GGUF type for KV type %s", kv_type_name(t));
}

// GGUF's blocks serve the plain types and q8_0 in blocks of 32 (the bytes the
// GPU's store reproduces); q8_0 blocks of 16 and 8 go through the block coder
// below (ggml's arithmetic over len values); q4_0 (a least-squares scale) and
// fp8 have their own coders at every length.
bool gguf_blocks(KvType t, int len) { return !row_of(t).scaled || (t == KvType::Q8_0 && len == kQK); }

constexpr float kFp8Max = 448.0f;

// quantize_row_q8_0_ref over one block of len values.
void encode_q8_0_block(const float* x, uint8_t* out, int len) {
  float amax = 0;
  for (int i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127;
  const float id = d != 0.f ? 1.0f / d : 0.f;
  const uint16_t d16 = fp32_to_fp16(d);
  std::memcpy(out, &d16, 2);
  for (int i = 0; i < len; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[i] * id)));
}

// q4_0 with a least-squares scale. GGUF's reference maps the block's signed
// largest value to -8 and so spends the scale on one value; for a cache whose
// values meet random queries the error of every value counts alike. So the
// encoder tries kQ4FitCandidates grids, candidate c mapping the signed largest
// value to -(8 + 0.2 (c - 8)), that is -6.4 ... -9.4 (beyond -8 it clips the
// largest to -8 and gains resolution for the rest); for each it rounds the
// values to levels l in [-8, 7] and takes the scale d = sum(w x l) / sum(w l l)
// that minimises sum(w (x - d l)^2) for those levels, and it keeps the
// candidate with the least error, i.e. the largest sum(w x l)^2 / sum(w l l),
// the first on ties. w is 1, or for K with K smoothing the channel's weight in
// the logits (src/k_smoothing.h). stories260K (blocks of 8): q4_0 K's KL
// divergence falls from 0.115 to 0.075, q4_0 V's from 0.0037 to 0.0028
// (docs/kv-quality.md). The sums run over each half of the block and
// add the halves, so that the GPU's store (two lanes a candidate, one a half;
// kernels/cuda/kv_codec.cuh) rounds them identically and the bytes match.
// The format is GGUF's Q4_0: byte j holds elements j and j + len / 2, value
// (nibble - 8) * d.
void encode_q4_0_block(const float* x, const float* w, uint8_t* out, int len) {
  float amax = 0.f, max = 0.f;
  for (int i = 0; i < len; ++i) {
    if (amax < std::fabs(x[i])) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0.f) {  // all zero: d = 0, every level 0
    std::memset(out, 0, 2);
    std::memset(out + 2, 0x88, static_cast<size_t>(len / 2));
    return;
  }
  int best = 0;
  float best_r = 0.f, best_d = 0.f;
  for (int c = 0; c < kQ4FitCandidates; ++c) {
    const float iscale = q4_fit_iscale(c, max);
    float half_lx[2] = {0.f, 0.f}, half_l2[2] = {0.f, 0.f};
    for (int h = 0; h < 2; ++h)
      for (int i = h * len / 2; i < (h + 1) * len / 2; ++i) {
        const float l = static_cast<float>(q4_fit_level(iscale, x[i]));
        const float wi = w ? w[i] : 1.0f;
        half_lx[h] += (wi * x[i]) * l;
        half_l2[h] += wi * (l * l);
      }
    // suml2 > 0: the largest value's level is at least 6 in magnitude, and w > 0.
    const float sumlx = half_lx[0] + half_lx[1], suml2 = half_l2[0] + half_l2[1];
    const float r = sumlx * sumlx / suml2;
    if (c == 0 || r > best_r) {
      best = c;
      best_r = r;
      best_d = sumlx / suml2;
    }
  }
  const uint16_t d16 = fp32_to_fp16(best_d);
  std::memcpy(out, &d16, 2);
  const float iscale = q4_fit_iscale(best, max);
  for (int j = 0; j < len / 2; ++j) {
    const int q0 = q4_fit_level(iscale, x[j]) + 8, q1 = q4_fit_level(iscale, x[j + len / 2]) + 8;
    out[2 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
  }
}

void encode_fp8_block(const float* x, uint8_t* out, int len) {
  float amax = 0;
  for (int i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  // The scale maps the block's largest value onto e4m3's largest, 448.
  const uint16_t d16 = fp32_to_fp16(amax / kFp8Max);
  const float d = fp16_to_fp32(d16);
  std::memcpy(out, &d16, 2);
  for (int i = 0; i < len; ++i) out[2 + i] = fp8_e4m3_from_float(d > 0 ? x[i] / d : 0.0f);
}

void decode_block(KvType t, const uint8_t* in, float* y, int len) {
  uint16_t d16;
  std::memcpy(&d16, in, 2);
  const float d = fp16_to_fp32(d16);
  const uint8_t* q = in + 2;
  switch (t) {
    case KvType::Q8_0:
      for (int i = 0; i < len; ++i) y[i] = static_cast<float>(static_cast<int8_t>(q[i])) * d;
      return;
    case KvType::Q4_0:
      for (int j = 0; j < len / 2; ++j) {
        y[j] = static_cast<float>((q[j] & 0xF) - 8) * d;
        y[j + len / 2] = static_cast<float>((q[j] >> 4) - 8) * d;
      }
      return;
    default:
      for (int i = 0; i < len; ++i) y[i] = fp8_e4m3_to_float(q[i]) * d;
      return;
  }
}

}  // namespace

KvType kv_type_from_name(const std::string& name) {
  std::string known;
  for (const auto& r : kKvTypes) {
    if (name == r.name) return r.type;
    known += std::string(known.empty() ? "" : ", ") + r.name;
  }
  fail("unknown KV cache type '%s'; known: %s", name.c_str(), known.c_str());
}

const char* kv_type_name(KvType t) { return row_of(t).name; }

int kv_block_len(KvType t, int head_dim) {
  const KvRow& r = row_of(t);
  if (!r.scaled) return 1;
  const int len = head_dim > 0 ? kv_quant_block_len(head_dim) : 0;
  RUNLM_CHECK(len > 0,
              "KV cache type %s at head_dim=%d unsupported: a scale covers 32, 16 or 8 values of one head, so the "
              "quantized types (q8_0, q4_0, fp8) need head_dim a multiple of 8; supported at head_dim=%d: f32, f16, "
              "bf16",
              r.name, head_dim, head_dim);
  return len;
}

size_t kv_row_bytes(KvType t, int64_t n, int head_dim) {
  const KvRow& r = row_of(t);
  const int len = kv_block_len(t, head_dim);
  RUNLM_CHECK(n % len == 0, "KV type %s: a row of %lld elements is not a multiple of its block of %d (head_dim=%d)",
              r.name, static_cast<long long>(n), len, head_dim);
  return static_cast<size_t>(n / len) * block_bytes(r, len);
}

float fp8_e4m3_to_float(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 15, mant = v & 7;
  if (exp == 15 && mant == 7) return NAN;
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9)  // subnormal: mant/8 * 2^-6
                             : std::ldexp(1.0f + mant / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

uint8_t fp8_e4m3_from_float(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  float a = std::min(std::fabs(x), kFp8Max);  // saturate: e4m3fn has no infinity
  // The 127 non-negative finite codes are increasing in value: binary search
  // for the neighbours, then round to nearest, ties to the even code.
  int lo = 0, hi = 126;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (fp8_e4m3_to_float(static_cast<uint8_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  int code = lo;
  if (lo < 126) {
    const float below = fp8_e4m3_to_float(static_cast<uint8_t>(lo));
    const float above = fp8_e4m3_to_float(static_cast<uint8_t>(lo + 1));
    if (a - below > above - a || (a - below == above - a && (lo & 1))) code = lo + 1;
  }
  return static_cast<uint8_t>(sign | code);
}

void kv_encode_row(KvType t, const float* x, void* dst, int64_t n, int head_dim, const float* weights) {
  const int len = kv_block_len(t, head_dim);
  kv_row_bytes(t, n, head_dim);  // checks the block multiple
  if (gguf_blocks(t, len)) {
    quantize_row(dtype_of(t), x, dst, n);
    return;
  }
  uint8_t* out = static_cast<uint8_t*>(dst);
  const size_t bytes = block_bytes(row_of(t), len);
  for (int64_t b = 0; b < n / len; ++b, out += bytes) {
    const float* xb = x + b * len;
    switch (t) {
      case KvType::Q8_0: encode_q8_0_block(xb, out, len); break;
      case KvType::Q4_0: encode_q4_0_block(xb, weights ? weights + b * len : nullptr, out, len); break;
      default: encode_fp8_block(xb, out, len); break;
    }
  }
}

void kv_decode_row(KvType t, const void* src, float* dst, int64_t n, int head_dim) {
  const int len = kv_block_len(t, head_dim);
  kv_row_bytes(t, n, head_dim);
  if (gguf_blocks(t, len)) {
    dequantize_row(dtype_of(t), src, dst, n);
    return;
  }
  const uint8_t* in = static_cast<const uint8_t*>(src);
  const size_t bytes = block_bytes(row_of(t), len);
  for (int64_t b = 0; b < n / len; ++b, in += bytes) decode_block(t, in, dst + b * len, len);
}

}  // namespace runlm
