// The GPU ops the model families need (kernels/cuda/gpu_ops.h) against the
// CPU references of kernels/cpu/ops.h: RoPE of every RopeSpec (NeoX halves,
// partial rotation, per-pair factors, attention factor, YaRN) in the KV store
// and in decode_attention_rope, the attention soft-cap and sinks of
// decode_attention_rope, the attention output bias, q/k/v biases with
// per-head q/k RMSNorm, GeGLU (f32, f16, int8 x), the logit soft-cap and the
// scaled embedding. Random inputs from fixed seeds,
// outputs poisoned (0xFF bytes: NaN as f32 and f16) before each run.
// Skipped in a CPU-only build or without a device, except the host-side
// check of rope.cuh's table against rope_ext.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cpu/ops.h"
#include "cpu/quant.h"
#include "cuda/rope.cuh"
#include "dtype.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/gpu_ops.h"
#include "paged_kv.h"
#include "gpu_test_buffers.h"
#endif

using namespace runlm;
#ifdef RUNLM_CUDA
using namespace runlm::test;
#endif

namespace {

// YaRN as gpt-oss's GGUF gives it (layer_rope_specs): factor 32 over 4096
// original positions, beta_fast 32, beta_slow 1, theta 150000, NeoX, and
// the per-pair divisors where `factors` is set.
RopeSpec yarn_spec(int n_rot, float theta, float freq_scale, const float* factors) {
  RopeSpec s;
  s.neox = true;
  s.n_rot = n_rot;
  s.theta = theta;
  s.freq_scale = freq_scale;
  s.factors = factors;
  s.ext_factor = 1.0f;
  rope_yarn_corr_dims(n_rot, 4096, theta, 32.0f, 1.0f, s.corr_dims);
  return s;
}

}  // namespace

// rope.cuh's table (what every rotating kernel reads) reproduces rope_ext's
// YaRN rotation: random heads turned at random positions with cos(pos * f)
// and sin(pos * f) times the table's attn_factor, as the kernels do (angle
// in double), against rope_ext: 1e-5 relative. YaRN must also move the
// result (against the same spec without it) far beyond that. Host only:
// runs without a device.
TEST(RopeTable, YarnMatchesRopeExt) {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> upos(0, 131071);
  for (int hd : {64, 128}) {
    std::vector<float> factors(static_cast<size_t>(hd / 2));
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.25f * float(i % 5);
    for (const RopeSpec& spec :
         {yarn_spec(hd, 150000.0f, 1.0f / 32, nullptr), yarn_spec(hd / 2, 10000.0f, 0.25f, nullptr),
          yarn_spec(hd, 150000.0f, 1.0f / 32, factors.data())}) {
      const gpu::RopeTable t = gpu::rope_table(hd, spec);
      RopeSpec plain = spec;
      plain.ext_factor = 0.0f;
      for (int trial = 0; trial < 20; ++trial) {
        const int pos = trial == 0 ? 0 : upos(rng);
        std::vector<float> x(static_cast<size_t>(hd));
        for (float& e : x) e = u(rng);
        std::vector<float> want = x, unblended = x, got = x;
        rope_ext(want.data(), 1, hd, pos, spec);
        rope_ext(unblended.data(), 1, hd, pos, plain);
        const int half = t.n_rot / 2;
        for (int i = 0; i < half; ++i) {
          const double angle = double(pos) * t.f[i];
          const float c = float(std::cos(angle)) * t.attn_factor, s = float(std::sin(angle)) * t.attn_factor;
          const int e0 = t.neox ? i : 2 * i, e1 = t.neox ? i + half : 2 * i + 1;
          got[size_t(e0)] = x[size_t(e0)] * c - x[size_t(e1)] * s;
          got[size_t(e1)] = x[size_t(e0)] * s + x[size_t(e1)] * c;
        }
        double num = 0, den = 0, moved = 0;
        for (int e = 0; e < hd; ++e) {
          num += (double(got[size_t(e)]) - want[size_t(e)]) * (double(got[size_t(e)]) - want[size_t(e)]);
          den += double(want[size_t(e)]) * want[size_t(e)];
          moved += (double(unblended[size_t(e)]) - want[size_t(e)]) * (double(unblended[size_t(e)]) - want[size_t(e)]);
        }
        EXPECT_LT(std::sqrt(num / den), 1e-5) << "hd " << hd << " n_rot " << spec.n_rot << " pos " << pos;
        EXPECT_GT(std::sqrt(moved / den), 1e-2) << "YaRN must differ from plain scaling, pos " << pos;
      }
    }
  }
}

