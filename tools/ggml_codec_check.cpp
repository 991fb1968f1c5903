// ggml_codec_check LLAMA_BIN_DIR: compares runlm's CPU block codecs with the
// ggml of a llama.cpp build (libggml-base.so and libggml-cpu.so in
// LLAMA_BIN_DIR, loaded with dlopen), for every type runlm writes:
//  1. encode: runlm's quantize_row vs ggml_quantize_chunk without an
//     importance matrix (what llama-quantize runs), byte for byte;
//  2. decode: runlm's dequantize_row vs ggml's dequantize_row_*, bit for bit;
//  3. dot: ggml's CPU vec_dot quantizes the activations to its vec_dot_type
//     (Q8_0 / Q8_K) first; runlm's dot_row keeps them in f32. Printed per
//     type: the mean |ggml - runlm| over the mean |runlm| with x as is, and
//     with x replaced by its ggml-quantized-then-decoded copy. If the
//     second is at float-rounding level (~1e-7), the difference between the
//     two programs' matrix products is the activation quantization alone.
// Exit status 1 if an encode or decode comparison differs.
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cpu/quant.h"
#include "dtype.h"

using namespace runlm;

namespace {

using QuantizeChunk = size_t (*)(int type, const float* src, void* dst, int64_t start, int64_t nrows,
                                 int64_t n_per_row, const float* imatrix);
using ToFloat = void (*)(const void* x, float* y, int64_t k);
using FromFloat = void (*)(const float* x, void* y, int64_t k);
using VecDot = void (*)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by, int nrc);
struct TraitsCpu {  // ggml's struct ggml_type_traits_cpu
  FromFloat from_float;
  VecDot vec_dot;
  int vec_dot_type;
  int64_t nrows;
};
using GetTraitsCpu = const TraitsCpu* (*)(int type);

void* sym(void* lib, const std::string& name) {
  void* p = dlsym(lib, name.c_str());
  if (!p) {
    std::fprintf(stderr, "ggml_codec_check: %s not found: %s\n", name.c_str(), dlerror());
    std::exit(2);
  }
  return p;
}

// ggml's dequantize_row_* names: the k-quant suffix is upper case.
std::string ggml_decoder_name(DType t) {
  std::string n = dtype_name(t);
  if (n.size() > 2 && n.compare(n.size() - 2, 2, "_k") == 0) n[n.size() - 1] = 'K';
  return "dequantize_row_" + n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ggml_codec_check LLAMA_BIN_DIR (holding libggml-base.so, libggml-cpu.so)\n");
    return 2;
  }
  const std::string dir = argv[1];
  void* base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  void* cpu = base ? dlopen((dir + "/libggml-cpu.so").c_str(), RTLD_NOW | RTLD_GLOBAL) : nullptr;
  if (!base || !cpu) {
    std::fprintf(stderr, "ggml_codec_check: %s\n", dlerror());
    return 2;
  }
  reinterpret_cast<void (*)()>(sym(cpu, "ggml_cpu_init"))();
  const auto quantize_chunk = reinterpret_cast<QuantizeChunk>(sym(base, "ggml_quantize_chunk"));
  const auto traits = reinterpret_cast<GetTraitsCpu>(sym(cpu, "ggml_get_type_traits_cpu"));

  // Rows of N(0, s^2) with s varying by row, one all-zero block, one outlier.
  constexpr int64_t kCols = 4096, kRows = 64;
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(kCols * kRows), x(kCols);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c) w[r * kCols + c] = normal(rng) * std::ldexp(1.0f, static_cast<int>(r % 7) - 5);
  std::fill(w.begin() + 512, w.begin() + 768, 0.f);
  w[3000] = 50.f;
  for (auto& v : x) v = normal(rng);

  bool ok = true;
  const DType types[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,
                         DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS,
                         DType::MXFP4};
  std::printf("%-7s %-12s %-12s %-22s %-22s\n", "type", "encode", "decode", "dot: x as is", "dot: x via ggml's act");
  for (DType t : types) {
    const size_t row_bytes = dtype_row_bytes(t, kCols);
    std::vector<uint8_t> ours(row_bytes * kRows), theirs(row_bytes * kRows);
    for (int64_t r = 0; r < kRows; ++r) quantize_row(t, w.data() + r * kCols, ours.data() + r * row_bytes, kCols);
    quantize_chunk(static_cast<int>(t), w.data(), theirs.data(), 0, kRows, kCols, nullptr);
    size_t bad_bytes = 0;
    for (size_t i = 0; i < ours.size(); ++i) bad_bytes += ours[i] != theirs[i];

    const auto to_float = reinterpret_cast<ToFloat>(sym(base, ggml_decoder_name(t)));
    std::vector<float> a(kCols), b(kCols);
    size_t bad_floats = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      dequantize_row(t, theirs.data() + r * row_bytes, a.data(), kCols);
      to_float(theirs.data() + r * row_bytes, b.data(), kCols);
      bad_floats += static_cast<size_t>(std::memcmp(a.data(), b.data(), kCols * sizeof(float)) != 0);
    }

    // The activations as ggml's CPU matmul sees them.
    const TraitsCpu* tr = traits(static_cast<int>(t));
    const int act_type = tr->vec_dot_type;
    const DTypeInfo* act_info = dtype_info_or_null(static_cast<uint32_t>(act_type));
    std::vector<uint8_t> xq(act_info ? act_info->type_size * (kCols / act_info->block_size) : 0);
    traits(act_type)->from_float(x.data(), xq.data(), kCols);
    std::vector<float> x_seen(kCols);
    if (act_type == static_cast<int>(DType::Q8_1)) {
      // Q8_1 (d, s = d * sum(q), 32 int8) has no exported decoder: q * d.
      for (int64_t blk = 0; blk < kCols / 32; ++blk) {
        const uint8_t* p = xq.data() + blk * 36;
        const float d = fp16_to_fp32(static_cast<uint16_t>(p[0] | (p[1] << 8)));
        for (int j = 0; j < 32; ++j) x_seen[blk * 32 + j] = static_cast<float>(static_cast<int8_t>(p[4 + j])) * d;
      }
    } else {
      reinterpret_cast<ToFloat>(sym(base, ggml_decoder_name(static_cast<DType>(act_type))))(xq.data(), x_seen.data(),
                                                                                            kCols);
    }
    // Relative to the mean |dot|: single dots can cancel to near zero.
    double diff_plain = 0, diff_seen = 0, mag = 0;
    for (int64_t r = 0; r < kRows; ++r) {
      float g = 0;
      tr->vec_dot(static_cast<int>(kCols), &g, 0, theirs.data() + r * row_bytes, 0, xq.data(), 0, 1);
      const float plain = dot_row(t, theirs.data() + r * row_bytes, x.data(), kCols);
      const float seen = dot_row(t, theirs.data() + r * row_bytes, x_seen.data(), kCols);
      diff_plain += std::fabs(g - plain);
      diff_seen += std::fabs(g - seen);
      mag += std::fabs(plain);
    }
    diff_plain /= mag;
    diff_seen /= mag;
    std::printf("%-7s %-12s %-12s %-22s %-22s\n", dtype_name(t),
                bad_bytes ? std::to_string(bad_bytes).append(" bytes").c_str() : "same bytes",
                bad_floats ? std::to_string(bad_floats).append(" rows").c_str() : "same floats",
                ( strfmt("%.2e", diff_plain) + " (" + (act_info ? act_info->name : "?") + ")").c_str(),
                strfmt("%.2e", diff_seen).c_str());
    ok = ok && bad_bytes == 0 && bad_floats == 0;
  }
  return ok ? 0 : 1;
}
