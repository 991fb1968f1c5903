// Tests for paged decode attention. Always run: the CPU reference
// paged_decode_attention_ref against a direct dense formula (contiguous
// caches, no paging), the reference's paging (a shuffled table gives the
// contiguous result), and the flash-decoding state merge
// (kernels/cuda/attn_state.h) against whole-set softmax. With CUDA and a
// device: the GPU kernels against the reference over a grid of
// (batch, lengths that are not page multiples, block sizes, head dims,
// GQA/MQA/MHA, query tokens per sequence, window, soft-cap, shuffled tables,
// split or not), graph capture, NaN rows for out-of-bound lengths, and parameter
// errors. (runlm bench-decode times the kernels.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "cpu/kv_quant.h"
#include "cpu/ops.h"
#include "cuda/attn_state.h"
#include "dtype.h"
#include "paged_kv.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/paged_attention.h"
#endif

using namespace runlm;

namespace {

// ---------------------------------------------------------------- CPU-only

// Dense attention in double for one query row over keys [first, pos] of a
// contiguous cache [len][n_kv_heads][hd] of floats.
// softcap > 0 caps each scaled score at softcap * tanh(score / softcap);
// sink (nullptr: none) is one more logit of the softmax, without a value.
void dense_row(const float* q, const std::vector<float>& k, const std::vector<float>& v, int n_kv, int hd, int kvh,
               int first, int pos, double scale, double* out, double softcap = 0, const float* sink = nullptr) {
  std::vector<double> s;
  double mx = -INFINITY;
  for (int t = first; t <= pos; ++t) {
    double d = 0;
    for (int j = 0; j < hd; ++j) d += double(q[j]) * k[(size_t(t) * n_kv + kvh) * hd + j];
    s.push_back(softcap > 0 ? softcap * std::tanh(d * scale / softcap) : d * scale);
    mx = std::max(mx, s.back());
  }
  if (sink) mx = std::max(mx, double(*sink));
  double sum = sink ? std::exp(*sink - mx) : 0.0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (int j = 0; j < hd; ++j) {
    double acc = 0;
    for (int t = first; t <= pos; ++t) acc += s[t - first] * v[(size_t(t) * n_kv + kvh) * hd + j];
    out[j] = acc / sum;
  }
}

// The reference against dense_row on a tiny case: two sequences, contiguous
// table (page j of sequence s is s * pages + j), n_q 1 and 3, window on/off,
// soft-cap off, near the scores' size (0.7) and far above it (50), without
// and with sinks (one per head, from a small share to a dominating one).
TEST(PagedAttentionRef, MatchesDenseFormula) {
  const int n_heads = 4, n_kv = 2, hd = 8, bs = 4;
  const std::vector<int> lens = {7, 13}, nq = {1, 3};
  const std::vector<float> head_sinks = {-2.0f, 0.5f, 3.0f, 9.0f};
  for (bool with_sinks : {false, true})
  for (float softcap : {0.0f, 0.7f, 50.0f})
  for (int window : {0, 5}) {
    std::mt19937 rng(11 + window);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int pages_per_seq = 4;  // 16 slots >= 13
    const int n_pages = 2 * pages_per_seq;
    std::vector<float> kpool(size_t(n_pages) * bs * n_kv * hd), vpool(kpool.size());
    for (float& x : kpool) x = u(rng);
    for (float& x : vpool) x = u(rng);
    std::vector<int32_t> table(2 * pages_per_seq);
    std::iota(table.begin(), table.end(), 0);
    std::vector<int32_t> cu_q = {0, nq[0], nq[0] + nq[1]};
    const int total_q = cu_q.back();
    std::vector<float> q(size_t(total_q) * n_heads * hd), out(q.size(), NAN);
    for (float& x : q) x = 2.0f * u(rng);
    PagedDecodeParams p;
    p.q = q.data();
    p.out = out.data();
    p.cu_q = cu_q.data();
    p.n_seqs = 2;
    p.total_q = total_q;
    p.max_q_per_seq = 3;
    p.max_seq_len = 13;
    p.n_heads = n_heads;
    p.window = window;
    p.scale = 1.0f / std::sqrt(float(hd));
    p.softcap = softcap;
    p.sinks = with_sinks ? head_sinks.data() : nullptr;
    p.kv.k_pool = kpool.data();
    p.kv.v_pool = vpool.data();
    p.kv.k_type = KvType::F32;
    p.kv.v_type = KvType::F32;
    p.kv.block_tables = table.data();
    p.kv.max_blocks_per_seq = pages_per_seq;
    p.kv.seq_lens = lens.data();
    p.kv.block_size = bs;
    p.kv.n_kv_heads = n_kv;
    p.kv.head_dim = hd;
    paged_decode_attention_ref(p);
    for (int s = 0; s < 2; ++s) {
      // Sequence s's cache, contiguous: slots s * 16 ...
      const size_t row = size_t(n_kv) * hd;
      std::vector<float> k(kpool.begin() + s * 16 * row, kpool.begin() + (s + 1) * 16 * row);
      std::vector<float> v(vpool.begin() + s * 16 * row, vpool.begin() + (s + 1) * 16 * row);
      for (int i = 0; i < nq[s]; ++i) {
        const int pos = lens[s] - nq[s] + i;
        const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
        for (int h = 0; h < n_heads; ++h) {
          double want[hd];
          const size_t at = (size_t(cu_q[s] + i) * n_heads + h) * hd;
          dense_row(&q[at], k, v, n_kv, hd, h / (n_heads / n_kv), first, pos, p.scale, want, softcap,
                    with_sinks ? &head_sinks[size_t(h)] : nullptr);
          for (int j = 0; j < hd; ++j)
            EXPECT_NEAR(out[at + j], want[j], 1e-5) << "softcap " << softcap << " sinks " << with_sinks << " window "
                                                    << window << " seq " << s << " q " << i << " h " << h;
        }
      }
    }
  }
}

// The flash-decoding merge: states of random pieces (some empty) merged in
// any grouping give the softmax-weighted sum over the whole set.
TEST(PagedAttentionState, MergeMatchesWholeSet) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + int(rng() % 40), dim = 3;
    std::vector<float> s(n), v(size_t(n) * dim);
    for (float& x : s) x = nd(rng);
    for (float& x : v) x = nd(rng);
    // Whole set in double, base 2 as the kernels use.
    double mx = -INFINITY, den = 0, num[dim] = {0, 0, 0};
    for (float x : s) mx = std::max<double>(mx, x);
    for (int t = 0; t < n; ++t) {
      const double w = std::exp2(s[t] - mx);
      den += w;
      for (int j = 0; j < dim; ++j) num[j] += w * v[t * dim + j];
    }
    // Pieces at random cut points (an empty piece where two cuts meet).
    std::vector<int> cuts = {0, n};
    for (int c = 0; c < 4; ++c) cuts.push_back(int(rng() % (n + 1)));
    std::sort(cuts.begin(), cuts.end());
    float m = -INFINITY, d = 0, o[dim] = {0, 0, 0};
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      float pm = -INFINITY, pd = 0, po[dim] = {0, 0, 0};
      for (int t = cuts[c]; t < cuts[c + 1]; ++t) pm = std::max(pm, s[t]);
      for (int t = cuts[c]; t < cuts[c + 1]; ++t) {
        const float w = std::exp2(s[t] - pm);
        pd += w;
        for (int j = 0; j < dim; ++j) po[j] += w * v[t * dim + j];
      }
      float sa, sb;
      attn_state_merge(m, d, pm, pd, sa, sb);
      for (int j = 0; j < dim; ++j) o[j] = o[j] * sa + po[j] * sb;
      ASSERT_FALSE(std::isnan(m) || std::isnan(d)) << "trial " << trial;
    }
    EXPECT_FLOAT_EQ(m, float(mx));
    for (int j = 0; j < dim; ++j) EXPECT_NEAR(o[j] / d, num[j] / den, 1e-4 * (1 + std::fabs(num[j] / den)));
  }
  // Two empty states stay empty and NaN-free.
  float m = -INFINITY, d = 0, sa = -1, sb = -1;
  attn_state_merge(m, d, -INFINITY, 0.0f, sa, sb);
  EXPECT_EQ(m, -INFINITY);
  EXPECT_EQ(d, 0.0f);
  EXPECT_EQ(sb, 0.0f);
  EXPECT_FALSE(std::isnan(sa));
}

