// The model families of models/arch.h on the CPU: every family's tiny
// random model (tools/make_random_model presets) loads with the layer its
// description gives and generates end to end; the parts of the layer are
// checked by their properties (soft-caps bound logits by their formula,
// fused and split tensors give the same logits, NeoX and adjacent RoPE
// differ, rope_freqs changes the logits and all-ones factors do not);
// unsupported files are Errors naming what is wrong; the CUDA engine's
// support check names the feature and the architecture; --vocab-from copies
// a real vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attention_ref.h"
#include "common.h"
#include "dtype.h"
#include "engine.h"
#include "engine_support.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "model.h"
#include "ops.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {

// The embedded model's 512-piece vocabulary keeps the files small.
std::string small_tokenizer() { return embedded_model_dir() + "/stories260K-tok512.model"; }

// make_random_model PRESET at a tiny size plus `extra` options; the path.
std::string make_model(const TempPath& out, const std::string& preset, const std::string& size,
                       const std::string& extra = "") {
  const std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset " + preset + " " + size + " " + extra +
                          " --type f32 --tokenizer " + small_tokenizer() + " -o " + out.str();
  const CommandResult r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
  return out.str();
}

struct Family {
  const char* preset;
  const char* size;
  Arch arch;
};
const Family kFamilies[] = {
    {"llama3-8b", "--dim 64 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --rope-orig-ctx 16", Arch::Llama},
    {"qwen2.5-7b", "--dim 64 --hidden 128 --layers 2 --heads 4 --kv-heads 2", Arch::Qwen2},
    {"qwen3-8b", "--dim 64 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --head-dim 32", Arch::Qwen3},
    {"gemma2-9b", "--dim 64 --hidden 128 --layers 4 --heads 2 --kv-heads 1 --head-dim 64 --sliding-window 8",
     Arch::Gemma2},
    {"gemma3-12b", "--dim 64 --hidden 128 --layers 6 --heads 2 --kv-heads 1 --head-dim 64 --sliding-window 8",
     Arch::Gemma3},
    {"phi3-mini", "--dim 64 --hidden 128 --layers 2 --heads 4 --kv-heads 4", Arch::Phi3},
    {"mistral-nemo-12b", "--dim 64 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --head-dim 32", Arch::Llama},
};

std::unique_ptr<Engine> cpu(const Model& m, int n_ctx = 128) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = n_ctx;
  return make_cpu_engine(m, eo);
}

std::vector<int> prompt(int n_vocab) {
  std::vector<int> ids{1};
  for (int i = 1; i < 24; ++i) ids.push_back((i * 37 + 11) % n_vocab);
  return ids;
}

// Logits of every position of the fixed prompt.
std::vector<float> logits_of(const std::string& path, int n_ctx = 128) {
  auto m = Model::load(path);
  auto e = cpu(*m, n_ctx);
  const std::vector<int> ids = prompt(m->config().n_vocab);
  std::vector<float> out(ids.size() * size_t(m->config().n_vocab), NAN);
  e->forward(ids.data(), int(ids.size()), 0, out.data(), true);
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

// A copy of the GGUF at src with `edit` applied to its metadata, `rename`
// mapping key prefixes ("llama." -> "qwen2."), and `tensor_fill` replacing
// a tensor's f32 values.
std::string rewritten(const std::string& src_path, const TempPath& out, const std::function<void(GgufWriter&)>& edit,
                      const std::pair<std::string, std::string>& rename = {},
                      const std::string& tensor = "", float tensor_value = 0) {
  auto src = GgufFile::open(src_path);
  GgufWriter w;
  for (const GgufKV& kv : src->metadata()) {
    std::string key = kv.key;
    if (!rename.first.empty() && key.rfind(rename.first, 0) == 0) key = rename.second + key.substr(rename.first.size());
    w.set(key, kv.value);
  }
  edit(w);
  std::vector<std::vector<float>> keep;
  for (const auto& t : src->tensors()) {
    if (t.name == tensor) {
      keep.emplace_back(size_t(t.n_elements()), tensor_value);
      w.add_tensor(t.name, DType::F32, t.ne, reinterpret_cast<const uint8_t*>(keep.back().data()));
    } else {
      w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
    }
  }
  w.write(out.str());
  return out.str();
}

}  // namespace

