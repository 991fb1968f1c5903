// runlm bench-attn: the FlashAttention-3 paper's forward sweep. 16k tokens in
// all (batch = total / seqlen), hidden 2048 (n_heads = hidden / head_dim),
// bf16, causal and not. Each backend is first checked on sampled rows
// against the CPU reference (float64), then timed with CUDA events (warm-up,
// median of repeats). FLOPs = 4 * batch * heads * seqlen^2 * head_dim, halved
// for causal. Prints a table, or one JSON object per line with -o json.
// --block-size N reads K and V as paged pools (AttnParams' paged mode): the
// same rows scattered over pages of N keys in a shuffled order, one block
// table per shape; 0 (default) is the contiguous layout. --softcap X times
// the attention logit soft-cap (Gemma 2: 50): every score s becomes
// X * tanh(s / X); the reference rows apply it too.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cxxopts.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention.h"
#include "commands.h"
#include "cli_common.h"
#include "cuda_bench.h"
#include "common.h"
#include "cpu/attention_ref.h"
#include "dtype.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>
#endif

namespace runlm {

namespace {

std::vector<int> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      r.push_back(std::stoi(item, &used));
      RUNLM_CHECK(used == item.size(), "bench-attn: %s: '%s' is not an integer", flag, item.c_str());
    } catch (const std::logic_error&) {
      fail("bench-attn: %s: '%s' is not an integer", flag, item.c_str());
    }
  }
  RUNLM_CHECK(!r.empty(), "bench-attn: %s is empty", flag);
  return r;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) r.push_back(item);
  return r;
}

#ifdef RUNLM_CUDA
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench-attn: %s: %s", what, cudaGetErrorString(e));
}

struct Shape {
  int hdim, seqlen, batch, heads;
  bool causal;
  double flops() const { return 4.0 * batch * heads * double(seqlen) * seqlen * hdim / (causal ? 2 : 1); }
};
#endif

}  // namespace

