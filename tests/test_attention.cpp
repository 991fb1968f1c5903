// Tests for prefill attention: the CPU reference against an independent dense
// formula and the mask semantics (always run), the backend table and dispatch
// errors, and every GPU backend against the reference over the feature grid
// (skipped without a CUDA device or in a CPU-only build).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention.h"
#include "common.h"
#include "cpu/attention_ref.h"
#include "cpu/kv_quant.h"
#include "dtype.h"
#include "paged_kv.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/attn_kernels.h"
#endif

using namespace runlm;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Problem {
  std::vector<int32_t> cu_q, cu_k;
  int n_heads = 1, n_kv_heads = 1, head_dim = 4;
  bool causal = false;
  int window_left = -1;
  float softcap = 0.0f;  // AttnParams::softcap
  std::vector<float> sinks;  // AttnParams::sinks, [n_heads]; empty = none
  std::vector<float> q, k, v;
  int total_q() const { return cu_q.back(); }
  int total_k() const { return cu_k.back(); }
  int batch() const { return int(cu_q.size()) - 1; }
  float scale() const { return 1.0f / std::sqrt(float(head_dim)); }
};

std::vector<int32_t> prefix(const std::vector<int>& lens) {
  std::vector<int32_t> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Random inputs, rounded to dtype (bf16/f16) when given, so the reference and
// the kernels see the same values.
Problem make_problem(const std::vector<int>& lq, const std::vector<int>& lk, int nh, int nkv, int hd, bool causal,
                     int window_left, uint32_t seed, const DType* round_to = nullptr) {
  Problem p;
  p.cu_q = prefix(lq);
  p.cu_k = prefix(lk);
  p.n_heads = nh;
  p.n_kv_heads = nkv;
  p.head_dim = hd;
  p.causal = causal;
  p.window_left = window_left;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, size_t n) {
    x.resize(n);
    for (float& e : x) {
      e = dist(rng);
      if (round_to && *round_to == DType::BF16) e = bf16_to_fp32(fp32_to_bf16(e));
      if (round_to && *round_to == DType::F16) e = fp16_to_fp32(fp32_to_fp16(e));
    }
  };
  fill(p.q, size_t(p.total_q()) * nh * hd);
  fill(p.k, size_t(p.total_k()) * nkv * hd);
  fill(p.v, size_t(p.total_k()) * nkv * hd);
  return p;
}

std::vector<uint16_t> to_half_bits(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = t == DType::BF16 ? fp32_to_bf16(x[i]) : fp32_to_fp16(x[i]);
  return r;
}

float from_half_bits(uint16_t h, DType t) { return t == DType::BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h); }

void run_ref(const Problem& p, std::vector<float>& out, std::vector<float>& lse) {
  out.assign(p.q.size(), std::nanf(""));
  lse.assign(size_t(p.total_q()) * p.n_heads, std::nanf(""));
  AttnRefParams r;
  r.q = p.q.data();
  r.k = p.k.data();
  r.v = p.v.data();
  r.out = out.data();
  r.lse = lse.data();
  r.cu_seqlens_q = p.cu_q.data();
  r.cu_seqlens_k = p.cu_k.data();
  r.batch = p.batch();
  r.n_heads = p.n_heads;
  r.n_kv_heads = p.n_kv_heads;
  r.head_dim = p.head_dim;
  r.causal = p.causal;
  r.window_left = p.window_left;
  r.scale = p.scale();
  r.softcap = p.softcap;
  r.sinks = p.sinks.empty() ? nullptr : p.sinks.data();
  attention_ref(r);
}

// An independent statement of the semantics: dense score matrix over the
// whole sequence, mask written from the key's distance to the last key, exp
// without max subtraction (fine for the small scores used here), a head's
// sink one more term of the denominator.
void dense_formula(const Problem& p, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(p.q.size(), 0.0);
  lse.assign(size_t(p.total_q()) * p.n_heads, 0.0);
  const int d = p.head_dim;
  for (int b = 0; b < p.batch(); ++b) {
    const int sq = p.cu_q[b + 1] - p.cu_q[b], sk = p.cu_k[b + 1] - p.cu_k[b];
    for (int h = 0; h < p.n_heads; ++h) {
      const int g = h * p.n_kv_heads / p.n_heads;  // kv head of query head h
      for (int i = 0; i < sq; ++i) {
        const int qi = p.cu_q[b] + i;
        double z = 0;
        std::vector<double> o(d, 0.0);
        const double sink = p.sinks.empty() ? 0.0 : std::exp(double(p.sinks[h]));
        for (int j = 0; j < sk; ++j) {
          // Query i is (sq-1-i) rows before the last query, which sits with
          // the last key: it may see keys up to (sq-1-i) before the last key.
          const int behind_last_q = sq - 1 - i, behind_last_k = sk - 1 - j;
          if (p.causal && behind_last_k < behind_last_q) continue;
          if (p.window_left >= 0 && behind_last_k - behind_last_q > p.window_left) continue;
          double s = 0;
          for (int c = 0; c < d; ++c)
            s += double(p.q[(size_t(qi) * p.n_heads + h) * d + c]) *
                 p.k[(size_t(p.cu_k[b] + j) * p.n_kv_heads + g) * d + c];
          s *= p.scale();
          if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
          const double w = std::exp(s);
          z += w;
          for (int c = 0; c < d; ++c) o[c] += w * p.v[(size_t(p.cu_k[b] + j) * p.n_kv_heads + g) * d + c];
        }
        for (int c = 0; c < d; ++c) out[(size_t(qi) * p.n_heads + h) * d + c] = z > 0 ? o[c] / (z + sink) : 0.0;
        lse[size_t(h) * p.total_q() + qi] = z + sink > 0 ? std::log(z + sink) : -INFINITY;
      }
    }
  }
}

// The K and V of a Problem placed in paged pools (src/paged_kv.h layout, as
// AttnParams' paged mode reads them): pages handed out in a shuffled order,
// every slot no sequence owns (unused pages and the tail of each last page)
// filled with garbage that includes NaN and +-inf, and each table row padded
// with -1 past its sequence's pages (entries that must never be read). With
// a window, the pages wholly before the first query's window are released
// as the engine's sliding window does (entry -1, no page, no data).
struct PagedKv {
  int block_size = 0, num_pages = 0, max_blocks = 0;
  std::vector<int32_t> tables;           // [batch, max_blocks] page indices
  std::vector<uint16_t> k_pool, v_pool;  // [num_pages * block_size, n_kv_heads, head_dim] bits of the dtype
  // Typed pools (make_typed_paged): the KV types and the pools' bytes
  // (src/paged_kv.h layout), used instead of k_pool / v_pool when set.
  std::optional<KvType> k_type, v_type;
  std::vector<uint8_t> k_bytes, v_bytes;
};

uint16_t garbage_bits(std::mt19937& rng, DType t) {
  const bool bf = t == DType::BF16;
  switch (rng() % 4) {
    case 0: return bf ? 0x7fc0 : 0x7e00;  // NaN
    case 1: return bf ? 0x7f80 : 0x7c00;  // +inf
    case 2: return bf ? 0xff80 : 0xfc00;  // -inf
    default: {
      const float x = std::uniform_real_distribution<float>(-3e4f, 3e4f)(rng);  // finite, far from the data
      return bf ? fp32_to_bf16(x) : fp32_to_fp16(x);
    }
  }
}