// ---------------------------------------------------------------- test cases

// One problem: sequences, query tokens, heads, page size, window, KV type;
// pools filled with random values (never zero), tables shuffled or
// contiguous. Host-side, shared by the CPU reference, the GPU tests and the
// bench's validation.
struct Case {
  std::vector<int> lens;   // keys per sequence
  std::vector<int> nq;     // query tokens per sequence (same size as lens)
  int n_heads = 32, n_kv = 8, hd = 128, bs = 16, window = 0;
  int max_seq_slack = 0;   // max_seq_len = max(lens) + slack
  KvType k_type = KvType::F16, v_type = KvType::F16;
  bool shuffle = true;
  bool stale_tail = false;  // slots past each sequence's length in its last page: NaN / inf / garbage (stale_tail_slots)
  float score_steps = 0;    // > 0: scores rise in steps of this / 4 along each sequence (step_scores)
  float softcap = 0;        // PagedDecodeParams::softcap
  bool sinks = false;       // PagedDecodeParams::sinks, one per head uniform in [sink_lo, sink_hi]
  float sink_lo = -2.0f, sink_hi = 4.0f;
  float q_gain = 1;         // q drawn from [-3, 3] * q_gain (scores ~q_gain in size)
  uint32_t seed = 1;
};

struct HostProblem {
  Case c;
  int n_pages = 0, max_blocks = 0, total_q = 0, max_q = 1, max_seq_len = 0;
  KvPoolLayout lk, lv;                 // page layouts of k_type, v_type (src/paged_kv.h)
  std::vector<uint8_t> kpool, vpool;   // [n_pages] pages of lk / lv
  std::vector<int32_t> tables;         // [n_seqs, max_blocks]
  std::vector<int32_t> cu_q;
  std::vector<float> q;                // [total_q, n_heads, hd]
  std::vector<float> sinks;            // [n_heads] when c.sinks, else empty

  // sk: the sinks where the params are read (host or device); unused without c.sinks.
  PagedDecodeParams params(const void* k, const void* v, const int32_t* tab, const int32_t* lens, const int32_t* cq,
                           const float* qp, float* out, const float* sk) const {
    PagedDecodeParams p;
    p.q = qp;
    p.out = out;
    p.cu_q = cq;
    p.n_seqs = int(c.lens.size());
    p.total_q = total_q;
    p.max_q_per_seq = max_q;
    p.max_seq_len = max_seq_len;
    p.n_heads = c.n_heads;
    p.window = c.window;
    p.scale = 1.0f / std::sqrt(float(c.hd));
    p.softcap = c.softcap;
    p.sinks = c.sinks ? sk : nullptr;
    p.kv.k_pool = k;
    p.kv.v_pool = v;
    p.kv.k_type = c.k_type;
    p.kv.v_type = c.v_type;
    p.kv.block_tables = tab;
    p.kv.max_blocks_per_seq = max_blocks;
    p.kv.seq_lens = lens;
    p.kv.block_size = c.bs;
    p.kv.n_kv_heads = c.n_kv;
    p.kv.head_dim = c.hd;
    return p;
  }
};

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A pool of n_pages pages of type t: every slot a row of random values
// (uniform in [-1, 1], drawn in slot order) encoded by kv_encode_row and put
// in the page layout (f16 and bf16 give the same bits as converting each value).
std::vector<uint8_t> random_pool(KvType t, const KvPoolLayout& l, int n_pages, int n_kv, int hd, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int row_elems = n_kv * hd;
  std::vector<uint8_t> pool(size_t(n_pages) * l.page), row(kv_row_bytes(t, row_elems, hd));
  std::vector<float> x(row_elems);
  for (int64_t slot = 0; slot < int64_t(n_pages) * l.block_size; ++slot) {
    for (float& v : x) v = u(rng);
    kv_encode_row(t, x.data(), row.data(), row_elems, hd);
    kv_pool_write_row(t, l, pool.data(), slot, row.data());
  }
  return pool;
}

// Writes NaN / inf / garbage into the slots past each sequence's length in
// its last page, K and V, quants and scales (a reused page's stale rows, or
// memory never written): f16 scales NaN, +-inf, 65504 and random bits, quant
// bytes 0x7f / 0xff (e4m3 NaN; int8 127, -1) and random bytes. The
// reference reads no key past a length; no kernel may let these rows into
// the output (the TMA kernel reads whole 16-slot rows of a page).
void stale_tail_slots(const Case& c, const std::vector<int32_t>& tables, int max_blocks, KvType t,
                      const KvPoolLayout& l, std::vector<uint8_t>& pool, std::mt19937& rng) {
  const uint16_t scales[] = {0x7e00, 0x7c00, 0xfc00, 0x7bff};
  const uint8_t quants[] = {0x7f, 0xff};
  for (size_t s = 0; s < c.lens.size(); ++s) {
    const int len = c.lens[s], bs = c.bs;
    if (len % bs == 0) continue;
    const int64_t page = tables[s * max_blocks + (len - 1) / bs];
    for (int r = len % bs; r < bs; ++r) {
      const int64_t slot = page * bs + r;
      uint8_t* q = pool.data() + l.quant_offset(slot);
      for (int64_t i = 0; i < l.q_row; ++i) q[i] = i % 3 == 2 ? uint8_t(rng()) : quants[(i + r) % 2];
      if (l.s_row == 0) continue;
      uint8_t* sc = pool.data() + l.scale_offset(slot);
      for (int64_t i = 0; i + 1 < l.s_row; i += 2) {
        const uint16_t x = (i / 2) % 5 == 4 ? uint16_t(rng()) : scales[(i / 2 + r) % 4];
        std::memcpy(sc + i, &x, 2);
      }
    }
  }
}

