// runlm bench-decode: the paged decode attention kernels alone. For each KV
// type (K and V the same) and each point B x L (B sequences of one decode
// token over L keys each), GQA 32/8, head_dim 128, pages of 16 slots in a
// shuffled order: microseconds a launch, the bytes the kernel must read (K
// and V quants + scales, once), GB/s, decode steps of the batch a second,
// the ratio to f16 (f16 always runs first) and the kernel that ran.
// Sequence 0 of every point is first checked against the CPU reference
// (paged_decode_attention_ref); a kernel outside its tolerance is an error.
// Timing: a CUDA graph of 20 launches rotating over distinct page sets (so a
// small problem does not run from L2), median of 7 replays. --softcap X runs
// the kernels (and the reference check) with the attention logit soft-cap.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cxxopts.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "cuda_bench.h"
#include "common.h"
#include "cpu/kv_quant.h"
#include "cpu/ops.h"
#include "paged_kv.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/paged_attention.h"
#endif

namespace runlm {

namespace {

struct Point {
  int b = 0, l = 0;
};

// "64x8192,1x32768" -> points.
std::vector<Point> parse_points(const std::string& s) {
  RUNLM_CHECK(!s.empty() && s.back() != ',', "bench-decode: --points '%s' is not a list of BxL (e.g. 64x8192)",
              s.c_str());
  std::vector<Point> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    Point p;
    char x = 0;
    std::istringstream is(item);
    RUNLM_CHECK((is >> p.b >> x >> p.l) && x == 'x' && is.peek() == EOF && p.b >= 1 && p.l >= 1,
                "bench-decode: --points: '%s' is not BxL (e.g. 64x8192)", item.c_str());
    r.push_back(p);
  }
  RUNLM_CHECK(!r.empty(), "bench-decode: --points is empty");
  return r;
}

#ifdef RUNLM_CUDA
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench-decode: %s: %s", what, cudaGetErrorString(e));
}

