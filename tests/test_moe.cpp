// Mixture-of-experts families on the CPU (Mixtral as llama with experts,
// Qwen3-MoE, gpt-oss): the routing (top k, the two gating orders, the
// renormalisation), gpt-oss's clamped SwiGLU, attention sinks and YaRN RoPE
// against their formulas computed here; the tiny random presets load with
// the keys llama.cpp reads, generate, and their first token's logits match
// the whole layer written out in plain loops; the CUDA engine refuses them
// naming the features.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common.h"
#include "engine.h"
#include "engine_support.h"
#include "gguf.h"
#include "model.h"
#include "moe_routing.h"
#include "ops.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {

std::string small_tokenizer() { return embedded_model_dir() + "/stories260K-tok512.model"; }

std::string make_model(const TempPath& out, const std::string& preset, const std::string& size,
                       const std::string& type = "f32") {
  const std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset " + preset + " " + size + " --type " +
                          type + " --tokenizer " + small_tokenizer() + " -o " + out.str();
  const CommandResult r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  return out.str();
}

constexpr const char* kMixtral = "--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --experts 4 --experts-used 2";
constexpr const char* kQwen3Moe =
    "--dim 64 --hidden 96 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --experts-used 3 "
    "--expert-hidden 48";
constexpr const char* kGptOss =
    "--dim 64 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 16 --experts 4 --experts-used 2 "
    "--expert-hidden 32 --sliding-window 5";

struct MoeFamily {
  const char* preset;
  const char* size;
  Arch arch;
};
const MoeFamily kMoeFamilies[] = {
    {"mixtral-8x7b", kMixtral, Arch::Llama},
    {"qwen3-30b-a3b", kQwen3Moe, Arch::Qwen3Moe},
    {"gpt-oss-20b", kGptOss, Arch::GptOss},
};

std::unique_ptr<Engine> cpu(const Model& m, int n_ctx = 64) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = n_ctx;
  return make_cpu_engine(m, eo);
}

std::vector<int> prompt(int n_vocab) {
  std::vector<int> ids{1};
  for (int i = 1; i < 20; ++i) ids.push_back((i * 37 + 11) % n_vocab);
  return ids;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

std::vector<float> matvec(const float* w, const std::vector<float>& x, size_t rows) {
  std::vector<float> y(rows);
  for (size_t r = 0; r < rows; ++r) {
    double acc = 0;
    for (size_t c = 0; c < x.size(); ++c) acc += double(w[r * x.size() + c]) * x[c];
    y[r] = float(acc);
  }
  return y;
}
std::vector<float> matvec(const std::vector<float>& w, const std::vector<float>& x) {
  return matvec(w.data(), x, w.size() / x.size());
}

std::vector<float> rms(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] * inv * w[i]);
  return y;
}

std::vector<double> softmax_d(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> y(x.size());
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += y[i] = std::exp(x[i] - m);
  for (double& v : y) v /= s;
  return y;
}

}  // namespace

TEST(MoeRouting, SoftmaxThenTopKThenRenormalise) {
  const float logits[5] = {0.5f, 2.0f, -1.0f, 1.5f, 0.0f};
  std::vector<double> p = softmax_d({0.5, 2.0, -1.0, 1.5, 0.0});
  MoeRouting r;
  r.n_expert = 5;
  r.n_used = 2;
  r.softmax_first = true;
  int32_t ex[2];
  float w[2], tmp[5];
  // Without renormalisation the weights are the full softmax's probabilities.
  r.normalize = false;
  moe_route(logits, r, ex, w, tmp);
  EXPECT_EQ(ex[0], 1);
  EXPECT_EQ(ex[1], 3);
  EXPECT_NEAR(w[0], p[1], 1e-6);
  EXPECT_NEAR(w[1], p[3], 1e-6);
  // Renormalised (Mixtral, Qwen3-MoE norm_topk_prob): they sum to 1, in the same ratio.
  r.normalize = true;
  moe_route(logits, r, ex, w, tmp);
  EXPECT_NEAR(w[0], p[1] / (p[1] + p[3]), 1e-6);
  EXPECT_NEAR(w[1], p[3] / (p[1] + p[3]), 1e-6);
  EXPECT_NEAR(w[0] / w[1], std::exp(0.5), 1e-5);
  // expert_weights_scale multiplies after the renormalisation.
  r.scale = 2.5f;
  moe_route(logits, r, ex, w, tmp);
  EXPECT_NEAR(w[0] + w[1], 2.5, 1e-5);
}