// Scores in steps (score_steps = D > 0, log2 units): q gets a common
// component along e = (1, ..., 1) / sqrt(hd) of every head, and the K rows of
// each sequence's fifth j (j = 0..4) one of -C_j e, so that the keys of
// fifth j score about -D (4 - j) / 4 (+ the usual +-6 of the random parts):
// the running max jumps by ~D / 4 four times mid-sequence (past the TMA kernel's
// lazy-max slack, kLazyMaxSlack, at D = 40) and creeps up in between.
// The keys that carry the weight in the end (the last fifth) are as
// large as the other tests' keys, so f16 operands cost the usual error.
constexpr float kStepQ = 10.0f;  // q's component along e
void step_scores(const Case& c, const std::vector<int32_t>& tables, int max_blocks, const KvPoolLayout& l,
                 std::vector<uint8_t>& pool, std::vector<float>& q, std::mt19937& rng) {
  const float e = 1.0f / std::sqrt(float(c.hd));
  for (float& x : q) x += kStepQ * e;
  // q.k = -kStepQ C for k = -C e: C_j = D (4 - j) / 4 / (kStepQ x the score scale log2(e) / sqrt(hd)).
  const float c_top = c.score_steps / (kStepQ * 1.4426950408889634f * e);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int row_elems = c.n_kv * c.hd;
  std::vector<float> x(row_elems);
  std::vector<uint8_t> row(kv_row_bytes(c.k_type, row_elems, c.hd));
  for (size_t s = 0; s < c.lens.size(); ++s)
    for (int pos = 0; pos < c.lens[s]; ++pos) {
      const int j = 5 * pos / c.lens[s];
      const float shift = -c_top * float(4 - j) / 4.0f * e;
      for (float& v : x) v = u(rng) + shift;
      kv_encode_row(c.k_type, x.data(), row.data(), row_elems, c.hd);
      kv_pool_write_row(c.k_type, l, pool.data(), int64_t(tables[s * max_blocks + pos / c.bs]) * c.bs + pos % c.bs,
                        row.data());
    }
}

HostProblem make_problem(const Case& c) {
  HostProblem hp;
  hp.c = c;
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int n = int(c.lens.size());
  int used = 0, max_len = 0;
  for (int s = 0; s < n; ++s) {
    used += ceil_div(c.lens[s], c.bs);
    max_len = std::max(max_len, c.lens[s]);
  }
  hp.max_seq_len = max_len + c.max_seq_slack;
  hp.max_blocks = ceil_div(hp.max_seq_len, c.bs) + 1;
  hp.n_pages = used + 3;  // spare pages hold random data nobody should read
  hp.lk = kv_pool_layout(c.k_type, c.bs, c.n_kv, c.hd);
  hp.lv = kv_pool_layout(c.v_type, c.bs, c.n_kv, c.hd);
  hp.kpool = random_pool(c.k_type, hp.lk, hp.n_pages, c.n_kv, c.hd, rng);
  hp.vpool = random_pool(c.v_type, hp.lv, hp.n_pages, c.n_kv, c.hd, rng);
  std::vector<int32_t> pages(hp.n_pages);
  std::iota(pages.begin(), pages.end(), 0);
  if (c.shuffle) std::shuffle(pages.begin(), pages.end(), rng);
  // Entries past a sequence's pages point far outside the pool: a read of
  // one would fault rather than pass unnoticed.
  hp.tables.assign(size_t(n) * hp.max_blocks, 0x3fffffff);
  int next = 0;
  for (int s = 0; s < n; ++s)
    for (int j = 0; j < ceil_div(c.lens[s], c.bs); ++j) hp.tables[size_t(s) * hp.max_blocks + j] = pages[next++];
  if (c.stale_tail) {
    stale_tail_slots(c, hp.tables, hp.max_blocks, c.k_type, hp.lk, hp.kpool, rng);
    stale_tail_slots(c, hp.tables, hp.max_blocks, c.v_type, hp.lv, hp.vpool, rng);
  }
  hp.cu_q = {0};
  for (int s = 0; s < n; ++s) {
    hp.cu_q.push_back(hp.cu_q.back() + c.nq[s]);
    hp.max_q = std::max(hp.max_q, c.nq[s]);
  }
  hp.total_q = hp.cu_q.back();
  hp.q.resize(size_t(hp.total_q) * c.n_heads * c.hd);
  for (float& x : hp.q) x = 3.0f * c.q_gain * u(rng);
  if (c.score_steps > 0) step_scores(c, hp.tables, hp.max_blocks, hp.lk, hp.kpool, hp.q, rng);
  if (c.sinks) {
    std::uniform_real_distribution<float> us(c.sink_lo, c.sink_hi);
    hp.sinks.resize(size_t(c.n_heads));
    for (float& x : hp.sinks) x = us(rng);
  }
  return hp;
}

// Gives `a` (same case, other page placement) b's page contents and q: the
// same sequences at a's page numbers.
void place_contents_of(const HostProblem& b, const Case& c, HostProblem& a) {
  const size_t kpage = a.lk.page, vpage = a.lv.page;
  for (size_t s = 0; s < c.lens.size(); ++s)
    for (int j = 0; j < ceil_div(c.lens[s], c.bs); ++j) {
      const size_t pa = a.tables[s * a.max_blocks + j], pb = b.tables[s * b.max_blocks + j];
      std::copy_n(&b.kpool[pb * kpage], kpage, &a.kpool[pa * kpage]);
      std::copy_n(&b.vpool[pb * vpage], vpage, &a.vpool[pa * vpage]);
    }
  a.q = b.q;
}

// The CPU reference over all sequences, one thread per slice of sequences.
// bf16 pools go to the reference as f32 (exact).
std::vector<float> reference(const HostProblem& hp) {
  std::vector<float> out(hp.q.size(), NAN);
  PagedDecodeParams p = hp.params(hp.kpool.data(), hp.vpool.data(), hp.tables.data(), hp.c.lens.data(),
                                  hp.cu_q.data(), hp.q.data(), out.data(), hp.sinks.data());
  const int n = p.n_seqs;
  const int n_threads = std::max(1, std::min<int>(n, int(std::thread::hardware_concurrency())));
  std::vector<std::thread> threads;
  for (int w = 0; w < n_threads; ++w) {
    threads.emplace_back([&, w] {
      for (int s = w; s < n; s += n_threads) {  // interleaved: lengths vary
        PagedDecodeParams sub = p;
        sub.n_seqs = 1;
        sub.cu_q = p.cu_q + s;
        sub.kv.seq_lens = p.kv.seq_lens + s;
        sub.kv.block_tables = p.kv.block_tables + size_t(s) * p.kv.max_blocks_per_seq;
        paged_decode_attention_ref(sub);
      }
    });
  }
  for (auto& th : threads) th.join();
  return out;
}

// One decode case per K/V type pair that reaches every kernel (f16 and
// bf16 pairs: mma_f16 at 64 / 128, simt at 256; quantized pairs: tma_sm90
// at 128 on sm_90, mma_quant_sm80, mma_sm80 at 256; mixed pairs:
// mma_sm80), head_dims 64, 128, 256 and each of `windows` (0: none), GQA
// 16/8 (n_kv_heads a multiple of 8 for tma_sm90), 1 or 2 query tokens;
// seeds from `seed` on, one per case.
std::vector<Case> kernel_grid(uint32_t seed, std::initializer_list<int> windows) {
  const std::pair<KvType, KvType> pairs[] = {{KvType::F16, KvType::F16},   {KvType::BF16, KvType::BF16},
                                             {KvType::Q8_0, KvType::Q8_0}, {KvType::Q4_0, KvType::Q4_0},
                                             {KvType::FP8, KvType::FP8},   {KvType::F16, KvType::Q8_0},
                                             {KvType::Q8_0, KvType::F16}};
  std::vector<Case> r;
  for (auto [kt, vt] : pairs)
    for (int hd : {64, 128, 256})
      for (int window : windows) {
        Case c;
        c.lens = {2, 17, 300, 1100};  // >= the query tokens
        c.nq.assign(c.lens.size(), 1 + int(seed % 2));
        c.n_heads = 16;
        c.n_kv = 8;
        c.hd = hd;
        c.window = window;
        c.k_type = kt;
        c.v_type = vt;
        c.seed = seed++;
        r.push_back(c);
      }
  return r;
}

