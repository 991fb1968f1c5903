// `runlm convert` of the mixture-of-experts Hugging Face classes
// (MixtralForCausalLM, Qwen3MoeForCausalLM, GptOssForCausalLM): tiny random
// checkpoints (2 layers, 4 experts, top 2) are written here in each layout
// transformers saves (one tensor per expert; the fused gate_up_proj /
// down_proj; gpt-oss's transposed gate_up_proj with gate and up interleaved),
// converted, run on the CPU engine, and every position's logits compared
// with the model computed here in plain loops the way transformers computes
// it (rotate_half RoPE on the unpermuted q/k, YaRN's inverse frequencies,
// sliding windows, attention sinks, the routers, the experts). Then the
// configurations runlm cannot run the same way are errors naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common.h"
#include "convert.h"
#include "cpu/quant.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;
namespace fs = std::filesystem;

namespace {

enum class Family { Mixtral, Qwen3Moe, GptOss };
// How the experts are stored: one 2-D tensor per expert, or transformers'
// fused 3-D gate_up_proj / down_proj (gpt-oss always has its own fused form).
enum class Layout { PerExpert, Fused };

struct Shape {
  Family family;
  int vocab = 512, dim = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16;
  int experts = 4, used = 2, expert_hidden = 32;
  float eps = 1e-5f;
  double theta = 10000.0;
  int window = 0;              // gpt-oss: the even layers' sliding window
  bool norm_topk = true;       // Qwen3-MoE's norm_topk_prob
  // gpt-oss's YaRN (transformers' inverse frequencies, truncate true).
  double yarn_factor = 0, yarn_orig = 0;
};

using Vec = std::vector<float>;

// The weights in one canonical form, matrices row-major [out][in] as
// nn.Linear keeps them; the layouts below are written from these.
struct Layer {
  Vec attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, sinks, q_norm, k_norm, ffn_norm, router, router_b;
  std::vector<Vec> gate, up, down, gate_b, up_b, down_b;  // per expert
};
struct Weights {
  Vec embed, norm, lm_head;
  std::vector<Layer> layers;
};

Weights random_weights(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uniform = [&](size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    Vec v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  // Matrices with unit-variance outputs; norms near 1; biases small.
  auto matrix = [&](int out, int in) {
    const float b = std::sqrt(3.0f / float(in));
    return uniform(size_t(out) * size_t(in), -b, b);
  };
  auto norm = [&](int n) { return uniform(size_t(n), 0.8f, 1.2f); };
  const bool oss = s.family == Family::GptOss;
  const int q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  Weights w;
  w.embed = uniform(size_t(s.vocab) * size_t(s.dim), -1.0f, 1.0f);
  w.norm = norm(s.dim);
  w.lm_head = matrix(s.vocab, s.dim);
  for (int l = 0; l < s.layers; ++l) {
    Layer L;
    L.attn_norm = norm(s.dim);
    L.wq = matrix(q, s.dim);
    L.wk = matrix(kv, s.dim);
    L.wv = matrix(kv, s.dim);
    L.wo = matrix(s.dim, q);
    L.ffn_norm = norm(s.dim);
    L.router = matrix(s.experts, s.dim);
    if (s.family == Family::Qwen3Moe) L.q_norm = norm(s.head_dim), L.k_norm = norm(s.head_dim);
    if (oss) {
      L.bq = uniform(size_t(q), -0.2f, 0.2f);
      L.bk = uniform(size_t(kv), -0.2f, 0.2f);
      L.bv = uniform(size_t(kv), -0.2f, 0.2f);
      L.bo = uniform(size_t(s.dim), -0.2f, 0.2f);
      L.sinks = uniform(size_t(s.heads), -1.0f, 2.0f);  // not zero: they take a share of every softmax
      L.router_b = uniform(size_t(s.experts), -0.5f, 0.5f);
    }
    for (int e = 0; e < s.experts; ++e) {
      L.gate.push_back(matrix(s.expert_hidden, s.dim));
      L.up.push_back(matrix(s.expert_hidden, s.dim));
      L.down.push_back(matrix(s.dim, s.expert_hidden));
      if (oss) {
        L.gate_b.push_back(uniform(size_t(s.expert_hidden), -0.5f, 0.5f));
        L.up_b.push_back(uniform(size_t(s.expert_hidden), -0.5f, 0.5f));
        L.down_b.push_back(uniform(size_t(s.dim), -0.5f, 0.5f));
      }
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

struct HfTensor {
  std::vector<int64_t> shape;
  Vec values;
  std::vector<uint8_t> bytes = {};  // a U8 tensor (MXFP4 blocks, scales) in place of values
};
using HfTensors = std::map<std::string, HfTensor>;

// The checkpoint's tensors, named and laid out as transformers saves them.
HfTensors hf_tensors(const Shape& s, const Weights& w, Layout layout) {
  const int64_t H = s.dim, I = s.expert_hidden, E = s.experts, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  HfTensors t;
  t["model.embed_tokens.weight"] = {{s.vocab, H}, w.embed};
  t["model.norm.weight"] = {{H}, w.norm};
  t["lm_head.weight"] = {{s.vocab, H}, w.lm_head};
  for (int l = 0; l < s.layers; ++l) {
    const Layer& L = w.layers[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t[p + "input_layernorm.weight"] = {{H}, L.attn_norm};
    t[p + "post_attention_layernorm.weight"] = {{H}, L.ffn_norm};
    t[p + "self_attn.q_proj.weight"] = {{q, H}, L.wq};
    t[p + "self_attn.k_proj.weight"] = {{kv, H}, L.wk};
    t[p + "self_attn.v_proj.weight"] = {{kv, H}, L.wv};
    t[p + "self_attn.o_proj.weight"] = {{H, q}, L.wo};
    if (!L.q_norm.empty()) {
      t[p + "self_attn.q_norm.weight"] = {{s.head_dim}, L.q_norm};
      t[p + "self_attn.k_norm.weight"] = {{s.head_dim}, L.k_norm};
    }
    if (s.family == Family::GptOss) {
      t[p + "self_attn.q_proj.bias"] = {{q}, L.bq};
      t[p + "self_attn.k_proj.bias"] = {{kv}, L.bk};
      t[p + "self_attn.v_proj.bias"] = {{kv}, L.bv};
      t[p + "self_attn.o_proj.bias"] = {{H}, L.bo};
      t[p + "self_attn.sinks"] = {{s.heads}, L.sinks};
      t[p + "mlp.router.weight"] = {{E, H}, L.router};
      t[p + "mlp.router.bias"] = {{E}, L.router_b};
      // x @ W: gate_up_proj [E, H, 2I], column 2o the gate's row o, 2o + 1 the up's.
      Vec gu(size_t(E * H * 2 * I)), gub(size_t(E * 2 * I)), dn(size_t(E * I * H)), dnb;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t o = 0; o < I; ++o) {
          for (int64_t h = 0; h < H; ++h) {
            gu[size_t((e * H + h) * 2 * I + 2 * o)] = L.gate[size_t(e)][size_t(o * H + h)];
            gu[size_t((e * H + h) * 2 * I + 2 * o + 1)] = L.up[size_t(e)][size_t(o * H + h)];
          }
          gub[size_t(e * 2 * I + 2 * o)] = L.gate_b[size_t(e)][size_t(o)];
          gub[size_t(e * 2 * I + 2 * o + 1)] = L.up_b[size_t(e)][size_t(o)];
        }
        for (int64_t i = 0; i < I; ++i)
          for (int64_t h = 0; h < H; ++h) dn[size_t((e * I + i) * H + h)] = L.down[size_t(e)][size_t(h * I + i)];
        dnb.insert(dnb.end(), L.down_b[size_t(e)].begin(), L.down_b[size_t(e)].end());
      }
      t[p + "mlp.experts.gate_up_proj"] = {{E, H, 2 * I}, gu};
      t[p + "mlp.experts.gate_up_proj_bias"] = {{E, 2 * I}, gub};
      t[p + "mlp.experts.down_proj"] = {{E, I, H}, dn};
      t[p + "mlp.experts.down_proj_bias"] = {{E, H}, dnb};
      continue;
    }
    const bool mixtral_names = s.family == Family::Mixtral && layout == Layout::PerExpert;
    const std::string moe = p + (mixtral_names ? "block_sparse_moe." : "mlp.");
    t[moe + "gate.weight"] = {{E, H}, L.router};
    if (layout == Layout::PerExpert) {
      const bool w123 = s.family == Family::Mixtral;
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = moe + "experts." + std::to_string(e) + ".";
        t[x + (w123 ? "w1" : "gate_proj") + ".weight"] = {{I, H}, L.gate[size_t(e)]};
        t[x + (w123 ? "w3" : "up_proj") + ".weight"] = {{I, H}, L.up[size_t(e)]};
        t[x + (w123 ? "w2" : "down_proj") + ".weight"] = {{H, I}, L.down[size_t(e)]};
      }
    } else {
      // transformers' fused experts: [E, 2I, H], the gate rows then the up rows.
      Vec gu, dn;
      for (int64_t e = 0; e < E; ++e) {
        gu.insert(gu.end(), L.gate[size_t(e)].begin(), L.gate[size_t(e)].end());
        gu.insert(gu.end(), L.up[size_t(e)].begin(), L.up[size_t(e)].end());
        dn.insert(dn.end(), L.down[size_t(e)].begin(), L.down[size_t(e)].end());
      }
      t[moe + "experts.gate_up_proj"] = {{E, 2 * I, H}, gu};
      t[moe + "experts.down_proj"] = {{E, H, I}, dn};
    }
  }
  return t;
}

nlohmann::json hf_config(const Shape& s) {
  nlohmann::json c = {{"hidden_size", s.dim}, {"intermediate_size", s.expert_hidden}, {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads}, {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim}, {"vocab_size", s.vocab}, {"rms_norm_eps", s.eps},
                      {"rope_theta", s.theta}, {"tie_word_embeddings", false}, {"hidden_act", "silu"},
                      {"num_experts_per_tok", s.used}, {"torch_dtype", "float32"}};
  switch (s.family) {
    case Family::Mixtral:
      c["architectures"] = {"MixtralForCausalLM"};
      c["model_type"] = "mixtral";
      c["num_local_experts"] = s.experts;
      c["sliding_window"] = nullptr;
      c["router_jitter_noise"] = 0.0;
      break;
    case Family::Qwen3Moe:
      c["architectures"] = {"Qwen3MoeForCausalLM"};
      c["model_type"] = "qwen3_moe";
      c["num_experts"] = s.experts;
      c["intermediate_size"] = 96;  // the dense MLP's, unused when every layer has experts
      c["moe_intermediate_size"] = s.expert_hidden;
      c["norm_topk_prob"] = s.norm_topk;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = nlohmann::json::array();
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["attention_bias"] = false;
      break;
    case Family::GptOss: {
      c["architectures"] = {"GptOssForCausalLM"};
      c["model_type"] = "gpt_oss";
      c["num_local_experts"] = s.experts;
      c["sliding_window"] = s.window;
      nlohmann::json types = nlohmann::json::array();
      for (int l = 0; l < s.layers; ++l) types.push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
      c["layer_types"] = types;
      c["attention_bias"] = true;
      c["swiglu_limit"] = 7.0;
      c["max_position_embeddings"] = int64_t(s.yarn_factor * s.yarn_orig);
      c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", s.yarn_factor}, {"beta_fast", 32.0},
                           {"beta_slow", 1.0}, {"truncate", true},
                           {"original_max_position_embeddings", int64_t(s.yarn_orig)}};
      break;
    }
  }
  return c;
}

void write_checkpoint(const fs::path& dir, const nlohmann::json& config, const HfTensors& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump();
  fs::copy_file(embedded_model_dir() + "/stories260K-tok512.model", dir / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const bool u8 = !t.bytes.empty();
    const size_t n = u8 ? t.bytes.size() : t.values.size() * 4;
    header[name] = {{"dtype", u8 ? "U8" : "F32"}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + n}}};
    data.append(u8 ? reinterpret_cast<const char*>(t.bytes.data()) : reinterpret_cast<const char*>(t.values.data()), n);
  }
  const std::string h = header.dump();
  const uint64_t len = h.size();
  std::ofstream f(dir / "model.safetensors", std::ios::binary);
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << h << data;
}