TEST(MoeRouting, TopKThenSoftmaxOverTheChosen) {
  // gpt-oss: the two best logits, then a softmax over just those two.
  const float logits[4] = {3.0f, -2.0f, 1.0f, 2.5f};
  MoeRouting r;
  r.n_expert = 4;
  r.n_used = 2;
  r.softmax_first = false;
  r.normalize = false;
  int32_t ex[2];
  float w[2], tmp[4];
  moe_route(logits, r, ex, w, tmp);
  EXPECT_EQ(ex[0], 0);
  EXPECT_EQ(ex[1], 3);
  const double e = std::exp(0.5);
  EXPECT_NEAR(w[0], e / (e + 1), 1e-6);
  EXPECT_NEAR(w[1], 1 / (e + 1), 1e-6);
  // The order matters: softmax over all four first gives other weights.
  r.softmax_first = true;
  float w2[2];
  moe_route(logits, r, ex, w2, tmp);
  EXPECT_GT(std::abs(w2[0] - w[0]), 0.05);
}

TEST(MoeRouting, TopKPicksTheLargestAndTiesGoToTheLowerIndex) {
  const float logits[6] = {0.1f, 0.7f, 0.7f, -3.0f, 0.9f, 0.2f};
  MoeRouting r;
  r.n_expert = 6;
  r.n_used = 3;
  r.softmax_first = false;
  int32_t ex[3];
  float w[3], tmp[6];
  moe_route(logits, r, ex, w, tmp);
  EXPECT_EQ(ex[0], 4);
  EXPECT_EQ(ex[1], 1);
  EXPECT_EQ(ex[2], 2);
  EXPECT_FLOAT_EQ(w[1], w[2]);
  r.n_used = 7;
  expect_words(error_of([&] { moe_route(logits, r, ex, w, tmp); }), {"7 of 6 experts"});
}

TEST(MoeOps, SwigluOaiClampsGateAboveAndUpBothWays) {
  const float gate_in[5] = {-2.0f, 0.5f, 6.0f, 9.0f, 100.0f};
  const float up[5] = {1.0f, -9.0f, 0.25f, 8.0f, -7.5f};
  float gate[5];
  std::copy(gate_in, gate_in + 5, gate);
  swiglu_oai(gate, up, 5);
  for (int i = 0; i < 5; ++i) {
    const double g = std::min<double>(gate_in[i], 7.0);
    const double u = std::clamp<double>(up[i], -7.0, 7.0);
    const double want = g / (1 + std::exp(-1.702 * g)) * (u + 1);
    EXPECT_NEAR(gate[i], want, 1e-5 * std::max(1.0, std::abs(want))) << i;
  }
  // Gates of 9 and 100 are both cut to 7: the same output for the same up.
  float a[2] = {9.0f, 100.0f};
  const float u2[2] = {0.5f, 0.5f};
  swiglu_oai(a, u2, 2);
  EXPECT_EQ(a[0], a[1]);
}

TEST(MoeOps, SinkTakesItsShareOfTheSoftmax) {
  std::vector<float> x = {1.0f, 2.0f, 0.5f};
  softmax_with_sink(x.data(), 3, 1.5f);
  const double den = std::exp(1.0) + std::exp(2.0) + std::exp(0.5) + std::exp(1.5);
  EXPECT_NEAR(x[0], std::exp(1.0) / den, 1e-6);
  EXPECT_NEAR(x[1], std::exp(2.0) / den, 1e-6);
  EXPECT_NEAR(x[2], std::exp(0.5) / den, 1e-6);
  EXPECT_LT(x[0] + x[1] + x[2], 0.9);
  // A sink far above every score takes almost everything (its max is used, no overflow).
  std::vector<float> y = {0.0f, 0.0f};
  softmax_with_sink(y.data(), 2, 200.0f);
  EXPECT_LT(y[0], 1e-30);
  EXPECT_TRUE(std::isfinite(y[0]));
}

