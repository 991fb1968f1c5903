// KV-cache types: the encodings round trip within their step, fp8 e4m3 is
// exact on its own values, and attention over a quantized cache stays close
// to the f32 cache (K and V types chosen independently).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common.h"
#include "engine.h"
#include "kv_quant.h"
#include "model.h"
#include "ops.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
double rel_rms(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}
}  // namespace

TEST(KvQuant, Fp8E4m3IsExactOnItsOwnValuesAndRoundsToNearest) {
  for (int c = 0; c < 256; ++c) {
    const float f = fp8_e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // +0 and -0
    EXPECT_EQ(fp8_e4m3_from_float(f), c) << c;
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);          // largest finite
  EXPECT_EQ(fp8_e4m3_from_float(1e6f), 0x7e);          // saturates, no infinity
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_from_float(1.0625f), 0x38);       // halfway 1 and 1.125: ties to even (1.0)
  EXPECT_EQ(fp8_e4m3_from_float(1.1875f), 0x3a);       // halfway 1.125 and 1.25: ties to even (1.25)
}

// Step-size bounds (relative RMS error on N(0,1) rows): f16 2^-11, bf16
// 2^-8; q8_0 ~ amax/127/sqrt(12) per block (~0.6%); fp8 e4m3 has 3 mantissa
// bits (~2.6% relative per value); q4_0 ~ amax/8/sqrt(12) (~9%). The bounds
// below add margin over those estimates.
TEST(KvQuant, RowsRoundTripWithinTheirStep) {
  const auto x = randn(4096, 3);
  const std::pair<KvType, double> cases[] = {{KvType::F32, 0.0},     {KvType::F16, 3e-4}, {KvType::BF16, 3e-3},
                                             {KvType::Q8_0, 0.008},  {KvType::FP8, 0.035}, {KvType::Q4_0, 0.11}};
  for (const auto& [t, bound] : cases) {
    std::vector<uint8_t> enc(kv_row_bytes(t, 4096));
    std::vector<float> dec(4096, NAN);
    kv_encode_row(t, x.data(), enc.data(), 4096);
    kv_decode_row(t, enc.data(), dec.data(), 4096);
    EXPECT_LE(rel_rms(dec, x), bound) << kv_type_name(t);
  }
  EXPECT_THROW(kv_row_bytes(KvType::Q8_0, 40), Error);
  EXPECT_THROW(kv_type_from_name("q5_1"), Error);
}

// Attention of one query over 300 positions with mixed K/V types against
// the f32 cache: the error follows the coarser of the two types.
TEST(KvQuant, AttentionOverAQuantizedCacheStaysClose) {
  const int n_heads = 8, n_kv = 2, hd = 64, kv_dim = n_kv * hd, n_pos = 300;
  const auto k = randn(static_cast<size_t>(n_pos) * kv_dim, 5), v = randn(static_cast<size_t>(n_pos) * kv_dim, 6);
  const auto q = randn(static_cast<size_t>(n_heads) * hd, 7);
  auto run = [&](KvType tk, KvType tv) {
    std::vector<uint8_t> kc(kv_row_bytes(tk, kv_dim) * n_pos), vc(kv_row_bytes(tv, kv_dim) * n_pos);
    for (int t = 0; t < n_pos; ++t) {
      kv_encode_row(tk, &k[static_cast<size_t>(t) * kv_dim], kc.data() + t * kv_row_bytes(tk, kv_dim), kv_dim);
      kv_encode_row(tv, &v[static_cast<size_t>(t) * kv_dim], vc.data() + t * kv_row_bytes(tv, kv_dim), kv_dim);
    }
    KvLayerView view{kc.data(), vc.data(), tk, tv, kv_row_bytes(tk, kv_dim), kv_row_bytes(tv, kv_dim), nullptr, 0};
    std::vector<float> out(static_cast<size_t>(n_heads) * hd, NAN), scratch(n_heads * (n_pos + 1) + 2 * kv_dim);
    attention_one_token(out.data(), q.data(), view, n_pos - 1, n_heads, n_kv, hd, 0, 0.125f, scratch.data());
    return out;
  };
  const auto ref = run(KvType::F32, KvType::F32);
  EXPECT_LT(rel_rms(run(KvType::Q8_0, KvType::Q8_0), ref), 0.02);
  EXPECT_LT(rel_rms(run(KvType::FP8, KvType::FP8), ref), 0.06);
  EXPECT_LT(rel_rms(run(KvType::Q4_0, KvType::Q4_0), ref), 0.25);
  EXPECT_LT(rel_rms(run(KvType::Q8_0, KvType::Q4_0), ref), 0.25);
  EXPECT_LT(rel_rms(run(KvType::F16, KvType::F16), ref), 1e-3);
}

TEST(KvQuant, EnginesTakeTheTypesAndRefuseWhatTheyLack) {
  auto model = Model::load(shared_model("stories260K.gguf"));
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.type_k = KvType::Q8_0;
  eo.type_v = KvType::Q8_0;
  auto q8 = make_cpu_engine(*model, eo);
  EXPECT_EQ(q8->type_k(), KvType::Q8_0);
  const CommandResult r = run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                                      " -n 1 -ctk q9 -t 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown KV cache type 'q9'"), std::string::npos) << r.err;
  if (cuda_device_available()) {
    // The GPU takes quantized KV in the paged cache only, and needs head_dim
    // a multiple of 32 (stories260K has 8): each refusal names its reason.
    eo.device = Device::Cuda;
    try {
      make_cuda_engine(*model, eo);
      ADD_FAILURE() << "the GPU engine accepted a contiguous q8_0 KV cache";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--kv paged"), std::string::npos) << e.what();
    }
    eo.kv = KvLayout::Paged;
    try {
      make_cuda_engine(*model, eo);
      ADD_FAILURE() << "the GPU engine accepted q8_0 KV at head_dim 8";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("head_dim=8"), std::string::npos) << e.what();
    }
  }
}