// gpt-oss as released: its experts as MXFP4 blocks and scales (transformers'
// layout, rows by output, gate and up interleaved) of random bytes; w's
// experts become the values transformers decodes them to
// (convert_moe_packed_tensors: value 2k of a block is byte k's low nibble,
// 2k + 1 its high nibble, each FP4_VALUES[nibble] * 2^(scale - 127)).
void to_mxfp4_experts(const Shape& s, Weights& w, HfTensors& t, uint32_t seed) {
  static const float kFp4[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  std::mt19937 rng(seed);
  const int64_t H = s.dim, I = s.expert_hidden, E = s.experts;
  // Rows [E, out] of `in` values each: random bytes, and the values of row (e, o).
  auto packed = [&](const std::string& name, int64_t out, int64_t in,
                    const std::function<float&(int64_t e, int64_t o, int64_t i)>& value) {
    const int64_t nb = in / 32;
    HfTensor blocks{{E, out, nb, 16}, {}, std::vector<uint8_t>(size_t(E * out * nb * 16))};
    HfTensor scales{{E, out, nb}, {}, std::vector<uint8_t>(size_t(E * out * nb))};
    for (uint8_t& b : blocks.bytes) b = uint8_t(rng());
    for (uint8_t& x : scales.bytes) x = uint8_t(119 + rng() % 5);  // 2^-8 .. 2^-4: weights of about +-0.2
    for (int64_t e = 0; e < E; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          const int64_t blk = (e * out + o) * nb + i / 32;
          const uint8_t byte = blocks.bytes[size_t(blk * 16 + (i % 32) / 2)];
          value(e, o, i) = std::ldexp(kFp4[(byte >> (4 * (i % 2))) & 0xF], int(scales.bytes[size_t(blk)]) - 127);
        }
    t[name + "_blocks"] = blocks;
    t[name + "_scales"] = scales;
    t.erase(name);
  };
  for (int l = 0; l < s.layers; ++l) {
    Layer& L = w.layers[size_t(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    packed(p + "gate_up_proj", 2 * I, H, [&](int64_t e, int64_t o, int64_t i) -> float& {
      return (o % 2 ? L.up : L.gate)[size_t(e)][size_t((o / 2) * H + i)];
    });
    packed(p + "down_proj", H, I, [&](int64_t e, int64_t o, int64_t i) -> float& {
      return L.down[size_t(e)][size_t(o * I + i)];
    });
  }
}

// A gpt-oss checkpoint as released: MXFP4 experts, the rest f32, and the
// quantization_config that says so; weights hold the values transformers
// computes with.
struct Mxfp4GptOss {
  Weights weights;
  HfTensors tensors;
  nlohmann::json config;
};
Mxfp4GptOss mxfp4_gpt_oss(const Shape& s, uint32_t seed) {
  Mxfp4GptOss m{random_weights(s, seed), {}, hf_config(s)};
  m.tensors = hf_tensors(s, m.weights, Layout::Fused);
  to_mxfp4_experts(s, m.weights, m.tensors, seed + 1);
  m.config["quantization_config"] = {
      {"quant_method", "mxfp4"},
      {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
  return m;
}

// ---- the model as transformers computes it ---------------------------------

using DVec = std::vector<double>;

DVec matvec(const Vec& w, const DVec& x, size_t rows) {
  DVec y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < x.size(); ++c) y[r] += double(w[r * x.size() + c]) * x[c];
  return y;
}

DVec rms_norm(const DVec& x, const Vec& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  DVec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

DVec softmax(const DVec& x) {
  const double m = *std::max_element(x.begin(), x.end());
  DVec y(x.size());
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) sum += y[i] = std::exp(x[i] - m);
  for (double& v : y) v /= sum;
  return y;
}

// RoPE's inverse frequencies and the cos/sin multiplier: plain, or YaRN as
// transformers' _compute_yarn_parameters (truncated correction range).
std::pair<DVec, double> inv_freqs(const Shape& s) {
  const int d = s.head_dim;
  DVec f(size_t(d / 2));
  for (int i = 0; i < d / 2; ++i) f[size_t(i)] = 1.0 / std::pow(s.theta, 2.0 * i / d);
  if (s.yarn_factor == 0) return {f, 1.0};
  auto corr_dim = [&](double rot) { return d * std::log(s.yarn_orig / (rot * 2 * M_PI)) / (2 * std::log(s.theta)); };
  const double low = std::max(0.0, std::floor(corr_dim(32.0)));
  const double high = std::min(double(d - 1), std::ceil(corr_dim(1.0)));
  for (int i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1 - ramp;
    f[size_t(i)] = f[size_t(i)] / s.yarn_factor * (1 - extrapolation) + f[size_t(i)] * extrapolation;
  }
  return {f, 0.1 * std::log(s.yarn_factor) + 1.0};
}

// rotate_half: pairs (i, i + d/2) of each head.
void rope(DVec& x, int n_heads, int d, int pos, const DVec& freqs, double scale) {
  for (int h = 0; h < n_heads; ++h)
    for (int i = 0; i < d / 2; ++i) {
      const double a = pos * freqs[size_t(i)], c = std::cos(a) * scale, sn = std::sin(a) * scale;
      double& x0 = x[size_t(h * d + i)];
      double& x1 = x[size_t(h * d + i + d / 2)];
      const double y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
      x0 = y0, x1 = y1;
    }
}

// Logits at every position of `ids`.
std::vector<DVec> hf_forward(const Shape& s, const Weights& w, const std::vector<int>& ids) {
  const bool oss = s.family == Family::GptOss, qwen = s.family == Family::Qwen3Moe;
  const int H = s.dim, d = s.head_dim, q_dim = s.heads * d, kv_dim = s.kv_heads * d, I = s.expert_hidden;
  const auto [freqs, rope_scale] = inv_freqs(s);
  std::vector<std::vector<DVec>> keys(size_t(s.layers)), values(size_t(s.layers));
  std::vector<DVec> out;
  for (size_t t = 0; t < ids.size(); ++t) {
    DVec x(w.embed.begin() + size_t(ids[t]) * size_t(H), w.embed.begin() + size_t(ids[t] + 1) * size_t(H));
    for (int l = 0; l < s.layers; ++l) {
      const Layer& L = w.layers[size_t(l)];
      const DVec h = rms_norm(x, L.attn_norm, s.eps);
      DVec q = matvec(L.wq, h, size_t(q_dim)), k = matvec(L.wk, h, size_t(kv_dim)), v = matvec(L.wv, h, size_t(kv_dim));
      if (oss) {
        for (int i = 0; i < q_dim; ++i) q[size_t(i)] += L.bq[size_t(i)];
        for (int i = 0; i < kv_dim; ++i) k[size_t(i)] += L.bk[size_t(i)], v[size_t(i)] += L.bv[size_t(i)];
      }
      if (qwen) {  // per-head RMSNorm before RoPE
        auto per_head = [&](DVec& x_, int n, const Vec& nw) {
          for (int hh = 0; hh < n; ++hh) {
            DVec one(x_.begin() + hh * d, x_.begin() + (hh + 1) * d);
            one = rms_norm(one, nw, s.eps);
            std::copy(one.begin(), one.end(), x_.begin() + hh * d);
          }
        };
        per_head(q, s.heads, L.q_norm);
        per_head(k, s.kv_heads, L.k_norm);
      }
      rope(q, s.heads, d, int(t), freqs, rope_scale);
      rope(k, s.kv_heads, d, int(t), freqs, rope_scale);
      keys[size_t(l)].push_back(k);
      values[size_t(l)].push_back(v);
      const bool sliding = oss && l % 2 == 0;
      DVec att(size_t(q_dim), 0.0);
      for (int hh = 0; hh < s.heads; ++hh) {
        const int g = hh / (s.heads / s.kv_heads);
        DVec scores;
        std::vector<size_t> seen;
        for (size_t p = 0; p <= t; ++p) {
          if (sliding && t - p >= size_t(s.window)) continue;
          double dot = 0;
          for (int i = 0; i < d; ++i) dot += q[size_t(hh * d + i)] * keys[size_t(l)][p][size_t(g * d + i)];
          scores.push_back(dot / std::sqrt(double(d)));
          seen.push_back(p);
        }
        if (oss) scores.push_back(L.sinks[size_t(hh)]);  // the sink's column, dropped after the softmax
        const DVec pr = softmax(scores);
        for (size_t j = 0; j < seen.size(); ++j)
          for (int i = 0; i < d; ++i) att[size_t(hh * d + i)] += pr[j] * values[size_t(l)][seen[j]][size_t(g * d + i)];
      }
      DVec o = matvec(L.wo, att, size_t(H));
      for (int i = 0; i < H; ++i) x[size_t(i)] += o[size_t(i)] + (oss ? L.bo[size_t(i)] : 0.0);

      const DVec h2 = rms_norm(x, L.ffn_norm, s.eps);
      DVec logits = matvec(L.router, h2, size_t(s.experts));
      if (oss)
        for (int e = 0; e < s.experts; ++e) logits[size_t(e)] += L.router_b[size_t(e)];
      // Mixtral, Qwen3-MoE: softmax, top k (renormalised: Mixtral always,
      // Qwen3-MoE with norm_topk_prob). gpt-oss: top k logits, their softmax.
      const DVec score = oss ? logits : softmax(logits);
      std::vector<int> order(size_t(s.experts));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[size_t(a)] > score[size_t(b)]; });
      order.resize(size_t(s.used));
      DVec wts;
      for (int e : order) wts.push_back(score[size_t(e)]);
      if (oss) {
        wts = softmax(wts);
      } else if (s.family == Family::Mixtral || s.norm_topk) {
        const double sum = std::accumulate(wts.begin(), wts.end(), 0.0);
        for (double& x_ : wts) x_ /= sum;
      }
      for (size_t j = 0; j < order.size(); ++j) {
        const size_t e = size_t(order[j]);
        DVec gv = matvec(L.gate[e], h2, size_t(I)), uv = matvec(L.up[e], h2, size_t(I));
        DVec a(gv.size());
        for (int i = 0; i < I; ++i) {
          if (oss) {
            const double gg = std::min(gv[size_t(i)] + L.gate_b[e][size_t(i)], 7.0);
            const double uu = std::clamp(uv[size_t(i)] + L.up_b[e][size_t(i)], -7.0, 7.0);
            a[size_t(i)] = gg / (1 + std::exp(-1.702 * gg)) * (uu + 1);
          } else {
            a[size_t(i)] = gv[size_t(i)] / (1 + std::exp(-gv[size_t(i)])) * uv[size_t(i)];
          }
        }
        const DVec dn = matvec(L.down[e], a, size_t(H));
        for (int i = 0; i < H; ++i) x[size_t(i)] += wts[j] * (dn[size_t(i)] + (oss ? L.down_b[e][size_t(i)] : 0.0));
      }
    }
    out.push_back(matvec(w.lm_head, rms_norm(x, w.norm, s.eps), size_t(s.vocab)));
  }
  return out;
}

// Runs the GGUF on the CPU token by token; each position's logits against the reference.
void expect_logits_match(const std::string& gguf, const std::vector<DVec>& want, const std::vector<int>& ids) {
  auto m = Model::load(gguf);
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = 64;
  auto e = make_cpu_engine(*m, eo);
  std::vector<float> got(size_t(m->config().n_vocab));
  for (size_t t = 0; t < ids.size(); ++t) {
    e->forward(&ids[t], 1, int(t), got.data(), false);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - want[t][i]));
      scale = std::max(scale, std::abs(want[t][i]));
    }
    EXPECT_LT(worst, 2e-4 * std::max(1.0, scale)) << "position " << t << ": max |logit difference|, scale " << scale;
  }
}