TEST(MoeOps, AttentionSinksScaleTheFirstTokenOutput) {
  // One position: without a sink attention returns V; with sink s per head,
  // V times e^score / (e^score + e^s).
  const int n_heads = 2, n_kv = 1, hd = 4;
  const float q[8] = {1, 0, 0, 0, 0, 1, 0, 0};
  const float k[4] = {0.5f, 2.0f, 0, 0};
  const float v[4] = {1, 2, 3, 4};
  KvLayerView kv{reinterpret_cast<const uint8_t*>(k), reinterpret_cast<const uint8_t*>(v), KvType::F32, KvType::F32,
                 sizeof(k), sizeof(v), nullptr, 0};
  std::vector<float> scratch(64), out(8);
  const float sinks[2] = {0.0f, 3.0f};
  attention_one_token(out.data(), q, kv, 0, n_heads, n_kv, hd, 0, 0.5f, scratch.data(), 0.0f, sinks);
  const double s0 = 0.5 * 0.5, s1 = 2.0 * 0.5;
  const double p0 = std::exp(s0) / (std::exp(s0) + 1.0), p1 = std::exp(s1) / (std::exp(s1) + std::exp(3.0));
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[i], v[i] * p0, 1e-6);
    EXPECT_NEAR(out[4 + i], v[i] * p1, 1e-6);
  }
  attention_one_token(out.data(), q, kv, 0, n_heads, n_kv, hd, 0, 0.5f, scratch.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[i], v[i]);
}

TEST(MoeOps, YarnCorrectionDimsAndAnglesFollowTheFormulas) {
  // gpt-oss: 64 rotary dims, base 150000, original context 4096, beta 32 / 1.
  float dims[2];
  rope_yarn_corr_dims(64, 4096, 150000.0f, 32.0f, 1.0f, dims);
  auto corr = [](double beta) { return 64 * std::log(4096 / (beta * 2 * M_PI)) / (2 * std::log(150000.0)); };
  EXPECT_EQ(dims[0], std::floor(corr(32)));  // 8.09 -> 8
  EXPECT_EQ(dims[1], std::ceil(corr(1)));    // 17.4 -> 18
  EXPECT_EQ(dims[0], 8.0f);
  EXPECT_EQ(dims[1], 18.0f);

  // One head of 64 dims, NeoX pairs (i, i + 32), every pair set to (1, 0):
  // after RoPE pair i is mscale * (cos a_i, sin a_i).
  RopeSpec rs;
  rs.neox = true;
  rs.n_rot = 64;
  rs.theta = 150000.0f;
  rs.freq_scale = 1.0f / 32;
  rs.attn_factor = 1.0f;
  rs.ext_factor = 1.0f;
  rs.corr_dims[0] = dims[0];
  rs.corr_dims[1] = dims[1];
  const int pos = 77;
  std::vector<float> x(64, 0.0f);
  for (int i = 0; i < 32; ++i) x[size_t(i)] = 1.0f;
  rope_ext(x.data(), 1, 64, pos, rs);
  const double mscale = 1 + 0.1 * std::log(32.0);
  for (int i = 0; i < 32; ++i) {
    const double extrap = pos * std::pow(150000.0, -2.0 * i / 64);
    const double interp = extrap / 32;
    const double ramp = 1 - std::clamp((i - 8.0) / (18.0 - 8.0), 0.0, 1.0);  // 1 below pair 8, 0 above 18
    const double a = interp * (1 - ramp) + extrap * ramp;
    EXPECT_NEAR(x[size_t(i)], mscale * std::cos(a), 2e-5) << i;
    EXPECT_NEAR(x[size_t(i + 32)], mscale * std::sin(a), 2e-5) << i;
  }
  // Without ext_factor the same spec is plain linear scaling without mscale.
  rs.ext_factor = 0;
  std::vector<float> y(64, 0.0f);
  for (int i = 0; i < 32; ++i) y[size_t(i)] = 1.0f;
  rope_ext(y.data(), 1, 64, pos, rs);
  EXPECT_NEAR(y[0], std::cos(pos / 32.0), 1e-5);
}

