// runlm bench: llama-bench-style throughput table. ppN evaluates an N-token
// prompt in one forward (prefill); tgN generates N tokens one at a time
// (decode). Each test runs once to warm up, then -r times; t/s is the mean
// and standard deviation over those runs. For tg the table adds the bytes
// each token must read (every weight once, plus the KV cache so far) per
// second, as a fraction of the measured copy bandwidth: the decode ceiling.
//
// With -npl B1,B2,... it is llama-batched-bench instead: B sequences of -npp
// random prompt tokens each, run together through the continuous-batching
// scheduler of `runlm batch` (paged KV), prefill timed apart from -ntg
// decode steps.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "model.h"
#include "sampler.h"
#include "scheduler.h"
#include "tokenizer.h"

namespace runlm {

namespace {

// "128,512" -> {128, 512}. Zeros are dropped ("0 = none") unless
// positive_only, where every value must be a positive number.
std::vector<int> parse_int_list(const std::string& s, const char* flag, bool positive_only = false) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    RUNLM_CHECK(!item.empty() && *end == '\0' && v >= (positive_only ? 1 : 0) && v < (1L << 24),
                "%s: bad value '%s' in '%s'; expected %s numbers, comma separated", flag, item.c_str(), s.c_str(),
                positive_only ? "positive" : "non-negative");
    if (v > 0) out.push_back(static_cast<int>(v));
  }
  RUNLM_CHECK(!positive_only || !out.empty(), "%s: no value given", flag);
  return out;
}

struct Stats {
  double mean = 0, stddev = 0;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = v.size() > 1 ? std::sqrt(s.stddev / static_cast<double>(v.size() - 1)) : 0;
  return s;
}

// From reading the model file to an engine ready to run (weights uploaded
// and repacked on a GPU), and the device memory in use then: what a model
// costs before its first token. Printed on stderr; each JSON row carries it.
struct LoadReport {
  double seconds = 0;
  uint64_t device_mem_bytes = 0;
};

LoadReport report_load(const Stopwatch& since_start, const Engine& engine) {
  LoadReport r{since_start.seconds(), engine.device_memory_in_use()};
  std::fprintf(stderr, "bench: model loaded and engine ready in %.2f s", r.seconds);
  if (r.device_mem_bytes) std::fprintf(stderr, ", %s of device memory in use", format_bytes(r.device_mem_bytes).c_str());
  std::fprintf(stderr, "\n");
  return r;
}

struct Row {
  std::string test;
  Stats tps;
  double bw_fraction = -1;  // tg only
  double bytes_per_s = 0;
};

// One -npl row, with llama-batched-bench's columns: PP prompt tokens and TG
// decode steps per sequence, PL (B) sequences, N_KV cache positions filled.
struct BatchedRow {
  int pp = 0, tg = 0, pl = 0;
  int64_t n_kv = 0;
  double t_pp = 0, t_tg = 0;  // seconds
  int64_t steps = 0;
  SchedulerTimes times;       // the whole row (prefill and decode)
};