TEST(Families, EveryFamilyLoadsWithItsLayerAndGeneratesOnTheCpu) {
  for (const Family& f : kFamilies) {
    SCOPED_TRACE(f.preset);
    TempPath path(".gguf");
    make_model(path, f.preset, f.size);
    auto m = Model::load(path.str());
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.arch, f.arch);
    const ArchDesc& d = arch_desc(f.arch);
    EXPECT_EQ(c.rope_style, d.rope_style);
    EXPECT_EQ(c.ffn_act, d.ffn_act);
    EXPECT_EQ(c.qk_norm, d.qk_norm);
    EXPECT_EQ(c.post_norms, d.post_norms);
    EXPECT_EQ(c.qkv_bias, d.qkv_bias);
    EXPECT_EQ(c.fused_qkv, d.fused_qkv);
    EXPECT_EQ(c.fused_gate_up, d.fused_gate_up);
    // Greedy generation, one token at a time after the prompt.
    auto e = cpu(*m);
    std::vector<int> ids = prompt(c.n_vocab);
    std::vector<float> logits(size_t(c.n_vocab));
    e->forward(ids.data(), int(ids.size()), 0, logits.data(), false);
    for (int step = 0; step < 16; ++step) {
      for (float x : logits) ASSERT_TRUE(std::isfinite(x));
      const int next = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
      e->forward(&next, 1, int(ids.size()), logits.data(), false);
      ids.push_back(next);
    }
    // The whole sequence in one step gives the last step's logits.
    auto e2 = cpu(*m);
    std::vector<float> batch(size_t(c.n_vocab));
    e2->forward(ids.data(), int(ids.size()), 0, batch.data(), false);
    EXPECT_LE(max_abs_diff(batch, logits), 1e-5);
  }
}

TEST(Families, DescriptionsResolveAsLlamaCppReadsThem) {
  TempPath g2(".gguf"), g3(".gguf"), q3(".gguf"), phi(".gguf"), nemo(".gguf");
  const ModelConfig c2 = Model::load(make_model(g2, "gemma2-9b", kFamilies[3].size))->config();
  EXPECT_FLOAT_EQ(c2.embd_scale, std::sqrt(64.0f));
  EXPECT_FLOAT_EQ(c2.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(c2.final_softcap, 30.0f);
  EXPECT_FLOAT_EQ(c2.attn_scale(), 1.0f / 8.0f);  // 1/sqrt(head_dim 64)
  EXPECT_EQ(c2.sliding_window, 8);
  EXPECT_EQ(c2.swa_layers, (std::vector<uint8_t>{1, 0, 1, 0}));  // llama.cpp's gemma2 pattern 2
  EXPECT_TRUE(c2.tied_embeddings);

  const ModelConfig c3 = Model::load(make_model(g3, "gemma3-12b", kFamilies[4].size))->config();
  EXPECT_EQ(c3.swa_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));  // 5 local : 1 global
  EXPECT_FLOAT_EQ(c3.attn_softcap, 0.0f);
  EXPECT_FLOAT_EQ(c3.final_softcap, 0.0f);
  EXPECT_TRUE(c3.local_rope);
  EXPECT_FLOAT_EQ(c3.rope_theta_local, 10000.0f);
  EXPECT_FLOAT_EQ(c3.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c3.rope_freq_scale, 1.0f / 8);   // linear factor 8 on the global layers
  EXPECT_FLOAT_EQ(c3.rope_freq_scale_local, 1.0f);  // none on the local ones

  const ModelConfig cq = Model::load(make_model(q3, "qwen3-8b", kFamilies[2].size))->config();
  EXPECT_EQ(cq.head_dim, 32);  // key_length, not dim / heads
  EXPECT_EQ(cq.q_dim(), 128);

  const ModelConfig cp = Model::load(make_model(phi, "phi3-mini", kFamilies[5].size))->config();
  EXPECT_EQ(cp.sliding_window, 2047);

  const ModelConfig cn = Model::load(make_model(nemo, "mistral-nemo-12b", kFamilies[6].size))->config();
  EXPECT_EQ(cn.arch, Arch::Llama);
  EXPECT_EQ(cn.head_dim, 32);
  EXPECT_EQ(cn.rope_style, RopeStyle::Adjacent);
  EXPECT_TRUE(cn.features_beyond_llama().empty());
}