#ifndef RUNLM_CUDA

TEST(GpuFamilyOps, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (RUNLM_CUDA off)"; }

#else

namespace {

// ||a - b|| / ||b||; any non-finite value of a makes it infinite.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> f16_to_f32(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = fp16_to_fp32(h[i]);
  return f;
}
float round_f16(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// The RoPE variants of the families, on a head of head_dim; `factors`
// provides the per-pair divisors where a variant uses them.
struct RopeCase {
  const char* name;
  RopeSpec spec;
};
std::vector<RopeCase> rope_cases(int head_dim, const std::vector<float>& factors) {
  std::vector<RopeCase> cs;
  RopeSpec s;
  s.theta = 10000.0f;
  cs.push_back({"adjacent (llama)", s});
  s.neox = true;
  s.theta = 1000000.0f;
  cs.push_back({"neox (qwen2, gemma)", s});
  s.n_rot = head_dim / 2;
  cs.push_back({"neox partial", s});
  s.neox = false;
  s.freq_scale = 0.25f;
  cs.push_back({"adjacent partial, linear scale", s});
  s = RopeSpec{};
  s.neox = true;
  s.theta = 10000.0f;
  s.factors = factors.data();
  s.attn_factor = 1.19f;
  cs.push_back({"neox, longrope factors and attention factor (phi3)", s});
  s.neox = false;
  s.attn_factor = 1.0f;
  s.theta = 500000.0f;
  cs.push_back({"adjacent, rope_freqs factors (llama3)", s});
  cs.push_back({"neox, YaRN factor 32 (gpt-oss)", yarn_spec(head_dim, 150000.0f, 1.0f / 32, nullptr)});
  s = yarn_spec(head_dim / 2, 10000.0f, 0.25f, nullptr);
  s.neox = false;
  s.attn_factor = 0.9f;
  cs.push_back({"adjacent partial, YaRN factor 4, attention factor", s});
  for (auto& c : cs) {
    if (c.spec.n_rot == 0) c.spec.n_rot = head_dim;  // the CPU's rope_ext needs it explicit
  }
  return cs;
}

std::vector<float> rope_factors(int n) {
  std::vector<float> f(size_t(n) / 2);
  for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 0.37f * float(i % 7);  // divisors >= 1, never all ones
  return f;
}

}  // namespace

// ---- RoPE in the KV store ------------------------------------------------------------

// q rotated in place against rope_ext (~1e-7 per rotation: angles reduced
// in double, sincosf of the remainder; bound 1e-5), q_out and the f16 cache
// rows against the same values rounded to f16 (1e-3), V stored unrotated.
// Rows of positions never written stay poisoned.
TEST(GpuFamilyOps, RopeAndStoreKvEveryRopeVariant) {
  REQUIRE_GPU();
  const int n_heads = 4, n_kv = 2;
  const std::vector<int> pos = {0, 5, 1000};
  const int n = static_cast<int>(pos.size()), n_ctx = 1001;
  for (int hd : {64, 256}) {
    const std::vector<float> factors = rope_factors(hd);
    uint32_t seed = 100;
    for (const RopeCase& rc : rope_cases(hd, factors)) {
      SCOPED_TRACE(std::string(rc.name) + " head_dim " + std::to_string(hd));
      const std::vector<float> q = randn(size_t(n) * n_heads * hd, ++seed);
      const std::vector<float> k = randn(size_t(n) * n_kv * hd, ++seed);
      const std::vector<float> v = randn(size_t(n) * n_kv * hd, ++seed);
      std::vector<float> qr = q, kr = k;
      for (int i = 0; i < n; ++i) {
        rope_ext(qr.data() + size_t(i) * n_heads * hd, n_heads, hd, pos[size_t(i)], rc.spec);
        rope_ext(kr.data() + size_t(i) * n_kv * hd, n_kv, hd, pos[size_t(i)], rc.spec);
      }
      auto dq = upload(q);
      auto dk = upload(k);
      auto dv = upload(v);
      auto dp = upload(pos);
      DevBuf kc(size_t(n_ctx) * n_kv * hd * 2), vc(size_t(n_ctx) * n_kv * hd * 2), qo(q.size() * 2);
      gpu::rope_and_store_kv(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), n, n_heads, n_kv, hd,
                             rc.spec, kc.as<uint16_t>(), vc.as<uint16_t>(), qo.as<uint16_t>(), nullptr);
      EXPECT_LT(rel_err(dq->get<float>(q.size()), qr), 1e-5);
      EXPECT_LT(rel_err(f16_to_f32(qo.get<uint16_t>(q.size())), qr), 1e-3);
      const std::vector<float> kcf = f16_to_f32(kc.get<uint16_t>(size_t(n_ctx) * n_kv * hd));
      const std::vector<float> vcf = f16_to_f32(vc.get<uint16_t>(size_t(n_ctx) * n_kv * hd));
      std::vector<float> kg, vg;
      for (int i = 0; i < n; ++i) {
        const size_t row = size_t(pos[size_t(i)]) * n_kv * hd;
        kg.insert(kg.end(), kcf.begin() + long(row), kcf.begin() + long(row + size_t(n_kv) * hd));
        vg.insert(vg.end(), vcf.begin() + long(row), vcf.begin() + long(row + size_t(n_kv) * hd));
      }
      EXPECT_LT(rel_err(kg, kr), 1e-3);
      EXPECT_LT(rel_err(vg, v), 1e-3);
      EXPECT_TRUE(std::isnan(kcf[size_t(1) * n_kv * hd])) << "row 1 was never a position: must stay poisoned";
    }
  }
}