TEST(MoeFamilies, PresetsResolveAsLlamaCppReadsThem) {
  {
    TempPath p(".gguf");
    make_model(p, "mixtral-8x7b", kMixtral);
    auto g = GgufFile::open(p.str());
    EXPECT_EQ(g->get_string("general.architecture"), "llama");
    EXPECT_EQ(g->get_int("llama.expert_count"), 4);
    EXPECT_EQ(g->get_int("llama.expert_used_count"), 2);
    EXPECT_EQ(g->find("llama.expert_feed_forward_length"), nullptr);  // llama's experts are feed_forward_length wide
    const GgufTensorInfo* up = g->find_tensor("blk.1.ffn_up_exps.weight");
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(up->ne, (std::vector<int64_t>{64, 96, 4}));
    EXPECT_EQ(g->find_tensor("blk.0.ffn_up.weight"), nullptr);
    const ModelConfig c = Model::load(p.str())->config();
    EXPECT_EQ(c.arch, Arch::Llama);
    EXPECT_EQ(c.n_expert, 4);
    EXPECT_EQ(c.n_expert_used, 2);
    EXPECT_EQ(c.expert_hidden_dim, 96);
    EXPECT_EQ(c.moe_gating, MoeGating::SoftmaxThenTopK);
    EXPECT_TRUE(c.moe_norm_weights);
  }
  {
    TempPath p(".gguf");
    make_model(p, "qwen3-30b-a3b", kQwen3Moe);
    auto g = GgufFile::open(p.str());
    EXPECT_EQ(g->get_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(g->get_int("qwen3moe.expert_feed_forward_length"), 48);
    EXPECT_EQ(g->find_tensor("blk.0.ffn_down_exps.weight")->ne, (std::vector<int64_t>{48, 64, 8}));
    const ModelConfig c = Model::load(p.str())->config();
    EXPECT_EQ(c.arch, Arch::Qwen3Moe);
    EXPECT_EQ(c.expert_hidden_dim, 48);
    EXPECT_EQ(c.n_expert_used, 3);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_TRUE(c.moe_norm_weights);
    EXPECT_FALSE(c.moe_biases);
  }
  {
    TempPath p(".gguf");
    make_model(p, "gpt-oss-20b", kGptOss);
    auto g = GgufFile::open(p.str());
    EXPECT_EQ(g->get_string("general.architecture"), "gpt-oss");
    EXPECT_EQ(g->get_string("gpt-oss.rope.scaling.type"), "yarn");
    EXPECT_EQ(g->get_float("gpt-oss.rope.scaling.factor"), 32.0);
    EXPECT_EQ(g->get_int("gpt-oss.rope.scaling.original_context_length"), 4096);
    for (const char* t : {"blk.0.attn_sinks.weight", "blk.0.attn_output.bias", "blk.0.post_attention_norm.weight",
                          "blk.0.ffn_gate_inp.bias", "blk.0.ffn_up_exps.bias", "blk.0.attn_q.bias"})
      EXPECT_NE(g->find_tensor(t), nullptr) << t;
    EXPECT_EQ(g->find_tensor("blk.0.ffn_norm.weight"), nullptr);
    const ModelConfig c = Model::load(p.str())->config();
    EXPECT_EQ(c.arch, Arch::GptOss);
    EXPECT_EQ(c.moe_gating, MoeGating::TopKThenSoftmax);
    EXPECT_FALSE(c.moe_norm_weights);
    EXPECT_TRUE(c.moe_biases && c.attn_sinks && c.attn_out_bias && c.qkv_bias && c.ffn_norm_post_attention);
    EXPECT_EQ(c.ffn_act, FfnActivation::SwigluOai);
    EXPECT_TRUE(c.rope_yarn);
    EXPECT_FLOAT_EQ(c.rope_freq_scale, 1.0f / 32);
    EXPECT_EQ(c.rope_orig_ctx, 4096);
    // llama.cpp's yarn_attn_factor: get_mscale(32) / (1 + 0.1 ln 32), about 1.
    EXPECT_NEAR(c.rope_attn_factor, 1.0f, 1e-6);
    // Every other layer slides, layer 0 first (llama.cpp's swa pattern 2).
    EXPECT_EQ(c.sliding_window, 5);
    EXPECT_EQ(c.swa_layers, (std::vector<uint8_t>{1, 0}));
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.q_dim(), 64);
  }
}