PagedKv make_paged(const Problem& p, DType t, int block_size, uint32_t seed) {
  PagedKv kv;
  kv.block_size = block_size;
  std::mt19937 rng(seed);
  const size_t row = size_t(p.n_kv_heads) * p.head_dim;
  std::vector<int> pages(p.batch()), released(p.batch(), 0);
  int used = 0, most = 0;
  for (int b = 0; b < p.batch(); ++b) {
    const int sq = p.cu_q[b + 1] - p.cu_q[b], sk = p.cu_k[b + 1] - p.cu_k[b];
    pages[b] = (sk + block_size - 1) / block_size;
    // BlockManager::release_before(first query's position - window_left).
    if (p.window_left >= 0 && sq > 0) released[b] = std::max(0, sk - sq - p.window_left) / block_size;
    used += pages[b] - released[b];
    most = std::max(most, pages[b]);
  }
  kv.max_blocks = most + 1;              // at least one padding entry a row
  kv.num_pages = used + used / 2 + 3;    // unused pages stay garbage
  std::vector<int32_t> order(kv.num_pages);
  for (int i = 0; i < kv.num_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  // Never the identity table: the first sequence's first page is not the page of its own index.
  if (order[0] == released[0]) std::swap(order[0], order[kv.num_pages - 1]);
  kv.tables.assign(size_t(p.batch()) * kv.max_blocks, -1);
  const size_t slots = size_t(kv.num_pages) * block_size;
  kv.k_pool.resize(slots * row);
  kv.v_pool.resize(slots * row);
  for (uint16_t& x : kv.k_pool) x = garbage_bits(rng, t);
  for (uint16_t& x : kv.v_pool) x = garbage_bits(rng, t);
  const std::vector<uint16_t> kb = to_half_bits(p.k, t), vb = to_half_bits(p.v, t);
  int next = 0;
  for (int b = 0; b < p.batch(); ++b) {
    int32_t* table = &kv.tables[size_t(b) * kv.max_blocks];
    for (int i = released[b]; i < pages[b]; ++i) table[i] = order[next++];
    for (int j = released[b] * block_size; j < p.cu_k[b + 1] - p.cu_k[b]; ++j) {
      const size_t slot = size_t(table[j / block_size]) * block_size + j % block_size;
      const size_t src = size_t(p.cu_k[b] + j) * row;
      std::copy(kb.begin() + src, kb.begin() + src + row, kv.k_pool.begin() + slot * row);
      std::copy(vb.begin() + src, vb.begin() + src + row, kv.v_pool.begin() + slot * row);
    }
  }
  return kv;
}

// The host gather: the contiguous [total_k, n_kv_heads, head_dim] rows of
// p's sequences read back out of a pool through the tables; rows of released
// pages (-1) come back as 0 bits.
std::vector<uint16_t> gather_paged(const Problem& p, const PagedKv& kv, const std::vector<uint16_t>& pool) {
  const size_t row = size_t(p.n_kv_heads) * p.head_dim;
  std::vector<uint16_t> out(size_t(p.total_k()) * row, 0);
  for (int b = 0; b < p.batch(); ++b)
    for (int j = 0; j < p.cu_k[b + 1] - p.cu_k[b]; ++j) {
      const int32_t page = kv.tables[size_t(b) * kv.max_blocks + j / kv.block_size];
      if (page < 0) continue;
      const size_t slot = size_t(page) * kv.block_size + j % kv.block_size;
      std::copy(pool.begin() + slot * row, pool.begin() + (slot + 1) * row, out.begin() + size_t(p.cu_k[b] + j) * row);
    }
  return out;
}

// What gather_paged should return: the contiguous rows, with those of
// released pages 0. No query sees a released key (AttentionRef checks that
// invisible keys do not matter), so the reference on p stands.
std::vector<uint16_t> expected_gather(const Problem& p, const PagedKv& kv, const std::vector<float>& x, DType t) {
  std::vector<uint16_t> bits = to_half_bits(x, t);
  const size_t row = size_t(p.n_kv_heads) * p.head_dim;
  for (int b = 0; b < p.batch(); ++b)
    for (int j = 0; j < p.cu_k[b + 1] - p.cu_k[b]; ++j)
      if (kv.tables[size_t(b) * kv.max_blocks + j / kv.block_size] < 0)
        std::fill_n(bits.begin() + size_t(p.cu_k[b] + j) * row, row, uint16_t(0));
  return bits;
}

// make_paged's tables and page order, with K and V stored as types kt / vt
// (kv_encode_row's bytes placed by kv_pool_write_row, as the engine's store
// writes them); every byte no sequence owns is garbage (f16 NaN / inf bit
// patterns among them, so a scale read from there poisons the output).
// decoded gets p with K and V replaced by what a typed-pool reader must see:
// each row read back (kv_pool_read_row), decoded (kv_decode_row) and
// rounded to f16, as gather_kv writes it; rows of released pages 0.
PagedKv make_typed_paged(const Problem& p, KvType kt, KvType vt, int block_size, uint32_t seed, Problem* decoded) {
  const DType f16 = DType::F16;
  PagedKv kv = make_paged(p, f16, block_size, seed);
  kv.k_type = kt;
  kv.v_type = vt;
  kv.k_pool.clear();
  kv.v_pool.clear();
  const int n = p.n_kv_heads * p.head_dim;
  std::mt19937 rng(seed + 1);
  *decoded = p;
  for (int which = 0; which < 2; ++which) {
    const KvType t = which ? vt : kt;
    const KvPoolLayout l = kv_pool_layout(t, block_size, p.n_kv_heads, p.head_dim);
    std::vector<uint8_t>& pool = which ? kv.v_bytes : kv.k_bytes;
    pool.resize(size_t(l.page) * kv.num_pages);
    for (size_t i = 0; i + 1 < pool.size(); i += 2) {
      const uint16_t g = garbage_bits(rng, f16);
      pool[i] = uint8_t(g & 0xff);
      pool[i + 1] = uint8_t(g >> 8);
    }
    const std::vector<float>& src = which ? p.v : p.k;
    std::vector<float>& dec = which ? decoded->v : decoded->k;
    std::vector<uint8_t> row(kv_row_bytes(t, n, p.head_dim));
    for (int b = 0; b < p.batch(); ++b)
      for (int j = 0; j < p.cu_k[b + 1] - p.cu_k[b]; ++j) {
        float* out = &dec[size_t(p.cu_k[b] + j) * n];
        const int32_t page = kv.tables[size_t(b) * kv.max_blocks + j / block_size];
        if (page < 0) {
          std::fill_n(out, n, 0.0f);
          continue;
        }
        const int64_t slot = int64_t(page) * block_size + j % block_size;
        kv_encode_row(t, &src[size_t(p.cu_k[b] + j) * n], row.data(), n, p.head_dim);
        kv_pool_write_row(t, l, pool.data(), slot, row.data());
        std::fill(row.begin(), row.end(), uint8_t(0));
        kv_pool_read_row(t, l, pool.data(), slot, row.data());
        kv_decode_row(t, row.data(), out, n, p.head_dim);
        for (int c = 0; c < n; ++c) out[c] = fp16_to_fp32(fp32_to_fp16(out[c]));
      }
  }
  return kv;
}

// A batch of sequences and the attention options, as the case grids
// (paged_cases below, gpu_cases further down) list them.
struct AttnShapeCase {
  const char* name;
  std::vector<int> lq, lk;
  int n_heads, n_kv_heads;
  bool causal;
  int window_left;
};

// The paged feature grid: varlen batches of 2-3 sequences, queries at an
// offset into cached keys (chunked prefill, later chat turns), GQA / MQA /
// MHA, causal with and without a sliding window, and non-causal; lengths
// not multiples of any tile or page.

const std::vector<AttnShapeCase>& paged_cases() {
  static const std::vector<AttnShapeCase> k = {
      {"gqa_causal_chunk", {70, 129, 5}, {333, 129, 5}, 8, 2, true, -1},
      {"mqa_causal_window", {300, 17}, {650, 400}, 4, 1, true, 100},
      {"mha_noncausal_offset", {64, 10, 33}, {300, 90, 161}, 2, 2, false, -1},
  };
  return k;
}

// Soft-capped problems (AttnParams::softcap): a cap near the scores' own
// size (q_gain 1: scores ~N(0, 1)), so that most of them are bent, causal
// with and without a window and non-causal; and Gemma-2-like layers (cap 50,
// GQA 2:1, a global and a sliding-window layer) with q scaled up so the
// scores reach the cap's range (~N(0, 12^2)).
struct SoftcapCase {
  AttnShapeCase shape;
  float softcap, q_gain;
};

const std::vector<SoftcapCase>& softcap_cases() {
  static const std::vector<SoftcapCase> k = {
      {{"gqa_causal_cap1", {130, 63, 257}, {130, 63, 257}, 8, 2, true, -1}, 1.0f, 1.0f},
      {{"gqa_causal_window_offset_cap2", {300, 5}, {650, 400}, 4, 2, true, 100}, 2.0f, 1.0f},
      {{"mha_noncausal_offset_cap1", {64, 10}, {300, 90}, 2, 2, false, -1}, 1.0f, 1.0f},
      {{"gemma2_global_cap50", {300, 37}, {300, 200}, 4, 2, true, -1}, 50.0f, 12.0f},
      {{"gemma2_local_cap50", {300, 37}, {300, 200}, 4, 2, true, 127}, 50.0f, 12.0f},
  };
  return k;
}

// The problem of soft-cap case c at head_dim hd, inputs rounded to t (q
// after its gain).
Problem make_softcap_problem(const SoftcapCase& c, int hd, DType t, uint32_t seed) {
  const AttnShapeCase& s = c.shape;
  Problem p = make_problem(s.lq, s.lk, s.n_heads, s.n_kv_heads, hd, s.causal, s.window_left, seed, &t);
  for (float& x : p.q) {
    x *= c.q_gain;
    x = t == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(x)) : fp16_to_fp32(fp32_to_fp16(x));
  }
  p.softcap = c.softcap;
  return p;
}

// Problems with attention sinks (AttnParams::sinks, gpt-oss): per-head
// sink logits uniform in [sink_lo, sink_hi] against scores ~N(0, 1), [-2, 4]
// where rows are short, [0, 6] where every row sees 100+ keys (a sink of
// e^4 against a sum of ~100 e^0.5 would move the output too little); gpt-oss
// layers (GQA, causal, full and a 128-token sliding window, chunked-prefill
// offsets), non-causal, rows that see no key (out 0, lse = the sink), sinks
// that dominate every row (e^10..e^12 against a sum of scores' exp of a few
// hundred: the output shrinks ~100-fold and the relative bound then tests
// the sink's share itself), and sinks with a soft-cap.
struct SinkCase {
  AttnShapeCase shape;
  float sink_lo, sink_hi, softcap;
};

const std::vector<SinkCase>& sink_cases() {
  static const std::vector<SinkCase> k = {
      {{"gptoss_full_gqa", {130, 63, 257}, {130, 63, 257}, 8, 2, true, -1}, -2.0f, 4.0f, 0.0f},
      {{"gptoss_sliding128_offset", {300, 5}, {650, 400}, 8, 2, true, 127}, 0.0f, 6.0f, 0.0f},
      {{"mha_noncausal_offset", {64, 10}, {300, 90}, 2, 2, false, -1}, 0.0f, 6.0f, 0.0f},
      {{"causal_q_longer_than_k", {100, 30}, {60, 31}, 2, 1, true, -1}, -2.0f, 4.0f, 0.0f},
      {{"sink_dominates", {130, 63}, {130, 200}, 4, 2, true, -1}, 10.0f, 12.0f, 0.0f},
      {{"sinks_and_softcap_window", {300, 5}, {650, 400}, 4, 2, true, 100}, 0.0f, 6.0f, 2.0f},
  };
  return k;
}

// The problem of sink case c at head_dim hd, inputs rounded to t.
Problem make_sink_problem(const SinkCase& c, int hd, DType t, uint32_t seed) {
  const AttnShapeCase& s = c.shape;
  Problem p = make_problem(s.lq, s.lk, s.n_heads, s.n_kv_heads, hd, s.causal, s.window_left, seed, &t);
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<float> u(c.sink_lo, c.sink_hi);
  p.sinks.resize(size_t(s.n_heads));
  for (float& x : p.sinks) x = u(rng);
  p.softcap = c.softcap;
  return p;
}