// The same rotation into a q8_0 K pool (the per-element path of the store),
// read back through gather_kv's decoder: within q8_0's rounding (2e-2).
TEST(GpuFamilyOps, RopeIntoQuantizedKvPool) {
  REQUIRE_GPU();
  const int n_heads = 2, n_kv = 2, hd = 64, block_size = 16, n_pages = 2;
  const std::vector<int> pos = {0, 3, 20};
  const std::vector<int> slots = {16, 19, 4};  // page table {1, 0}: position p in slot table[p / 16] * 16 + p % 16
  const std::vector<int32_t> table = {1, 0};
  const int n = static_cast<int>(pos.size()), kv_dim = n_kv * hd, total_k = 21;
  const std::vector<float> factors = rope_factors(hd);
  uint32_t seed = 300;
  for (const RopeCase& rc : rope_cases(hd, factors)) {
    SCOPED_TRACE(rc.name);
    const std::vector<float> q = randn(size_t(n) * n_heads * hd, ++seed);
    const std::vector<float> k = randn(size_t(n) * kv_dim, ++seed);
    const std::vector<float> v = randn(size_t(n) * kv_dim, ++seed);
    std::vector<float> kr = k;
    for (int i = 0; i < n; ++i) rope_ext(kr.data() + size_t(i) * kv_dim, n_kv, hd, pos[size_t(i)], rc.spec);
    auto dq = upload(q);
    auto dk = upload(k);
    auto dv = upload(v);
    auto dp = upload(pos);
    auto ds = upload(slots);
    auto dt = upload(table);
    auto dcu = upload(std::vector<int32_t>{0, total_k});
    const size_t pool_bytes = size_t(n_pages) * size_t(kv_pool_layout(KvType::Q8_0, block_size, n_kv, hd).page);
    DevBuf kp(pool_bytes), vp(size_t(n_pages) * block_size * kv_dim * 2);
    gpu::rope_and_store_kv_slots(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), ds->as<int>(), n,
                                 n_heads, n_kv, hd, rc.spec, kp.p, vp.p, KvType::Q8_0, KvType::F16, block_size,
                                 nullptr, nullptr);
    DevBuf ko(size_t(total_k) * kv_dim * 2), vo(size_t(total_k) * kv_dim * 2);
    gpu::gather_kv(kp.p, vp.p, KvType::Q8_0, KvType::F16, dt->as<int32_t>(), 2, dcu->as<int32_t>(), 1, total_k,
                   block_size, kv_dim, ko.as<uint16_t>(), vo.as<uint16_t>(), nullptr);
    const std::vector<float> kg_all = f16_to_f32(ko.get<uint16_t>(size_t(total_k) * kv_dim));
    const std::vector<float> vg_all = f16_to_f32(vo.get<uint16_t>(size_t(total_k) * kv_dim));
    std::vector<float> kg, vg;
    for (int p : pos) {
      kg.insert(kg.end(), kg_all.begin() + long(size_t(p) * kv_dim), kg_all.begin() + long(size_t(p + 1) * kv_dim));
      vg.insert(vg.end(), vg_all.begin() + long(size_t(p) * kv_dim), vg_all.begin() + long(size_t(p + 1) * kv_dim));
    }
    EXPECT_LT(rel_err(kg, kr), 2e-2);
    EXPECT_LT(rel_err(vg, v), 1e-3);
  }
}