TEST(MoeFamilies, EveryFamilyGeneratesAndBatchedEqualsStepwise) {
  for (const MoeFamily& f : kMoeFamilies) {
    SCOPED_TRACE(f.preset);
    TempPath path(".gguf");
    make_model(path, f.preset, f.size);
    auto m = Model::load(path.str());
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.arch, f.arch);
    EXPECT_TRUE(c.moe());
    auto e = cpu(*m);
    std::vector<int> ids = prompt(c.n_vocab);
    std::vector<float> logits(size_t(c.n_vocab));
    e->forward(ids.data(), int(ids.size()), 0, logits.data(), false);
    for (int step = 0; step < 12; ++step) {
      for (float x : logits) ASSERT_TRUE(std::isfinite(x));
      const int next = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
      e->forward(&next, 1, int(ids.size()), logits.data(), false);
      ids.push_back(next);
    }
    // The whole sequence in one step (every expert sees many tokens at once)
    // gives the stepwise logits.
    auto e2 = cpu(*m);
    std::vector<float> batch(size_t(c.n_vocab));
    e2->forward(ids.data(), int(ids.size()), 0, batch.data(), false);
    EXPECT_LE(max_abs_diff(batch, logits), 1e-4);
  }
}

namespace {

// The first token's logits of a 1-layer MoE model written out in plain
// loops. At position 0 attention sees one key: it returns V (times the
// sink's share for gpt-oss), so q and k matter only through the sink.
std::vector<float> first_token_reference(const GgufFile& g, const ModelConfig& c, int tok) {
  auto t = [&](const std::string& name) {
    const GgufTensorInfo* info = g.find_tensor(name);
    EXPECT_NE(info, nullptr) << name;
    std::vector<float> v(size_t(info->n_elements()));
    std::memcpy(v.data(), g.tensor_data(*info), v.size() * 4);  // f32 file
    return v;
  };
  const bool oss = c.arch == Arch::GptOss;
  const int dim = c.dim, hd = c.head_dim, group = c.n_heads / c.n_kv_heads;
  const std::vector<float> embd = t("token_embd.weight");
  std::vector<float> x(embd.begin() + size_t(tok) * dim, embd.begin() + size_t(tok + 1) * dim);
  const std::vector<float> h = rms(x, t("blk.0.attn_norm.weight"), c.rms_eps);
  std::vector<float> v = matvec(t("blk.0.attn_v.weight"), h);
  std::vector<float> att(size_t(c.q_dim()));
  if (oss) {
    std::vector<float> q = matvec(t("blk.0.attn_q.weight"), h), k = matvec(t("blk.0.attn_k.weight"), h);
    const std::vector<float> bq = t("blk.0.attn_q.bias"), bk = t("blk.0.attn_k.bias"), bv = t("blk.0.attn_v.bias");
    for (size_t i = 0; i < q.size(); ++i) q[i] += bq[i];
    for (size_t i = 0; i < k.size(); ++i) k[i] += bk[i], v[i] += bv[i];
    // RoPE at position 0 turns nothing but YaRN scales q and k by mscale.
    const double mscale = c.rope_attn_factor * (1 + 0.1 * std::log(1.0 / c.rope_freq_scale));
    const std::vector<float> sinks = t("blk.0.attn_sinks.weight");
    for (int hh = 0; hh < c.n_heads; ++hh) {
      double s = 0;
      for (int i = 0; i < hd; ++i) s += double(q[size_t(hh * hd + i)]) * k[size_t((hh / group) * hd + i)];
      s *= mscale * mscale / std::sqrt(double(hd));
      const double p = 1 / (1 + std::exp(sinks[size_t(hh)] - s));
      for (int i = 0; i < hd; ++i) att[size_t(hh * hd + i)] = float(p * v[size_t((hh / group) * hd + i)]);
    }
  } else {
    for (int hh = 0; hh < c.n_heads; ++hh)
      for (int i = 0; i < hd; ++i) att[size_t(hh * hd + i)] = v[size_t((hh / group) * hd + i)];
  }
  std::vector<float> o = matvec(t("blk.0.attn_output.weight"), att);
  if (oss) {
    const std::vector<float> bo = t("blk.0.attn_output.bias");
    for (int i = 0; i < dim; ++i) o[size_t(i)] += bo[size_t(i)];
  }
  for (int i = 0; i < dim; ++i) x[size_t(i)] += o[size_t(i)];
  const std::vector<float> h2 = rms(x, t(oss ? "blk.0.post_attention_norm.weight" : "blk.0.ffn_norm.weight"), c.rms_eps);

  // Router: Mixtral / Qwen3-MoE softmax over all, top k, renormalised;
  // gpt-oss top k logits (plus the router bias), softmax over those.
  std::vector<float> logits = matvec(t("blk.0.ffn_gate_inp.weight"), h2);
  if (oss) {
    const std::vector<float> b = t("blk.0.ffn_gate_inp.bias");
    for (size_t i = 0; i < logits.size(); ++i) logits[i] += b[i];
  }
  std::vector<double> score(logits.begin(), logits.end());
  if (!oss) score = softmax_d(score);
  std::vector<int> order(score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
  order.resize(size_t(c.n_expert_used));
  std::vector<double> w;
  for (int e : order) w.push_back(score[size_t(e)]);
  if (oss) {
    w = softmax_d(w);
  } else {
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    for (double& x_ : w) x_ /= sum;
  }
  const int eh = c.expert_hidden_dim;
  const std::vector<float> gate = t("blk.0.ffn_gate_exps.weight"), up = t("blk.0.ffn_up_exps.weight"),
                           down = t("blk.0.ffn_down_exps.weight");
  std::vector<double> moe(size_t(dim), 0.0);
  for (size_t s = 0; s < order.size(); ++s) {
    const int e = order[s];
    std::vector<float> gv = matvec(gate.data() + size_t(e) * eh * dim, h2, size_t(eh));
    std::vector<float> uv = matvec(up.data() + size_t(e) * eh * dim, h2, size_t(eh));
    if (oss) {
      const std::vector<float> bg = t("blk.0.ffn_gate_exps.bias"), bu = t("blk.0.ffn_up_exps.bias");
      for (int i = 0; i < eh; ++i) gv[size_t(i)] += bg[size_t(e * eh + i)], uv[size_t(i)] += bu[size_t(e * eh + i)];
    }
    std::vector<float> a(static_cast<size_t>(eh));
    for (int i = 0; i < eh; ++i) {
      const double gg = gv[size_t(i)], uu = uv[size_t(i)];
      if (oss) {
        const double g7 = std::min(gg, 7.0), u7 = std::clamp(uu, -7.0, 7.0);
        a[size_t(i)] = float(g7 / (1 + std::exp(-1.702 * g7)) * (u7 + 1));
      } else {
        a[size_t(i)] = float(gg / (1 + std::exp(-gg)) * uu);
      }
    }
    std::vector<float> d = matvec(down.data() + size_t(e) * dim * eh, a, size_t(dim));
    if (oss) {
      const std::vector<float> bd = t("blk.0.ffn_down_exps.bias");
      for (int i = 0; i < dim; ++i) d[size_t(i)] += bd[size_t(e * dim + i)];
    }
    for (int i = 0; i < dim; ++i) moe[size_t(i)] += w[s] * d[size_t(i)];
  }
  for (int i = 0; i < dim; ++i) x[size_t(i)] += float(moe[size_t(i)]);
  return matvec(t("output.weight"), rms(x, t("output_norm.weight"), c.rms_eps));
}

}  // namespace

TEST(MoeFamilies, FirstTokenMatchesTheLayerWrittenOut) {
  const std::pair<const char*, std::string> cases[] = {
      {"mixtral-8x7b", "--dim 64 --hidden 96 --layers 1 --heads 4 --kv-heads 2 --experts 4 --experts-used 2"},
      {"qwen3-30b-a3b", "--dim 64 --hidden 96 --layers 1 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 "
                        "--experts-used 3 --expert-hidden 48"},
      {"gpt-oss-20b", "--dim 64 --hidden 64 --layers 1 --heads 4 --kv-heads 2 --head-dim 16 --experts 4 "
                      "--experts-used 2 --expert-hidden 32"},
  };
  for (const auto& [preset, size] : cases) {
    SCOPED_TRACE(preset);
    TempPath path(".gguf");
    make_model(path, preset, size);
    auto m = Model::load(path.str());
    auto g = GgufFile::open(path.str());
    for (int tok : {5, 17, 301}) {
      const std::vector<float> want = first_token_reference(*g, m->config(), tok);
      auto e = cpu(*m);
      std::vector<float> got(want.size());
      e->forward(&tok, 1, 0, got.data(), false);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, double(std::abs(got[i] - want[i])));
        scale = std::max(scale, double(std::abs(want[i])));
      }
      EXPECT_LT(worst, 1e-4 * std::max(1.0, scale)) << "token " << tok << ": max |logit difference|";
    }
  }
}