// y = W x for a GGUF matrix W of rows x cols (ne = {cols, rows}).
std::vector<float> matvec(const std::vector<float>& w, const std::vector<float>& x) {
  std::vector<float> y(w.size() / x.size());
  for (size_t r = 0; r < y.size(); ++r) {
    double acc = 0;
    for (size_t c = 0; c < x.size(); ++c) acc += double(w[r * x.size() + c]) * x[c];
    y[r] = float(acc);
  }
  return y;
}

std::vector<float> rms(const std::vector<float>& x, const std::vector<float>& w, float eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] * inv * w[i]);
  return y;
}

TEST(Families, Gemma2FirstTokenMatchesTheLayerWrittenOut) {
  // At position 0 attention returns V whatever q, k, RoPE and the soft-cap
  // do, so the first token's logits follow from the rest of the layer alone:
  // the embedding scale, the norms and post norms, GELU, the tied output and
  // the final soft-cap, written out here in plain loops.
  TempPath path(".gguf");
  make_model(path, "gemma2-9b", "--dim 64 --hidden 128 --layers 1 --heads 2 --kv-heads 1 --head-dim 64");
  auto g = GgufFile::open(path.str());
  auto t = [&](const std::string& name) {
    const GgufTensorInfo* info = g->find_tensor(name);
    EXPECT_NE(info, nullptr) << name;
    std::vector<float> v(size_t(info->n_elements()));
    std::memcpy(v.data(), g->tensor_data(*info), v.size() * 4);  // f32 file
    return v;
  };
  const float eps = float(g->get_float("gemma2.attention.layer_norm_rms_epsilon"));
  const int tok = 17, dim = 64;
  const std::vector<float> embd = t("token_embd.weight");
  auto reference = [&](float embd_scale) {
    std::vector<float> x(embd.begin() + tok * dim, embd.begin() + (tok + 1) * dim);
    for (float& v : x) v *= embd_scale;
    const std::vector<float> v = matvec(t("blk.0.attn_v.weight"), rms(x, t("blk.0.attn_norm.weight"), eps));
    std::vector<float> att(v);
    att.insert(att.end(), v.begin(), v.end());  // two query heads share the kv head
    const std::vector<float> o =
        rms(matvec(t("blk.0.attn_output.weight"), att), t("blk.0.post_attention_norm.weight"), eps);
    for (int i = 0; i < dim; ++i) x[i] += o[i];
    const std::vector<float> h = rms(x, t("blk.0.ffn_norm.weight"), eps);
    std::vector<float> gate = matvec(t("blk.0.ffn_gate.weight"), h);
    const std::vector<float> up = matvec(t("blk.0.ffn_up.weight"), h);
    for (size_t i = 0; i < gate.size(); ++i) {
      const double a = gate[i];
      gate[i] = float(0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a))) * up[i]);
    }
    const std::vector<float> d =
        rms(matvec(t("blk.0.ffn_down.weight"), gate), t("blk.0.post_ffw_norm.weight"), eps);
    for (int i = 0; i < dim; ++i) x[i] += d[i];
    std::vector<float> logits = matvec(embd, rms(x, t("output_norm.weight"), eps));
    for (float& l : logits) l = 30.0f * std::tanh(l / 30.0f);
    return logits;
  };
  const std::vector<float> want = reference(std::sqrt(64.0f)), unscaled = reference(1.0f);

  auto m = Model::load(path.str());
  auto e = cpu(*m);
  std::vector<float> got(want.size());
  e->forward(&tok, 1, 0, got.data(), false);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
  EXPECT_LT(worst, 1e-3) << "max |logit difference|";
  // The embedding scale matters: without it the logits are far off.
  EXPECT_GT(max_abs_diff(got, unscaled), 100 * worst);
}

