// KV-cache types: the encodings round trip within their step, fp8 e4m3 is
// exact on its own values, attention over a quantized cache stays close to
// the f32 cache (K and V types chosen independently), and a block (one scale)
// never spans two heads: heads of 8 or 16 get blocks of their own size, and
// stories260K (head_dim 8) keeps its logits with q8_0 K and V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common.h"
#include "engine.h"
#include "kv_quant.h"
#include "model.h"
#include "ops.h"
#include "paged_kv.h"
#include "quant.h"
#include "test_support.h"
#include "tokenizer.h"

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
    std::vector<uint8_t> enc(kv_row_bytes(t, 4096, 128));
    std::vector<float> dec(4096, NAN);
    kv_encode_row(t, x.data(), enc.data(), 4096, 128);
    kv_decode_row(t, enc.data(), dec.data(), 4096, 128);
    EXPECT_LE(rel_rms(dec, x), bound) << kv_type_name(t);
  }
  EXPECT_THROW(kv_row_bytes(KvType::Q8_0, 40, 32), Error);
  EXPECT_THROW(kv_type_from_name("q5_1"), Error);
}

// Attention of one query over 300 positions with mixed K/V types against
// the f32 cache: the error follows the coarser of the two types.
TEST(KvQuant, AttentionOverAQuantizedCacheStaysClose) {
  const int n_heads = 8, n_kv = 2, hd = 64, kv_dim = n_kv * hd, n_pos = 300;
  const auto k = randn(static_cast<size_t>(n_pos) * kv_dim, 5), v = randn(static_cast<size_t>(n_pos) * kv_dim, 6);
  const auto q = randn(static_cast<size_t>(n_heads) * hd, 7);
  auto run = [&](KvType tk, KvType tv) {
    const size_t kb = kv_row_bytes(tk, kv_dim, hd), vb = kv_row_bytes(tv, kv_dim, hd);
    std::vector<uint8_t> kc(kb * n_pos), vc(vb * n_pos);
    for (int t = 0; t < n_pos; ++t) {
      kv_encode_row(tk, &k[static_cast<size_t>(t) * kv_dim], kc.data() + t * kb, kv_dim, hd);
      kv_encode_row(tv, &v[static_cast<size_t>(t) * kv_dim], vc.data() + t * vb, kv_dim, hd);
    }
    KvLayerView view{kc.data(), vc.data(), tk, tv, kb, vb, nullptr, 0};
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

// The block rule (kernels/cpu/kv_quant.h): 32 values when head_dim is a
// multiple of 32, else 16 or 8, whichever divides head_dim; row and page
// sizes follow it, and other head_dims are refused naming the combination.
TEST(KvQuant, BlocksFollowHeadDim) {
  const std::pair<int, int> rule[] = {{8, 8},   {16, 16}, {24, 8},  {40, 8},   {48, 16},
                                      {80, 16}, {32, 32}, {64, 32}, {96, 32}, {128, 32}};
  for (KvType t : {KvType::Q8_0, KvType::Q4_0, KvType::FP8}) {
    for (const auto& [hd, len] : rule) EXPECT_EQ(kv_block_len(t, hd), len) << kv_type_name(t) << " hd " << hd;
    for (int hd : {4, 6, 12, 20, 100}) {
      const std::string msg = error_of([&] { kv_block_len(t, hd); });
      expect_words(msg, {kv_type_name(t), "head_dim=" + std::to_string(hd), "multiple of 8", "f16", "bf16"});
      EXPECT_THROW(kv_row_bytes(t, 4 * hd, hd), Error);
    }
  }
  for (KvType t : {KvType::F32, KvType::F16, KvType::BF16}) EXPECT_EQ(kv_block_len(t, 12), 1);
  // Rows: 4 heads of 8 are 4 blocks (q8_0 / fp8: 2 + 8 bytes, q4_0: 2 + 4);
  // 2 heads of 16 are 2 blocks; 4 heads of 128 keep GGUF's 16 blocks of 32.
  EXPECT_EQ(kv_row_bytes(KvType::Q8_0, 32, 8), 4u * 10);
  EXPECT_EQ(kv_row_bytes(KvType::FP8, 32, 8), 4u * 10);
  EXPECT_EQ(kv_row_bytes(KvType::Q4_0, 32, 8), 4u * 6);
  EXPECT_EQ(kv_row_bytes(KvType::Q8_0, 32, 16), 2u * 18);
  EXPECT_EQ(kv_row_bytes(KvType::Q4_0, 32, 16), 2u * 10);
  EXPECT_EQ(kv_row_bytes(KvType::Q8_0, 512, 128), 16u * 34);
  EXPECT_EQ(kv_row_bytes(KvType::Q4_0, 512, 128), 16u * 18);
  EXPECT_EQ(kv_row_bytes(KvType::F16, 32, 8), 64u);
  // Pages (src/paged_kv.h): the same scale count per slot.
  struct PageCase {
    KvType t;
    int n_kv, hd;
    int64_t q_row, s_row;
  };
  const PageCase pages[] = {{KvType::Q8_0, 4, 8, 32, 8},   {KvType::Q4_0, 4, 8, 16, 8}, {KvType::FP8, 4, 8, 32, 8},
                            {KvType::Q8_0, 2, 16, 32, 4},  {KvType::Q4_0, 2, 16, 16, 4},
                            {KvType::Q8_0, 4, 128, 512, 32}, {KvType::Q4_0, 8, 64, 256, 32},
                            {KvType::F16, 4, 8, 64, 0}};
  for (const PageCase& c : pages) {
    const KvPoolLayout l = kv_pool_layout(c.t, 16, c.n_kv, c.hd);
    EXPECT_EQ(l.q_row, c.q_row) << kv_type_name(c.t) << " " << c.n_kv << "x" << c.hd;
    EXPECT_EQ(l.s_row, c.s_row) << kv_type_name(c.t) << " " << c.n_kv << "x" << c.hd;
    EXPECT_EQ(size_t(l.q_row + l.s_row), kv_row_bytes(c.t, c.n_kv * c.hd, c.hd));
    EXPECT_EQ(l.page, 16 * (l.q_row + l.s_row));
  }
}

// q8_0 blocks of 32 are GGUF's Q8_0 blocks, byte for byte (the bytes the
// GPU's store reproduces), and a block of 8 has the same format at its size.
TEST(KvQuant, Q8BlocksOf32AreGgufAndSmallBlocksKeepTheFormat) {
  const auto x = randn(512, 11);
  for (int hd : {32, 64, 128}) {
    std::vector<uint8_t> kv(kv_row_bytes(KvType::Q8_0, 512, hd)), gguf(kv.size());
    kv_encode_row(KvType::Q8_0, x.data(), kv.data(), 512, hd);
    quantize_row(DType::Q8_0, x.data(), gguf.data(), 512);
    EXPECT_EQ(kv, gguf) << "hd " << hd;
  }
  const float v[8] = {-8, 1, 2, 3, 4, 5, 6, 7};
  uint8_t q8[10];
  kv_encode_row(KvType::Q8_0, v, q8, 8, 8);
  float back[8];
  kv_decode_row(KvType::Q8_0, q8, back, 8, 8);
  EXPECT_EQ(static_cast<int8_t>(q8[2]), -127);  // the largest magnitude takes the full range
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(back[i], v[i], 8.0 / 254 + 1e-6) << i;
}

// q4_0 keeps GGUF's Q4_0 format (blocks of 32 decode through GGUF's own
// dequantizer to the same values; scale, then byte j = element j in the low
// nibble and element j + L / 2 in the high one), but its scale is a least-
// squares fit: on N(0, 1) values no block's error exceeds that of GGUF's
// reference quantizer (largest value to -8) by more than the f16 rounding of
// the scale, and the total is clearly lower.
TEST(KvQuant, Q4HasGgufFormatAndLeastSquaresScale) {
  const int n = 4096;
  const auto x = randn(n, 11);
  for (int hd : {8, 16, 32, 128}) {
    const int len = kv_quant_block_len(hd);
    std::vector<uint8_t> kv(kv_row_bytes(KvType::Q4_0, n, hd));
    std::vector<float> fit(n, NAN), ref(n, NAN);
    kv_encode_row(KvType::Q4_0, x.data(), kv.data(), n, hd);
    kv_decode_row(KvType::Q4_0, kv.data(), fit.data(), n, hd);
    if (len == kQK) {
      std::vector<float> gguf_dec(n, NAN);
      dequantize_row(DType::Q4_0, kv.data(), gguf_dec.data(), n);
      EXPECT_EQ(gguf_dec, fit) << "hd " << hd;
    }
    // GGUF's reference quantizer, one block of len values at a time (ggml's
    // arithmetic: d = max / -8, levels trunc(x / d + 8.5)).
    for (int b = 0; b < n / len; ++b) {
      float amax = 0, mx = 0;
      for (int i = 0; i < len; ++i)
        if (amax < std::fabs(x[size_t(b * len + i)])) amax = std::fabs(mx = x[size_t(b * len + i)]);
      const float d = mx / -8, id = 1 / d, d16 = fp16_to_fp32(fp32_to_fp16(d));
      for (int i = 0; i < len; ++i) {
        const int q = std::min(15, static_cast<int>(x[size_t(b * len + i)] * id + 8.5f));
        ref[size_t(b * len + i)] = static_cast<float>(q - 8) * d16;
      }
    }
    double e_fit = 0, e_ref = 0;
    for (int b = 0; b < n / len; ++b) {
      double bf = 0, br = 0, amax = 0;
      for (int i = b * len; i < (b + 1) * len; ++i) {
        bf += (fit[size_t(i)] - x[size_t(i)]) * (fit[size_t(i)] - x[size_t(i)]);
        br += (ref[size_t(i)] - x[size_t(i)]) * (ref[size_t(i)] - x[size_t(i)]);
        amax = std::max(amax, double(std::fabs(x[size_t(i)])));
      }
      // The f16 scale is within 2^-11 of the fit; that moves each value by at
      // most 8 * 2^-11 * d ~ amax * 2^-11.
      EXPECT_LE(bf, br + len * std::pow(amax * 2 * std::ldexp(1.0, -11), 2) + 1e-12) << "hd " << hd << " block " << b;
      e_fit += bf;
      e_ref += br;
    }
    // Measured: squared error 0.76x GGUF's in blocks of 8, 0.83x in 16, 0.87x in 32.
    EXPECT_LT(e_fit, 0.92 * e_ref) << "hd " << hd << ": RMS error " << std::sqrt(e_fit / n) << " against GGUF's "
                                   << std::sqrt(e_ref / n);
  }
  const float v[8] = {-8, 1, 2, 3, 4, 5, 6, 7};  // fits levels x exactly: d = 1, quants x + 8
  uint8_t q4[6];
  kv_encode_row(KvType::Q4_0, v, q4, 8, 8);
  const uint8_t want_q4[6] = {0x00, 0x3c, 0xc0, 0xd9, 0xea, 0xfb};  // f16 1.0, then {0,12} {9,13} {10,14} {11,15}
  EXPECT_TRUE(std::equal(q4, q4 + 6, want_q4));
  const float zeros[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  kv_encode_row(KvType::Q4_0, zeros, q4, 8, 8);
  const uint8_t want_zero[6] = {0, 0, 0x88, 0x88, 0x88, 0x88};  // d = 0, every level 0
  EXPECT_TRUE(std::equal(q4, q4 + 6, want_zero));
}

// Weights (K smoothing's per-channel weight in the logits) steer q4_0's
// scale fit: with channels weighted by up to e^3 against each other, the
// weighted error of the weighted fit is no larger in any block (up to the f16
// rounding of the scale) and clearly lower in total; the other types ignore
// the weights.
TEST(KvQuant, Q4WeightsSteerTheScaleFit) {
  const int n = 4096, hd = 128;
  const auto x = randn(n, 17);
  std::vector<float> w(n);
  std::mt19937 g(5);
  std::uniform_real_distribution<float> log_w(-1.5f, 1.5f);
  for (auto& v : w) v = std::exp(log_w(g));
  std::vector<uint8_t> plain(kv_row_bytes(KvType::Q4_0, n, hd)), weighted(plain.size());
  kv_encode_row(KvType::Q4_0, x.data(), plain.data(), n, hd);
  kv_encode_row(KvType::Q4_0, x.data(), weighted.data(), n, hd, w.data());
  std::vector<float> dp(n, NAN), dw(n, NAN);
  kv_decode_row(KvType::Q4_0, plain.data(), dp.data(), n, hd);
  kv_decode_row(KvType::Q4_0, weighted.data(), dw.data(), n, hd);
  double ep = 0, ew = 0;
  for (int b = 0; b < n / 32; ++b) {
    double bp = 0, bw = 0, amax = 0, wsum = 0;
    for (int i = b * 32; i < (b + 1) * 32; ++i) {
      bp += w[size_t(i)] * std::pow(dp[size_t(i)] - x[size_t(i)], 2);
      bw += w[size_t(i)] * std::pow(dw[size_t(i)] - x[size_t(i)], 2);
      amax = std::max(amax, double(std::fabs(x[size_t(i)])));
      wsum += w[size_t(i)];
    }
    EXPECT_LE(bw, bp + wsum * std::pow(amax * 2 * std::ldexp(1.0, -11), 2) + 1e-12) << "block " << b;
    ep += bp;
    ew += bw;
  }
  EXPECT_LT(ew, 0.97 * ep) << "weighted error " << ew << " against " << ep;
  for (KvType t : {KvType::Q8_0, KvType::FP8}) {
    std::vector<uint8_t> a(kv_row_bytes(t, n, hd)), b(a.size());
    kv_encode_row(t, x.data(), a.data(), n, hd);
    kv_encode_row(t, x.data(), b.data(), n, hd, w.data());
    EXPECT_EQ(a, b) << kv_type_name(t);
  }
}

// One row of 4 heads whose magnitudes differ by up to 10^4 (as the
// heads of a real K row differ, more mildly). Every head's error is bounded
// by its own largest value: q8_0 by half a step of amax / 127 plus the f16
// rounding of the scale (127 * d * 2^-11 = amax * 2^-11); q4_0 by 3/16 of
// amax (the least-squares scale maps the signed max to 6.4-9.4 levels and
// may clip values opposite it at +7: at most 0.168 measured); fp8
// by e4m3's relative 2^-4 plus the subnormal step. With head_dim 32 (one
// block spanning the four heads, the layout before the fix) the small heads
// lose everything, which the same bounds catch.
TEST(KvQuant, SmallHeadsKeepTheirOwnScale) {
  const std::pair<KvType, double> bound[] = {
      {KvType::Q8_0, 1.0 / 254 + 1.0 / 2048}, {KvType::Q4_0, 3.0 / 16}, {KvType::FP8, 1.0 / 16 + 1.0 / 1024}};
  const float scale[4] = {300.0f, 0.002f, 1.0f, 20.0f};  // hd 16: blocks of 32 pair heads 0-1 and 2-3
  for (int hd : {8, 16}) {
    const int n = 4 * hd;
    auto x = randn(size_t(n), 21 + hd);
    for (int h = 0; h < 4; ++h)
      for (int i = 0; i < hd; ++i) x[size_t(h * hd + i)] *= scale[h];
    // Worst error of each head, relative to that head's largest value.
    auto head_errors = [&](KvType t, int block_hd) {
      std::vector<uint8_t> enc(kv_row_bytes(t, n, block_hd));
      std::vector<float> dec(size_t(n), NAN);
      kv_encode_row(t, x.data(), enc.data(), n, block_hd);
      kv_decode_row(t, enc.data(), dec.data(), n, block_hd);
      std::vector<double> rel(4);
      for (int h = 0; h < 4; ++h) {
        double amax = 0, err = 0;
        for (int i = h * hd; i < (h + 1) * hd; ++i) {
          amax = std::max(amax, double(std::fabs(x[size_t(i)])));
          err = std::max(err, double(std::fabs(dec[size_t(i)] - x[size_t(i)])));
        }
        rel[size_t(h)] = err / amax;
      }
      return rel;
    };
    for (const auto& [t, b] : bound) {
      const auto own = head_errors(t, hd);
      for (int h = 0; h < 4; ++h)
        EXPECT_LE(own[size_t(h)], b) << kv_type_name(t) << " hd " << hd << " head " << h << " (x" << scale[h] << ")";
      // Blocks of 32 across the heads: the head at 0.002 rounds to nothing
      // against a scale set by the head at 300 (q8_0, q4_0), or to e4m3's
      // subnormals (fp8).
      const auto spanning = head_errors(t, 32);
      EXPECT_GT(spanning[1], b) << kv_type_name(t) << " hd " << hd;
    }
  }
}

// End to end on stories260K (head_dim 8, 4 KV heads): with q8_0 K and V the
// logits over 256 tokens of text stay close to those of the f16 cache. The
// bound is set from bf16, the low-precision reference: bf16 rounds a value to
// within |x| * 2^-9, q8_0 to within amax / 254 of its block, so per value
// q8_0's error is 2 * amax / |x| times bf16's. What reaches the logits is
// q . dk: weighted by q over this model's Q and K rows (a dump of the
// perplexity text), q8_0 with a scale per head gives 5.0x bf16's RMS, blocks
// of 32 spanning 4 heads 6.2x. So the RMS logit change may be at most 5.5x
// bf16's (measured 4.6x; 6.1x with the blocks of 32), and the mean KL
// divergence at most 0.005 (measured 0.0027; 0.0043 with blocks of 32).
TEST(KvQuant, Stories260kQ8KvLogitsStayCloseToF16) {
  RUNLM_REQUIRE_ASSET(shared_model("sotu29m/eval.txt"));
  auto model = Model::load(shared_model("stories260K.gguf"));
  const std::string text = read_file(shared_model("sotu29m/eval.txt")).substr(0, 1500);
  std::vector<int> tokens = model->tokenizer().encode(text, true);
  ASSERT_GE(tokens.size(), 256u);
  tokens.resize(256);
  const int n_vocab = model->config().n_vocab;
  auto logits = [&](KvType t) {
    EngineOptions eo;
    eo.device = Device::Cpu;
    eo.n_threads = 2;
    eo.n_ctx = 256;
    eo.type_k = eo.type_v = t;
    auto engine = make_cpu_engine(*model, eo);
    std::vector<float> out(tokens.size() * size_t(n_vocab));
    engine->forward(tokens.data(), int(tokens.size()), 0, out.data(), true);
    return out;
  };
  const auto ref = logits(KvType::F16), bf16 = logits(KvType::BF16), q8 = logits(KvType::Q8_0);
  auto rms_diff = [&](const std::vector<float>& a) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += (a[i] - ref[i]) * double(a[i] - ref[i]);
    return std::sqrt(s / double(a.size()));
  };
  auto mean_kl = [&](const std::vector<float>& a) {  // KL(softmax(ref) || softmax(a)) per token
    double total = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* p = &ref[t * size_t(n_vocab)];
      const float* q = &a[t * size_t(n_vocab)];
      const double mp = *std::max_element(p, p + n_vocab), mq = *std::max_element(q, q + n_vocab);
      double zp = 0, zq = 0;
      for (int i = 0; i < n_vocab; ++i) {
        zp += std::exp(p[i] - mp);
        zq += std::exp(q[i] - mq);
      }
      double kl = 0;
      for (int i = 0; i < n_vocab; ++i) {
        const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
        kl += std::exp(lp) * (lp - lq);
      }
      total += kl;
    }
    return total / double(tokens.size());
  };
  const double rms_bf16 = rms_diff(bf16), rms_q8 = rms_diff(q8), kl_q8 = mean_kl(q8);
  std::printf("stories260K, 256 tokens: RMS logit change bf16 %.5f, q8_0 %.5f (%.2fx); mean KL q8_0 %.6f\n", rms_bf16,
              rms_q8, rms_q8 / rms_bf16, kl_q8);
  EXPECT_GT(rms_bf16, 0.0);
  EXPECT_LE(rms_q8, 5.5 * rms_bf16);
  EXPECT_LE(kl_q8, 0.005);
}

// Through the command line: a model with heads of 12 refuses the quantized
// types for K or V with the error naming the combination, and takes the
// plain ones; heads of 24 run every type (blocks of 8).
TEST(KvQuant, HeadDimsNotAMultipleOf8RefuseQuantizedTypes) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  auto model_with_heads_of = [](int hd, const TempPath& out) {
    const std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset tiny --type f32 --layers 1 --heads 4" +
                            " --kv-heads 2 --hidden 64 --dim " + std::to_string(4 * hd) + " --tokenizer " +
                            shared_model("llama2-tokenizer.model") + " -o " + out.str();
    ASSERT_EQ(run_command(cmd).exit_code, 0) << cmd;
  };
  const TempPath hd12(".gguf"), hd24(".gguf");
  model_with_heads_of(12, hd12);
  model_with_heads_of(24, hd24);
  // The CPU's rule; the GPU's (head_dim % 32, paged cache) has its own test
  // (CudaEngine.KvTypeErrorsNameTheCombination).
  auto generate = [](const TempPath& m, const std::string& k, const std::string& v) {
    return run_command(runlm_binary() + " generate --device cpu -m " + m.str() + " -p Hi -n 2 -t 2 -ctk " + k +
                       " -ctv " + v);
  };
  for (const auto& [k, v] : {std::pair<std::string, std::string>{"q8_0", "f16"}, {"f16", "q4_0"}, {"fp8", "fp8"}}) {
    const CommandResult r = generate(hd12, k, v);
    EXPECT_EQ(r.exit_code, 1) << k << "/" << v;
    expect_words(r.err, {k == "f16" ? v : k, "head_dim=12", "multiple of 8", "f32, f16, bf16"});
  }
  EXPECT_EQ(generate(hd12, "f16", "bf16").exit_code, 0);
  for (const std::string t : {"q8_0", "q4_0", "fp8"}) {
    const CommandResult r = generate(hd24, t, t);
    EXPECT_EQ(r.exit_code, 0) << t << ": " << r.err;
  }
}