const std::vector<int> kIds = {1, 17, 301, 42, 499, 7, 250, 88, 3, 130};

Shape mixtral() { return Shape{Family::Mixtral}; }
Shape qwen3moe() {
  Shape s{Family::Qwen3Moe};
  s.head_dim = 32;  // q_dim 128 != hidden 64
  s.theta = 1e6;
  s.eps = 1e-6f;
  return s;
}
Shape gpt_oss() {
  Shape s{Family::GptOss};
  s.theta = 150000.0;
  s.window = 3;
  s.yarn_factor = 32.0;
  s.yarn_orig = 4096.0;
  return s;
}

class ConvertMoe : public ::testing::Test {
 protected:
  fs::path dir = fs::temp_directory_path() / ("runlm_convmoe_" + std::to_string(getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::string out() const { return (dir / "out.gguf").string(); }
  void TearDown() override { fs::remove_all(dir); }

  // Writes the checkpoint, converts it and checks every position's logits.
  void check(const Shape& s, Layout layout, uint32_t seed) {
    const Weights w = random_weights(s, seed);
    write_checkpoint(dir, hf_config(s), hf_tensors(s, w, layout));
    convert_hf(dir.string(), out());
    expect_logits_match(out(), hf_forward(s, w, kIds), kIds);
  }
};

}  // namespace

TEST_F(ConvertMoe, MixtralPerExpertTensorsMatchTransformersMath) {
  check(mixtral(), Layout::PerExpert, 11);
  auto g = GgufFile::open(out());
  EXPECT_EQ(g->get_string("general.architecture"), "llama");
  EXPECT_EQ(g->get_int("llama.expert_count"), 4);
  EXPECT_EQ(g->get_int("llama.expert_used_count"), 2);
  EXPECT_EQ(g->get_int("llama.feed_forward_length"), 32);
  EXPECT_EQ(g->find("llama.expert_feed_forward_length"), nullptr);
  EXPECT_EQ(g->find("llama.attention.sliding_window"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.1.ffn_gate_exps.weight")->ne, (std::vector<int64_t>{64, 32, 4}));
  EXPECT_EQ(g->find_tensor("blk.1.ffn_down_exps.weight")->ne, (std::vector<int64_t>{32, 64, 4}));
  EXPECT_EQ(g->find_tensor("blk.0.ffn_gate_inp.weight")->ne, (std::vector<int64_t>{64, 4}));
}

TEST_F(ConvertMoe, MixtralFusedExpertsMatchTransformersMath) { check(mixtral(), Layout::Fused, 12); }

TEST_F(ConvertMoe, Qwen3MoePerExpertTensorsMatchTransformersMath) {
  check(qwen3moe(), Layout::PerExpert, 21);
  auto g = GgufFile::open(out());
  EXPECT_EQ(g->get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(g->get_int("qwen3moe.expert_feed_forward_length"), 32);
  EXPECT_EQ(g->get_int("qwen3moe.feed_forward_length"), 96);
  EXPECT_TRUE(g->get_bool("qwen3moe.expert_weights_norm"));
  EXPECT_EQ(g->get_int("qwen3moe.attention.key_length"), 32);
}

TEST_F(ConvertMoe, Qwen3MoeFusedExpertsWithoutNormTopkProbMatchTransformersMath) {
  Shape s = qwen3moe();
  s.norm_topk = false;  // the weights stay the full softmax's probabilities
  check(s, Layout::Fused, 22);
  EXPECT_FALSE(GgufFile::open(out())->get_bool("qwen3moe.expert_weights_norm"));
}

TEST_F(ConvertMoe, GptOssMatchesTransformersMath) {
  check(gpt_oss(), Layout::Fused, 31);
  auto g = GgufFile::open(out());
  EXPECT_EQ(g->get_string("general.architecture"), "gpt-oss");
  EXPECT_EQ(g->get_int("gpt-oss.expert_feed_forward_length"), 32);
  EXPECT_EQ(g->get_int("gpt-oss.attention.sliding_window"), 3);
  EXPECT_EQ(g->find("gpt-oss.attention.sliding_window_pattern"), nullptr);  // llama.cpp's fixed alternation
  EXPECT_EQ(g->get_string("gpt-oss.rope.scaling.type"), "yarn");
  EXPECT_EQ(g->get_float("gpt-oss.rope.scaling.factor"), 32.0);
  EXPECT_EQ(g->get_int("gpt-oss.rope.scaling.original_context_length"), 4096);
  EXPECT_EQ(g->find("gpt-oss.rope.scaling.yarn_beta_fast"), nullptr);
  for (const char* t : {"blk.0.attn_sinks.weight", "blk.0.attn_output.bias", "blk.0.ffn_gate_inp.bias",
                        "blk.0.ffn_gate_exps.bias", "blk.0.ffn_up_exps.bias", "blk.0.ffn_down_exps.bias",
                        "blk.1.post_attention_norm.weight"})
    EXPECT_NE(g->find_tensor(t), nullptr) << t;
  EXPECT_EQ(g->find_tensor("blk.0.ffn_norm.weight"), nullptr);
  EXPECT_EQ(Model::load(out())->config().swa_layers, (std::vector<uint8_t>{1, 0}));
}

// gpt-oss as released (MXFP4 experts, the rest unquantized): the experts
// are copied as GGUF MXFP4 blocks, which decode exactly to transformers'
// values, and the model gives transformers' logits.
TEST_F(ConvertMoe, GptOssMxfp4ExpertsAreCopiedAsMxfp4) {
  const Shape s = gpt_oss();
  const Mxfp4GptOss m = mxfp4_gpt_oss(s, 41);
  const Weights& w = m.weights;
  write_checkpoint(dir, m.config, m.tensors);
  convert_hf(dir.string(), out());
  auto g = GgufFile::open(out());
  const int64_t H = s.dim, I = s.expert_hidden;
  for (int l = 0; l < s.layers; ++l) {
    const Layer& L = w.layers[size_t(l)];
    for (const char* name : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      SCOPED_TRACE(strfmt("blk.%d.%s", l, name));
      const GgufTensorInfo* ti = g->find_tensor(strfmt("blk.%d.%s.weight", l, name));
      ASSERT_TRUE(ti);
      EXPECT_EQ(ti->type, DType::MXFP4);
      const bool down = std::string(name) == "ffn_down_exps";
      const std::vector<Vec>& want = down ? L.down : std::string(name) == "ffn_up_exps" ? L.up : L.gate;
      EXPECT_EQ(ti->ne, (std::vector<int64_t>{down ? I : H, down ? H : I, s.experts}));
      Vec got(size_t(ti->n_elements()));
      dequantize_row(DType::MXFP4, g->tensor_data(*ti), got.data(), ti->n_elements());
      Vec all;
      for (const Vec& v : want) all.insert(all.end(), v.begin(), v.end());
      EXPECT_EQ(got, all);  // exact: the blocks are copied, not re-encoded
    }
    EXPECT_EQ(g->find_tensor(strfmt("blk.%d.ffn_gate_exps.bias", l))->type, DType::F32);
  }
  expect_logits_match(out(), hf_forward(s, w, kIds), kIds);
}

TEST_F(ConvertMoe, GptOssMxfp4BlocksMissingOrNotBytesAreErrors) {
  const Shape s = gpt_oss();
  const Mxfp4GptOss m = mxfp4_gpt_oss(s, 43);
  const HfTensors& base = m.tensors;
  const nlohmann::json& cfg = m.config;
  const std::string scales = "model.layers.1.mlp.experts.down_proj_scales";
  HfTensors t = base;
  t.erase(scales);
  write_checkpoint(dir, cfg, t);
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }), {scales, "missing"});
  t = base;
  HfTensor& sc = t[scales];
  sc.values.assign(sc.bytes.begin(), sc.bytes.end());  // the same numbers, stored as F32
  sc.bytes.clear();
  fs::remove_all(dir);
  write_checkpoint(dir, cfg, t);
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }), {scales, "bytes (U8)"});
  // The unquantized layout under an mxfp4 configuration: the blocks are missing.
  fs::remove_all(dir);
  write_checkpoint(dir, cfg, hf_tensors(s, random_weights(s, 45), Layout::Fused));
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }), {"gate_up_proj_blocks", "missing"});
}