TEST(Families, FinalSoftcapIsCapTimesTanhOfUncappedLogits) {
  TempPath base(".gguf"), uncapped(".gguf");
  make_model(base, "gemma2-9b", kFamilies[3].size);
  // A cap of 1e30 leaves the logits as they are (tanh(x) = x to float precision).
  rewritten(base.str(), uncapped, [](GgufWriter& w) { w.set_f32("gemma2.final_logit_softcapping", 1e30f); });
  const std::vector<float> capped = logits_of(base.str()), raw = logits_of(uncapped.str());
  double raw_max = 0;
  for (size_t i = 0; i < capped.size(); ++i) {
    ASSERT_LE(std::abs(capped[i]), 30.0f);
    EXPECT_NEAR(capped[i], 30.0 * std::tanh(raw[i] / 30.0), 1e-4 * std::max(1.0, std::abs(double(capped[i]))));
    raw_max = std::max(raw_max, std::abs(double(raw[i])));
  }
  EXPECT_GT(raw_max, 1.0);  // the cap had something to do
}

TEST(Families, AttentionSoftcapChangesGemma2Logits) {
  TempPath base(".gguf"), tight(".gguf"), loose(".gguf");
  make_model(base, "gemma2-9b", kFamilies[3].size);
  rewritten(base.str(), tight, [](GgufWriter& w) { w.set_f32("gemma2.attn_logit_softcapping", 0.05f); });
  rewritten(base.str(), loose, [](GgufWriter& w) { w.set_f32("gemma2.attn_logit_softcapping", 1e30f); });
  const auto a = logits_of(base.str()), t = logits_of(tight.str()), l = logits_of(loose.str());
  EXPECT_GT(max_abs_diff(a, t), 1e-3);
  EXPECT_GT(max_abs_diff(t, l), 1e-3);
}

TEST(Families, AttentionSoftcapInTheReferenceKernels) {
  // attention_one_token (the engine's) and attention_ref (the kernels'
  // reference) apply the cap the same way: cap * tanh(scaled score / cap).
  const int n_heads = 2, n_kv = 1, hd = 8, n = 6;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 3);
  std::vector<float> q(size_t(n) * n_heads * hd), k(size_t(n) * n_kv * hd), v(k.size());
  for (auto* vec : {&q, &k, &v})
    for (float& x : *vec) x = nd(rng);
  const float scale = 0.5f, cap = 2.0f;
  AttnRefParams p;
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  std::vector<float> ref(q.size()), ref_nocap(q.size());
  const int32_t cu[2] = {0, n};
  p.cu_seqlens_q = cu, p.cu_seqlens_k = cu, p.batch = 1, p.n_heads = n_heads, p.n_kv_heads = n_kv, p.head_dim = hd;
  p.causal = true, p.scale = scale, p.softcap = cap, p.out = ref.data();
  attention_ref(p);
  p.softcap = 0, p.out = ref_nocap.data();
  attention_ref(p);
  std::vector<float> scratch(size_t(n_heads) * (n + 1) + 2 * n_kv * hd);
  const KvLayerView kv{reinterpret_cast<const uint8_t*>(k.data()), reinterpret_cast<const uint8_t*>(v.data()),
                       KvType::F32, KvType::F32, size_t(n_kv * hd) * 4, size_t(n_kv * hd) * 4, nullptr, 0};
  double diff_cap = 0, diff_nocap = 0;
  for (int t = 0; t < n; ++t) {
    std::vector<float> out(size_t(n_heads) * hd);
    attention_one_token(out.data(), &q[size_t(t) * n_heads * hd], kv, t, n_heads, n_kv, hd, 0, scale, scratch.data(),
                        cap);
    for (int i = 0; i < n_heads * hd; ++i) {
      diff_cap = std::max(diff_cap, double(std::abs(out[i] - ref[size_t(t) * n_heads * hd + i])));
      diff_nocap = std::max(diff_nocap, double(std::abs(out[i] - ref_nocap[size_t(t) * n_heads * hd + i])));
    }
  }
  EXPECT_LT(diff_cap, 1e-5);
  EXPECT_GT(diff_nocap, 1e-2);  // the cap matters at these score sizes
}