TEST(MoeFamilies, QwenNormTopkProbOffKeepsTheSoftmaxWeights) {
  // expert_weights_norm = false (a Qwen3-MoE with norm_topk_prob false)
  // changes the logits; the default (absent) is llama.cpp's renormalisation.
  TempPath base(".gguf"), off(".gguf"), on(".gguf");
  make_model(base, "qwen3-30b-a3b", kQwen3Moe);
  auto copy_with = [&](const TempPath& out, std::optional<bool> norm) {
    auto src = GgufFile::open(base.str());
    GgufWriter w;
    w.copy_metadata(*src);
    if (norm) w.set("qwen3moe.expert_weights_norm", GgufValue::make_bool(*norm));
    for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
    w.write(out.str());
  };
  copy_with(off, false);
  copy_with(on, true);
  auto logits = [](const std::string& p) {
    auto m = Model::load(p);
    auto e = cpu(*m);
    const std::vector<int> ids = prompt(m->config().n_vocab);
    std::vector<float> out(size_t(m->config().n_vocab));
    e->forward(ids.data(), int(ids.size()), 0, out.data(), false);
    return out;
  };
  EXPECT_FALSE(Model::load(off.str())->config().moe_norm_weights);
  EXPECT_EQ(max_abs_diff(logits(base.str()), logits(on.str())), 0.0);
  EXPECT_GT(max_abs_diff(logits(base.str()), logits(off.str())), 1e-3);
}