template <typename T>
void upload(DevMem& d, const std::vector<T>& h) {
  ck(cudaMemcpy(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}

// Seconds a launch: the median over graph replays of kIters launches that
// rotate over the params' page sets.
double time_launches(const std::vector<PagedDecodeParams>& ps, void* ws, size_t ws_bytes, DecodeKernel kernel) {
  constexpr int kIters = 20, kReps = 7;
  cudaStream_t st;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  paged_decode_attention(ps[0], ws, ws_bytes, st, -1, kernel);  // warm-up outside the capture
  ck(cudaStreamSynchronize(st), "warm-up");
  cudaGraph_t graph;
  ck(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), "capture");
  for (int i = 0; i < kIters; ++i) paged_decode_attention(ps[i % ps.size()], ws, ws_bytes, st, -1, kernel);
  ck(cudaStreamEndCapture(st, &graph), "end capture");
  cudaGraphExec_t exec;
  ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  ck(cudaGraphLaunch(exec, st), "replay");
  std::vector<float> ms;
  for (int r = 0; r < kReps; ++r) {
    ck(cudaEventRecord(a, st), "record");
    ck(cudaGraphLaunch(exec, st), "replay");
    ck(cudaEventRecord(b, st), "record");
    ck(cudaEventSynchronize(b), "sync");
    float t = 0;
    ck(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  return ms[ms.size() / 2] / kIters * 1e-3;
}

// n_pages pages of uniform values in (-1, 1), encoded as type t.
std::vector<uint8_t> random_pages(KvType t, const KvPoolLayout& l, int n_pages, int n_kv, int hd, std::mt19937& rng) {
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

// The largest relative error of an output row (head) against the reference.
double worst_row_error(const std::vector<float>& out, const std::vector<float>& ref, int hd) {
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
    worst = std::max(worst, finite ? std::sqrt(num / std::max(den, 1e-30)) : INFINITY);
  }
  return worst;
}

// The tests' tolerance (tests/test_paged_attention.cpp, row_tolerance).
double row_tolerance(KvType t, DecodeKernel kernel) {
  if (!decode_kernel_uses_tensor_cores(kernel)) return 1e-3;
  return t == KvType::BF16 ? 6e-3 : 3e-3;
}
#endif

}  // namespace

int cmd_bench_decode(int argc, char** argv) {
  cxxopts::Options opts("runlm bench-decode",
                        "Paged decode attention: us, MB read, GB/s and tokens/s per KV type, and the kernel that ran");
  opts.add_options()
      ("kv", "KV types (K and V the same), comma separated; f16 always runs first",
       cxxopts::value<std::string>()->default_value("f16,q8_0,fp8,q4_0"))
      ("points", "BxL points: B sequences of one decode token over L keys",
       cxxopts::value<std::string>()->default_value("64x8192,1x32768"))
      ("heads", "query heads / KV heads", cxxopts::value<std::string>()->default_value("32/8"))
      ("hdim", "head dim", cxxopts::value<int>()->default_value("128"))
      ("block-size", "page size in slots", cxxopts::value<int>()->default_value("16"))
      ("softcap", "attention logit soft-cap (0 = none; Gemma 2: 50)", cxxopts::value<float>()->default_value("0"))
      ("kernel", "auto (the selector's choice) or a kernel to force: simt, mma_sm80, mma_quant_sm80, mma_f16, "
                 "tma_sm90", cxxopts::value<std::string>()->default_value("auto"))
      ("o,output", "table or json", cxxopts::value<std::string>()->default_value("table"))
      ("h,help", "show help");
  cxxopts::ParseResult args;
  try {
    args = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    fail("bench-decode: %s", e.what());
  }
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  std::vector<KvType> types = {KvType::F16};
  {
    std::stringstream ss(args["kv"].as<std::string>());
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) {
        const KvType t = kv_type_from_name(item);
        RUNLM_CHECK(kv_type_on_gpu(t), "bench-decode: --kv %s unsupported; supported: f16, bf16, q8_0, q4_0, fp8",
                    item.c_str());
        if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
      }
  }
  const std::vector<Point> points = parse_points(args["points"].as<std::string>());
  int n_heads = 0, n_kv = 0;
  {
    char slash = 0;
    std::istringstream is(args["heads"].as<std::string>());
    RUNLM_CHECK((is >> n_heads >> slash >> n_kv) && slash == '/' && n_heads > 0 && n_kv > 0 && n_heads % n_kv == 0,
                "bench-decode: --heads '%s' is not H/KV with KV dividing H", args["heads"].as<std::string>().c_str());
  }
  const int hd = args["hdim"].as<int>(), bs = args["block-size"].as<int>();
  const float softcap = args["softcap"].as<float>();
  RUNLM_CHECK(softcap >= 0.0f && std::isfinite(softcap),
              "bench-decode: --softcap %g must be 0 (none) or finite and > 0", softcap);
  RUNLM_CHECK(bs >= 8 && bs <= 256 && (bs & (bs - 1)) == 0,
              "bench-decode: --block-size %d unsupported; supported: powers of two in 8..256", bs);
  for (const Point& p : points)
    RUNLM_CHECK(p.l % bs == 0, "bench-decode: L=%d is not a multiple of --block-size %d", p.l, bs);
  const std::string out_fmt = args["output"].as<std::string>();
  RUNLM_CHECK(out_fmt == "table" || out_fmt == "json", "bench-decode: -o %s unknown; supported: table, json",
              out_fmt.c_str());
  const std::string kernel_name = args["kernel"].as<std::string>();

#ifndef RUNLM_CUDA
  (void)hd;
  fail("bench-decode: runlm was built without CUDA");
#else
  DecodeKernel forced = DecodeKernel::Auto;
  {
    bool known = false;
    for (DecodeKernel k : {DecodeKernel::Auto, DecodeKernel::Simt, DecodeKernel::MmaSm80, DecodeKernel::MmaQuantSm80,
                           DecodeKernel::MmaF16, DecodeKernel::TmaSm90})
      if (kernel_name == decode_kernel_name(k)) forced = k, known = true;
    RUNLM_CHECK(known, "bench-decode: --kernel %s unknown; supported: auto, simt, mma_sm80, mma_quant_sm80, mma_f16, "
                "tma_sm90", kernel_name.c_str());
  }
  int dev = 0;
  cudaDeviceProp prop{};
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  if (out_fmt == "table") {
    std::printf("paged decode by KV type (GQA %d/%d, hd %d, page %d, auto split) on %s\n", n_heads, n_kv, hd, bs,
                prop.name);
    std::printf("%5s %6s %6s %10s %10s %10s %12s %8s  %s\n", "B", "L", "kv", "us", "MB read", "GB/s", "tokens/s",
                "vs f16", "kernel");
  }
  int64_t max_pages = 0;
  for (const Point& p : points) max_pages = std::max<int64_t>(max_pages, int64_t(p.b) * (p.l / bs));
  std::vector<double> f16_tps(points.size(), 0.0);
  for (KvType t : types) {
    const KvPoolLayout l = kv_pool_layout(t, bs, n_kv, hd);
    // The pool: 256 random pages, repeated up to the largest point's pages.
    DevMem kpool(size_t(max_pages) * l.page), vpool(size_t(max_pages) * l.page);
    std::mt19937 rng(7 + int(t));
    const int chunk = 256;
    const std::vector<uint8_t> hk = random_pages(t, l, chunk, n_kv, hd, rng);
    const std::vector<uint8_t> hv = random_pages(t, l, chunk, n_kv, hd, rng);
    for (int64_t pg = 0; pg < max_pages; pg += chunk) {
      const size_t n = size_t(std::min<int64_t>(chunk, max_pages - pg)) * l.page;
      ck(cudaMemcpy(kpool.as<uint8_t>() + size_t(pg) * l.page, hk.data(), n, cudaMemcpyHostToDevice), "fill");
      ck(cudaMemcpy(vpool.as<uint8_t>() + size_t(pg) * l.page, hv.data(), n, cudaMemcpyHostToDevice), "fill");
    }
    for (size_t pi = 0; pi < points.size(); ++pi) {
      const int B = points[pi].b, L = points[pi].l, pages = L / bs;
      const double bytes = double(B) * L * double(2 * (l.q_row + l.s_row));  // K and V read once
      // Rotations over distinct page sets: together >= 256 MB where the pool allows.
      const size_t need = size_t(B) * pages;
      const int n_rot = int(std::max<size_t>(
          1, std::min<size_t>({size_t(16), size_t(max_pages) / need, size_t(std::ceil(256e6 / bytes))})));
      std::vector<int32_t> tables(need * n_rot), lens(B, L), cu(B + 1);
      for (int r = 0; r < n_rot; ++r) {
        std::iota(tables.begin() + r * need, tables.begin() + (r + 1) * need, int32_t(r * need));
        std::shuffle(tables.begin() + r * need, tables.begin() + (r + 1) * need, rng);
      }
      std::iota(cu.begin(), cu.end(), 0);
      std::vector<float> hq(size_t(B) * n_heads * hd);
      std::uniform_real_distribution<float> u(-3.0f, 3.0f);
      for (float& x : hq) x = u(rng);
      DevMem dq(hq.size() * 4), dout(hq.size() * 4), dlens(size_t(B) * 4), dcu(size_t(B + 1) * 4),
          dtab(tables.size() * 4);
      upload(dq, hq);
      upload(dlens, lens);
      upload(dcu, cu);
      upload(dtab, tables);
      const size_t ws_bytes = paged_decode_workspace_bytes(B, B, n_heads, hd, L);
      DevMem ws(ws_bytes);
      PagedDecodeParams p;
      p.q = dq.as<float>();
      p.out = dout.as<float>();
      p.cu_q = dcu.as<int32_t>();
      p.n_seqs = B;
      p.total_q = B;
      p.max_q_per_seq = 1;
      p.max_seq_len = L;
      p.n_heads = n_heads;
      p.scale = 1.0f / std::sqrt(float(hd));
      p.softcap = softcap;
      p.kv.k_pool = kpool.p;
      p.kv.v_pool = vpool.p;
      p.kv.k_type = p.kv.v_type = t;
      p.kv.block_tables = dtab.as<int32_t>();
      p.kv.max_blocks_per_seq = pages;
      p.kv.seq_lens = dlens.as<int32_t>();
      p.kv.block_size = bs;
      p.kv.n_kv_heads = n_kv;
      p.kv.head_dim = hd;
      const DecodeKernel ran = forced != DecodeKernel::Auto ? forced : select_decode_kernel(p).kernel;
      // Sequence 0 against the reference, on a host copy of its pages.
      {
        ck(cudaMemset(dout.p, 0xff, hq.size() * 4), "poison");
        paged_decode_attention(p, ws.p, ws_bytes, nullptr, -1, forced);
        ck(cudaDeviceSynchronize(), "sync");
        std::vector<float> out(size_t(n_heads) * hd), ref(out.size());
        ck(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost), "download");
        std::vector<uint8_t> pk(size_t(pages) * l.page), pv(pk.size());
        for (int j = 0; j < pages; ++j) {
          ck(cudaMemcpy(&pk[size_t(j) * l.page], kpool.as<uint8_t>() + size_t(tables[j]) * l.page, l.page,
                        cudaMemcpyDeviceToHost),
             "page");
          ck(cudaMemcpy(&pv[size_t(j) * l.page], vpool.as<uint8_t>() + size_t(tables[j]) * l.page, l.page,
                        cudaMemcpyDeviceToHost),
             "page");
        }
        std::vector<int32_t> table(pages), one_len = {L}, one_cu = {0, 1};
        std::iota(table.begin(), table.end(), 0);
        PagedDecodeParams rp = p;
        rp.q = hq.data();
        rp.out = ref.data();
        rp.cu_q = one_cu.data();
        rp.n_seqs = 1;
        rp.total_q = 1;
        rp.kv.k_pool = pk.data();
        rp.kv.v_pool = pv.data();
        rp.kv.block_tables = table.data();
        rp.kv.seq_lens = one_len.data();
        paged_decode_attention_ref(rp);
        const double err = worst_row_error(out, ref, hd), tol = row_tolerance(t, ran);
        RUNLM_CHECK(err < tol, "bench-decode: kernel %s at kv %s B=%d L=%d: error %.3g against the reference (tolerance %.3g)",
                    decode_kernel_name(ran), kv_type_name(t), B, L, err, tol);
      }
      std::vector<PagedDecodeParams> ps;
      for (int r = 0; r < n_rot; ++r) {
        ps.push_back(p);
        ps.back().kv.block_tables = dtab.as<int32_t>() + size_t(r) * need;
      }
      const double secs = time_launches(ps, ws.p, ws_bytes, forced);
      const double tps = B / secs;
      if (t == KvType::F16) f16_tps[pi] = tps;
      const double vs = f16_tps[pi] > 0 ? tps / f16_tps[pi] : 0.0;
      if (out_fmt == "json")
        std::printf("{\"bench\": \"decode\", \"device\": \"%s\", \"kv\": \"%s\", \"B\": %d, \"L\": %d, \"n_heads\": %d, "
                    "\"n_kv_heads\": %d, \"head_dim\": %d, \"block_size\": %d, \"partition\": %d, \"us\": %.2f, "
                    "\"mb_read\": %.1f, \"gbps\": %.1f, \"tokens_per_s\": %.0f, \"vs_f16\": %.3f, \"kernel\": \"%s\", "
                    "\"softcap\": %g}\n",
                    prop.name, kv_type_name(t), B, L, n_heads, n_kv, hd, bs, paged_decode_auto_partition(p, forced),
                    secs * 1e6, bytes / 1e6, bytes / secs / 1e9, tps, vs, decode_kernel_name(ran), softcap);
      else
        std::printf("%5d %6d %6s %10.2f %10.1f %10.1f %12.0f %8.2f  %s\n", B, L, kv_type_name(t), secs * 1e6,
                    bytes / 1e6, bytes / secs / 1e9, tps, vs, decode_kernel_name(ran));
      std::fflush(stdout);
    }
  }
  return 0;
#endif
}

}  // namespace runlm