// ---- decode_attention_rope: RoPE variants and the attention soft-cap ---------------------

// Against a host reference over the same f16 values: cache rows before the
// step random f16, the step's keys rope_ext'd and rounded to f16, q
// rope_ext'd in f32, scores q.k * scale, then cap * tanh(s / cap) when
// capped, softmax and the V sum in double. The GPU differs by its fp32
// sums: 1e-3. The step's cache rows must hold the rotated keys (f16).
TEST(GpuFamilyOps, DecodeAttentionRopeEveryRopeVariantSoftcapAndSinks) {
  REQUIRE_GPU();
  const int n_heads = 4, n_kv = 2, n = 3, pos0 = 37, max_ctx = 64;
  uint32_t seed = 500;
  for (int hd : {64, 256}) {
    const std::vector<float> factors = rope_factors(hd);
    const int kv_dim = n_kv * hd, q_dim = n_heads * hd;
    for (const RopeCase& rc : rope_cases(hd, factors)) {
      for (float cap : {0.0f, 2.5f}) {
        for (int window : {0, 16}) {
          for (bool with_sinks : {false, true}) {
            SCOPED_TRACE(std::string(rc.name) + " head_dim " + std::to_string(hd) + " softcap " + std::to_string(cap) +
                         " window " + std::to_string(window) + " sinks " + std::to_string(with_sinks));
            // Sinks uniform in [-2, 4] against scores of a few units, one per head.
            std::vector<float> sinks;
            if (with_sinks) {
              std::mt19937 rng(++seed);
              std::uniform_real_distribution<float> u(-2.0f, 4.0f);
              for (int h = 0; h < n_heads; ++h) sinks.push_back(u(rng));
            }
            const float scale = 1.0f / std::sqrt(float(hd)) * 2.0f;  // scores of several units: the cap bites
            const std::vector<float> q = randn(size_t(n) * q_dim, ++seed);
            const std::vector<float> k = randn(size_t(n) * kv_dim, ++seed);
            const std::vector<float> v = randn(size_t(n) * kv_dim, ++seed);
            std::vector<float> cache_k = randn(size_t(max_ctx) * kv_dim, ++seed);
            std::vector<float> cache_v = randn(size_t(max_ctx) * kv_dim, ++seed);
            std::vector<uint16_t> hk(cache_k.size()), hv(cache_v.size());
            for (size_t i = 0; i < hk.size(); ++i) {
              hk[i] = fp32_to_fp16(cache_k[i]);
              hv[i] = fp32_to_fp16(cache_v[i]);
              cache_k[i] = fp16_to_fp32(hk[i]);
              cache_v[i] = fp16_to_fp32(hv[i]);
            }
            // The reference cache: the step's rows rotated and rounded.
            std::vector<float> qr = q;
            for (int t = 0; t < n; ++t) {
              std::vector<float> kt(k.begin() + long(size_t(t) * kv_dim), k.begin() + long(size_t(t + 1) * kv_dim));
              rope_ext(kt.data(), n_kv, hd, pos0 + t, rc.spec);
              rope_ext(qr.data() + size_t(t) * q_dim, n_heads, hd, pos0 + t, rc.spec);
              for (int e = 0; e < kv_dim; ++e) {
                cache_k[size_t(pos0 + t) * kv_dim + e] = round_f16(kt[size_t(e)]);
                cache_v[size_t(pos0 + t) * kv_dim + e] = round_f16(v[size_t(t) * kv_dim + e]);
              }
            }
            std::vector<float> want(size_t(n) * q_dim);
            for (int t = 0; t < n; ++t) {
              const int p = pos0 + t, first = window > 0 ? std::max(0, p - window + 1) : 0;
              for (int h = 0; h < n_heads; ++h) {
                const int kvh = h / (n_heads / n_kv);
                std::vector<double> s;
                double mx = -INFINITY;
                for (int j = first; j <= p; ++j) {
                  double dot = 0;
                  for (int e = 0; e < hd; ++e)
                    dot += double(qr[size_t(t) * q_dim + h * hd + e]) * cache_k[size_t(j) * kv_dim + kvh * hd + e];
                  dot *= scale;
                  if (cap > 0) dot = cap * std::tanh(dot / cap);
                  s.push_back(dot);
                  mx = std::max(mx, dot);
                }
                if (with_sinks) mx = std::max(mx, double(sinks[size_t(h)]));
                double sum = with_sinks ? std::exp(sinks[size_t(h)] - mx) : 0.0;
                for (double& x : s) sum += (x = std::exp(x - mx));
                for (int e = 0; e < hd; ++e) {
                  double acc = 0;
                  for (int j = first; j <= p; ++j) acc += s[size_t(j - first)] * cache_v[size_t(j) * kv_dim + kvh * hd + e];
                  want[size_t(t) * q_dim + h * hd + e] = float(acc / sum);
                }
              }
            }
            auto dq = upload(q);
            auto dk = upload(k);
            auto dv = upload(v);
            auto dp = upload(std::vector<int>{pos0, pos0 + 1, pos0 + 2});
            auto kc = upload(hk);
            auto vc = upload(hv);
            auto ds = upload(sinks);
            DevBuf out(want.size() * sizeof(float));
            gpu::decode_attention_rope(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), n, n_heads,
                                       n_kv, hd, rc.spec, kc->as<uint16_t>(), vc->as<uint16_t>(), window, scale, max_ctx,
                                       out.as<float>(), nullptr, nullptr, cap, with_sinks ? ds->as<float>() : nullptr);
            EXPECT_LT(rel_err(out.get<float>(want.size()), want), 1e-3);
            const std::vector<float> kcf = f16_to_f32(kc->get<uint16_t>(hk.size()));
            const std::vector<float> vcf = f16_to_f32(vc->get<uint16_t>(hv.size()));
            for (size_t i = size_t(pos0) * kv_dim; i < size_t(pos0 + n) * kv_dim; ++i) {
              ASSERT_NEAR(kcf[i], cache_k[i], 2e-3f * std::max(1.0f, std::abs(cache_k[i]))) << i;
              ASSERT_EQ(vcf[i], cache_v[i]) << i;
            }
          }
        }
      }
    }
  }
}