// Soft-capped decode (PagedDecodeParams::softcap): kernel_grid with and
// without a window. A cap of 1 against scores of ~N(0, 1) bends most of them.
std::vector<Case> softcap_cases() {
  std::vector<Case> r = kernel_grid(1600, {0, 300});
  for (Case& c : r) c.softcap = 1.0f;
  return r;
}

// Gemma-2-like decode: head_dim 256, cap 50, GQA 2:1, a global layer and a
// sliding-window layer (4096) over sequences longer than the window, f16
// and q8_0 pools. q's gain of 6 puts the largest scores (~25) where the
// cap bends them.
std::vector<Case> gemma2_cases() {
  std::vector<Case> r;
  uint32_t seed = 1700;
  for (KvType t : {KvType::F16, KvType::Q8_0})
    for (int window : {0, 4096}) {
      Case c;
      c.lens = {3, 700, 5000};
      c.nq = {1, 2, 1};
      c.n_heads = 8;
      c.n_kv = 4;
      c.hd = 256;
      c.window = window;
      c.k_type = c.v_type = t;
      c.softcap = 50.0f;
      c.q_gain = 6.0f;
      c.seed = seed++;
      r.push_back(c);
    }
  return r;
}

// Decode with attention sinks (PagedDecodeParams::sinks, gpt-oss):
// kernel_grid, full and a 128-token sliding window (gpt-oss's); sinks in
// [-2, 4] against scores ~N(0, 1). Then sinks that dominate every row
// (e^8..e^10 against ~1100 keys' e^0.5), and sinks with a soft-cap.
std::vector<Case> sink_cases() {
  std::vector<Case> r = kernel_grid(1800, {0, 128});
  for (Case& c : r) c.sinks = true;
  uint32_t seed = 1800 + uint32_t(r.size());
  for (KvType t : {KvType::F16, KvType::Q8_0})
    for (int hd : {64, 128}) {
      Case c = r[0];
      c.k_type = c.v_type = t;
      c.hd = hd;
      c.sink_lo = 8.0f;
      c.sink_hi = 10.0f;
      c.seed = seed++;
      r.push_back(c);
      c.sink_lo = -2.0f;
      c.sink_hi = 4.0f;
      c.softcap = 1.0f;
      c.window = 128;
      c.seed = seed++;
      r.push_back(c);
    }
  return r;
}

// Worst per-row relative error ||out - ref|| / ||ref||; any non-finite value
// counts as infinite.
double worst_row_error(const std::vector<float>& out, const std::vector<float>& ref, int hd, std::string* where) {
  double worst = 0;
  for (size_t r = 0; r * hd < ref.size(); ++r) {
    double num = 0, den = 0;
    bool finite = true;
    for (int j = 0; j < hd; ++j) {
      const double o = out[r * hd + j], w = ref[r * hd + j];
      finite = finite && std::isfinite(o);
      num += (o - w) * (o - w);
      den += w * w;
    }
    const double e = finite ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY;
    if (e > worst) {
      worst = e;
      *where = "row " + std::to_string(r);
    }
  }
  return worst;
}

// The cap moves some row of the reference's output past the GPU tests'
// per-row bound (at most 3e-3, times q_gain on tensor cores, check_case) by
// more than 5x, so a kernel that ignored it would fail them. One case per
// head_dim and window (the types do not change the scores' size) and the
// Gemma cases.
TEST(PagedAttentionRef, SoftcapCasesAreSensitive) {
  std::vector<Case> cases;
  for (const Case& c : softcap_cases())
    if (c.k_type == KvType::F16 && c.v_type == KvType::F16) cases.push_back(c);
  for (const Case& c : gemma2_cases())
    if (c.k_type == KvType::F16) cases.push_back(c);
  for (Case c : cases) {
    const HostProblem capped = make_problem(c);
    c.softcap = 0;
    const HostProblem plain = make_problem(c);
    std::string where;
    EXPECT_GT(worst_row_error(reference(plain), reference(capped), c.hd, &where), 5 * 3e-3 * c.q_gain)
        << "hd " << c.hd << " window " << c.window << " q_gain " << c.q_gain;
  }
}

// The sinks move some row of the reference's output past the GPU tests'
// per-row bound (at most 3e-3 on tensor cores) by more than 5x, for every
// head_dim, window and sink range of sink_cases.
TEST(PagedAttentionRef, SinkCasesAreSensitive) {
  for (Case c : sink_cases()) {
    if (c.k_type != KvType::F16 || c.v_type != KvType::F16) continue;  // the types do not change the scores' size
    const HostProblem with = make_problem(c);
    c.sinks = false;
    const HostProblem without = make_problem(c);
    std::string where;
    EXPECT_GT(worst_row_error(reference(without), reference(with), c.hd, &where), 5 * 3e-3)
        << "hd " << c.hd << " window " << c.window << " sinks from " << c.sink_lo << " softcap " << c.softcap;
  }
}

// The reference's own paging: the same sequences in a shuffled and a
// contiguous table give the same output.
TEST(PagedAttentionRef, ShuffledTableMatchesContiguous) {
  Case c;
  c.lens = {1, 15, 16, 17, 40};
  c.nq = {1, 1, 2, 1, 3};
  c.n_heads = 4;
  c.n_kv = 2;
  c.hd = 8;
  c.bs = 8;
  c.seed = 3;
  HostProblem a = make_problem(c);
  c.shuffle = false;
  HostProblem b = make_problem(c);
  // Same pages, other placement: move b's page contents to a's places.
  place_contents_of(b, c, a);
  EXPECT_EQ(reference(a), reference(b));
}

// The reference over quantized pools (page layout of src/paged_kv.h) equals
// the reference over f32 pools holding the decoded values (kv_pool_read_row
// + kv_decode_row of every slot): the layout and the per-head decoding agree,
// for blocks of 32 and for the blocks of 16 and 8 of small heads.
TEST(PagedAttentionRef, QuantizedPoolsMatchDecodedF32) {
  for (int hd : {64, 16, 8}) {
    for (KvType kt : {KvType::Q8_0, KvType::Q4_0, KvType::FP8, KvType::BF16})
      for (KvType vt : {KvType::FP8, KvType::Q4_0, KvType::F16}) {
        Case c;
        c.lens = {1, 20, 77};
        c.nq = {1, 2, 1};
        c.n_heads = 8;
        c.n_kv = 2;
        c.hd = hd;
        c.bs = 16;
        c.window = kt == KvType::Q4_0 ? 30 : 0;
        c.k_type = kt;
        c.v_type = vt;
        c.seed = 40 + int(kt) * 5 + int(vt);
        HostProblem a = make_problem(c);
        HostProblem b = a;
        b.c.k_type = b.c.v_type = KvType::F32;
        b.lk = kv_pool_layout(KvType::F32, c.bs, c.n_kv, c.hd);
        b.lv = b.lk;
        const int row = c.n_kv * c.hd;
        b.kpool.assign(size_t(a.n_pages) * b.lk.page, 0);
        b.vpool.assign(b.kpool.size(), 0);
        std::vector<uint8_t> kr(kv_row_bytes(kt, row, c.hd)), vr(kv_row_bytes(vt, row, c.hd));
        for (int64_t slot = 0; slot < int64_t(a.n_pages) * c.bs; ++slot) {
          kv_pool_read_row(kt, a.lk, a.kpool.data(), slot, kr.data());
          kv_decode_row(kt, kr.data(), reinterpret_cast<float*>(b.kpool.data()) + slot * row, row, c.hd);
          kv_pool_read_row(vt, a.lv, a.vpool.data(), slot, vr.data());
          kv_decode_row(vt, vr.data(), reinterpret_cast<float*>(b.vpool.data()) + slot * row, row, c.hd);
        }
        EXPECT_EQ(reference(a), reference(b)) << kv_type_name(kt) << "/" << kv_type_name(vt) << " hd " << hd;
      }
  }
}

