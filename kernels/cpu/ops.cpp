#include "ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

void matmul(const QMatrix& w, const float* x, float* y, int64_t n_tokens, ThreadPool& pool) {
  pool.parallel_for(w.rows, [&](int64_t begin, int64_t end, int) {
    if (n_tokens == 1) {
      for (int64_t r = begin; r < end; ++r) y[r] = dot_row(w.type, w.data + w.row_bytes * r, x, w.cols);
      return;
    }
    // Decode each row once, then dot it with every token.
    std::vector<float> row(static_cast<size_t>(w.cols));
    for (int64_t r = begin; r < end; ++r) {
      dequantize_row(w.type, w.data + w.row_bytes * r, row.data(), w.cols);
      for (int64_t t = 0; t < n_tokens; ++t) {
        const float* xt = x + t * w.cols;
        float acc = 0;
        for (int64_t i = 0; i < w.cols; ++i) acc += row[i] * xt[i];
        y[t * w.rows + r] = acc;
      }
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

void attention_one_token(float* out, const float* q, const float* k_cache, const float* v_cache,
                         int64_t kv_stride, int pos, int n_heads, int n_kv_heads, int head_dim,
                         int window, float scale, float* scratch) {
  const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
  const int group = n_heads / n_kv_heads;
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / group;
    const float* qh = q + h * head_dim;
    float* scores = scratch;
    for (int t = first; t <= pos; ++t) {
      const float* k = k_cache + t * kv_stride + kvh * head_dim;
      float acc = 0;
      for (int i = 0; i < head_dim; ++i) acc += qh[i] * k[i];
      scores[t - first] = acc * scale;
    }
    softmax(scores, pos - first + 1);
    float* oh = out + h * head_dim;
    std::fill(oh, oh + head_dim, 0.0f);
    for (int t = first; t <= pos; ++t) {
      const float* v = v_cache + t * kv_stride + kvh * head_dim;
      const float a = scores[t - first];
      for (int i = 0; i < head_dim; ++i) oh[i] += a * v[i];
    }
  }
}

}  // namespace runlm