// The soft-cap changes the output where scores exceed the cap (so the test
// above can tell capped from uncapped), and the plain decode_attention takes
// it too.
TEST(GpuFamilyOps, DecodeAttentionSoftcapChangesLargeScores) {
  REQUIRE_GPU();
  const int hd = 64, max_ctx = 16, n_heads = 2;
  const std::vector<float> q = randn(size_t(n_heads) * hd, 900, 3.0f);
  std::vector<uint16_t> k(size_t(max_ctx) * hd), v(size_t(max_ctx) * hd);
  const std::vector<float> kf = randn(k.size(), 901, 3.0f), vf = randn(v.size(), 902);
  for (size_t i = 0; i < k.size(); ++i) k[i] = fp32_to_fp16(kf[i]), v[i] = fp32_to_fp16(vf[i]);
  auto dq = upload(q);
  auto dk = upload(k);
  auto dv = upload(v);
  auto dp = upload(std::vector<int>{max_ctx - 1});
  DevBuf a(q.size() * 4), b(q.size() * 4);
  gpu::decode_attention(dq->as<float>(), dk->as<uint16_t>(), dv->as<uint16_t>(), 1, dp->as<int>(), n_heads, 1, hd, 0,
                        1.0f, max_ctx, a.as<float>(), nullptr, nullptr, 0.0f);
  gpu::decode_attention(dq->as<float>(), dk->as<uint16_t>(), dv->as<uint16_t>(), 1, dp->as<int>(), n_heads, 1, hd, 0,
                        1.0f, max_ctx, b.as<float>(), nullptr, nullptr, 1.0f);
  const std::vector<float> ua = a.get<float>(q.size()), ub = b.get<float>(q.size());
  EXPECT_GT(rel_err(ub, ua), 1e-2) << "a soft-cap of 1 on scores of tens must change the output";
  for (float x : ub) ASSERT_TRUE(std::isfinite(x));
}