// Relative L2 distance of two outputs.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

// ---------------------------------------------------------------- CPU reference

TEST(AttentionRef, MatchesDenseFormula) {
  struct C {
    std::vector<int> lq, lk;
    int nh, nkv, hd;
    bool causal;
    int wl;
  };
  const std::vector<C> cases = {
      {{5}, {5}, 1, 1, 4, false, -1},        {{3, 6, 1}, {3, 6, 1}, 2, 1, 8, true, -1},
      {{2, 4}, {7, 9}, 4, 2, 6, true, -1},   {{6}, {11}, 2, 2, 5, true, 2},
      {{7, 3}, {7, 8}, 3, 1, 4, false, 1},   {{5}, {3}, 1, 1, 4, true, -1},  // first rows see no key
      {{4, 0, 3}, {4, 2, 5}, 2, 2, 3, false, -1},
  };
  uint32_t seed = 1;
  for (const C& c : cases) {
    Problem p = make_problem(c.lq, c.lk, c.nh, c.nkv, c.hd, c.causal, c.wl, seed++);
    std::vector<float> out, lse;
    run_ref(p, out, lse);
    std::vector<double> eo, el;
    dense_formula(p, eo, el);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], eo[i], 1e-5) << "case " << seed - 1 << " elem " << i;
    for (size_t i = 0; i < lse.size(); ++i) {
      if (std::isinf(el[i])) {
        EXPECT_EQ(lse[i], -kInf) << "case " << seed - 1 << " lse " << i;
      } else {
        ASSERT_NEAR(lse[i], el[i], 1e-5) << "case " << seed - 1 << " lse " << i;
      }
    }
  }
}

// The soft-cap: the reference against the dense formula (which caps each
// scaled score itself), caps small and large against the scores.
TEST(AttentionRef, SoftcapMatchesDenseFormula) {
  uint32_t seed = 50;
  for (float cap : {0.5f, 2.0f, 50.0f})
    for (int wl : {-1, 2}) {
      Problem p = make_problem({3, 6}, {7, 6}, 4, 2, 8, true, wl, seed++);
      for (float& x : p.q) x *= 4.0f;  // scores up to ~10: the small caps saturate
      p.softcap = cap;
      std::vector<float> out, lse;
      run_ref(p, out, lse);
      std::vector<double> eo, el;
      dense_formula(p, eo, el);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], eo[i], 1e-5) << "cap " << cap << " elem " << i;
      for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], el[i], 1e-5) << "cap " << cap << " lse " << i;
    }
}

// Sinks: the reference against the dense formula (the sink one more term of
// the denominator), with and without a window, rows that see no key (lse =
// the sink), small and dominating sinks.
TEST(AttentionRef, SinksMatchDenseFormula) {
  uint32_t seed = 70;
  for (float lo : {-2.0f, 3.0f})
    for (int wl : {-1, 2}) {
      Problem p = make_problem({5, 6}, {3, 6}, 4, 2, 8, true, wl, seed++);  // sequence 0's first rows see no key
      std::mt19937 rng(seed);
      std::uniform_real_distribution<float> u(lo, lo + 6.0f);
      p.sinks.resize(4);
      for (float& x : p.sinks) x = u(rng);
      std::vector<float> out, lse;
      run_ref(p, out, lse);
      std::vector<double> eo, el;
      dense_formula(p, eo, el);
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], eo[i], 1e-6) << "sinks from " << lo << " elem " << i;
      for (size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], el[i], 1e-5) << "sinks from " << lo << " lse " << i;
      for (int h = 0; h < 4; ++h) EXPECT_EQ(lse[size_t(h) * p.total_q()], p.sinks[size_t(h)]) << "row without keys";
    }
}

// Every sink case moves the output well past the GPU tests' bound (relative
// L2 1e-2): a backend that ignored the sinks would fail them.
TEST(AttentionRef, SinkCasesAreSensitive) {
  for (const SinkCase& c : sink_cases())
    for (int hd : {64, 256}) {
      Problem p = make_sink_problem(c, hd, DType::BF16, 950u + hd);
      std::vector<float> with, without, lse;
      run_ref(p, with, lse);
      p.sinks.clear();
      run_ref(p, without, lse);
      EXPECT_GT(rel_l2(without, with), 0.05) << c.shape.name << " d" << hd;
    }
}

// Every soft-cap case moves the output well past the GPU tests' bound
// (relative L2 1e-2): a backend that ignored the cap would fail them.
TEST(AttentionRef, SoftcapCasesAreSensitive) {
  for (const SoftcapCase& c : softcap_cases())
    for (int hd : {64, 256}) {
      Problem p = make_softcap_problem(c, hd, DType::BF16, 900u + hd);
      std::vector<float> capped, plain, lse;
      run_ref(p, capped, lse);
      p.softcap = 0.0f;
      run_ref(p, plain, lse);
      EXPECT_GT(rel_l2(plain, capped), 0.05) << c.shape.name << " d" << hd;
    }
}

TEST(AttentionRef, CausalIsBottomRightAligned) {
  // One query after 5 cached keys sees all of them: causal changes nothing.
  Problem p = make_problem({1}, {5}, 1, 1, 8, true, -1, 11);
  std::vector<float> a, la, b, lb;
  run_ref(p, a, la);
  p.causal = false;
  run_ref(p, b, lb);
  EXPECT_EQ(a, b);
  EXPECT_EQ(la, lb);
  // With sq == sk the first query sees only key 0: out is exactly v[0].
  Problem s = make_problem({4}, {4}, 1, 1, 8, true, -1, 12);
  run_ref(s, a, la);
  for (int c = 0; c < 8; ++c) EXPECT_FLOAT_EQ(a[c], s.v[c]);
}

TEST(AttentionRef, WindowZeroSeesOnlyItself) {
  // window_left = 0 with causal: query i (position sk-sq+i) sees its own key only.
  Problem p = make_problem({3}, {6}, 2, 1, 4, true, 0, 13);
  std::vector<float> out, lse;
  run_ref(p, out, lse);
  for (int i = 0; i < 3; ++i)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 4; ++c) EXPECT_FLOAT_EQ(out[(i * 2 + h) * 4 + c], p.v[(3 + i) * 4 + c]) << i << " " << h;
}

TEST(AttentionRef, InvisibleKeysDoNotMatter) {
  // Changing keys/values outside the causal window leaves the output as is;
  // changing a visible one does not.
  Problem p = make_problem({8}, {8}, 1, 1, 4, true, 2, 14);
  std::vector<float> a, la, b, lb;
  run_ref(p, a, la);
  Problem p2 = p;
  for (int c = 0; c < 4; ++c) p2.v[7 * 4 + c] += 5.0f;  // key 7: visible only to row 7
  for (int c = 0; c < 4; ++c) p2.v[0 * 4 + c] -= 3.0f;  // key 0: visible to rows 0..2
  run_ref(p2, b, lb);
  for (int i = 0; i < 8; ++i) {
    const bool changed = i == 7 || i <= 2;
    float diff = 0;
    for (int c = 0; c < 4; ++c) diff += std::fabs(a[i * 4 + c] - b[i * 4 + c]);
    if (changed)
      EXPECT_GT(diff, 1e-3f) << "row " << i;
    else
      EXPECT_EQ(diff, 0.0f) << "row " << i;
  }
}

TEST(AttentionRef, GqaHeadsShareKv) {
  Problem p = make_problem({5}, {5}, 4, 2, 4, false, -1, 15);
  // Give heads 0 and 1 (both on kv head 0) the same queries.
  for (int i = 0; i < 5; ++i)
    for (int c = 0; c < 4; ++c) p.q[(i * 4 + 1) * 4 + c] = p.q[(i * 4 + 0) * 4 + c];
  std::vector<float> out, lse;
  run_ref(p, out, lse);
  for (int i = 0; i < 5; ++i)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[(i * 4 + 1) * 4 + c], out[(i * 4 + 0) * 4 + c]);
  // Head 2 reads kv head 1: giving it head 0's queries changes its output.
  for (int i = 0; i < 5; ++i)
    for (int c = 0; c < 4; ++c) p.q[(i * 4 + 2) * 4 + c] = p.q[(i * 4 + 0) * 4 + c];
  run_ref(p, out, lse);
  EXPECT_NE(out[2 * 4], out[0]);
}

TEST(AttentionRef, RejectsBadParams) {
  Problem p = make_problem({2}, {2}, 3, 2, 4, false, -1, 16);
  std::vector<float> out, lse;
  EXPECT_THROW(run_ref(p, out, lse), Error);  // 3 % 2 != 0
}

// ---------------------------------------------------------------- table and dispatch

TEST(AttentionDispatch, NamesRoundTrip) {
  for (const char* n : {"naive", "fa2", "fa3", "auto"})
    EXPECT_STREQ(attn_backend_name(attn_backend_from_name(n)), n);
  try {
    attn_backend_from_name("fa4");
    FAIL() << "fa4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fa4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("naive|fa2|fa3|auto"), std::string::npos) << e.what();
  }
}

TEST(AttentionDispatch, UnsupportedReasons) {
  AttnParams p;
  p.head_dim = 96;
  p.dtype = DType::BF16;
#ifdef RUNLM_CUDA
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90), "fa3: head_dim=96 unsupported; supported: head_dim {64,128,256}");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Naive, p, 90), "");
  p.head_dim = 128;
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90), "");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 80), "fa3: sm_80 unsupported; supported: sm_90");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa2, p, 75), "fa2: sm_75 unsupported; supported: sm_80 and newer");
  p.head_dim = 8;  // stories260K
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa2, p, 90), "fa2: head_dim=8 unsupported; supported: head_dim {64,128,256}");
  p.head_dim = 512;
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Naive, p, 90), "naive: head_dim=512 unsupported; supported: head_dim 1..256");
#else
  for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3})
    EXPECT_NE(attn_unsupported_reason(b, p, 0).find("built without CUDA"), std::string::npos);