TEST(MoeFamilies, BadExpertKeysAreErrors) {
  TempPath base(".gguf");
  make_model(base, "qwen3-30b-a3b", kQwen3Moe);
  auto edited = [&](const TempPath& out, const std::function<void(GgufWriter&)>& edit) {
    auto src = GgufFile::open(base.str());
    GgufWriter w;
    w.copy_metadata(*src);
    edit(w);
    for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
    w.write(out.str());
    return out.str();
  };
  {
    TempPath p(".gguf");
    edited(p, [](GgufWriter& w) { w.set_u32("qwen3moe.expert_used_count", 9); });
    expect_words(error_of([&] { Model::load(p.str()); }), {"expert_used_count 9", "exceeds", "8"});
  }
  {
    TempPath p(".gguf");
    edited(p, [](GgufWriter& w) { w.set_u32("qwen3moe.expert_count", 0); });
    expect_words(error_of([&] { Model::load(p.str()); }), {"qwen3moe", "expert_count > 0"});
  }
  {
    TempPath p(".gguf");
    edited(p, [](GgufWriter& w) { w.set_u32("qwen3moe.expert_feed_forward_length", 40); });
    expect_words(error_of([&] { Model::load(p.str()); }), {"ffn_gate_exps.weight", "expected [64, 40, 8]"});
  }
}

// The CUDA engine runs every MoE family whole (tests/test_gpu_moe.cpp):
// the experts, and gpt-oss's attention (sinks, YaRN, output bias).
TEST(MoeFamilies, CudaEngineTakesTheExperts) {
  for (const MoeFamily& f : kMoeFamilies) {
    SCOPED_TRACE(f.preset);
    TempPath path(".gguf");
    make_model(path, f.preset, f.size);
    const ModelConfig c = Model::load(path.str())->config();
    EXPECT_EQ(cuda_engine_unsupported_layer(c), "");
  }
  // What the expert kernels do not take is refused by name.
  TempPath path(".gguf");
  make_model(path, kMoeFamilies[0].preset, kMoeFamilies[0].size);
  ModelConfig c = Model::load(path.str())->config();
  c.ffn_act = FfnActivation::GeluTanh;
  expect_words(error_of([&] { require_cuda_engine_support(c); }),
               {"CUDA engine does not implement", "GELU experts", "--device cpu"});
  c.ffn_act = FfnActivation::SiLU;
  c.n_expert = 300;
  expect_words(cuda_engine_unsupported_layer(c), {"300 experts (at most 256)"});
  c.n_expert = 0;  // a dense layer with gpt-oss's activation
  c.ffn_act = FfnActivation::SwigluOai;
  expect_words(cuda_engine_unsupported_layer(c), {"swiglu_oai", "outside experts"});
}