// ---- the attention output bias --------------------------------------------------------

// add_bias_rows (attn_output.bias after wo) against the host sum, exact:
// one f32 add each. Rows of 1, 7 and 300 tokens, a width not a multiple of
// the block size.
TEST(GpuFamilyOps, AddBiasRows) {
  REQUIRE_GPU();
  const int64_t cols = 2880 + 3;
  const std::vector<float> bias = randn(size_t(cols), 950);
  for (int rows : {1, 7, 300}) {
    const std::vector<float> x = randn(size_t(rows) * cols, 951 + unsigned(rows));
    std::vector<float> want = x;
    for (int r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) want[size_t(r * cols + c)] += bias[size_t(c)];
    auto dx = upload(x);
    auto db = upload(bias);
    gpu::add_bias_rows(dx->as<float>(), db->as<float>(), rows, cols, nullptr);
    EXPECT_EQ(dx->get<float>(want.size()), want) << rows << " rows";
  }
}

// ---- q/k/v biases and per-head q/k RMSNorm -------------------------------------------

// Against add + kernels/cpu/ops.h rmsnorm per head (double sum there, fp32
// here: 1e-5), with biases only, norms only and both.
TEST(GpuFamilyOps, QkvBiasHeadNorm) {
  REQUIRE_GPU();
  const int n = 5, n_heads = 4, n_kv = 2;
  const float eps = 1e-6f;
  for (int hd : {32, 128, 256}) {
    for (int mode = 0; mode < 3; ++mode) {
      const bool bias = mode != 1, norm = mode != 0;
      SCOPED_TRACE("head_dim " + std::to_string(hd) + (bias ? " bias" : "") + (norm ? " norm" : ""));
      const uint32_t seed = 700 + uint32_t(hd) + uint32_t(mode);
      const std::vector<float> q = randn(size_t(n) * n_heads * hd, seed), k = randn(size_t(n) * n_kv * hd, seed + 10),
                               v = randn(size_t(n) * n_kv * hd, seed + 20);
      const std::vector<float> bq = randn(size_t(n_heads) * hd, seed + 30), bk = randn(size_t(n_kv) * hd, seed + 40),
                               bv = randn(size_t(n_kv) * hd, seed + 50);
      const std::vector<float> wq = randn(size_t(hd), seed + 60), wk = randn(size_t(hd), seed + 70);
      std::vector<float> qr = q, kr = k, vr = v;
      auto apply = [&](std::vector<float>& x, const std::vector<float>& b, const std::vector<float>* w, int heads) {
        for (int t = 0; t < n; ++t)
          for (int h = 0; h < heads; ++h) {
            float* row = x.data() + (size_t(t) * heads + h) * hd;
            if (bias)
              for (int e = 0; e < hd; ++e) row[e] += b[size_t(h) * hd + e];
            if (w) {
              std::vector<float> tmp(row, row + hd);
              rmsnorm(row, tmp.data(), w->data(), hd, eps);
            }
          }
      };
      apply(qr, bq, norm ? &wq : nullptr, n_heads);
      apply(kr, bk, norm ? &wk : nullptr, n_kv);
      apply(vr, bv, nullptr, n_kv);
      auto dq = upload(q);
      auto dk = upload(k);
      auto dv = upload(v);
      auto dbq = upload(bq);
      auto dbk = upload(bk);
      auto dbv = upload(bv);
      auto dwq = upload(wq);
      auto dwk = upload(wk);
      gpu::qkv_bias_head_norm(dq->as<float>(), dk->as<float>(), dv->as<float>(), bias ? dbq->as<float>() : nullptr,
                              bias ? dbk->as<float>() : nullptr, bias ? dbv->as<float>() : nullptr,
                              norm ? dwq->as<float>() : nullptr, norm ? dwk->as<float>() : nullptr, n, n_heads, n_kv,
                              hd, eps, nullptr);
      EXPECT_LT(rel_err(dq->get<float>(q.size()), qr), 1e-5);
      EXPECT_LT(rel_err(dk->get<float>(k.size()), kr), 1e-5);
      EXPECT_LT(rel_err(dv->get<float>(v.size()), vr), 1e-6);
    }
  }
}

// ---- GeGLU, soft-cap, scaled embedding ------------------------------------------------