#endif
}

// Soft-cap is in every backend's row: a Gemma-2-like prefill (head_dim 256,
// cap 50, a window, GQA, f16 or bf16) runs on each of them on sm_90.
TEST(AttentionDispatch, SoftcapSupported) {
  AttnParams p;
  p.head_dim = 256;
  p.softcap = 50.0f;
  p.causal = true;
  p.window_left = 4095;
  p.n_heads = 8;
  p.n_kv_heads = 4;
  for (const AttnBackendInfo& r : attn_backends()) EXPECT_TRUE(r.softcap) << r.name;
  for (DType t : {DType::F16, DType::BF16}) {
    p.dtype = t;
#ifdef RUNLM_CUDA
    for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3})
      EXPECT_EQ(attn_unsupported_reason(b, p, 90), "") << attn_backend_name(b);
#else
    EXPECT_NE(attn_unsupported_reason(AttnBackend::Fa2, p, 90).find("built without CUDA"), std::string::npos);
#endif
  }
}

// Sinks are in every backend's row: a gpt-oss-like prefill (head_dim 64,
// GQA 8:1, a 128-token window) runs on each of them on sm_90.
TEST(AttentionDispatch, SinksSupported) {
  AttnParams p;
  const float sinks[8] = {};
  p.head_dim = 64;
  p.sinks = sinks;  // only tested for null
  p.causal = true;
  p.window_left = 127;
  p.n_heads = 64;
  p.n_kv_heads = 8;
  for (const AttnBackendInfo& r : attn_backends()) EXPECT_TRUE(r.sinks) << r.name;
  for (DType t : {DType::F16, DType::BF16}) {
    p.dtype = t;
#ifdef RUNLM_CUDA
    for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3})
      EXPECT_EQ(attn_unsupported_reason(b, p, 90), "") << attn_backend_name(b);
#else
    EXPECT_NE(attn_unsupported_reason(AttnBackend::Fa2, p, 90).find("built without CUDA"), std::string::npos);
#endif
  }
}

TEST(AttentionDispatch, InvalidSoftcapThrows) {
  int dummy[4] = {};
  AttnParams p;
  p.q = p.k = p.v = dummy;
  p.out = dummy;
  p.cu_seqlens_q = p.cu_seqlens_k = dummy;
  p.batch = 1;
  p.n_heads = p.n_kv_heads = 2;
  p.head_dim = 64;
  p.scale = 0.125f;
  for (float bad : {-1.0f, std::nanf(""), kInf}) {
    p.softcap = bad;
    try {
      attention_dispatch(AttnBackend::Naive, p);
      ADD_FAILURE() << "softcap " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("attention: softcap="), std::string::npos) << e.what();
    }
  }
}

TEST(AttentionDispatch, InvalidParamsThrow) {
  AttnParams p;  // null pointers
  EXPECT_THROW(attention_dispatch(AttnBackend::Auto, p), Error);
  int dummy[4] = {};
  p.q = p.k = p.v = dummy;
  p.out = dummy;
  p.cu_seqlens_q = p.cu_seqlens_k = dummy;
  p.batch = 1;
  p.n_heads = 6;
  p.n_kv_heads = 4;  // not a divisor
  p.head_dim = 64;
  p.scale = 0.125f;
  try {
    attention_dispatch(AttnBackend::Naive, p);
    FAIL() << "n_heads=6 n_kv_heads=4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_kv_heads=4"), std::string::npos) << e.what();
  }
#ifndef RUNLM_CUDA
  p.n_kv_heads = 2;
  try {
    attention_dispatch(AttnBackend::Fa2, p);
    FAIL() << "CPU-only build launched fa2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without CUDA"), std::string::npos) << e.what();
  }
#endif
}

// ---------------------------------------------------------------- paged K/V (CPU side)

TEST(AttentionPagedRef, PoolHoldsTheContiguousRows) {
  // The GPU paged tests compare against the reference on the contiguous K/V;
  // this checks that the pools they build hold exactly those rows, in a
  // shuffled page order, with garbage (NaN included) everywhere else.
  size_t released = 0;
  for (const AttnShapeCase& c : paged_cases())
  for (DType t : {DType::BF16, DType::F16})
    for (int bs : {8, 16, 64, 256}) {
      Problem p = make_problem(c.lq, c.lk, c.n_heads, c.n_kv_heads, 64, c.causal, c.window_left, 21u + bs, &t);
      const PagedKv kv = make_paged(p, t, bs, 31u + bs);
      EXPECT_EQ(gather_paged(p, kv, kv.k_pool), expected_gather(p, kv, p.k, t)) << c.name << " bs=" << bs;
      EXPECT_EQ(gather_paged(p, kv, kv.v_pool), expected_gather(p, kv, p.v, t)) << c.name << " bs=" << bs;
      bool identity = true;
      for (int i = 0; i < kv.max_blocks - 1; ++i) identity &= kv.tables[i] < 0 || kv.tables[i] == i;
      EXPECT_FALSE(identity) << "page order should not be the identity";
      for (int32_t e : kv.tables) released += e < 0;
      std::vector<int> seen(kv.num_pages, 0);
      for (int32_t e : kv.tables)
        if (e >= 0) ++seen.at(e);
      for (int n : seen) EXPECT_LE(n, 1) << "a page shared by two table entries";
      size_t nan = 0;
      for (uint16_t x : kv.v_pool) nan += std::isnan(from_half_bits(x, t));
      EXPECT_GT(nan, 0u);
    }
  EXPECT_GT(released, 0u);
}

TEST(AttentionPagedRef, TypedPoolsHoldTheEncodedRows) {
  // make_typed_paged (the typed GPU grid's input): the decoded K/V it hands
  // the reference are the stored rows' values (f16 exactly; quantized within
  // their error), 0 for released pages; the pools have the layout's size.
  const DType f16 = DType::F16;
  const AttnShapeCase& c = paged_cases()[1];  // the window case: released pages
  Problem p = make_problem(c.lq, c.lk, c.n_heads, c.n_kv_heads, 64, c.causal, c.window_left, 77u, &f16);
  for (KvType t : {KvType::F16, KvType::BF16, KvType::Q8_0, KvType::FP8, KvType::Q4_0}) {
    Problem dec;
    const PagedKv kv = make_typed_paged(p, t, KvType::Q4_0, 16, 78u, &dec);
    ASSERT_EQ(kv.k_bytes.size(), size_t(kv_pool_layout(t, 16, p.n_kv_heads, 64).page) * kv.num_pages);
    const double tol = t == KvType::F16 ? 0.0 : t == KvType::BF16 ? 1e-2 : t == KvType::Q8_0 ? 2e-2 : 0.15;
    double worst = 0;
    size_t zero_rows = 0;
    const size_t row = size_t(p.n_kv_heads) * 64;
    for (int b = 0; b < p.batch(); ++b)
      for (int j = 0; j < p.cu_k[b + 1] - p.cu_k[b]; ++j) {
        const size_t r = size_t(p.cu_k[b] + j) * row;
        if (kv.tables[size_t(b) * kv.max_blocks + j / 16] < 0) {
          for (size_t e = 0; e < row; ++e) EXPECT_EQ(dec.k[r + e], 0.0f);
          ++zero_rows;
          continue;
        }
        for (size_t e = 0; e < row; ++e) {
          worst = std::max(worst, double(std::fabs(dec.k[r + e] - p.k[r + e])) / 3.0);  // |x| <~ 3
          EXPECT_EQ(dec.k[r + e], fp16_to_fp32(fp32_to_fp16(dec.k[r + e])));  // f16 values
        }
      }
    EXPECT_LE(worst, tol) << kv_type_name(t);
    EXPECT_GT(zero_rows, 0u);
  }
}

TEST(AttentionPagedDispatch, BlockSizesAndValidation) {
  int32_t table[4] = {};
  AttnParams p;
  p.head_dim = 128;
  p.dtype = DType::BF16;
  p.block_tables = table;
  p.max_blocks_per_seq = 4;
  p.num_pages = 4;
#ifdef RUNLM_CUDA
  for (int bs : {8, 16, 32, 64, 128, 256}) {
    p.block_size = bs;
    for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3})
      EXPECT_EQ(attn_unsupported_reason(b, p, 90), "") << attn_backend_name(b) << " bs=" << bs;
  }
  p.block_size = 12;
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Naive, p, 90), "");  // naive divides: any page size
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa2, p, 90),
            "fa2: paged K/V block_size=12 unsupported; supported: block_size {8,16,32,64,128,256}");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90),
            "fa3: paged K/V block_size=12 unsupported; supported: block_size {8,16,32,64,128,256}");