// kv_pool_write_row / kv_pool_read_row: a row survives the round trip, and
// rows of neighbouring slots (same page, next page) do not overlap (heads of
// 64: blocks of 32; heads of 16 and 8: blocks of their own size).
TEST(PagedAttentionRef, PoolRowRoundTrip) {
  for (int hd : {64, 16, 8}) {
    for (KvType t : {KvType::Q8_0, KvType::Q4_0, KvType::FP8, KvType::F16}) {
      const KvPoolLayout l = kv_pool_layout(t, 8, 3, hd);
      const int row = 3 * hd;
      std::vector<uint8_t> pool(size_t(3) * l.page, 0);
      std::vector<std::vector<uint8_t>> rows;
      std::mt19937 rng(9);
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      for (int slot = 0; slot < 24; ++slot) {
        std::vector<float> x(row);
        for (float& v : x) v = u(rng);
        rows.emplace_back(kv_row_bytes(t, row, hd));
        kv_encode_row(t, x.data(), rows.back().data(), row, hd);
        kv_pool_write_row(t, l, pool.data(), slot, rows.back().data());
      }
      std::vector<uint8_t> got(kv_row_bytes(t, row, hd));
      for (int slot = 0; slot < 24; ++slot) {
        kv_pool_read_row(t, l, pool.data(), slot, got.data());
        EXPECT_EQ(got, rows[slot]) << kv_type_name(t) << " hd " << hd << " slot " << slot;
      }
      EXPECT_EQ(l.page, 8 * (l.q_row + l.s_row));
      EXPECT_EQ(l.page % 16, 0) << "pages keep 16-byte alignment";
    }
  }
}

#ifdef RUNLM_CUDA
// ---------------------------------------------------------------- GPU

bool have_device(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    *why = std::string("no CUDA device") + (e != cudaSuccess ? std::string(": ") + cudaGetErrorString(e) : "");
    cudaGetLastError();
    return false;
  }
  return true;
}