TEST(Families, FusedAndSplitTensorsGiveIdenticalLogits) {
  TempPath fused(".gguf"), split(".gguf");
  make_model(fused, "phi3-mini", kFamilies[5].size);
  make_model(split, "phi3-mini", kFamilies[5].size, "--split-qkv");
  EXPECT_TRUE(Model::load(fused.str())->config().fused_qkv);
  EXPECT_TRUE(Model::load(fused.str())->config().fused_gate_up);
  EXPECT_FALSE(Model::load(split.str())->config().fused_qkv);
  EXPECT_FALSE(Model::load(split.str())->config().fused_gate_up);
  EXPECT_EQ(max_abs_diff(logits_of(fused.str()), logits_of(split.str())), 0.0);
  // Any family reads a fused attn_qkv, as llama.cpp does.
  TempPath q_split(".gguf"), q_fused(".gguf");
  make_model(q_split, "qwen2.5-7b", kFamilies[1].size);
  make_model(q_fused, "qwen2.5-7b", kFamilies[1].size, "--fuse-qkv");
  EXPECT_TRUE(Model::load(q_fused.str())->config().fused_qkv);
  EXPECT_EQ(max_abs_diff(logits_of(q_fused.str()), logits_of(q_split.str())), 0.0);
}

TEST(Families, NeoxRopeIsAdjacentRopeOnInterleavedHalves) {
  const int hd = 16, n_heads = 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(hd) * n_heads);
  for (float& v : x) v = nd(rng);
  // Interleave the halves: (x[i], x[i + hd/2]) become the pair (2i, 2i+1).
  std::vector<float> inter(x.size());
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      inter[h * hd + 2 * i] = x[h * hd + i];
      inter[h * hd + 2 * i + 1] = x[h * hd + i + hd / 2];
    }
  RopeSpec neox{true, hd, 10000.0f, 1.0f, nullptr, 1.0f}, adj{false, hd, 10000.0f, 1.0f, nullptr, 1.0f};
  std::vector<float> a = x, b = inter;
  rope_ext(a.data(), n_heads, hd, 7, neox);
  rope_ext(b.data(), n_heads, hd, 7, adj);
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < hd / 2; ++i) {
      EXPECT_EQ(a[h * hd + i], b[h * hd + 2 * i]);
      EXPECT_EQ(a[h * hd + i + hd / 2], b[h * hd + 2 * i + 1]);
    }
  // Partial rotation leaves the tail alone; adjacent rope_ext is rope().
  std::vector<float> c = x, d = x;
  rope_ext(c.data(), n_heads, hd, 7, RopeSpec{true, 8, 10000.0f, 1.0f, nullptr, 1.0f});
  for (int h = 0; h < n_heads; ++h)
    for (int i = 8; i < hd; ++i) EXPECT_EQ(c[h * hd + i], x[h * hd + i]);
  std::vector<float> e = x;
  rope(e.data(), n_heads, hd, 7, 10000.0f, 1.0f);
  rope_ext(d.data(), n_heads, hd, 7, adj);
  EXPECT_EQ(d, e);
}