#endif
  // Parameter checks run before any backend (and without a device).
  int dummy[4] = {};
  p.q = p.k = p.v = dummy;
  p.out = dummy;
  p.cu_seqlens_q = p.cu_seqlens_k = dummy;
  p.batch = 1;
  p.n_heads = p.n_kv_heads = 2;
  p.scale = 0.125f;
  p.block_size = 16;
  p.max_seqlen_k = 65;  // 4 pages of 16 hold 64 keys
  try {
    attention_dispatch(AttnBackend::Naive, p);
    FAIL() << "a block table too short for max_seqlen_k accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seqlen_k=65"), std::string::npos) << e.what();
  }
  p.max_seqlen_k = 64;
  p.num_pages = 0;
  try {
    attention_dispatch(AttnBackend::Naive, p);
    FAIL() << "num_pages=0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_pages=0"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- GPU backends

#ifdef RUNLM_CUDA
namespace {

bool have_cuda_device(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
    return false;
  }
  if (n == 0) {
    *why = "no CUDA device";
    return false;
  }
  return true;
}

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { ck(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// Lengths are not multiples of any tile (64/128); 0-length sequences, queries
// at an offset into cached keys, windows wide enough to skip whole tiles, and
// rows that see no key at all.
const std::vector<AttnShapeCase>& gpu_cases() {
  static const std::vector<AttnShapeCase> k = {
      {"mha_varlen", {1, 77, 0, 200, 129}, {1, 77, 0, 200, 129}, 4, 4, false, -1},
      {"gqa_causal", {130, 63, 257}, {130, 63, 257}, 8, 2, true, -1},
      {"mqa_causal_offset", {50, 129, 1, 17}, {200, 129, 300, 17}, 4, 1, true, -1},
      {"gqa_causal_window_offset", {300, 5}, {650, 400}, 4, 2, true, 100},
      {"mha_window", {333}, {333}, 2, 2, false, 70},
      {"mha_offset", {64, 10}, {300, 90}, 2, 2, false, -1},
      {"causal_q_longer_than_k", {100, 30}, {60, 31}, 2, 1, true, -1},
  };
  return k;
}

struct RefResult {
  Problem prob;
  std::vector<float> out, lse;
};

// The reference for case ci of a grid at (dtype, head_dim), computed once and
// shared by every backend; seed_base keeps the grids' inputs apart.
const RefResult& cached_ref_of(const std::vector<AttnShapeCase>& cases, uint32_t seed_base, DType t, int hd,
                               int ci) {
  static std::map<std::tuple<const void*, int, int, int>, std::unique_ptr<RefResult>> cache;
  auto key = std::make_tuple(static_cast<const void*>(&cases), int(t), hd, ci);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  const AttnShapeCase& c = cases[ci];
  auto r = std::make_unique<RefResult>();
  r->prob = make_problem(c.lq, c.lk, c.n_heads, c.n_kv_heads, hd, c.causal, c.window_left,
                         seed_base + 17u * ci + hd + (t == DType::BF16 ? 0u : 7u), &t);
  run_ref(r->prob, r->out, r->lse);
  return *cache.emplace(key, std::move(r)).first->second;
}

const RefResult& cached_ref(DType t, int hd, int ci) { return cached_ref_of(gpu_cases(), 1000u, t, hd, ci); }

struct GpuRun {
  std::vector<float> out, lse;
};

// Uploads p, poisons out and lse with NaN (0xFF bytes), dispatches, downloads.
// With paged, K and V go in as its pools and block tables instead.
// Typed pools (paged->k_type set) go in as their bytes, with their types.
GpuRun run_gpu(AttnBackend b, const Problem& p, DType t, const PagedKv* paged = nullptr) {
  const bool typed = paged && paged->k_type;
  const auto q = to_half_bits(p.q, t);
  const auto k = typed ? std::vector<uint16_t>() : paged ? paged->k_pool : to_half_bits(p.k, t);
  const auto v = typed ? std::vector<uint16_t>() : paged ? paged->v_pool : to_half_bits(p.v, t);
  const void* k_src = typed ? static_cast<const void*>(paged->k_bytes.data()) : k.data();
  const void* v_src = typed ? static_cast<const void*>(paged->v_bytes.data()) : v.data();
  DevBuf dq(q.size() * 2), dk(typed ? paged->k_bytes.size() : k.size() * 2),
      dv(typed ? paged->v_bytes.size() : v.size() * 2), dout(q.size() * 2);
  DevBuf dlse(size_t(p.total_q()) * p.n_heads * 4), dcq(p.cu_q.size() * 4), dck(p.cu_k.size() * 4);
  ck(cudaMemcpy(dq.p, q.data(), dq.n, cudaMemcpyHostToDevice), "upload q");
  ck(cudaMemcpy(dk.p, k_src, dk.n, cudaMemcpyHostToDevice), "upload k");
  ck(cudaMemcpy(dv.p, v_src, dv.n, cudaMemcpyHostToDevice), "upload v");
  ck(cudaMemcpy(dcq.p, p.cu_q.data(), dcq.n, cudaMemcpyHostToDevice), "upload cu_q");
  ck(cudaMemcpy(dck.p, p.cu_k.data(), dck.n, cudaMemcpyHostToDevice), "upload cu_k");
  ck(cudaMemset(dout.p, 0xff, dout.n), "poison out");
  ck(cudaMemset(dlse.p, 0xff, dlse.n), "poison lse");
  DevBuf dsinks(p.sinks.size() * 4);
  if (!p.sinks.empty()) ck(cudaMemcpy(dsinks.p, p.sinks.data(), dsinks.n, cudaMemcpyHostToDevice), "upload sinks");
  DevBuf dtab(paged ? paged->tables.size() * 4 : 0);
  if (paged) ck(cudaMemcpy(dtab.p, paged->tables.data(), dtab.n, cudaMemcpyHostToDevice), "upload block tables");
  AttnParams a;
  a.q = dq.p;
  a.k = dk.p;
  a.v = dv.p;
  a.out = dout.p;
  a.lse = static_cast<float*>(dlse.p);
  a.cu_seqlens_q = static_cast<const int32_t*>(dcq.p);
  a.cu_seqlens_k = static_cast<const int32_t*>(dck.p);
  a.batch = p.batch();
  a.total_q = p.total_q();
  a.total_k = p.total_k();
  for (int i = 0; i < p.batch(); ++i) {
    a.max_seqlen_q = std::max(a.max_seqlen_q, p.cu_q[i + 1] - p.cu_q[i]);
    a.max_seqlen_k = std::max(a.max_seqlen_k, p.cu_k[i + 1] - p.cu_k[i]);
  }
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.dtype = t;
  a.causal = p.causal;
  a.window_left = p.window_left;
  a.scale = p.scale();
  a.softcap = p.softcap;
  a.sinks = p.sinks.empty() ? nullptr : static_cast<const float*>(dsinks.p);
  if (paged) {
    a.block_tables = static_cast<const int32_t*>(dtab.p);
    a.max_blocks_per_seq = paged->max_blocks;
    a.block_size = paged->block_size;
    a.num_pages = paged->num_pages;
    a.k_type = paged->k_type;
    a.v_type = paged->v_type;
  }
  attention_dispatch(b, a);
  ck(cudaDeviceSynchronize(), "attention kernel");
  std::vector<uint16_t> o(q.size());
  GpuRun r;
  r.lse.resize(size_t(p.total_q()) * p.n_heads);
  ck(cudaMemcpy(o.data(), dout.p, dout.n, cudaMemcpyDeviceToHost), "download out");
  ck(cudaMemcpy(r.lse.data(), dlse.p, dlse.n, cudaMemcpyDeviceToHost), "download lse");
  r.out.resize(o.size());
  for (size_t i = 0; i < o.size(); ++i) r.out[i] = from_half_bits(o[i], t);
  return r;
}

// The GPU result against the float64 reference: every element written and
// finite, relative L2 error < 1e-2, lse within 2e-3 (-inf where no key is visible).
void expect_matches_ref(const GpuRun& g, const RefResult& ref) {
  double num = 0, den = 0;
  size_t nan = 0;
  for (size_t i = 0; i < g.out.size(); ++i) {
    if (!std::isfinite(g.out[i])) {
      ++nan;
      continue;
    }
    const double d = double(g.out[i]) - ref.out[i];
    num += d * d;
    den += double(ref.out[i]) * ref.out[i];
  }
  ASSERT_EQ(nan, 0u) << "elements left unwritten (poison) or non-finite";
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  EXPECT_LT(rel, 1e-2) << "relative error";
  size_t lse_bad = 0;
  double lse_max = 0;
  for (size_t i = 0; i < g.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      lse_bad += !(std::isinf(g.lse[i]) && g.lse[i] < 0);
    } else if (!std::isfinite(g.lse[i])) {
      ++lse_bad;
    } else {
      lse_max = std::max(lse_max, std::fabs(double(g.lse[i]) - ref.lse[i]));
    }
  }
  EXPECT_EQ(lse_bad, 0u) << "lse rows non-finite or not -inf where no key is visible";
  EXPECT_LT(lse_max, 2e-3) << "lse max abs error";
}

int device_sm() {
  int dev = 0, major = 0, minor = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cc major");
  ck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cc minor");
  return major * 10 + minor;
}

using GpuParam = std::tuple<AttnBackend, DType, int, int>;  // backend, dtype, head_dim, case

class AttentionGpu : public ::testing::TestWithParam<GpuParam> {};

TEST_P(AttentionGpu, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const auto [backend, t, hd, ci] = GetParam();
  const RefResult& ref = cached_ref(t, hd, ci);
  AttnParams probe;
  probe.head_dim = hd;
  probe.dtype = t;
  probe.causal = ref.prob.causal;
  probe.window_left = ref.prob.window_left;
  const std::string unsupported = attn_unsupported_reason(backend, probe, device_sm());
  if (!unsupported.empty()) {
    // Not runnable here (fa3 off sm_90): dispatch must refuse, naming why.
    try {
      run_gpu(backend, ref.prob, t);
      FAIL() << "dispatch ran an unsupported combination: " << unsupported;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), unsupported);
    }
    return;
  }
  expect_matches_ref(run_gpu(backend, ref.prob, t), ref);
}

std::string gpu_param_name(const ::testing::TestParamInfo<GpuParam>& info) {
  const auto [backend, t, hd, ci] = info.param;
  return std::string(attn_backend_name(backend)) + "_" + dtype_name(t) + "_d" + std::to_string(hd) + "_" +
         gpu_cases()[ci].name;
}