TEST(MoeFamilies, PerplexityAndGenerateRunOnTheCpu) {
  TempPath text(".txt");
  {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "Once upon a time there was a little girl who liked to play in the park. ";
    FILE* f = std::fopen(text.str().c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(s.c_str(), f);
    std::fclose(f);
  }
  for (const MoeFamily& fam : kMoeFamilies) {
    SCOPED_TRACE(fam.preset);
    TempPath path(".gguf");
    make_model(path, fam.preset, fam.size);
    const CommandResult p = run_command(runlm_binary() + " perplexity --device cpu -t 2 -c 32 -m " + path.str() +
                                        " -f " + text.str());
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_NE(p.out.find("Final estimate: PPL = "), std::string::npos) << p.out << p.err;
    EXPECT_EQ(p.out.find("nan"), std::string::npos) << p.out;
    const CommandResult gen = run_command(runlm_binary() + " generate --device cpu -t 2 -n 8 --temp 0 -m " +
                                          path.str() + " -p 'Once upon a time'");
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
  }
}

TEST(MoeFamilies, QuantizeMxfp4MoeMakesExpertsMxfp4AndTheRestQ8) {
  TempPath f32(".gguf"), q(".gguf");
  make_model(f32, "gpt-oss-20b", "--dim 64 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --experts 4 "
                                 "--experts-used 2 --expert-hidden 64");
  const CommandResult r = run_command(runlm_binary() + " quantize " + f32.str() + " " + q.str() + " mxfp4_moe");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto g = GgufFile::open(q.str());
  for (const auto& t : g->tensors()) {
    SCOPED_TRACE(t.name);
    const bool expert = t.name.find("_exps.weight") != std::string::npos;
    const bool matrix = t.ne.size() >= 2 && t.name.find("ffn_gate_inp") == std::string::npos &&
                        t.name.find(".bias") == std::string::npos;
    if (expert) {
      EXPECT_EQ(t.type, DType::MXFP4);
    } else if (matrix) {
      EXPECT_EQ(t.type, DType::Q8_0);
    }
  }
  EXPECT_EQ(g->find_tensor("blk.0.ffn_gate_inp.weight")->type, DType::F32);  // llama.cpp never quantizes the router
  // The quantized model runs and stays close to the f32 one.
  auto lf = Model::load(f32.str());
  auto lq = Model::load(q.str());
  const std::vector<int> ids = prompt(lf->config().n_vocab);
  std::vector<float> a(size_t(lf->config().n_vocab)), b(a.size());
  cpu(*lf)->forward(ids.data(), int(ids.size()), 0, a.data(), false);
  cpu(*lq)->forward(ids.data(), int(ids.size()), 0, b.data(), false);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(a[i]) * a[i];
  EXPECT_GT(num, 0);
  EXPECT_LT(std::sqrt(num / den), 0.2);
}

TEST(MoeFamilies, HarmonyChatTemplateRendersForAGptOssModel) {
  // gpt-oss's chat template (the harmony format) through runlm template.
  const std::string tmpl = test_asset("templates/openai-gpt-oss-120b.jinja");
  RUNLM_REQUIRE_ASSET(tmpl);
  TempPath model(".gguf"), conv(".json");
  make_model(model, "gpt-oss-20b", kGptOss);
  {
    FILE* f = std::fopen(conv.str().c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(R"([{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},)"
               R"({"role":"assistant","content":"Hello!"},{"role":"user","content":"2+2?"}])",
               f);
    std::fclose(f);
  }
  const CommandResult r = run_command(runlm_binary() + " template -m " + model.str() + " --chat-template-file " + tmpl +
                                      " --messages " + conv.str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_words(r.out, {"<|start|>system<|message|>", "<|start|>developer<|message|># Instructions\n\nBe brief.",
                       "<|start|>user<|message|>Hi<|end|>",
                       "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>",
                       "<|start|>user<|message|>2+2?<|end|><|start|>assistant"});
}