int cmd_bench_attn(int argc, char** argv) {
  cxxopts::Options opts("runlm bench-attn", "Prefill attention sweep (FlashAttention-3 paper shapes), TFLOP/s per backend");
  opts.add_options()
      ("attn", "backends, comma separated (naive,fa2,fa3,auto)", cxxopts::value<std::string>()->default_value("fa2,fa3"))
      ("hdim", "head dims", cxxopts::value<std::string>()->default_value("64,128,256"))
      ("seqlen", "sequence lengths", cxxopts::value<std::string>()->default_value("512,1024,2048,4096,8192,16384"))
      ("causal", "causal modes: 0, 1 or 0,1", cxxopts::value<std::string>()->default_value("0,1"))
      ("total", "total tokens (batch = total / seqlen)", cxxopts::value<int>()->default_value("16384"))
      ("hidden", "hidden size (heads = hidden / hdim)", cxxopts::value<int>()->default_value("2048"))
      ("dtype", "bf16 or f16", cxxopts::value<std::string>()->default_value("bf16"))
      ("r,repeats", "timed repeats (median reported)", cxxopts::value<int>()->default_value("10"))
      ("o,output", "table or json", cxxopts::value<std::string>()->default_value("table"))
      ("block-size", "paged K/V with pages of this many keys (0 = contiguous)", cxxopts::value<int>()->default_value("0"))
      ("softcap", "attention logit soft-cap (0 = none; Gemma 2: 50)", cxxopts::value<float>()->default_value("0"))
      ("h,help", "show help");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  std::vector<AttnBackend> backends;
  for (const std::string& n : split(args["attn"].as<std::string>())) backends.push_back(attn_backend_from_name(n));
  RUNLM_CHECK(!backends.empty(), "bench-attn: --attn is empty");
  const std::vector<int> hdims = parse_int_list(args["hdim"].as<std::string>(), "--hdim");
  const std::vector<int> seqlens = parse_int_list(args["seqlen"].as<std::string>(), "--seqlen");
  const std::vector<int> causals = parse_int_list(args["causal"].as<std::string>(), "--causal");
  const int total = args["total"].as<int>(), hidden = args["hidden"].as<int>(), repeats = args["repeats"].as<int>();
  const std::string out_fmt = args["output"].as<std::string>();
  const DType dtype = dtype_from_name(args["dtype"].as<std::string>());
  RUNLM_CHECK(out_fmt == "table" || out_fmt == "json", "bench-attn: -o %s unknown; supported: table, json",
              out_fmt.c_str());
  RUNLM_CHECK(dtype == DType::BF16 || dtype == DType::F16, "bench-attn: --dtype %s unsupported; supported: bf16, f16",
              dtype_name(dtype));
  RUNLM_CHECK(repeats >= 1 && total >= 1 && hidden >= 1, "bench-attn: -r, --total and --hidden must be >= 1");
  for (int c : causals) RUNLM_CHECK(c == 0 || c == 1, "bench-attn: --causal %d unknown; supported: 0, 1", c);
  for (int d : hdims)
    RUNLM_CHECK(d >= 1 && hidden % d == 0, "bench-attn: --hdim %d does not divide --hidden %d", d, hidden);
  for (int s : seqlens) RUNLM_CHECK(s >= 1 && s <= total, "bench-attn: --seqlen %d must be in 1..%d", s, total);
  const float softcap = args["softcap"].as<float>();
  RUNLM_CHECK(softcap >= 0.0f && std::isfinite(softcap), "bench-attn: --softcap %g must be 0 (none) or finite and > 0",
              softcap);
  const int block_size = args["block-size"].as<int>();
  RUNLM_CHECK(block_size >= 0, "bench-attn: --block-size %d must be >= 0", block_size);
  for (int s : seqlens)
    RUNLM_CHECK(block_size == 0 || s % block_size == 0, "bench-attn: --seqlen %d is not a multiple of --block-size %d",
                s, block_size);

#ifndef RUNLM_CUDA
  fail("bench-attn: runlm was built without CUDA");
#else
  int dev = 0;
  cudaDeviceProp prop{};
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");

  // One set of inputs serves every shape: q, k and v are always
  // [batch * seqlen, heads, hdim] = [<= total, hidden] elements. Uniform
  // values of variance 1, rounded to the dtype; host float copies feed the
  // CPU reference.
  const size_t n = size_t(total) * hidden;
  std::vector<float> hq(n), hk(n), hv(n);
  std::vector<uint16_t> bits(n);
  DevMem dq(n * 2), dk(n * 2), dv(n * 2), dout(n * 2);
  std::mt19937_64 rng(12345);
  const double lim = std::sqrt(3.0);
  const std::pair<std::vector<float>*, void*> sets[] = {{&hq, dq.p}, {&hk, dk.p}, {&hv, dv.p}};
  for (const auto& [host, devp] : sets) {
    for (size_t i = 0; i < n; ++i) {
      const float x = float((double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * lim);
      bits[i] = dtype == DType::BF16 ? fp32_to_bf16(x) : fp32_to_fp16(x);
      (*host)[i] = dtype == DType::BF16 ? bf16_to_fp32(bits[i]) : fp16_to_fp32(bits[i]);
    }
    ck(cudaMemcpy(devp, bits.data(), n * 2, cudaMemcpyHostToDevice), "upload inputs");
  }
  // Paged: token row g of K and V moves to slot page_of[g / bs] * bs + g % bs
  // of pools of the same size; every shape's sequences cover rows
  // [0, batch * seqlen), so one scatter serves them all.
  const int n_pages = block_size > 0 ? (total + block_size - 1) / block_size : 0;
  std::vector<int32_t> page_of(n_pages);
  DevMem dpk(block_size > 0 ? size_t(n_pages) * block_size * hidden * 2 : 1);
  DevMem dpv(block_size > 0 ? size_t(n_pages) * block_size * hidden * 2 : 1);
  if (block_size > 0) {
    for (int i = 0; i < n_pages; ++i) page_of[i] = i;
    std::shuffle(page_of.begin(), page_of.end(), std::mt19937(777));
    const std::pair<const void*, void*> kv[] = {{dk.p, dpk.p}, {dv.p, dpv.p}};
    const size_t row = size_t(hidden) * 2;  // bytes of one token row
    for (const auto& [src, dst] : kv)
      for (int g0 = 0; g0 < total; g0 += block_size) {
        const int rows = std::min(block_size, total - g0);
        ck(cudaMemcpy(static_cast<char*>(dst) + size_t(page_of[g0 / block_size]) * block_size * row,
                      static_cast<const char*>(src) + size_t(g0) * row, rows * row, cudaMemcpyDeviceToDevice),
           "scatter pages");
      }
  }
  DevMem dtab(size_t(std::max(n_pages, 1)) * 4);
  DevMem dcu(size_t(total + 1) * 4);
  cudaEvent_t ev0, ev1;
  ck(cudaEventCreate(&ev0), "cudaEventCreate");
  ck(cudaEventCreate(&ev1), "cudaEventCreate");

  const bool json = out_fmt == "json";
  if (!json) {
    std::printf("bench-attn on %s (sm_%d%d), %s, %d tokens, hidden %d, median of %d, K/V %s (block size %d)\n",
                prop.name, prop.major, prop.minor, dtype_name(dtype), total, hidden, repeats,
                block_size > 0 ? "paged" : "contiguous", block_size);
    std::printf("%-6s %5s %6s %5s %5s %-7s %9s %9s %9s\n", "hdim", "seq", "batch", "heads", "caus", "backend", "ms",
                "TFLOP/s", "rel_err");
  }
  int failures = 0;
  std::vector<uint16_t> got(n);
  for (int hd : hdims) {
    for (int seq : seqlens) {
      for (int causal : causals) {
        Shape sh{hd, seq, std::max(1, total / seq), hidden / hd, causal != 0};
        std::vector<int32_t> cu(sh.batch + 1);
        for (int b = 0; b <= sh.batch; ++b) cu[b] = b * seq;
        ck(cudaMemcpy(dcu.p, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), "upload cu_seqlens");
        AttnParams p;
        p.q = dq.p;
        p.k = dk.p;
        p.v = dv.p;
        p.out = dout.p;
        p.cu_seqlens_q = p.cu_seqlens_k = static_cast<const int32_t*>(dcu.p);
        p.batch = sh.batch;
        p.total_q = p.total_k = sh.batch * seq;
        p.max_seqlen_q = p.max_seqlen_k = seq;
        p.n_heads = p.n_kv_heads = sh.heads;
        p.head_dim = hd;
        p.dtype = dtype;
        p.causal = sh.causal;
        p.scale = 1.0f / std::sqrt(float(hd));
        p.softcap = softcap;
        if (block_size > 0) {
          // Sequence b's key j is token row b * seq + j (seq is a multiple of block_size).
          const int per_seq = seq / block_size;
          std::vector<int32_t> tables(size_t(sh.batch) * per_seq);
          for (int b = 0; b < sh.batch; ++b)
            for (int i = 0; i < per_seq; ++i) tables[size_t(b) * per_seq + i] = page_of[b * per_seq + i];
          ck(cudaMemcpy(dtab.p, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice), "upload block tables");
          p.k = dpk.p;
          p.v = dpv.p;
          p.block_tables = static_cast<const int32_t*>(dtab.p);
          p.max_blocks_per_seq = per_seq;
          p.block_size = block_size;
          p.num_pages = n_pages;
        }

        // Reference rows: a fixed sample that includes the first and last rows.
        AttnRefParams r;
        r.q = hq.data();
        r.k = hk.data();
        r.v = hv.data();
        r.cu_seqlens_q = r.cu_seqlens_k = cu.data();
        r.batch = sh.batch;
        r.n_heads = r.n_kv_heads = sh.heads;
        r.head_dim = hd;
        r.causal = sh.causal;
        r.scale = p.scale;
        r.softcap = softcap;
        std::vector<std::pair<int64_t, int>> rows = {{0, 0}, {p.total_q - 1, sh.heads - 1}};
        std::mt19937 pick(uint32_t(hd * 131 + seq * 7 + causal));
        while (rows.size() < 24) rows.push_back({int64_t(pick() % uint32_t(p.total_q)), int(pick() % uint32_t(sh.heads))});
        std::vector<float> ref(rows.size() * hd);
        for (size_t i = 0; i < rows.size(); ++i) attention_ref_row(r, rows[i].first, rows[i].second, &ref[i * hd], nullptr);

        for (AttnBackend be : backends) {
          const char* name = attn_backend_name(be);
          auto report = [&](double ms, double err, const char* status) {
            const double tflops = ms > 0 ? sh.flops() / (ms * 1e-3) / 1e12 : 0.0;
            if (json) {
              std::printf(
                  "{\"what\": \"bench-attn\", \"backend\": \"%s\", \"hdim\": %d, \"seqlen\": %d, \"batch\": %d, "
                  "\"heads\": %d, \"causal\": %s, \"dtype\": \"%s\", \"ms\": %.4f, \"TFLOPs\": %.1f, \"rel_err\": %.2e, "
                  "\"status\": \"%s\", \"gpu\": \"%s\", \"block_size\": %d, \"softcap\": %g}\n",
                  name, hd, seq, sh.batch, sh.heads, sh.causal ? "true" : "false", dtype_name(dtype), ms, tflops, err,
                  status, prop.name, block_size, softcap);
            } else {
              std::printf("%-6d %5d %6d %5d %5d %-7s %9.3f %9.1f %9.2e %s\n", hd, seq, sh.batch, sh.heads, causal, name,
                          ms, tflops, err, status);
            }
            std::fflush(stdout);
          };
          try {
            // Validate: poisoned output, one run, sampled rows against the reference.
            ck(cudaMemset(dout.p, 0xff, n * 2), "poison out");
            attention_dispatch(be, p);
            ck(cudaDeviceSynchronize(), "attention run");
            ck(cudaMemcpy(got.data(), dout.p, n * 2, cudaMemcpyDeviceToHost), "download out");
            double num = 0, den = 0;
            for (size_t i = 0; i < rows.size(); ++i)
              for (int c = 0; c < hd; ++c) {
                const uint16_t h = got[(rows[i].first * sh.heads + rows[i].second) * hd + c];
                const double g = dtype == DType::BF16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
                const double d = g - ref[i * hd + c];
                num += std::isfinite(g) ? d * d : 1e30;
                den += double(ref[i * hd + c]) * ref[i * hd + c];
              }
            const double err = std::sqrt(num / std::max(den, 1e-30));
            if (!(err < 1e-2)) {
              ++failures;
              report(0, err, "WRONG");
              continue;
            }
            // Time: warm-up, then the median of `repeats` event-timed runs.
            for (int w = 0; w < 2; ++w) attention_dispatch(be, p);
            std::vector<float> times;
            for (int it = 0; it < repeats; ++it) {
              ck(cudaEventRecord(ev0), "event");
              attention_dispatch(be, p);
              ck(cudaEventRecord(ev1), "event");
              ck(cudaEventSynchronize(ev1), "attention run");
              float ms = 0;
              ck(cudaEventElapsedTime(&ms, ev0, ev1), "elapsed");
              times.push_back(ms);
            }
            std::sort(times.begin(), times.end());
            report(times[times.size() / 2], err, "ok");
          } catch (const Error& e) {
            report(0, 0, "unsupported");
            std::fprintf(stderr, "bench-attn: %s\n", e.what());
            ck(cudaGetLastError(), "after error");
          }
        }
      }
    }
  }
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  if (failures) fail("bench-attn: %d backend/shape results did not match the reference", failures);
  return 0;
#endif
}

}  // namespace runlm