INSTANTIATE_TEST_SUITE_P(All, AttentionGpu,
                         ::testing::Combine(::testing::Values(AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3),
                                            ::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128, 256),
                                            ::testing::Range(0, 7)),
                         gpu_param_name);

TEST(AttentionGpuDispatch, UnsupportedCombosThrow) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  Problem p = make_problem({10}, {10}, 2, 2, 96, true, -1, 77);
  EXPECT_THROW(run_gpu(AttnBackend::Fa2, p, DType::BF16), Error);
  EXPECT_THROW(run_gpu(AttnBackend::Fa3, p, DType::BF16), Error);
  // Auto picks a backend that supports head_dim 8 (stories260K): naive.
  DType t = DType::BF16;
  Problem sr = make_problem({9}, {9}, 2, 1, 8, true, -1, 78, &t);
  EXPECT_EQ(attn_resolve(AttnBackend::Auto, AttnParams{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                       1, 9, 9, 9, 9, 2, 1, 8, DType::BF16, true, -1, 0.3f, 0.0f, nullptr}),
            AttnBackend::Naive);
  const GpuRun g = run_gpu(AttnBackend::Auto, sr, t);
  std::vector<float> out, lse;
  run_ref(sr, out, lse);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(g.out[i], out[i], 2e-2) << i;
  // On sm_90 with head_dim 128, auto is fa3.
  if (device_sm() == 90) {
    EXPECT_EQ(attn_resolve(AttnBackend::Auto, AttnParams{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                         1, 9, 9, 9, 9, 2, 1, 128, DType::BF16, true, -1, 0.3f, 0.0f, nullptr}),
              AttnBackend::Fa3);
  }
}


// Scores whose row maxima keep growing along the keys: key row j of every
// sequence is scaled by 1 + j / 32 (then rounded to the dtype, so the
// reference sees the kernel's inputs), which moves a row's max by ~2^8 every
// tile or two. fa2 moves its running max only on growth > 2^8 and
// rescales O then (kFa2RescaleLog2); on N(0, 1) inputs the max settles in
// the first tile and that path would go untested. Mixed lengths (several
// query blocks, a short sequence), causal and not, GQA.
TEST(AttentionGpuRescale, GrowingScoresMatchReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  for (DType t : {DType::BF16, DType::F16})
    for (int hd : {64, 128, 256})
      for (bool causal : {false, true}) {
        Problem p = make_problem({300, 70}, {300, 70}, 4, 2, hd, causal, -1, 4000u + hd + causal, &t);
        for (int b = 0; b < p.batch(); ++b)
          for (int j = 0; j < p.cu_k[b + 1] - p.cu_k[b]; ++j)
            for (int e = 0; e < p.n_kv_heads * hd; ++e) {
              float& x = p.k[(size_t(p.cu_k[b]) + j) * p.n_kv_heads * hd + e];
              x *= 1.0f + j / 32.0f;
              x = t == DType::BF16 ? bf16_to_fp32(fp32_to_bf16(x)) : fp16_to_fp32(fp32_to_fp16(x));
            }
        RefResult ref;
        ref.prob = p;
        run_ref(p, ref.out, ref.lse);
        for (AttnBackend be : {AttnBackend::Fa2, AttnBackend::Fa3}) {
          AttnParams probe;
          probe.head_dim = hd;
          probe.dtype = t;
          probe.causal = causal;
          if (!attn_unsupported_reason(be, probe, device_sm()).empty()) continue;
          SCOPED_TRACE(std::string(attn_backend_name(be)) + " " + dtype_name(t) + " d" + std::to_string(hd) +
                       (causal ? " causal" : ""));
          expect_matches_ref(run_gpu(be, p, t), ref);
        }
      }
}

// fa3's main loop at head_dim 128 on contiguous K/V (the default kernel:
// 128-key tiles for the causal cases below 4096 keys, 176 otherwise). Varlen
// GQA batches, lengths not multiples of the tile: several key tiles per
// query block, so the loop body runs several times (the carried rescale
// factor), single-tile blocks (causal block 0: prologue and epilogue only),
// a sequence with queries but no keys (t_lo = t_hi), a window that skips
// leading tiles, and more query blocks than SMs in the first two cases
// (some CTAs take two blocks).
const std::vector<AttnShapeCase>& fa3_loop_cases() {
  static const std::vector<AttnShapeCase> k = {
      {"gqa_varlen", {300, 0, 700, 77, 450}, {300, 0, 700, 77, 450}, 8, 2, false, -1},
      {"gqa_varlen_causal", {300, 0, 700, 77, 450}, {300, 0, 700, 77, 450}, 8, 2, true, -1},
      {"gqa_causal_offset_nokeys", {129, 5, 260}, {600, 0, 260}, 8, 2, true, -1},
      {"gqa_causal_window", {700}, {700}, 8, 2, true, 200},
  };
  return k;
}

// Why fa3 at head_dim 128 cannot run here ("" when it can): no device, or
// not sm_90.
std::string fa3_d128_skip_reason() {
  std::string why;
  if (!have_cuda_device(&why)) return why;
  AttnParams probe;
  probe.head_dim = 128;
  probe.dtype = DType::BF16;
  return attn_unsupported_reason(AttnBackend::Fa3, probe, device_sm());
}

// The default kernel against the reference on the loop cases (outputs
// poisoned before every run, run_gpu).
TEST(AttentionGpuFa3Loop, MatchReference) {
  const std::string skip = fa3_d128_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  const std::vector<AttnShapeCase>& cases = fa3_loop_cases();
  for (DType t : {DType::BF16, DType::F16})
    for (int ci = 0; ci < int(cases.size()); ++ci) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + cases[ci].name);
      const RefResult& ref = cached_ref_of(cases, 5000u, t, 128, ci);
      expect_matches_ref(run_gpu(AttnBackend::Fa3, ref.prob, t), ref);
    }
}

// The default kernel's d128 key tiles (launch_fa3_paged): 176 non-causal
// and causal from 4096 keys, 128 for causal problems below that. One case of
// each (the long causal one crosses the switch: 4100 keys), bf16, against
// the reference with outputs poisoned (run_gpu).
TEST(AttentionGpuFa3Loop, DefaultTileChoices) {
  const std::string skip = fa3_d128_skip_reason();
  if (!skip.empty()) GTEST_SKIP() << skip;
  static const std::vector<AttnShapeCase> cases = {
      {"causal_4100_keys_bn176", {4100}, {4100}, 2, 1, true, -1},
      {"causal_varlen_bn128", {300, 700, 77}, {300, 700, 77}, 4, 2, true, -1},
      {"noncausal_varlen_bn176", {300, 700, 77}, {300, 700, 77}, 4, 2, false, -1},
  };
  for (int ci = 0; ci < int(cases.size()); ++ci) {
    SCOPED_TRACE(cases[ci].name);
    const RefResult& ref = cached_ref_of(cases, 5100u, DType::BF16, 128, ci);
    expect_matches_ref(run_gpu(AttnBackend::Fa3, ref.prob, DType::BF16), ref);
  }
}

// ---------------------------------------------------------------- soft-cap on the GPU

// The backend on ref's problem at (t, hd): where the dispatch rules the
// combination out, its refusal word for word; else its output against ref.
void expect_refusal_or_match(AttnBackend backend, DType t, int hd, const RefResult& ref) {
  AttnParams probe;
  probe.head_dim = hd;
  probe.dtype = t;
  probe.causal = ref.prob.causal;
  probe.window_left = ref.prob.window_left;
  probe.softcap = ref.prob.softcap;
  probe.sinks = ref.prob.sinks.empty() ? nullptr : ref.prob.sinks.data();  // only tested for null
  const std::string unsupported = attn_unsupported_reason(backend, probe, device_sm());
  if (!unsupported.empty()) {
    try {
      run_gpu(backend, ref.prob, t);
      FAIL() << "dispatch ran an unsupported combination: " << unsupported;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), unsupported);
    }
    return;
  }
  expect_matches_ref(run_gpu(backend, ref.prob, t), ref);
}

// The reference of soft-cap case ci at (dtype, head_dim), computed once.
const RefResult& cached_softcap_ref(DType t, int hd, int ci) {
  static std::map<std::tuple<int, int, int>, std::unique_ptr<RefResult>> cache;
  const auto key = std::make_tuple(int(t), hd, ci);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto r = std::make_unique<RefResult>();
  r->prob = make_softcap_problem(softcap_cases()[ci], hd, t, 7000u + 17u * ci + hd + (t == DType::BF16 ? 0u : 7u));
  run_ref(r->prob, r->out, r->lse);
  return *cache.emplace(key, std::move(r)).first->second;
}

using SoftcapParam = std::tuple<AttnBackend, DType, int, int>;  // backend, dtype, head_dim, case

class AttentionGpuSoftcap : public ::testing::TestWithParam<SoftcapParam> {};

// Contiguous K/V, outputs poisoned (run_gpu), against the soft-capped
// reference: relative L2 < 1e-2, lse within 2e-3 (expect_matches_ref).
// AttentionRef.SoftcapCasesAreSensitive checks that the cap moves every
// case's output by more than 5x that bound.
TEST_P(AttentionGpuSoftcap, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const auto [backend, t, hd, ci] = GetParam();
  expect_refusal_or_match(backend, t, hd, cached_softcap_ref(t, hd, ci));
}

std::string softcap_param_name(const ::testing::TestParamInfo<SoftcapParam>& info) {
  const auto [backend, t, hd, ci] = info.param;
  return std::string(attn_backend_name(backend)) + "_" + dtype_name(t) + "_d" + std::to_string(hd) + "_" +
         softcap_cases()[ci].shape.name;
}