// Runs `pl` sequences of `pp` random tokens through the scheduler at once.
// The prompt's forward samples each sequence's first token; then `tg` decode
// steps each evaluate one token per sequence and sample the next, so the
// cache ends with pp + tg positions per sequence, as in llama-batched-bench.
// Greedy, EOS ignored. Prefill ends when every sequence has its first token
// (prefill_first keeps decode out of it); decode is the rest. Both include
// what `runlm batch` pays per step: scheduling, the logits copy, sampling.
BatchedRow run_batched(Engine& engine, const Tokenizer& tok, Rng& rng, int n_vocab, int pp, int tg, int pl) {
  SchedulerOptions so;
  so.max_parallel = pl;
  so.max_seq_len = engine.n_ctx();
  so.prefill_first = true;
  Scheduler scheduler(engine, tok, so);
  for (int i = 0; i < pl; ++i) {
    Request r;
    r.index = i;
    // Fresh tokens for every run: reused prompts would hit the prefix cache.
    r.prompt.resize(static_cast<size_t>(pp));
    for (int& t : r.prompt) t = static_cast<int>(rng.next() % static_cast<uint64_t>(n_vocab));
    r.n_predict = tg + 1;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    scheduler.submit(std::move(r));
  }
  int started_at_once = -1;
  double t_pp = -1;
  std::vector<Completion> done;
  Stopwatch sw;
  scheduler.run([&](Completion&& c) { done.push_back(std::move(c)); }, nullptr,
                [&](const SchedulerProgress& p) {
                  // No sequence ends in the first step (tg >= 1), so this counts the ones admitted at once.
                  if (started_at_once < 0) started_at_once = p.running + p.done;
                  if (t_pp < 0 && p.first_tokens == pl) t_pp = sw.seconds();
                });
  const double t = sw.seconds();
  RUNLM_CHECK(started_at_once == pl && scheduler.preemptions() == 0,
              "-npl %d: only %d of the %d sequences ran at once (%lld preemptions): the KV pool is too small; raise "
              "--kv-mem or lower -npl",
              pl, started_at_once, pl, static_cast<long long>(scheduler.preemptions()));
  BatchedRow row;
  row.pp = pp;
  row.tg = tg;
  row.pl = pl;
  for (const Completion& c : done) {
    RUNLM_CHECK(c.finish == FinishReason::Length && static_cast<int>(c.tokens.size()) == tg + 1 && c.n_prompt_cached == 0,
                "-npl %d: sequence %d ended as %s after %zu tokens (%d prompt tokens cached); expected %d", pl, c.index,
                finish_reason_name(c.finish), c.tokens.size(), c.n_prompt_cached, tg + 1);
    row.n_kv += c.n_prompt + static_cast<int64_t>(c.tokens.size()) - 1;  // the last sampled token is never evaluated
  }
  row.t_pp = t_pp;
  row.t_tg = t - t_pp;
  row.steps = scheduler.steps();
  row.times = scheduler.times();
  return row;
}

}  // namespace