TEST_F(ConvertMoe, GptOssWithoutSinksOrWindowWouldDiffer) {
  // The comparison above can fail: the same checkpoint's logits move when
  // the reference drops the window or zeroes the sinks.
  const Shape s = gpt_oss();
  Weights w = random_weights(s, 31);
  const std::vector<DVec> base = hf_forward(s, w, kIds);
  Shape no_window = s;
  no_window.window = 1000;
  Weights no_sinks = w;
  for (Layer& L : no_sinks.layers) std::fill(L.sinks.begin(), L.sinks.end(), -1e9f);
  auto diff = [&](const std::vector<DVec>& other) {
    double d = 0;
    for (size_t t = 0; t < base.size(); ++t)
      for (size_t i = 0; i < base[t].size(); ++i) d = std::max(d, std::abs(base[t][i] - other[t][i]));
    return d;
  };
  EXPECT_GT(diff(hf_forward(no_window, w, kIds)), 1e-2);
  EXPECT_GT(diff(hf_forward(s, no_sinks, kIds)), 1e-2);
}

TEST_F(ConvertMoe, ConfigurationsRunlmCannotRunAreErrors) {
  struct Case {
    Shape shape;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {gpt_oss(), [](nlohmann::json& c) { c["quantization_config"] = {{"quant_method", "gptq"}}; },
       {"quantized checkpoint", "gptq", "gpt-oss: mxfp4 only", "bf16"}},
      {mixtral(), [](nlohmann::json& c) { c["quantization_config"] = {{"quant_method", "mxfp4"}}; },
       {"quantized checkpoint", "mxfp4", "only gpt-oss's mxfp4 experts"}},
      {qwen3moe(), [](nlohmann::json& c) { c["mlp_only_layers"] = {1}; }, {"mlp_only_layers", "not supported"}},
      {qwen3moe(), [](nlohmann::json& c) { c["decoder_sparse_step"] = 2; }, {"decoder_sparse_step"}},
      {qwen3moe(), [](nlohmann::json& c) { c["use_sliding_window"] = true; }, {"use_sliding_window"}},
      {mixtral(), [](nlohmann::json& c) { c["num_experts_per_tok"] = 5; }, {"num_experts_per_tok 5", "4 experts"}},
      {gpt_oss(), [](nlohmann::json& c) { c["swiglu_limit"] = 5.0; }, {"swiglu_limit 5"}},
      {gpt_oss(), [](nlohmann::json& c) { c["rope_scaling"]["rope_type"] = "dynamic"; },
       {"rope_scaling", "dynamic", "GptOssForCausalLM", "yarn"}},
      {gpt_oss(), [](nlohmann::json& c) { c["rope_scaling"]["attention_factor"] = 1.5; }, {"attention_factor"}},
      {gpt_oss(), [](nlohmann::json& c) { c["rope_scaling"]["factor"] = 16.0; },
       {"factor 16", "max_position_embeddings"}},
      {gpt_oss(), [](nlohmann::json& c) { c["layer_types"] = {"full_attention", "sliding_attention"}; },
       {"layer_types", "layer 0"}},
      {gpt_oss(), [](nlohmann::json& c) { c["attention_bias"] = false; }, {"attention_bias=false"}},
      {mixtral(), [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       {"rope_scaling", "yarn", "MixtralForCausalLM"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.words.front());
    nlohmann::json cfg = hf_config(c.shape);
    c.edit(cfg);
    write_checkpoint(dir, cfg, hf_tensors(c.shape, random_weights(c.shape, 5), Layout::PerExpert));
    expect_words(error_of([&] { convert_hf(dir.string(), out()); }), c.words);
    fs::remove_all(dir);
  }
}

TEST_F(ConvertMoe, MissingOrMisshapenExpertTensorsAreErrors) {
  const Shape s = mixtral();
  const Weights w = random_weights(s, 7);
  HfTensors t = hf_tensors(s, w, Layout::PerExpert);
  t.erase("model.layers.1.block_sparse_moe.experts.3.w2.weight");
  write_checkpoint(dir, hf_config(s), t);
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }),
               {"model.layers.1.block_sparse_moe.experts.3.w2.weight", "missing"});

  const Shape o = gpt_oss();
  HfTensors g = hf_tensors(o, random_weights(o, 7), Layout::Fused);
  g["model.layers.0.mlp.experts.gate_up_proj"].shape = {4, 64 * 2, 32};  // the fused [E, 2I, H] order: not gpt-oss's
  fs::remove_all(dir);
  write_checkpoint(dir, hf_config(o), g);
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }),
               {"mlp.experts.gate_up_proj", "[4, 128, 32]", "expected [4, 64, 64]"});

  // A tensor the layer does not read (a shared expert) is refused, not dropped.
  const Shape q = qwen3moe();
  HfTensors u = hf_tensors(q, random_weights(q, 7), Layout::PerExpert);
  u["model.layers.0.mlp.shared_expert.gate_proj.weight"] = {{8, 64}, Vec(8 * 64, 0.1f)};
  fs::remove_all(dir);
  write_checkpoint(dir, hf_config(q), u);
  expect_words(error_of([&] { convert_hf(dir.string(), out()); }),
               {"model.layers.0.mlp.shared_expert.gate_proj.weight", "Qwen3MoeForCausalLM"});
}