INSTANTIATE_TEST_SUITE_P(Softcap, AttentionGpuSoftcap,
                         ::testing::Combine(::testing::Values(AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3),
                                            ::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128, 256),
                                            ::testing::Range(0, 5)),
                         softcap_param_name);

// Soft-cap on paged K/V: f16 pools (every backend) and q8_0 / q4_0 pools
// read in place (naive, fa2; fa3 must refuse them, naming the types), the
// windowed cases (released pages) at head_dims 64, 128, 256, outputs
// poisoned, against the soft-capped reference (on the decoded values for
// the typed pools).
TEST(AttentionPagedGpuSoftcap, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const DType f16 = DType::F16;
  const int sm = device_sm();
  for (int ci : {1, 4})  // gqa_causal_window_offset_cap2, gemma2_local_cap50
    for (int hd : {64, 128, 256}) {
      const Problem p = make_softcap_problem(softcap_cases()[ci], hd, f16, 7500u + 13u * ci + hd);
      RefResult ref;
      ref.prob = p;
      run_ref(p, ref.out, ref.lse);
      const PagedKv kv = make_paged(p, f16, 16, 7600u + ci + hd);
      for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3}) {
        SCOPED_TRACE(std::string(attn_backend_name(b)) + " f16 pool d" + std::to_string(hd) + " " +
                     softcap_cases()[ci].shape.name);
        AttnParams probe;
        probe.head_dim = hd;
        probe.dtype = f16;
        probe.softcap = p.softcap;
        probe.block_tables = kv.tables.data();  // only tested for null
        probe.block_size = kv.block_size;
        if (!attn_unsupported_reason(b, probe, sm).empty()) continue;  // fa3 off sm_90
        expect_matches_ref(run_gpu(b, p, f16, &kv), ref);
      }
      for (KvType kt : {KvType::Q8_0, KvType::Q4_0}) {
        Problem decoded;
        const PagedKv tkv = make_typed_paged(p, kt, kt, 16, 7700u + ci + hd, &decoded);
        RefResult tref;
        tref.prob = decoded;
        run_ref(decoded, tref.out, tref.lse);
        for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3}) {
          SCOPED_TRACE(std::string(attn_backend_name(b)) + " " + kv_type_name(kt) + " pool d" + std::to_string(hd) +
                       " " + softcap_cases()[ci].shape.name);
          AttnParams probe;
          probe.head_dim = hd;
          probe.dtype = f16;
          probe.softcap = p.softcap;
          probe.block_tables = tkv.tables.data();
          probe.block_size = tkv.block_size;
          probe.k_type = probe.v_type = kt;
          const std::string unsupported = attn_unsupported_reason(b, probe, sm);
          if (!unsupported.empty()) {
            EXPECT_EQ(b, AttnBackend::Fa3) << unsupported;
            EXPECT_THROW(run_gpu(b, decoded, f16, &tkv), Error);
            continue;
          }
          expect_matches_ref(run_gpu(b, decoded, f16, &tkv), tref);
        }
      }
    }
}

// ---------------------------------------------------------------- sinks on the GPU

// The reference of sink case ci at (dtype, head_dim), computed once.
const RefResult& cached_sink_ref(DType t, int hd, int ci) {
  static std::map<std::tuple<int, int, int>, std::unique_ptr<RefResult>> cache;
  const auto key = std::make_tuple(int(t), hd, ci);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto r = std::make_unique<RefResult>();
  r->prob = make_sink_problem(sink_cases()[ci], hd, t, 8000u + 17u * ci + hd + (t == DType::BF16 ? 0u : 7u));
  run_ref(r->prob, r->out, r->lse);
  return *cache.emplace(key, std::move(r)).first->second;
}

using SinkParam = std::tuple<AttnBackend, DType, int, int>;  // backend, dtype, head_dim, case

class AttentionGpuSinks : public ::testing::TestWithParam<SinkParam> {};

// Contiguous K/V, outputs and lse poisoned (run_gpu), against the reference
// with sinks: relative L2 < 1e-2, lse within 2e-3 (the sink's share
// included; the sink itself where a row sees no key). AttentionRef.
// SinkCasesAreSensitive checks that the sinks move every case's output by
// more than 5x that bound.
TEST_P(AttentionGpuSinks, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const auto [backend, t, hd, ci] = GetParam();
  expect_refusal_or_match(backend, t, hd, cached_sink_ref(t, hd, ci));
}

std::string sink_param_name(const ::testing::TestParamInfo<SinkParam>& info) {
  const auto [backend, t, hd, ci] = info.param;
  return std::string(attn_backend_name(backend)) + "_" + dtype_name(t) + "_d" + std::to_string(hd) + "_" +
         sink_cases()[ci].shape.name;
}

INSTANTIATE_TEST_SUITE_P(Sinks, AttentionGpuSinks,
                         ::testing::Combine(::testing::Values(AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3),
                                            ::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128, 256),
                                            ::testing::Range(0, 6)),
                         sink_param_name);

// Sinks on paged K/V: pools in the dtype (f16 and bf16, every backend, page
// sizes 16 and 64) and typed pools read in place (q8_0/q8_0, q4_0/fp8,
// bf16/q8_0 under f16: naive and fa2; fa3 must refuse them), the sliding
// and the soft-capped cases (released pages) at head_dims 64, 128, 256,
// outputs poisoned, against the reference with sinks (on the decoded values
// for the typed pools).
TEST(AttentionPagedGpuSinks, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const int sm = device_sm();
  for (int ci : {1, 5})  // gptoss_sliding128_offset, sinks_and_softcap_window
    for (int hd : {64, 128, 256}) {
      for (DType t : {DType::F16, DType::BF16}) {
        const Problem p = make_sink_problem(sink_cases()[ci], hd, t, 8500u + 13u * ci + hd + unsigned(t));
        RefResult ref;
        ref.prob = p;
        run_ref(p, ref.out, ref.lse);
        for (int bs : {16, 64}) {
          const PagedKv kv = make_paged(p, t, bs, 8600u + ci + hd + bs);
          for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3}) {
            SCOPED_TRACE(std::string(attn_backend_name(b)) + " " + dtype_name(t) + " pool bs" + std::to_string(bs) +
                         " d" + std::to_string(hd) + " " + sink_cases()[ci].shape.name);
            AttnParams probe;
            probe.head_dim = hd;
            probe.dtype = t;
            probe.softcap = p.softcap;
            probe.sinks = p.sinks.data();
            probe.block_tables = kv.tables.data();  // only tested for null
            probe.block_size = kv.block_size;
            if (!attn_unsupported_reason(b, probe, sm).empty()) continue;  // fa3 off sm_90
            expect_matches_ref(run_gpu(b, p, t, &kv), ref);
          }
        }
      }
      const DType f16 = DType::F16;
      const Problem p = make_sink_problem(sink_cases()[ci], hd, f16, 8700u + 13u * ci + hd);
      for (const auto& [kt, vt] : std::vector<std::pair<KvType, KvType>>{
               {KvType::Q8_0, KvType::Q8_0}, {KvType::Q4_0, KvType::FP8}, {KvType::BF16, KvType::Q8_0}}) {
        Problem decoded;
        const PagedKv tkv = make_typed_paged(p, kt, vt, 16, 8800u + ci + hd, &decoded);
        RefResult tref;
        tref.prob = decoded;
        run_ref(decoded, tref.out, tref.lse);
        for (AttnBackend b : {AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3}) {
          SCOPED_TRACE(std::string(attn_backend_name(b)) + " K" + kv_type_name(kt) + " V" + kv_type_name(vt) +
                       " pool d" + std::to_string(hd) + " " + sink_cases()[ci].shape.name);
          AttnParams probe;
          probe.head_dim = hd;
          probe.dtype = f16;
          probe.softcap = p.softcap;
          probe.sinks = p.sinks.data();
          probe.block_tables = tkv.tables.data();
          probe.block_size = tkv.block_size;
          probe.k_type = kt;
          probe.v_type = vt;
          const std::string unsupported = attn_unsupported_reason(b, probe, sm);
          if (!unsupported.empty()) {
            EXPECT_EQ(b, AttnBackend::Fa3) << unsupported;
            EXPECT_THROW(run_gpu(b, decoded, f16, &tkv), Error);
            continue;
          }
          expect_matches_ref(run_gpu(b, decoded, f16, &tkv), tref);
        }
      }
    }
}

// ---------------------------------------------------------------- paged K/V on the GPU

// The reference for a paged case: attention_ref on the contiguous K/V, which
// is what the host gather of every pool built from it returns
// (AttentionPagedRef.PoolHoldsTheContiguousRows; rechecked per test).
const RefResult& cached_paged_ref(DType t, int hd, int ci) { return cached_ref_of(paged_cases(), 3000u, t, hd, ci); }

using PagedParam = std::tuple<AttnBackend, DType, int, int, int>;  // backend, dtype, head_dim, case, block_size

class AttentionPagedGpu : public ::testing::TestWithParam<PagedParam> {};

