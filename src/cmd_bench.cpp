// runlm bench: llama-bench-style throughput table. ppN evaluates an N-token
// prompt in one forward (prefill); tgN generates N tokens one at a time
// (decode). Each test runs once to warm up, then -r times; t/s is the mean
// and standard deviation over those runs. For tg the table adds the bytes
// each token must read (every weight once, plus the KV cache so far) per
// second, as a fraction of the measured copy bandwidth: the decode ceiling.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "model.h"
#include "sampler.h"

namespace runlm {

namespace {

std::vector<int> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    RUNLM_CHECK(!item.empty() && *end == '\0' && v >= 0 && v < (1L << 24), "%s: bad value '%s' in '%s'", flag,
                item.c_str(), s.c_str());
    if (v > 0) out.push_back(static_cast<int>(v));
  }
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

struct Row {
  std::string test;
  Stats tps;
  double bw_fraction = -1;  // tg only
  double bytes_per_s = 0;
};

}  // namespace

int cmd_bench(int argc, char** argv) {
  cxxopts::Options opts("runlm bench", "Prefill (pp) and decode (tg) throughput");
  add_model_options(opts);
  opts.add_options("bench")
      ("p,n-prompt", "prompt lengths, comma separated (0 = none)", cxxopts::value<std::string>()->default_value("512"))
      ("n,n-gen", "generation lengths, comma separated (0 = none)", cxxopts::value<std::string>()->default_value("128"))
      ("r,repetitions", "timed runs per test", cxxopts::value<int>()->default_value("5"))
      ("o,output", "md or json", cxxopts::value<std::string>()->default_value("md"));
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  const auto prompts = parse_int_list(args["n-prompt"].as<std::string>(), "-p");
  const auto gens = parse_int_list(args["n-gen"].as<std::string>(), "-n");
  const int reps = args["repetitions"].as<int>();
  RUNLM_CHECK(reps > 0, "-r must be positive, got %d", reps);
  const std::string format = args["output"].as<std::string>();
  RUNLM_CHECK(format == "md" || format == "json", "-o must be md or json, got '%s'", format.c_str());

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
  // row of it), plus K and V of the positions before it.
  const auto& w = model->weights();
  const double weight_bytes = static_cast<double>(model->weight_bytes() - w.tok_embd.nbytes() + w.tok_embd.row_bytes +
                                                  (c.tied_embeddings ? w.tok_embd.nbytes() : 0));
  const double kv_row = static_cast<double>(kv_row_bytes(engine->type_k(), c.kv_dim()) +
                                            kv_row_bytes(engine->type_v(), c.kv_dim()));  // K + V of one position
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
    std::printf("| model | type | size | params | backend | attn | kv | type_k | type_v | test | t/s | bandwidth |\n");
    std::printf("| --- | --- | ---: | ---: | --- | --- | --- | --- | --- | --- | ---: | ---: |\n");
    for (const Row& r : rows) {
      const std::string bw = r.bw_fraction < 0 ? "" : strfmt("%.0f GB/s = %.0f%% of %.0f GB/s copy", r.bytes_per_s / 1e9,
                                                             100 * r.bw_fraction, copy_bw / 1e9);
      std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f ± %.2f | %s |\n",
                  name.c_str(), type.c_str(), size.c_str(), n_params.c_str(), engine->backend_name(), attn,
                  kv_layout_name(eo.kv), kv_type_name(engine->type_k()), kv_type_name(engine->type_v()), r.test.c_str(),
                  r.tps.mean, r.tps.stddev, bw.c_str());
    }
  } else {
    for (const Row& r : rows) {
      std::printf("{\"model\": \"%s\", \"type\": \"%s\", \"size_bytes\": %zu, \"params\": %lld, \"backend\": \"%s\", "
                  "\"attn\": \"%s\", \"kv\": \"%s\", \"type_k\": \"%s\", \"type_v\": \"%s\", \"test\": \"%s\", "
                  "\"tps_mean\": %.3f, \"tps_stddev\": %.3f, \"copy_bw\": %.4g, \"bytes_per_s\": %.4g}\n",
                  name.c_str(), type.c_str(), model->weight_bytes(), static_cast<long long>(model->n_params()),
                  engine->backend_name(), attn, kv_layout_name(eo.kv), kv_type_name(engine->type_k()),
                  kv_type_name(engine->type_v()), r.test.c_str(), r.tps.mean, r.tps.stddev, copy_bw, r.bytes_per_s);
    }
  }
  return 0;
}

}  // namespace runlm
