#include "ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common.h"
#include "paged_kv.h"
#include "quant.h"
#include "thread_pool.h"

namespace runlm {

void rmsnorm(float* y, const float* x, const float* w, int64_t n, float eps) {
  double ss = 0;  // double: the mean of squares of a 4096-wide row loses bits in fp32
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void get_row(const QMatrix& w, int64_t r, float* out) {
  dequantize_row(w.type, w.data + w.row_bytes * static_cast<size_t>(r), out, w.cols);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void matmul(const QMatrix& w, const float* x, float* y, int64_t n_tokens, ThreadPool& pool) {
  pool.parallel_for(w.rows, [&](int64_t begin, int64_t end, int) {
    // Decode each row once, then dot it with every token. The same path for
    // one token or many keeps batched results identical to unbatched ones.
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = begin; r < end; ++r) {
      if (w.type == DType::F32) {
        const float* wr = reinterpret_cast<const float*>(w.data + w.row_bytes * r);
        for (int64_t t = 0; t < n_tokens; ++t) y[t * w.rows + r] = dot_f32(wr, x + t * w.cols, w.cols);
        continue;
      }
      dequantize_row(w.type, w.data + w.row_bytes * r, row.data(), w.cols);
      for (int64_t t = 0; t < n_tokens; ++t) y[t * w.rows + r] = dot_f32(row.data(), x + t * w.cols, w.cols);
    }
  });
}

void rope(float* x, int n_heads, int head_dim, int pos, float theta, float freq_scale) {
  for (int i = 0; i < head_dim; i += 2) {
    // Angles in double so that long positions keep their precision.
    const double freq = std::pow(static_cast<double>(theta), -static_cast<double>(i) / head_dim);
    const double angle = static_cast<double>(pos) * freq_scale * freq;
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    for (int h = 0; h < n_heads; ++h) {
      float* p = x + h * head_dim + i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

void rope_ext(float* x, int n_heads, int head_dim, int pos, const RopeSpec& spec) {
  const int half = spec.n_rot / 2;
  for (int i = 0; i < half; ++i) {
    // Angles in double so that long positions keep their precision.
    const double freq = std::pow(static_cast<double>(spec.theta), -2.0 * i / spec.n_rot);
    double angle = static_cast<double>(pos) * spec.freq_scale * freq;
    if (spec.factors) angle /= spec.factors[i];
    float mscale = spec.attn_factor;
    if (spec.ext_factor != 0.0f) {
      double extrap = static_cast<double>(pos) * freq;
      if (spec.factors) extrap /= spec.factors[i];
      const float y = (static_cast<float>(i) - spec.corr_dims[0]) / std::max(0.001f, spec.corr_dims[1] - spec.corr_dims[0]);
      const float ramp_mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * spec.ext_factor;
      angle = angle * (1.0 - ramp_mix) + extrap * ramp_mix;
      mscale *= 1.0f + 0.1f * std::log(1.0f / spec.freq_scale);
    }
    const float c = static_cast<float>(std::cos(angle)) * mscale;
    const float s = static_cast<float>(std::sin(angle)) * mscale;
    // Element pair (i0, i1) of each head.
    const int i0 = spec.neox ? i : 2 * i;
    const int i1 = spec.neox ? i + half : 2 * i + 1;
    for (int h = 0; h < n_heads; ++h) {
      float* p = x + static_cast<size_t>(h) * head_dim;
      const float a = p[i0], b = p[i1];
      p[i0] = a * c - b * s;
      p[i1] = a * s + b * c;
    }
  }
}

void rope_yarn_corr_dims(int n_rot, int orig_ctx, float theta, float beta_fast, float beta_slow, float dims[2]) {
  constexpr float kPi = 3.14159265358979323846f;
  auto corr_dim = [&](float beta) {
    return static_cast<float>(n_rot) * std::log(static_cast<float>(orig_ctx) / (beta * 2 * kPi)) /
           (2 * std::log(theta));
  };
  dims[0] = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  dims[1] = std::min(static_cast<float>(n_rot - 1), std::ceil(corr_dim(beta_slow)));
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void softmax(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_oai(float* gate, const float* up, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    gate[i] = g / (1.0f + std::exp(alpha * (-g))) * (u + 1.0f);
  }
}

void softmax_with_sink(float* x, int64_t n, float sink) {
  float mx = sink;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  sum += std::exp(sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void geglu(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  constexpr float kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoef * g * g))) * up[i];
  }
}

void attention_one_token(float* out, const float* q, const KvLayerView& kv, int pos, int n_heads, int n_kv_heads,
                         int head_dim, int window, float scale, float* scratch, float softcap, const float* sinks) {
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
  const int n = pos - first + 1;
  const int group = n_heads / n_kv_heads;
  const int kv_dim = n_kv_heads * head_dim;
  float* scores = scratch;                                  // [n_heads, n]
  float* krow = scratch + static_cast<size_t>(n_heads) * n;  // [kv_dim]
  float* vrow = krow + kv_dim;                              // [kv_dim]
  auto slot = [&](int t) -> size_t {
    return kv.block_table ? static_cast<size_t>(kv.block_table[t / kv.block_size]) * kv.block_size + t % kv.block_size
                          : static_cast<size_t>(t);
  };
  // An f32 row is used in place; other types are decoded once per position.
  auto row = [&](const uint8_t* base, KvType type, size_t row_bytes, int t, float* buf) -> const float* {
    const uint8_t* src = base + slot(t) * row_bytes;
    if (type == KvType::F32) return reinterpret_cast<const float*>(src);
    kv_decode_row(type, src, buf, kv_dim, head_dim);
    return buf;
  };
  for (int t = first; t <= pos; ++t) {
    const float* k = row(kv.k, kv.type_k, kv.row_bytes_k, t, krow);
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + h * head_dim;
      const float* kh = k + (h / group) * head_dim;
      float acc = 0;
      for (int i = 0; i < head_dim; ++i) acc += qh[i] * kh[i];
      const float score = acc * scale;
      scores[static_cast<size_t>(h) * n + (t - first)] = softcap > 0 ? softcap * std::tanh(score / softcap) : score;
    }
  }
  for (int h = 0; h < n_heads; ++h) {
    if (sinks) softmax_with_sink(scores + static_cast<size_t>(h) * n, n, sinks[h]);
    else softmax(scores + static_cast<size_t>(h) * n, n);
  }
  std::fill(out, out + static_cast<size_t>(n_heads) * head_dim, 0.0f);
  for (int t = first; t <= pos; ++t) {
    const float* v = row(kv.v, kv.type_v, kv.row_bytes_v, t, vrow);
    for (int h = 0; h < n_heads; ++h) {
      const float a = scores[static_cast<size_t>(h) * n + (t - first)];
      const float* vh = v + (h / group) * head_dim;
      float* oh = out + h * head_dim;
      for (int i = 0; i < head_dim; ++i) oh[i] += a * vh[i];
    }
  }
}

}  // namespace runlm


namespace runlm {

void paged_decode_attention_ref(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  const int hd = kv.head_dim;
  for (KvType t : {kv.k_type, kv.v_type}) kv_block_len(t, hd);  // the quantized types need head_dim % 8 == 0
  const KvPoolLayout lk = kv_pool_layout(kv.k_type, kv.block_size, kv.n_kv_heads, hd);
  const KvPoolLayout lv = kv_pool_layout(kv.v_type, kv.block_size, kv.n_kv_heads, hd);
  const int group = p.n_heads / kv.n_kv_heads;
  // Head kvh of a slot in f32: plain types converted, quantized ones put back
  // into kv_quant's block format (scale, quants) and decoded by it.
  auto load_any = [&](const void* pool, KvType t, const KvPoolLayout& l, int64_t slot, int kvh, float* dst) {
    const uint8_t* q = static_cast<const uint8_t*>(pool) + l.quant_offset(slot);
    switch (t) {
      case KvType::F32: std::memcpy(dst, q + int64_t(kvh) * hd * 4, size_t(hd) * 4); return;
      case KvType::F16:
      case KvType::BF16: {
        uint16_t h[1];
        for (int i = 0; i < hd; ++i) {
          std::memcpy(h, q + (int64_t(kvh) * hd + i) * 2, 2);
          dst[i] = t == KvType::F16 ? fp16_to_fp32(h[0]) : bf16_to_fp32(h[0]);
        }
        return;
      }
      default: break;
    }
    const uint8_t* s = static_cast<const uint8_t*>(pool) + l.scale_offset(slot);
    const int len = kv_block_len(t, hd), nb = hd / len, qb = t == KvType::Q4_0 ? len / 2 : len;
    uint8_t block[34];
    for (int b = 0; b < nb; ++b) {
      const int blk = kvh * nb + b;
      std::memcpy(block, s + 2 * blk, 2);
      std::memcpy(block + 2, q + int64_t(qb) * blk, size_t(qb));
      kv_decode_row(t, block, dst + len * b, len, hd);
    }
  };
  std::vector<float> kbuf(hd), vbuf(hd), scores, acc(hd);
  for (int s = 0; s < p.n_seqs; ++s) {
    const int len = kv.seq_lens[s];
    const int n_q = p.cu_q[s + 1] - p.cu_q[s];
    const int32_t* table = kv.block_tables + static_cast<int64_t>(s) * kv.max_blocks_per_seq;
    auto slot_of = [&](int pos) {
      return static_cast<int64_t>(table[pos / kv.block_size]) * kv.block_size + pos % kv.block_size;
    };
    for (int i = 0; i < n_q; ++i) {
      const int pos = len - n_q + i;
      const int first = p.window > 0 ? std::max(0, pos - p.window + 1) : 0;
      const int64_t qrow = p.cu_q[s] + i;
      scores.resize(static_cast<size_t>(pos - first + 1));
      for (int h = 0; h < p.n_heads; ++h) {
        const float* q = p.q + (qrow * p.n_heads + h) * hd;
        for (int t = first; t <= pos; ++t) {
          load_any(kv.k_pool, kv.k_type, lk, slot_of(t), h / group, kbuf.data());
          float d = 0;
          for (int j = 0; j < hd; ++j) d += q[j] * kbuf[j];
          const float sc = d * p.scale;
          scores[t - first] = p.softcap > 0 ? p.softcap * std::tanh(sc / p.softcap) : sc;
        }
        if (p.sinks) softmax_with_sink(scores.data(), pos - first + 1, p.sinks[h]);
        else softmax(scores.data(), pos - first + 1);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int t = first; t <= pos; ++t) {
          load_any(kv.v_pool, kv.v_type, lv, slot_of(t), h / group, vbuf.data());
          for (int j = 0; j < hd; ++j) acc[j] += scores[t - first] * vbuf[j];
        }
        std::copy(acc.begin(), acc.end(), p.out + (qrow * p.n_heads + h) * hd);
      }
    }
  }
}

}  // namespace runlm