TEST_P(AttentionPagedGpu, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const auto [backend, t, hd, ci, bs] = GetParam();
  const RefResult& ref = cached_paged_ref(t, hd, ci);
  const PagedKv kv = make_paged(ref.prob, t, bs, 4000u + 31u * ci + hd + bs);
  ASSERT_EQ(gather_paged(ref.prob, kv, kv.k_pool), expected_gather(ref.prob, kv, ref.prob.k, t));
  ASSERT_EQ(gather_paged(ref.prob, kv, kv.v_pool), expected_gather(ref.prob, kv, ref.prob.v, t));
  AttnParams probe;
  probe.head_dim = hd;
  probe.dtype = t;
  probe.causal = ref.prob.causal;
  probe.window_left = ref.prob.window_left;
  probe.block_tables = kv.tables.data();  // only tested for null
  probe.block_size = bs;
  const std::string unsupported = attn_unsupported_reason(backend, probe, device_sm());
  if (!unsupported.empty()) {
    try {
      run_gpu(backend, ref.prob, t, &kv);
      FAIL() << "dispatch ran an unsupported combination: " << unsupported;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), unsupported);
    }
    return;
  }
  const GpuRun g = run_gpu(backend, ref.prob, t, &kv);
  expect_matches_ref(g, ref);
  // Same kernel on the contiguous K/V: the arithmetic is the same (keys past
  // a sequence's end contribute an exact 0 either way), so the outputs should
  // be bit-identical; a difference points at the paged addressing.
  const GpuRun c = run_gpu(backend, ref.prob, t);
  size_t out_diff = 0, lse_diff = 0;
  for (size_t i = 0; i < g.out.size(); ++i) out_diff += !(g.out[i] == c.out[i]);
  for (size_t i = 0; i < g.lse.size(); ++i) lse_diff += !(g.lse[i] == c.lse[i]);
  EXPECT_EQ(out_diff, 0u) << "elements differing from the contiguous run of the same kernel";
  EXPECT_EQ(lse_diff, 0u) << "lse rows differing from the contiguous run of the same kernel";
}

std::string paged_param_name(const ::testing::TestParamInfo<PagedParam>& info) {
  const auto [backend, t, hd, ci, bs] = info.param;
  return std::string(attn_backend_name(backend)) + "_" + dtype_name(t) + "_d" + std::to_string(hd) + "_bs" +
         std::to_string(bs) + "_" + paged_cases()[ci].name;
}

INSTANTIATE_TEST_SUITE_P(Paged, AttentionPagedGpu,
                         ::testing::Combine(::testing::Values(AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3),
                                            ::testing::Values(DType::BF16, DType::F16), ::testing::Values(64, 128, 256),
                                            ::testing::Range(0, 3), ::testing::Values(8, 16, 64, 256)),
                         paged_param_name);

// ---------------------------------------------------------------- typed paged K/V on the GPU

// Every (K, V) pair of the GPU's KV types except f16/f16 (the grid above).
std::vector<std::pair<KvType, KvType>> typed_pairs() {
  const KvType types[] = {KvType::F16, KvType::BF16, KvType::Q8_0, KvType::FP8, KvType::Q4_0};
  std::vector<std::pair<KvType, KvType>> r;
  for (KvType k : types)
    for (KvType v : types)
      if (k != KvType::F16 || v != KvType::F16) r.emplace_back(k, v);
  return r;
}

struct TypedRef {
  Problem decoded;  // K and V as the kernels must read them (make_typed_paged)
  PagedKv kv;
  RefResult ref;    // attention_ref on decoded
};

// Built once per (pair, head_dim, case) and shared by the backends. The page
// size cycles with the pair (8, 16, 64, 256), so every pair meets one page
// size and every page size meets every type.
const TypedRef& cached_typed_ref(int pair, int hd, int ci) {
  static std::map<std::tuple<int, int, int>, std::unique_ptr<TypedRef>> cache;
  const auto key = std::make_tuple(pair, hd, ci);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  const auto [kt, vt] = typed_pairs()[pair];
  const AttnShapeCase& c = paged_cases()[ci];
  const DType f16 = DType::F16;
  auto r = std::make_unique<TypedRef>();
  const Problem p = make_problem(c.lq, c.lk, c.n_heads, c.n_kv_heads, hd, c.causal, c.window_left,
                                 5000u + 17u * ci + hd + 101u * pair, &f16);
  const int bs = std::vector<int>{8, 16, 64, 256}[pair % 4];
  r->kv = make_typed_paged(p, kt, vt, bs, 6000u + 31u * ci + hd + pair, &r->decoded);
  r->ref.prob = r->decoded;
  run_ref(r->decoded, r->ref.out, r->ref.lse);
  return *cache.emplace(key, std::move(r)).first->second;
}

using TypedParam = std::tuple<AttnBackend, int, int, int>;  // backend, pair, head_dim, case

class AttentionPagedTypedGpu : public ::testing::TestWithParam<TypedParam> {};

// A typed pool read in place (naive, fa2) against the reference on the
// decoded values, and bit for bit against the same kernel on the contiguous
// f16 rows gather_kv would have written (the same values, the same
// arithmetic). fa3 must refuse, naming the pair.
TEST_P(AttentionPagedTypedGpu, MatchesReference) {
  std::string why;
  if (!have_cuda_device(&why)) GTEST_SKIP() << why;
  const auto [backend, pair, hd, ci] = GetParam();
  const TypedRef& tr = cached_typed_ref(pair, hd, ci);
  const DType f16 = DType::F16;
  AttnParams probe;
  probe.head_dim = hd;
  probe.dtype = f16;
  probe.causal = tr.decoded.causal;
  probe.window_left = tr.decoded.window_left;
  probe.block_tables = tr.kv.tables.data();  // only tested for null
  probe.block_size = tr.kv.block_size;
  probe.k_type = tr.kv.k_type;
  probe.v_type = tr.kv.v_type;
  const std::string unsupported = attn_unsupported_reason(backend, probe, device_sm());
  if (!unsupported.empty()) {
    EXPECT_NE(backend, AttnBackend::Fa2) << unsupported;  // fa2 runs every pair (sm_80+)
    try {
      run_gpu(backend, tr.decoded, f16, &tr.kv);
      FAIL() << "dispatch ran an unsupported combination: " << unsupported;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), unsupported);
    }
    return;
  }
  const GpuRun g = run_gpu(backend, tr.decoded, f16, &tr.kv);
  expect_matches_ref(g, tr.ref);
  const GpuRun c = run_gpu(backend, tr.decoded, f16);
  size_t out_diff = 0, lse_diff = 0;
  for (size_t i = 0; i < g.out.size(); ++i) out_diff += !(g.out[i] == c.out[i]);
  for (size_t i = 0; i < g.lse.size(); ++i) lse_diff += !(g.lse[i] == c.lse[i]);
  EXPECT_EQ(out_diff, 0u) << "elements differing from the same kernel on the gathered f16 rows";
  EXPECT_EQ(lse_diff, 0u) << "lse rows differing from the same kernel on the gathered f16 rows";
}

std::string typed_param_name(const ::testing::TestParamInfo<TypedParam>& info) {
  const auto [backend, pair, hd, ci] = info.param;
  const auto [kt, vt] = typed_pairs()[pair];
  return std::string(attn_backend_name(backend)) + "_K" + kv_type_name(kt) + "_V" + kv_type_name(vt) + "_d" +
         std::to_string(hd) + "_" + paged_cases()[ci].name;
}

INSTANTIATE_TEST_SUITE_P(Typed, AttentionPagedTypedGpu,
                         ::testing::Combine(::testing::Values(AttnBackend::Naive, AttnBackend::Fa2, AttnBackend::Fa3),
                                            ::testing::Range(0, 24), ::testing::Values(64, 128, 256),
                                            ::testing::Range(0, 3)),
                         typed_param_name);

}  // namespace
#endif  // RUNLM_CUDA

// Typed pools in the table and the checks (CPU side: no device needed).
TEST(AttentionPagedDispatch, TypedPools) {
  int32_t table[4] = {};
  AttnParams p;
  p.head_dim = 128;
  p.dtype = DType::F16;
  p.block_tables = table;
  p.block_size = 16;
  p.max_blocks_per_seq = 4;
  p.num_pages = 4;
  EXPECT_FALSE(attn_kv_typed(p));
  p.k_type = KvType::F16;  // the dtype's own: not typed
  EXPECT_FALSE(attn_kv_typed(p));
  p.k_type = KvType::Q8_0;
  p.v_type = KvType::Q4_0;
  EXPECT_TRUE(attn_kv_typed(p));
  EXPECT_EQ(attn_kv_type(p, false), KvType::Q8_0);
  EXPECT_EQ(attn_kv_type(p, true), KvType::Q4_0);
#ifdef RUNLM_CUDA
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Naive, p, 90), "");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa2, p, 90), "");
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90),
            "fa3: paged K/V types K=q8_0 V=q4_0 unsupported; supported: K and V in the dtype (f16)");
  p.dtype = DType::BF16;
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa2, p, 90),
            "fa2: paged K/V types K=q8_0 V=q4_0 with dtype bf16 unsupported; supported: dtype f16");
  p.k_type = p.v_type = KvType::BF16;  // bf16 pools with bf16 attention: the plain paged path
  EXPECT_FALSE(attn_kv_typed(p));
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90), "");
  p.dtype = DType::F16;  // bf16 pools with f16 attention: typed
  EXPECT_EQ(attn_unsupported_reason(AttnBackend::Fa3, p, 90),
            "fa3: paged K/V types K=bf16 V=bf16 unsupported; supported: K and V in the dtype (f16)");
#endif
  // Parameter checks (before any backend).
  int dummy[4] = {};
  p.q = p.k = p.v = dummy;
  p.out = dummy;
  p.cu_seqlens_q = p.cu_seqlens_k = dummy;
  p.batch = 1;
  p.n_heads = p.n_kv_heads = 2;
  p.scale = 0.125f;
  auto expect_error = [&](const char* needle) {
    try {
      attention_dispatch(AttnBackend::Naive, p);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  p.k_type = KvType::Q8_0;
  p.v_type = KvType::F32;
  expect_error("KV type f32 (K=q8_0 V=f32) unsupported");
  p.v_type = KvType::FP8;
  p.head_dim = 80;
  expect_error("KV type q8_0 with head_dim=80 unsupported");
  p.head_dim = 128;
  p.block_tables = nullptr;
  expect_error("K=q8_0 V=fp8 with dtype f16 need paged K/V");
}