// runlm bench -npl: see run_batched. -c is the context of each sequence
// (default: just enough); the paged pool is sized for the largest B x
// (npp + ntg), within --kv-mem or the backend's memory cap, and every row is
// checked to fit before any runs.
int bench_batched(const cxxopts::ParseResult& args) {
  for (const auto& [name, flag] : {std::pair{"n-prompt", "-p"}, {"n-gen", "-n"}, {"repetitions", "-r"}})
    RUNLM_CHECK(!args.count(name), "-npl runs the parallel-sequences bench, which takes -npp and -ntg (one run each); "
                "%s is for the pp/tg table", flag);
  const auto pls = parse_int_list(args["npl"].as<std::string>(), "-npl", true);
  const auto pps = parse_int_list(args["npp"].as<std::string>(), "-npp", true);
  const auto tgs = parse_int_list(args["ntg"].as<std::string>(), "-ntg", true);
  const std::string format = args["output"].as<std::string>();
  RUNLM_CHECK(format == "md" || format == "json", "-o must be md or json, got '%s'", format.c_str());
  const int64_t kv_mem_mib = args["kv-mem"].as<int64_t>();
  RUNLM_CHECK(kv_mem_mib >= 0, "--kv-mem must be >= 0, got %lld", static_cast<long long>(kv_mem_mib));

  const Stopwatch load_clock;
  auto model = load_model_from_options(args);
  const ModelConfig& c = model->config();
  EngineOptions eo = engine_options_from(args, *model);
  RUNLM_CHECK(eo.kv == KvLayout::Paged || args.count("kv") == 0, "-npl runs on the paged KV cache; drop --kv contiguous");
  RUNLM_CHECK(eo.block_size > 0, "--block-size must be positive, got %d", eo.block_size);
  eo.kv = KvLayout::Paged;
  int longest = 0, max_pl = 0;
  int64_t pool_tokens = 0;  // the largest row: B x (npp + ntg), in whole pages per sequence
  for (int pp : pps)
    for (int tg : tgs)
      for (int pl : pls) {
        // +1: the scheduler stops a sequence whose context (its last sampled token included) fills -c.
        longest = std::max(longest, pp + tg + 1);
        max_pl = std::max(max_pl, pl);
        const int64_t pages = (pp + tg + eo.block_size - 1) / eo.block_size;
        pool_tokens = std::max(pool_tokens, pl * pages * eo.block_size);
      }
  if (!args["ctx-size"].as<int>()) eo.n_ctx = longest;
  RUNLM_CHECK(longest <= eo.n_ctx, "-npp + -ntg need a context of %d tokens per sequence (npp + ntg + 1) but -c is %d",
              longest, eo.n_ctx);
  eo.n_batch = std::max(eo.n_batch, max_pl);  // one decode step carries every sequence
  eo.kv_tokens = pool_tokens;
  eo.kv_bytes = kv_mem_mib << 20;
  auto engine = make_engine(*model, eo);
  const LoadReport load = report_load(load_clock, *engine);
  BlockManager& bm = *engine->blocks();
  for (int pp : pps)
    for (int tg : tgs)
      for (int pl : pls) {
        const int64_t need = static_cast<int64_t>(pl) * bm.pages_for(pp + tg);
        RUNLM_CHECK(need <= bm.n_pages(),
                    "-npl %d: %d sequences of %d + %d tokens need %lld KV pages of %d tokens, the pool has %d (%s of "
                    "KV memory); raise --kv-mem or lower -npl",
                    pl, pl, pp, tg, static_cast<long long>(need), eo.block_size, bm.n_pages(),
                    format_bytes(static_cast<uint64_t>(bm.n_pages()) * eo.block_size * c.n_layers *
                                 (kv_row_bytes(engine->type_k(), c.kv_dim(), c.head_dim) + kv_row_bytes(engine->type_v(), c.kv_dim(), c.head_dim)))
                        .c_str());
      }

  Rng rng(1234);
  const Tokenizer& tok = model->tokenizer();
  // Warm-up (first-call setup on the device), not reported.
  run_batched(*engine, tok, rng, c.n_vocab, pps[0], std::min(tgs[0], 4), *std::min_element(pls.begin(), pls.end()));
  std::vector<BatchedRow> rows;
  for (int pp : pps)
    for (int tg : tgs)
      for (int pl : pls) rows.push_back(run_batched(*engine, tok, rng, c.n_vocab, pp, tg, pl));

  const std::string name = c.name.empty() ? args["model"].as<std::string>() : c.name;
  const std::string type = model->weight_type_summary();
  const char* attn = engine->backend_name() == std::string("cpu") ? "cpu" : attn_backend_name(eo.attn);
  const char* type_k = kv_type_name(engine->type_k());
  const char* type_v = kv_type_name(engine->type_v());
  std::fprintf(stderr, "bench: %s, paged KV pool of %d pages x %d tokens, -b %d\n", engine->backend_name(), bm.n_pages(),
               eo.block_size, eo.n_batch);
  // Where each row's time went, for reading what limits it.
  for (const BatchedRow& r : rows)
    std::fprintf(stderr, "bench: B=%d: %lld steps; forward %.3f s, sampling %.3f s, other %.3f s\n", r.pl,
                 static_cast<long long>(r.steps), r.times.forward, r.times.sample,
                 r.times.total - r.times.forward - r.times.sample);
  if (format == "md") {
    std::printf("| model | type | backend | attn | decode kernel | type_k | type_v | PP | TG | B | N_KV | T_PP s | "
                "S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |\n");
    std::printf("| --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
                "---: |\n");
    for (const BatchedRow& r : rows) {
      const double t = r.t_pp + r.t_tg;
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %lld | %.3f | %.2f | %.3f | %.2f | %.3f | %.2f |\n",
                  name.c_str(), type.c_str(), engine->backend_name(), attn, engine->decode_kernel(), type_k, type_v, r.pp, r.tg, r.pl,
                  static_cast<long long>(r.n_kv), r.t_pp, r.pl * r.pp / r.t_pp, r.t_tg, r.pl * r.tg / r.t_tg, t,
                  static_cast<double>(r.n_kv) / t);
    }
  } else {
    for (const BatchedRow& r : rows) {
      const double t = r.t_pp + r.t_tg;
      nlohmann::ordered_json j = {{"model", name}, {"type", type}, {"size_bytes", model->weight_bytes()},
                          {"params", model->n_params()}, {"backend", engine->backend_name()}, {"attn", attn},
                          {"decode_kernel", engine->decode_kernel()}, {"kv", "paged"}, {"type_k", type_k}, {"type_v", type_v}, {"block_size", eo.block_size},
                          {"n_batch", eo.n_batch}, {"n_kv_max", static_cast<int64_t>(bm.n_pages()) * eo.block_size},
                          {"pp", r.pp}, {"tg", r.tg}, {"pl", r.pl}, {"n_kv", r.n_kv},
                          {"t_pp", r.t_pp}, {"speed_pp", r.pl * r.pp / r.t_pp},
                          {"t_tg", r.t_tg}, {"speed_tg", r.pl * r.tg / r.t_tg},
                          {"t", t}, {"speed", static_cast<double>(r.n_kv) / t}, {"steps", r.steps},
                          {"t_forward", r.times.forward}, {"t_sample", r.times.sample},
                          {"load_s", load.seconds}, {"device_mem_bytes", load.device_mem_bytes}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    }
  }
  return 0;
}