TEST(Families, NeoxAndAdjacentRopeGiveDifferentModels) {
  // The same llama weights read as qwen2 (NeoX, no biases) change the logits.
  TempPath base(".gguf"), as_qwen(".gguf");
  make_model(base, "tiny", "--dim 64 --heads 4 --kv-heads 2 --layers 2");
  rewritten(base.str(), as_qwen, [](GgufWriter& w) { w.set_string("general.architecture", "qwen2"); },
            {"llama.", "qwen2."});
  ASSERT_EQ(Model::load(as_qwen.str())->config().rope_style, RopeStyle::NeoX);
  const auto a = logits_of(base.str()), b = logits_of(as_qwen.str());
  EXPECT_GT(max_abs_diff(a, b), 1e-3);
}

TEST(Families, RopeFreqsChangeTheLogitsAndOnesDoNot) {
  const std::string size = kFamilies[0].size;
  TempPath with(".gguf"), without(".gguf"), ones(".gguf");
  make_model(with, "llama3-8b", size);
  make_model(without, "llama3-8b", size, "--no-rope-freqs");
  rewritten(with.str(), ones, [](GgufWriter&) {}, {}, "rope_freqs.weight", 1.0f);
  EXPECT_EQ(Model::load(with.str())->config().rope_factors, RopeFactors::Freqs);
  const auto w = logits_of(with.str()), wo = logits_of(without.str()), o = logits_of(ones.str());
  EXPECT_GT(max_abs_diff(w, wo), 1e-4);
  EXPECT_EQ(max_abs_diff(o, wo), 0.0);
}

TEST(Families, Llama3RopeFreqsMatchTheConverterFormula) {
  // Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, 8192.
  const auto f = llama3_rope_freqs(500000.0f, 128, 8.0, 1.0, 4.0, 8192.0);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.0f);  // short wavelengths untouched
  EXPECT_EQ(f.back(), 8.0f);   // long ones divided by the factor
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
  int between = 0;
  for (float x : f) between += x > 1.0f && x < 8.0f;
  EXPECT_GT(between, 0);  // the smooth blend
}

TEST(Families, LongropeFactorsFollowTheContextSize) {
  // phi3 with longrope: the short factors below the original context, the
  // long ones above; both differ from no factors.
  TempPath base(".gguf"), lr(".gguf");
  make_model(base, "phi3-mini", kFamilies[5].size);
  auto src = GgufFile::open(base.str());
  GgufWriter w;
  w.copy_metadata(*src);
  w.set_string("phi3.rope.scaling.type", "longrope");
  w.set_f32("phi3.rope.scaling.attn_factor", 1.2f);
  w.set_u32("phi3.rope.scaling.original_context_length", 64);
  std::vector<float> long_f(8, 4.0f), short_f(8, 1.0f);
  for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
  w.add_tensor("rope_factors_long.weight", DType::F32, {8}, reinterpret_cast<const uint8_t*>(long_f.data()));
  w.add_tensor("rope_factors_short.weight", DType::F32, {8}, reinterpret_cast<const uint8_t*>(short_f.data()));
  w.write(lr.str());
  const ModelConfig c = Model::load(lr.str())->config();
  EXPECT_EQ(c.rope_factors, RopeFactors::LongShort);
  EXPECT_FLOAT_EQ(c.rope_attn_factor, 1.2f);
  // llama.cpp's converter writes the factors without the type key: the same model.
  TempPath no_type(".gguf");
  auto with_type = GgufFile::open(lr.str());
  GgufWriter w2;
  for (const GgufKV& kv : with_type->metadata())
    if (kv.key != "phi3.rope.scaling.type") w2.set(kv.key, kv.value);
  for (const auto& t : with_type->tensors()) w2.add_tensor(t.name, t.type, t.ne, with_type->tensor_data(t));
  w2.write(no_type.str());
  EXPECT_EQ(Model::load(no_type.str())->config().rope_factors, RopeFactors::LongShort);
  EXPECT_EQ(max_abs_diff(logits_of(lr.str(), 128), logits_of(no_type.str(), 128)), 0.0);
  const auto plain = logits_of(base.str(), 64), short_ctx = logits_of(lr.str(), 64), long_ctx = logits_of(lr.str(), 128);
  EXPECT_GT(max_abs_diff(plain, short_ctx), 1e-4);  // the attention factor
  EXPECT_GT(max_abs_diff(short_ctx, long_ctx), 1e-4);  // the long factors
}