#define REQUIRE_DEVICE()                       \
  do {                                         \
    std::string why_;                          \
    if (!have_device(&why_)) GTEST_SKIP() << why_; \
  } while (0)

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Compute capability 9.0 (the build's sm_90a code: the TMA kernel runs there).
bool device_is_sm90() {
  int dev = 0, major = 0, minor = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cc major");
  ck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cc minor");
  return major == 9 && minor == 0;
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { ck(cudaMalloc(&p, bytes ? bytes : 16), "cudaMalloc"); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
void upload(DevBuf& d, const std::vector<T>& h) {
  ck(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}

// A problem on the device.
struct DevProblem {
  const HostProblem& hp;
  size_t ws_bytes;
  DevBuf k, v, tables, lens, cu_q, q, out, ws, sinks;
  explicit DevProblem(const HostProblem& h)
      : hp(h),
        ws_bytes(paged_decode_workspace_bytes(int(h.c.lens.size()), h.total_q, h.c.n_heads, h.c.hd, h.max_seq_len)),
        k(h.kpool.size()),
        v(h.vpool.size()),
        tables(h.tables.size() * 4),
        lens(h.c.lens.size() * 4),
        cu_q(h.cu_q.size() * 4),
        q(h.q.size() * 4),
        out(h.q.size() * 4),
        ws(ws_bytes),
        sinks(h.sinks.size() * 4) {
    upload(k, h.kpool);
    upload(v, h.vpool);
    upload(tables, h.tables);
    upload(lens, h.c.lens);
    upload(cu_q, h.cu_q);
    upload(q, h.q);
    upload(sinks, h.sinks);
  }
  PagedDecodeParams params() const {
    return hp.params(k.p, v.p, tables.as<int32_t>(), lens.as<int32_t>(), cu_q.as<int32_t>(), q.as<float>(),
                     out.as<float>(), sinks.as<float>());
  }
  // Poisons out with NaN (all-ones bits), runs, and returns out.
  std::vector<float> run(int partition, DecodeKernel kernel = DecodeKernel::Auto) {
    ck(cudaMemset(out.p, 0xff, hp.q.size() * 4), "poison");
    paged_decode_attention(params(), ws.p, ws_bytes, nullptr, partition, kernel);
    ck(cudaGetLastError(), "launch");
    ck(cudaDeviceSynchronize(), "sync");
    std::vector<float> h(hp.q.size());
    ck(cudaMemcpy(h.data(), out.p, h.size() * 4, cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

std::string describe(const Case& c, int partition) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "n_seqs=%zu heads=%d/%d hd=%d bs=%d window=%d kv=%s/%s max_q=%d part=%d softcap=%g sinks=%s seed=%u",
                c.lens.size(), c.n_heads, c.n_kv, c.hd, c.bs, c.window, kv_type_name(c.k_type), kv_type_name(c.v_type),
                *std::max_element(c.nq.begin(), c.nq.end()), partition, double(c.softcap),
                c.sinks ? (std::to_string(c.sink_lo) + ".." + std::to_string(c.sink_hi)).c_str() : "none", c.seed);
  return buf;
}

// Per-row tolerance (relative, ||out - ref|| / ||ref||) of the kernel that
// runs these params. The SIMT kernel computes in fp32 from the same exact
// values as the reference: 1e-3. The tensor-core kernel (quantized K or V,
// paged_decode_uses_tensor_cores) rounds q and each probability (times its
// V block scale) to f16 before the products: 2^-11 relative each, at most.
// A score s = sum_i q_i k_i (log2 units) moves by at most
// 2^-11 sum_i |q_i k_i|; with these inputs (q uniform in [-3, 3] scaled by
// log2(e) / sqrt(hd), values in [-1, 1]) that sum is ~0.5-0.7 in expectation
// at every head_dim, so a score moves by ~3e-4 (2^ of it: the weight by
// ~2.4e-4), and each weight moves by another <= 2^-10 (two roundings). The
// row output sum_k w_k v_k / sum_k w_k then moves by these relative weight
// errors times ||v_k - o|| / ||o||, which for random values is ~1-3 (few
// keys: o is a mix of 1-3 rows; many keys: the errors average out like o
// does): ~1e-3 at the worst row. Hence 3e-3 on that path only.
// The f16 tensor-core kernel on bf16 pools rounds q to bf16 (2^-9
// relative a value, 4x f16's) and keeps P to ~2^-17 (hi + lo bf16 parts).
// The estimate of ~8e-4 for the weights was short: the test grid measured
// rows up to 4.0e-3 (H100), all of it q's rounding (f16 pools,
// same kernel, stay under 3e-3). So 6e-3 for bf16 on tensor cores: 1.5x the
// worst measured, under the ~1e-2 that bf16 attention is held to elsewhere.
double row_tolerance(const PagedDecodeParams& p, DecodeKernel kernel) {
  if (!decode_kernel_uses_tensor_cores(kernel)) return 1e-3;
  return p.kv.k_type == KvType::BF16 ? 6e-3 : 3e-3;
}

// The kernels a case runs on: every kernel with an instance for it on this
// device (the selector's pick, the ones it picks on other devices, and the
// SIMT kernel, which runs everything), each forced through the launch.
std::vector<DecodeKernel> kernels_for(const DevProblem& dp) { return decode_kernels_for(dp.params()); }

// q_gain > 1 scales the tensor-core kernels' bound with it: their f16
// rounding of q moves a score by a fixed fraction of its size.
void check_case(const Case& c, std::vector<int> partitions = {-1}) {
  const HostProblem hp = make_problem(c);
  const std::vector<float> ref = reference(hp);
  DevProblem dp(hp);
  for (DecodeKernel k : kernels_for(dp)) {
    const double tol = row_tolerance(dp.params(), k) * (decode_kernel_uses_tensor_cores(k) ? c.q_gain : 1.0f);
    for (int part : partitions) {
      const std::vector<float> out = dp.run(part, k);
      std::string where;
      const double err = worst_row_error(out, ref, c.hd, &where);
      EXPECT_LT(err, tol) << describe(c, part) << " (kernel " << decode_kernel_name(k) << ") at " << where;
    }
  }
}

Case make_case(std::vector<int> lens, int nq, int n_heads, int n_kv, int hd, int bs, int window, uint32_t seed) {
  Case c;
  c.nq.assign(lens.size(), nq);
  for (int& l : lens) l = std::max(l, nq);  // a sequence holds at least its query tokens
  c.lens = lens;
  c.n_heads = n_heads;
  c.n_kv = n_kv;
  c.hd = hd;
  c.bs = bs;
  c.window = window;
  c.seed = seed;
  return c;
}

const std::vector<int> kLens = {1, 15, 16, 17, 1000, 5000};

TEST(PagedAttention, LengthsBlockSizesHeadDims) {
  REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (int bs : {8, 16, 32, 256})
    for (int hd : {64, 128, 256}) check_case(make_case(kLens, 1, 32, 8, hd, bs, 0, seed++), {-1, 0, 256});
}

TEST(PagedAttention, HeadLayoutsQueryTokensWindow) {
  REQUIRE_DEVICE();
  uint32_t seed = 200;
  struct Heads {
    int n_heads, n_kv;
  };
  for (Heads h : {Heads{32, 8}, Heads{32, 1}, Heads{16, 16}, Heads{6, 2}})
    for (int nq : {1, 4})
      for (int window : {0, 300}) check_case(make_case({4, 17, 1000, 2500}, nq, h.n_heads, h.n_kv, 128, 16, window, seed++), {-1, 0, 256});
}

TEST(PagedAttention, BatchSizes) {
  REQUIRE_DEVICE();
  std::mt19937 rng(7);
  for (int batch : {1, 2, 7, 64}) {
    Case c;
    for (int s = 0; s < batch; ++s) {
      c.nq.push_back(1 + int(rng() % 4));
      c.lens.push_back(std::max(c.nq.back(), 1 + int(rng() % 3000)));
    }
    c.seed = 300 + batch;
    c.max_seq_slack = 37;  // the bound need not be tight
    check_case(c, {-1, 0, 512});
  }
}

TEST(PagedAttention, SmallHeadDims) {
  REQUIRE_DEVICE();
  uint32_t seed = 400;
  // stories260K: 8 heads, 4 KV heads, head_dim 8.
  for (int hd : {8, 16, 32})
    for (int nq : {1, 3}) check_case(make_case(kLens, nq, 8, 4, hd, 8, 0, seed++), {-1, 0, 256});
  check_case(make_case({1, 300, 700}, 2, 8, 4, 8, 16, 64, seed++), {-1, 0, 256});
}

TEST(PagedAttention, Bf16Pool) {
  REQUIRE_DEVICE();
  Case c = make_case(kLens, 2, 32, 8, 128, 16, 0, 500);
  c.k_type = c.v_type = KvType::BF16;
  check_case(c, {-1, 0, 256});
}

// Every (K, V) pair of GPU KV types against the reference over the
// same quantized pages (kv_encode_row of random values, page layout of
// src/paged_kv.h). The reference decodes each value exactly as the kernel
// does (an integer or e4m3 level times an f16 scale is exact in fp32), so
// on the SIMT kernel the only differences are fp32 summation order and
// ex2.approx: the f16 tolerance (1e-3 relative per row) holds for every
// type. Pairs on the tensor-core kernel also round q and P to f16:
// row_tolerance.
const KvType kGpuKvTypes[] = {KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q4_0, KvType::FP8};

TEST(PagedAttention, KvTypePairs) {
  REQUIRE_DEVICE();
  uint32_t seed = 1100;
  for (KvType kt : kGpuKvTypes)
    for (KvType vt : kGpuKvTypes) {
      // GQA 32/8 (4 rows a CTA, 8 with 2 query tokens), several pages, lengths
      // off the page grid, split on and off, a window on every other pair.
      Case c = make_case({1, 17, 300, 2100}, 1 + seed % 2, 32, 8, 128, 16, seed % 2 ? 0 : 300, seed);
      c.k_type = kt;
      c.v_type = vt;
      check_case(c, {-1, 0, 256});
      ++seed;
    }
}

// Scores that rise in steps of ~10 (log2 units) mid-sequence, past
// the TMA kernel's lazy-max slack (step_scores: the running max jumps, O and d
// are rescaled then), and creep up by less in between (probabilities above 1
// until the next jump), with 1 and 2 query tokens, split and not, every
// tensor-core kernel, against the reference.
TEST(PagedAttention, RisingScoresRescaleMidSequence) {
  REQUIRE_DEVICE();
  uint32_t seed = 1150;
  const std::pair<KvType, KvType> pairs[] = {{KvType::Q4_0, KvType::Q4_0},
                                             {KvType::Q8_0, KvType::Q8_0},
                                             {KvType::FP8, KvType::Q4_0},
                                             {KvType::F16, KvType::F16}};
  for (auto [kt, vt] : pairs)
    for (int nq : {1, 2}) {
      Case c = make_case({17, 300, 2100}, nq, 32, 8, 128, 16, 0, seed++);
      c.k_type = kt;
      c.v_type = vt;
      c.score_steps = 40.0f;
      check_case(c, {-1, 0, 256});
    }
}

TEST(PagedAttention, KvTypeHeadDimsRowsPages) {
  REQUIRE_DEVICE();
  uint32_t seed = 1200;
  struct Heads {
    int n_heads, n_kv;
  };
  const std::pair<KvType, KvType> pairs[] = {{KvType::Q8_0, KvType::Q8_0},
                                             {KvType::Q4_0, KvType::Q4_0},
                                             {KvType::FP8, KvType::FP8},
                                             {KvType::Q8_0, KvType::Q4_0},
                                             {KvType::F16, KvType::FP8}};
  for (auto [kt, vt] : pairs)
    for (int hd : {32, 64, 256})
      for (Heads h : {Heads{8, 8}, Heads{16, 8}, Heads{32, 2}}) {  // 1, 2, 8 rows a CTA
        Case c = make_case({5, 33, 1000}, 1, h.n_heads, h.n_kv, hd, hd == 64 ? 8 : 32, hd == 32 ? 100 : 0, seed++);
        c.k_type = kt;
        c.v_type = vt;
        check_case(c, {-1, 0, 256});
      }
}

// The tensor-core kernels (mma_sm80, mma_quant_sm80): every pair they take (K
// and V in f16, q8_0, q4_0, fp8, at least one quantized) at head_dim 64,
// 128, 256, with 1, 2 and 4 query tokens a sequence over GQA 32/8 (4, 8, 16
// rows: one or two row chunks) and MHA 8/8 (1, 2, 4 rows of 8), pages of 16,
// 64 and 8 (a 16-key tile then spans two pages),
// lengths that cross pages and 256-key partitions, window 300 on and off,
// split auto / none / 256. Each run poisons the output with NaN first
// (DevProblem::run), pools and q are random (never zero).
TEST(PagedAttention, TensorCorePairsHeadDimsRows) {
  REQUIRE_DEVICE();
  const KvType types[] = {KvType::F16, KvType::Q8_0, KvType::Q4_0, KvType::FP8};
  struct Heads {
    int n_heads, n_kv;
  };
  uint32_t seed = 1300;
  int n = 0;
  for (KvType kt : types)
    for (KvType vt : types) {
      if (kt == KvType::F16 && vt == KvType::F16) continue;  // the SIMT kernel's pair
      for (int hd : {64, 128, 256})
        for (int nq : {1, 2, 4}) {
          // Heads, page size and window cycle so that every pair and head_dim
          // meets each of them (n counts the cases).
          const Heads h = n % 2 ? Heads{8, 8} : Heads{32, 8};
          const int bs = (n / 2) % 3 == 0 ? 16 : (n / 2) % 3 == 1 ? 64 : 8;
          const int window = (n / 4) % 2 ? 300 : 0;
          ++n;
          Case c = make_case({1, 17, 300, 1100}, nq, h.n_heads, h.n_kv, hd, bs, window, seed++);
          c.k_type = kt;
          c.v_type = vt;
          {
            const HostProblem hp = make_problem(c);
            DevProblem dp(hp);
            ASSERT_TRUE(paged_decode_uses_tensor_cores(dp.params())) << describe(c, -1);
          }
          check_case(c, {-1, 0, 256});
        }
    }
}

// The f16 tensor-core kernel (mma_f16: f16/f16 and bf16/bf16 pools):
// head_dim 64 and 128, 1, 2, 4 and 16 query tokens over GQA 32/8 (4 to 64
// rows: up to 8 row chunks) and MHA 8/8, pages of 8, 16 and 64, lengths
// that cross pages, 16-key tiles and 256-key partitions, window 300 and
// 17 (ends inside a tile) on and off, split auto / none / 256.
TEST(PagedAttention, PlainTensorCoreHeadDimsRowsPages) {
  REQUIRE_DEVICE();
  struct Heads {
    int n_heads, n_kv;
  };
  uint32_t seed = 1400;
  int n = 0;
  for (KvType t : {KvType::F16, KvType::BF16})
    for (int hd : {64, 128})
      for (int nq : {1, 2, 4, 16}) {
        const Heads h = n % 2 ? Heads{8, 8} : Heads{32, 8};
        const int bs = (n / 2) % 3 == 0 ? 16 : (n / 2) % 3 == 1 ? 64 : 8;
        const int window = (n / 3) % 3 == 0 ? 0 : (n / 3) % 3 == 1 ? 300 : 17;
        ++n;
        Case c = make_case({1, 17, 300, 1100}, nq, h.n_heads, h.n_kv, hd, bs, window, seed++);
        c.k_type = c.v_type = t;
        {
          const HostProblem hp = make_problem(c);
          DevProblem dp(hp);
          EXPECT_EQ(select_decode_kernel(dp.params()).kernel, DecodeKernel::MmaF16) << describe(c, -1);
        }
        check_case(c, {-1, 0, 256});
      }
}

// The TMA kernel's cases (K and V both q8_0 or fp8, hd 128, pages of 16 and
// 64; pairs with q4_0 at GQA 32/8) with NaN / inf / garbage in the slots
// past each sequence's length in its last page (Case::stale_tail; lengths 1,
// 17, 300, 1100 and 4100 end inside a page, 16-key tile and 256-key
// partition), every kernel; windows 0, 17 (ends inside a tile) and 300;
// split auto / none / 256; GQA 32/8 (4 rows a CTA at 1 token, 8 at 2; the
// TMA kernel runs) and 8/2 (the last KV head's scale box reads past the
// scale row: TMA's zero fill), and 6/3 (odd n_kv: mma_quant_sm80 runs).
TEST(PagedAttention, TensorCoreStaleTailSlots) {
  REQUIRE_DEVICE();
  struct Heads {
    int n_heads, n_kv;
  };
  const KvType types[] = {KvType::Q8_0, KvType::FP8, KvType::Q4_0};
  uint32_t seed = 1500;
  int n = 0;
  for (KvType kt : types)
    for (KvType vt : types)
      for (int bs : {16, 64})
        for (Heads h : {Heads{32, 8}, Heads{8, 2}, Heads{6, 3}}) {
          const bool q4 = kt == KvType::Q4_0 || vt == KvType::Q4_0;
          if (q4 && h.n_kv != 8) continue;  // q4_0 pairs: the TMA kernel's case only
          const int window = n % 3 == 0 ? 0 : n % 3 == 1 ? 17 : 300;
          const int nq = 1 + (n / 3) % 2;
          ++n;
          Case c = make_case({1, 17, 300, 1100, 4100}, nq, h.n_heads, h.n_kv, 128, bs, window, seed++);
          c.k_type = kt;
          c.v_type = vt;
          c.stale_tail = true;
          {  // the TMA kernel runs where it applies (an sm_90 device, n_kv a multiple of 8), else mma_quant_sm80
            const HostProblem hp = make_problem(c);
            DevProblem dp(hp);
            const DecodeKernel want =
                h.n_kv % 8 == 0 && device_is_sm90() ? DecodeKernel::TmaSm90 : DecodeKernel::MmaQuantSm80;
            EXPECT_EQ(select_decode_kernel(dp.params()).kernel, want) << describe(c, -1);
          }
          check_case(c, {-1, 0, 256});
        }
}

TEST(PagedAttention, WindowEdges) {
  REQUIRE_DEVICE();
  uint32_t seed = 600;
  for (int window : {1, 16, 17, 5000, 6000})
    for (int nq : {1, 4}) check_case(make_case(kLens, nq, 32, 8, 128, 16, window, seed++), {-1, 0, 256});
}

// WindowEdges on the tensor-core kernel (q8_0 K, q4_0 V), every version:
// windows that end inside or at the edge of a 16-key tile, and past the
// sequence.
TEST(PagedAttention, TensorCoreWindowEdges) {
  REQUIRE_DEVICE();
  uint32_t seed = 650;
  for (int window : {1, 16, 17, 5000, 6000})
    for (int nq : {1, 4}) {
      Case c = make_case(kLens, nq, 32, 8, 128, 16, window, seed++);
      c.k_type = KvType::Q8_0;
      c.v_type = KvType::Q4_0;
      check_case(c, {-1, 0, 256});
    }
}

// Shuffled and contiguous tables over the same page contents give bitwise
// equal outputs: the kernel's arithmetic does not depend on where pages sit.
TEST(PagedAttention, ShuffledEqualsContiguous) {
  REQUIRE_DEVICE();
  Case c = make_case(kLens, 1, 32, 8, 128, 16, 0, 700);
  HostProblem a = make_problem(c);
  c.shuffle = false;
  HostProblem b = make_problem(c);
  place_contents_of(b, c, a);
  DevProblem da(a), db(b);
  for (DecodeKernel k : kernels_for(da))
    for (int part : {-1, 0, 256})
      EXPECT_EQ(da.run(part, k), db.run(part, k)) << "partition " << part << " kernel " << decode_kernel_name(k);
}

// A graph captured once replays for new device-side lengths within the bounds.
TEST(PagedAttention, GraphReplaysNewLengths) {
  REQUIRE_DEVICE();
  // Pages for 3000 keys in every sequence; the replays use shorter lengths.
  Case c = make_case({3000, 3000, 3000}, 1, 32, 8, 128, 16, 0, 800);
  HostProblem hp = make_problem(c);
  DevProblem dp(hp);
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  for (DecodeKernel k : kernels_for(dp)) {  // each kernel, captured
    hp.c.lens = c.lens;
    upload(dp.lens, c.lens);
    cudaGraph_t graph;
    ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "begin capture");
    paged_decode_attention(dp.params(), dp.ws.p, dp.ws_bytes, st, -1, k);
    ck(cudaStreamEndCapture(st, &graph), "end capture");
    cudaGraphExec_t exec;
    ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    for (const std::vector<int>& lens : {std::vector<int>{3000, 17, 900}, std::vector<int>{1, 2999, 16}}) {
      hp.c.lens = lens;
      upload(dp.lens, lens);
      ck(cudaMemset(dp.out.p, 0xff, hp.q.size() * 4), "poison");
      ck(cudaGraphLaunch(exec, st), "replay");
      ck(cudaStreamSynchronize(st), "sync");
      std::vector<float> out(hp.q.size());
      ck(cudaMemcpy(out.data(), dp.out.p, out.size() * 4, cudaMemcpyDeviceToHost), "download");
      const std::vector<float> ref = reference(hp);
      std::string where;
      EXPECT_LT(worst_row_error(out, ref, c.hd, &where), row_tolerance(dp.params(), k))
          << "lens " << lens[0] << "," << lens[1] << " kernel " << decode_kernel_name(k) << " at " << where;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(st);
}

// A length past max_seq_len (or shorter than its query tokens) makes NaN
// rows for that sequence only; the others are unaffected.
TEST(PagedAttention, OutOfBoundLengthsGiveNaNRows) {
  REQUIRE_DEVICE();
  Case c = make_case({600, 50, 70}, 2, 8, 4, 64, 16, 0, 900);
  HostProblem hp = make_problem(c);
  const std::vector<float> ref = reference(hp);
  DevProblem dp(hp);
  for (DecodeKernel k : kernels_for(dp))  // the SIMT kernel and mma_f16 (f16, hd 64)
  for (int part : {0, 256}) {
    // Elementwise: the row tolerance's share of a value (|out| <= 1 here).
    const double tol = decode_kernel_uses_tensor_cores(k) ? 3e-3 : 1e-3;
    for (int which : {0, 1}) {
      std::vector<int> lens = hp.c.lens;
      PagedDecodeParams p = dp.params();
      if (which == 0) lens[1] = 1;        // 1 key < 2 query tokens
      if (which == 1) p.max_seq_len = 599;  // sequence 0 (600 keys) breaks the bound
      const int bad_seq = which == 0 ? 1 : 0;
      upload(dp.lens, lens);
      // A finite poison: NaN must be written for the bad rows, not left.
      ck(cudaMemset(dp.out.p, 0x7f, hp.q.size() * 4), "poison");
      paged_decode_attention(p, dp.ws.p, dp.ws_bytes, nullptr, part);
      ck(cudaDeviceSynchronize(), "sync");
      std::vector<float> out(hp.q.size());
      ck(cudaMemcpy(out.data(), dp.out.p, out.size() * 4, cudaMemcpyDeviceToHost), "download");
      const size_t row = size_t(c.n_heads) * c.hd;
      for (int s = 0; s < 3; ++s)
        for (size_t i = hp.cu_q[s] * row; i < hp.cu_q[s + 1] * row; ++i) {
          if (s == bad_seq)
            ASSERT_TRUE(std::isnan(out[i])) << "part " << part << " seq " << s << " elem " << i;
          else
            ASSERT_NEAR(out[i], ref[i], tol * (1 + std::fabs(ref[i]))) << "part " << part << " seq " << s
                                                                        << " kernel " << decode_kernel_name(k);
        }
    }
    upload(dp.lens, hp.c.lens);
  }
}

// Soft-cap on every kernel the case runs on (check_case forces each),
// split and not, outputs poisoned, against the soft-capped reference.
TEST(PagedAttention, SoftcapKernelsTypesHeadDimsWindow) {
  REQUIRE_DEVICE();
  for (const Case& c : softcap_cases()) check_case(c, {-1, 0, 256});
}

// Sinks on every kernel the case runs on (check_case forces each), split
// (the combine joins the sink) and not (the kernel's own store does),
// outputs poisoned, against the reference with sinks.
TEST(PagedAttention, SinksKernelsTypesHeadDimsWindow) {
  REQUIRE_DEVICE();
  for (const Case& c : sink_cases()) check_case(c, {-1, 0, 256});
}

// The Gemma-2-like layers (gemma2_cases) on every kernel that runs them,
// and what the selector picks for them: tma_sm90 and mma_quant_sm80 do not
// take head_dim 256, nor mma_f16; the reason names them and the kernel run
// instead.
TEST(PagedAttention, Gemma2LikeLayers) {
  REQUIRE_DEVICE();
  for (const Case& c : gemma2_cases()) {
    check_case(c, {-1, 0});
    const HostProblem hp = make_problem(c);
    DevProblem dp(hp);
    const DecodeKernelChoice ch = select_decode_kernel(dp.params());
    if (c.k_type == KvType::Q8_0) {
      EXPECT_EQ(ch.kernel, DecodeKernel::MmaSm80);
      EXPECT_NE(std::string(ch.reason).find("head_dim 256 unsupported -> mma_sm80"), std::string::npos) << ch.reason;
      EXPECT_NE(std::string(ch.reason).find("tma_sm90"), std::string::npos) << ch.reason;
    } else {
      EXPECT_EQ(ch.kernel, DecodeKernel::Simt);
      EXPECT_STREQ(ch.reason, "mma_f16 (head_dim 64, 128): head_dim 256 unsupported -> simt");
    }
  }
}

TEST(PagedAttention, UnsupportedParamsThrow) {
  REQUIRE_DEVICE();
  Case c = make_case({40}, 1, 8, 4, 64, 16, 0, 1000);
  HostProblem hp = make_problem(c);
  DevProblem dp(hp);
  auto expect_error = [&](PagedDecodeParams p, const char* needle, size_t ws_bytes, int part) {
    try {
      paged_decode_attention(p, dp.ws.p, ws_bytes, nullptr, part);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PagedDecodeParams p = dp.params();
  p.kv.head_dim = 96;
  expect_error(p, "head_dim=96", dp.ws_bytes, -1);
  p = dp.params();
  p.kv.block_size = 12;
  expect_error(p, "block_size=12", dp.ws_bytes, -1);
  p.kv.block_size = 512;
  expect_error(p, "block_size=512", dp.ws_bytes, -1);
  p = dp.params();
  p.kv.k_type = KvType::F32;
  expect_error(p, "kv type f32", dp.ws_bytes, -1);
  p = dp.params();
  p.kv.v_type = KvType::Q8_0;
  p.kv.head_dim = 16;
  expect_error(p, "head_dim=16 with kv K=f16 V=q8_0", dp.ws_bytes, -1);
  p = dp.params();
  p.n_heads = 6;
  expect_error(p, "n_heads=6", dp.ws_bytes, -1);
  for (float bad : {-1.0f, NAN, INFINITY}) {
    p = dp.params();
    p.softcap = bad;
    expect_error(p, "paged_decode_attention: softcap=", dp.ws_bytes, -1);
  }
  p = dp.params();
  expect_error(p, "partition_size=100", dp.ws_bytes, 100);
  p.max_seq_len = 4096;  // 16 partitions of 256 need room
  p.kv.max_blocks_per_seq = 4096 / 16;
  expect_error(p, "workspace", 0, 256);
}

#endif  // RUNLM_CUDA

}  // namespace