// geglu against kernels/cpu/ops.h geglu (tanhf against std::tanh: 1e-5),
// the f16 copy within f16 rounding (1e-3), and geglu_x8's int8 x within
// half a quantization step of the reference value.
TEST(GpuFamilyOps, GegluF32F16AndInt8) {
  REQUIRE_GPU();
  const int rows = 3;
  const int64_t cols = 4096;
  const std::vector<float> g = randn(size_t(rows * cols), 800, 3.0f), u = randn(g.size(), 801);
  std::vector<float> ref = g;
  geglu(ref.data(), u.data(), int64_t(ref.size()));
  auto dg = upload(g);
  auto du = upload(u);
  DevBuf h(g.size() * 2);
  gpu::geglu(dg->as<float>(), du->as<float>(), h.as<uint16_t>(), int64_t(g.size()), nullptr);
  EXPECT_LT(rel_err(dg->get<float>(g.size()), ref), 1e-5);
  EXPECT_LT(rel_err(f16_to_f32(h.get<uint16_t>(g.size())), ref), 1e-3);

  auto dg2 = upload(g);
  DevBuf x8(gpu::x8_bytes(rows, cols));
  gpu::geglu_x8(dg2->as<float>(), du->as<float>(), x8.p, rows, cols, nullptr);
  // Layout (kernels/cuda/x8_layout.cuh): int8 [rows * cols], 16-byte
  // aligned, then (d, d * sum) float pairs per 32 values.
  const size_t q_bytes = (g.size() + 15) / 16 * 16, nb = g.size() / 32;
  const std::vector<uint8_t> raw = x8.get<uint8_t>(q_bytes + nb * 8);
  for (size_t i = 0; i < g.size(); ++i) {
    float d;
    std::memcpy(&d, raw.data() + q_bytes + 8 * (i / 32), 4);
    const float got = static_cast<int8_t>(raw[i]) * d;
    ASSERT_NEAR(got, ref[i], 0.5f * d * 1.001f + 1e-5f) << i;
  }
  EXPECT_EQ(dg2->get<float>(g.size()), g);  // geglu_x8 leaves its inputs
}

TEST(GpuFamilyOps, SoftcapMatchesTheCpu) {
  REQUIRE_GPU();
  const std::vector<float> x = randn(10000, 810, 40.0f);
  for (float cap : {30.0f, 5.0f}) {
    std::vector<float> ref = x;
    softcap(ref.data(), int64_t(ref.size()), cap);
    auto dx = upload(x);
    gpu::softcap(dx->as<float>(), int64_t(x.size()), cap, nullptr);
    const std::vector<float> got = dx->get<float>(x.size());
    EXPECT_LT(rel_err(got, ref), 1e-6) << cap;
    for (float y : got) ASSERT_LE(std::abs(y), cap) << cap;
  }
}

// embed_rows with a scale: an f32 table's rows times the scale exactly (one
// f32 multiply, as the CPU engine's), a Q8_0 table's within 1e-6.
TEST(GpuFamilyOps, EmbedRowsScaled) {
  REQUIRE_GPU();
  const int64_t rows = 50, cols = 256;
  const float scale = std::sqrt(float(cols));
  const std::vector<int> tokens = {3, 0, 49, 3};
  for (DType t : {DType::F32, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> w = randn(size_t(rows * cols), 820);
    const size_t row_bytes = dtype_row_bytes(t, cols);
    std::vector<uint8_t> raw(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, raw.data() + size_t(r) * row_bytes, cols);
    const QMatrix host{t, raw.data(), row_bytes, cols, rows};
    gpu::GpuMatrix gm = gpu::upload_matrix(host);
    std::vector<float> want(tokens.size() * size_t(cols));
    for (size_t i = 0; i < tokens.size(); ++i) {
      get_row(host, tokens[i], want.data() + i * size_t(cols));
      for (int64_t c = 0; c < cols; ++c) want[i * size_t(cols) + size_t(c)] *= scale;
    }
    auto dt = upload(tokens);
    DevBuf out(want.size() * 4);
    gpu::embed_rows(gm, dt->as<int>(), int(tokens.size()), out.as<float>(), nullptr, scale);
    const std::vector<float> got = out.get<float>(want.size());
    if (t == DType::F32) EXPECT_EQ(got, want);
    else EXPECT_LT(rel_err(got, want), 1e-6);
    gpu::free_matrix(gm);
  }
}

#endif  // RUNLM_CUDA