TEST(Families, UnsupportedFilesAreErrorsNamingWhatIsWrong) {
  TempPath base(".gguf");
  make_model(base, "tiny", "--dim 64 --heads 4 --kv-heads 2 --layers 2");
  {
    TempPath p(".gguf");
    rewritten(base.str(), p, [](GgufWriter& w) { w.set_string("general.architecture", "falcon"); }, {"llama.", "falcon."});
    expect_words(error_of([&] { Model::load(p.str()); }), {"unknown architecture", "falcon", "qwen3", "gemma2"});
  }
  {
    TempPath p(".gguf");
    rewritten(base.str(), p, [](GgufWriter& w) {
      w.set_string("llama.rope.scaling.type", "dynamic");
      w.set_f32("llama.rope.scaling.factor", 4.0f);
    });
    expect_words(error_of([&] { Model::load(p.str()); }), {"rope scaling type", "dynamic", "not supported"});
  }
  {
    TempPath p(".gguf");
    rewritten(base.str(), p, [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); });
    expect_words(error_of([&] { Model::load(p.str()); }), {"longrope", "not supported", "llama"});
  }
  {
    TempPath p(".gguf"), phi(".gguf");
    make_model(phi, "phi3-mini", kFamilies[5].size);
    rewritten(phi.str(), p, [](GgufWriter& w) { w.set_string("phi3.rope.scaling.type", "longrope"); });
    expect_words(error_of([&] { Model::load(p.str()); }), {"longrope", "rope_factors_long.weight"});
  }
  {
    // A tensor the graph does not read (a bias on a llama) is refused.
    TempPath p(".gguf");
    auto src = GgufFile::open(base.str());
    GgufWriter w;
    w.copy_metadata(*src);
    for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
    std::vector<float> bias(64, 0.5f);
    w.add_tensor("blk.0.attn_q.bias", DType::F32, {64}, reinterpret_cast<const uint8_t*>(bias.data()));
    w.write(p.str());
    expect_words(error_of([&] { Model::load(p.str()); }), {"blk.0.attn_q.bias", "not used", "llama"});
  }
  {
    // qwen3 without its q/k norms: the missing tensor is named.
    TempPath q(".gguf"), p(".gguf");
    make_model(q, "qwen3-8b", kFamilies[2].size);
    auto src = GgufFile::open(q.str());
    GgufWriter w;
    w.copy_metadata(*src);
    for (const auto& t : src->tensors())
      if (t.name != "blk.1.attn_k_norm.weight") w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
    w.write(p.str());
    expect_words(error_of([&] { Model::load(p.str()); }), {"tensor not found", "blk.1.attn_k_norm.weight"});
  }
}

TEST(Families, CudaEngineSupportCheckNamesFeatureAndArchitecture) {
  for (const Family& f : kFamilies) {
    SCOPED_TRACE(f.preset);
    TempPath path(".gguf");
    make_model(path, f.preset, f.size);
    const ModelConfig c = Model::load(path.str())->config();
    const std::string err = error_of([&] { require_cuda_engine_support(c); });
    // --device auto falls back to the CPU with the same reason.
    EXPECT_EQ(cuda_engine_unsupported_layer(c), err == "<no error>" ? "" : err);
    EXPECT_EQ(err, "<no error>");  // the CUDA engine runs every dense family's layer
  }
  // A head dimension past the GPU kernels' 256 is named too.
  ModelConfig wide;
  wide.arch = Arch::Qwen3;
  wide.head_dim = 512;
  expect_words(cuda_engine_unsupported_layer(wide), {"head dimension 512", "at most 256", "qwen3"});
  wide.head_dim = 256;
  EXPECT_EQ(cuda_engine_unsupported_layer(wide), "");
  TempPath plain(".gguf");
  make_model(plain, "tiny", "--dim 64 --heads 4 --kv-heads 2 --layers 2");
  EXPECT_EQ(error_of([&] { require_cuda_engine_support(Model::load(plain.str())->config()); }), "<no error>");
}