int cmd_bench(int argc, char** argv) {
  cxxopts::Options opts("runlm bench", "Prefill (pp) and decode (tg) throughput");
  add_model_options(opts);
  opts.add_options("bench")
      ("p,n-prompt", "prompt lengths, comma separated (0 = none)", cxxopts::value<std::string>()->default_value("512"))
      ("n,n-gen", "generation lengths, comma separated (0 = none)", cxxopts::value<std::string>()->default_value("128"))
      ("r,repetitions", "timed runs per test", cxxopts::value<int>()->default_value("5"))
      ("o,output", "md or json", cxxopts::value<std::string>()->default_value("md"));
  opts.add_options("parallel sequences (llama-batched-bench)")
      ("npl", "-npl: sequences run at once, comma separated (selects this mode)", cxxopts::value<std::string>())
      ("npp", "-npp: prompt tokens per sequence, comma separated", cxxopts::value<std::string>()->default_value("128"))
      ("ntg", "-ntg: decode steps per sequence, comma separated", cxxopts::value<std::string>()->default_value("128"))
      ("kv-mem", "KV pool size in MiB (default: what the largest row needs, within the backend's cap)",
       cxxopts::value<int64_t>()->default_value("0"));
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  if (args.count("npl")) return bench_batched(args);
  for (const auto& [name, flag] : {std::pair{"npp", "-npp"}, {"ntg", "-ntg"}, {"kv-mem", "--kv-mem"}})
    RUNLM_CHECK(!args.count(name), "%s belongs to the parallel-sequences bench: add -npl B1,B2,...", flag);
  const auto prompts = parse_int_list(args["n-prompt"].as<std::string>(), "-p");
  const auto gens = parse_int_list(args["n-gen"].as<std::string>(), "-n");
  const int reps = args["repetitions"].as<int>();
  RUNLM_CHECK(reps > 0, "-r must be positive, got %d", reps);
  const std::string format = args["output"].as<std::string>();
  RUNLM_CHECK(format == "md" || format == "json", "-o must be md or json, got '%s'", format.c_str());

  const Stopwatch load_clock;
  auto model = load_model_from_options(args);
  const ModelConfig& c = model->config();
  EngineOptions eo = engine_options_from(args, *model);
  int longest = 1;
  for (int p : prompts) longest = std::max(longest, p);
  for (int n : gens) longest = std::max(longest, n + 1);
  if (!args["ctx-size"].as<int>()) eo.n_ctx = longest;
  RUNLM_CHECK(longest <= eo.n_ctx, "a test needs %d tokens of context but -c is %d", longest, eo.n_ctx);
  eo.n_batch = std::max(eo.n_batch, longest);  // pp runs as one forward, as llama-bench -b does
  auto engine = make_engine(*model, eo);
  const LoadReport load = report_load(load_clock, *engine);
  const double copy_bw = engine->measure_copy_bandwidth();

  Rng rng(1234);
  auto random_tokens = [&](int n) {
    std::vector<int> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int>(rng.next() % static_cast<uint64_t>(c.n_vocab));
    return t;
  };
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  std::vector<Row> rows;
  for (int p : prompts) {
    const auto toks = random_tokens(p);
    std::vector<double> tps;
    for (int r = 0; r <= reps; ++r) {
      Stopwatch sw;
      engine->forward(toks.data(), p, 0, logits.data(), false);
      if (r > 0) tps.push_back(p / sw.seconds());
    }
    rows.push_back({strfmt("pp%d", p), stats(tps)});
  }
  // Bytes one decode step reads: all weights but the embedding table (one
  // row of it) and, in a mixture of experts, but the experts not chosen (a
  // token reads n_expert_used of n_expert), plus K and V of the positions
  // before it.
  const auto& w = model->weights();
  double expert_bytes = 0;
  for (const LayerWeights& lw : w.layers)
    for (const WeightView* e : {&lw.gate_exps, &lw.up_exps, &lw.down_exps, &lw.gate_exps_b, &lw.up_exps_b,
                                &lw.down_exps_b})
      if (e->data) expert_bytes += static_cast<double>(e->nbytes());
  const double unread_experts = c.n_expert > 0 ? expert_bytes * (1.0 - double(c.n_expert_used) / c.n_expert) : 0.0;
  const double weight_bytes = static_cast<double>(model->weight_bytes() - w.tok_embd.nbytes() + w.tok_embd.row_bytes +
                                                  (c.tied_embeddings ? w.tok_embd.nbytes() : 0)) -
                              unread_experts;
  const double kv_row = static_cast<double>(kv_row_bytes(engine->type_k(), c.kv_dim(), c.head_dim) +
                                            kv_row_bytes(engine->type_v(), c.kv_dim(), c.head_dim));  // K + V of one position
  for (int n : gens) {
    const auto toks = random_tokens(n);
    std::vector<double> tps;
    for (int r = 0; r <= reps; ++r) {
      Stopwatch sw;
      for (int i = 0; i < n; ++i) engine->forward(&toks[i], 1, i, logits.data(), false);
      if (r > 0) tps.push_back(n / sw.seconds());
    }
    Row row{strfmt("tg%d", n), stats(tps)};
    const double avg_kv = c.n_layers * kv_row * (n - 1) / 2.0;
    row.bytes_per_s = (weight_bytes + avg_kv) * row.tps.mean;
    row.bw_fraction = row.bytes_per_s / copy_bw;
    rows.push_back(row);
  }

  const std::string name = c.name.empty() ? args["model"].as<std::string>() : c.name;
  const double bytes = static_cast<double>(model->weight_bytes());
  const std::string size = bytes >= (1 << 30) ? strfmt("%.2f GiB", bytes / (1 << 30)) : strfmt("%.2f MiB", bytes / (1 << 20));
  const double params = static_cast<double>(model->n_params());
  const std::string n_params = params >= 1e9 ? strfmt("%.2f B", params / 1e9) : strfmt("%.2f M", params / 1e6);
  const std::string type = model->weight_type_summary();
  const char* attn = engine->backend_name() == std::string("cpu") ? "cpu" : attn_backend_name(eo.attn);
  if (format == "md") {
    std::printf("| model | type | size | params | backend | attn | decode kernel | kv | type_k | type_v | test | t/s | "
                "bandwidth |\n");
    std::printf("| --- | --- | ---: | ---: | --- | --- | --- | --- | --- | --- | --- | ---: | ---: |\n");
    for (const Row& r : rows) {
      const std::string bw = r.bw_fraction < 0 ? "" : strfmt("%.0f GB/s = %.0f%% of %.0f GB/s copy", r.bytes_per_s / 1e9,
                                                             100 * r.bw_fraction, copy_bw / 1e9);
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f ± %.2f | %s |\n",
                  name.c_str(), type.c_str(), size.c_str(), n_params.c_str(), engine->backend_name(), attn,
                  engine->decode_kernel(), kv_layout_name(eo.kv), kv_type_name(engine->type_k()), kv_type_name(engine->type_v()), r.test.c_str(),
                  r.tps.mean, r.tps.stddev, bw.c_str());
    }
  } else {
    for (const Row& r : rows) {
      std::printf("{\"model\": \"%s\", \"type\": \"%s\", \"size_bytes\": %zu, \"params\": %lld, \"backend\": \"%s\", "
                  "\"attn\": \"%s\", \"decode_kernel\": \"%s\", \"kv\": \"%s\", \"type_k\": \"%s\", \"type_v\": \"%s\", \"test\": \"%s\", "
                  "\"tps_mean\": %.3f, \"tps_stddev\": %.3f, \"copy_bw\": %.4g, \"bytes_per_s\": %.4g, "
                  "\"load_s\": %.3f, \"device_mem_bytes\": %llu}\n",
                  name.c_str(), type.c_str(), model->weight_bytes(), static_cast<long long>(model->n_params()),
                  engine->backend_name(), attn, engine->decode_kernel(), kv_layout_name(eo.kv),
                  kv_type_name(engine->type_k()),
                  kv_type_name(engine->type_v()), r.test.c_str(), r.tps.mean, r.tps.stddev, copy_bw, r.bytes_per_s,
                  load.seconds, static_cast<unsigned long long>(load.device_mem_bytes));
    }
  }
  return 0;
}

}  // namespace runlm