TEST(Families, VocabFromCopiesTheTokenizerMetadata) {
  const std::string vocab = test_asset("vocab/ggml-vocab-qwen2.gguf");
  RUNLM_REQUIRE_ASSET(vocab);
  TempPath out(".gguf");
  const CommandResult r = run_command(std::string(RUNLM_RANDOM_MODEL_BINARY) +
                                      " --preset qwen2.5-7b --dim 64 --hidden 128 --layers 1 --heads 4 --kv-heads 2 "
                                      "--type q8_0 --vocab-from " + vocab + " -o " + out.str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto src = GgufFile::open(vocab), made = GgufFile::open(out.str());
  EXPECT_EQ(made->get_string("general.architecture"), "qwen2");
  EXPECT_EQ(made->get_string("tokenizer.ggml.model"), src->get_string("tokenizer.ggml.model"));
  EXPECT_EQ(made->get_string("tokenizer.ggml.pre"), src->get_string("tokenizer.ggml.pre"));
  EXPECT_EQ(made->get_string_array("tokenizer.ggml.tokens"), src->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(made->find_tensor("token_embd.weight")->ne[1],
            int64_t(src->get_string_array("tokenizer.ggml.tokens").size()));
  EXPECT_NE(made->find_tensor("blk.0.attn_q.bias"), nullptr);
}

// --repeat-rows N: the first N rows of each matrix taller than 2N are random
// and repeat down it; shorter matrices are random throughout. --pad-vocab
// pads --tokenizer's vocabulary to the preset's size.
TEST(Families, RepeatRowsAndPadVocab) {
  TempPath out(".gguf");
  const CommandResult r = run_command(std::string(RUNLM_RANDOM_MODEL_BINARY) +
                                      " --preset qwen3-30b-a3b --dim 64 --layers 1 --heads 4 --kv-heads 2 --head-dim 16"
                                      " --experts 8 --experts-used 2 --expert-hidden 32 --type q8_0 --repeat-rows 16"
                                      " --tokenizer " + embedded_model_dir() + "/stories260K-tok512.model --pad-vocab"
                                      " -o " + out.str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto g = GgufFile::open(out.str());
  const GgufTensorInfo* embd = g->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->ne[1], 151936);  // the preset's vocabulary, padded
  auto row = [&](const GgufTensorInfo& t, int64_t i) {
    const size_t bytes = dtype_row_bytes(t.type, t.ne[0]);
    const uint8_t* p = g->tensor_data(t) + bytes * static_cast<size_t>(i);
    return std::vector<uint8_t>(p, p + bytes);
  };
  EXPECT_EQ(row(*embd, 16), row(*embd, 0));
  EXPECT_EQ(row(*embd, 151935), row(*embd, 151935 % 16));
  EXPECT_NE(row(*embd, 1), row(*embd, 0));
  const GgufTensorInfo* router = g->find_tensor("blk.0.ffn_gate_inp.weight");  // 8 rows: random throughout
  ASSERT_NE(router, nullptr);
  for (int64_t i = 1; i < router->ne[1]; ++i) EXPECT_NE(row(*router, i), row(*router, 0)) << i;
  // Still a model that runs.
  auto m = Model::load(out.str());
  EXPECT_EQ(m->config().n_vocab, 151936);
}
