// runlm perplexity: perplexity of a model over a text file in chunks (as
// llama-perplexity), optionally saving its log-probs (--save-logits) or
// comparing with saved ones (--kl-base: KL divergence, top-1 agreement, PPL
// ratio). Output as llama-perplexity prints it: "[1]x,[2]y,..." (the running
// perplexity after each chunk, flushed as chunks finish) and then
// "Final estimate: PPL = X +/- Y" on stdout; the time per chunk and the ETA
// on stderr after the first chunk.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "engine.h"
#include "model.h"
#include "perplexity.h"

namespace runlm {

namespace {

// Default chunk when -c is 0 (the shared flag's default): llama-perplexity's
// usual 512, or the model's training context when that is shorter.
constexpr int kDefaultChunk = 512;

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RUNLM_CHECK(in, "cannot open text file %s (-f): %s", path.c_str(), std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  RUNLM_CHECK(!in.bad(), "cannot read text file %s (-f)", path.c_str());
  return ss.str();
}

std::string format_eta(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  return strfmt("%ld:%02ld", s / 60, s % 60);
}

void print_kld(const KldSummary& k, const std::string& base_path) {
  std::printf("\nKL divergence against %s (%lld tokens):\n", base_path.c_str(), static_cast<long long>(k.count));
  std::printf("  Mean PPL(Q)          : %10.4f +/- %.5f\n", k.ppl, k.ppl_stderr);
  std::printf("  Mean PPL(base)       : %10.4f +/- %.5f\n", k.ppl_base, k.ppl_base_stderr);
  std::printf("  PPL(Q)/PPL(base)     : %10.6f +/- %.6f\n", k.ppl_ratio, k.ppl_ratio_stderr);
  std::printf("  Mean ln(PPL(Q)/base) : %10.6f +/- %.6f\n", k.ln_ppl_ratio, k.ln_ppl_ratio_stderr);
  std::printf("  Cor(ln PPL(Q), base) : %9.2f %%\n", 100.0 * k.ppl_correlation);
  std::printf("  Mean KLD             : %10.6f +/- %.6f\n", k.kld_mean, k.kld_stderr);
  std::printf("  Maximum KLD          : %10.6f\n", k.kld_max);
  std::printf("  99.0%% KLD            : %10.6f\n", k.kld_p99);
  std::printf("  Median KLD           : %10.6f\n", k.kld_median);
  std::printf("  Same top token       : %9.3f +/- %.3f %%\n", 100.0 * k.same_top, 100.0 * k.same_top_stderr);
}

}  // namespace

int cmd_perplexity(int argc, char** argv) {
  cxxopts::Options opts("runlm perplexity",
                        "Perplexity of a model over a text, in chunks of -c tokens (default 512), each evaluated "
                        "from an empty cache; with --kl-base, the KL divergence against a run saved with "
                        "--save-logits");
  add_model_options(opts);
  opts.add_options("perplexity")
      ("f,file", "text file to score", cxxopts::value<std::string>())
      ("chunks", "score only the first N chunks (-1 = all)", cxxopts::value<int>()->default_value("-1"))
      ("chars", "use only the first N characters of the text (0 = all)",
       cxxopts::value<int64_t>()->default_value("0"))
      ("ppl-mode",
       "llama (default): llama-perplexity's method, BOS at the start of each chunk, only its second half scored, "
       "full chunks only; reference: no BOS, every token of a chunk but its first is scored, a short last chunk too",
       cxxopts::value<std::string>()->default_value("llama"))
      ("save-logits", "save this run's log-probs to FILE, to be the --kl-base of later runs",
       cxxopts::value<std::string>()->default_value(""))
      ("kl-base", "KL divergence, top-1 agreement and PPL ratio against the log-probs saved in FILE",
       cxxopts::value<std::string>()->default_value(""))
      ("per-chunk", "after the run, print each chunk's own perplexity on stdout");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  RUNLM_CHECK(args.count("file"), "no text given: use -f FILE");
  PerplexityOptions po;
  po.mode = ppl_mode_from_name(args["ppl-mode"].as<std::string>());
  po.n_chunks = args["chunks"].as<int>();
  po.n_chars = args["chars"].as<int64_t>();
  const int c_flag = args["ctx-size"].as<int>();
  RUNLM_CHECK(c_flag >= 0, "-c must be >= 0, got %d", c_flag);
  const std::string text_path = args["file"].as<std::string>();
  const std::string text = read_text_file(text_path);
  const std::string save_path = args["save-logits"].as<std::string>();
  const std::string base_path = args["kl-base"].as<std::string>();
  RUNLM_CHECK(save_path.empty() || save_path != base_path, "--save-logits and --kl-base name the same file %s",
              save_path.c_str());

  auto model = load_model_from_options(args);
  const int ctx_train = model->config().ctx_train;
  po.n_ctx = c_flag > 0 ? c_flag : std::min(kDefaultChunk, ctx_train > 0 ? ctx_train : kDefaultChunk);
  if (ctx_train > 0 && po.n_ctx > ctx_train)
    std::fprintf(stderr, "warning: chunks of %d tokens are longer than the model's training context (%d)\n",
                 po.n_ctx, ctx_train);
  const PerplexityPlan plan = plan_perplexity(model->tokenizer(), text, po);

  // The engine holds exactly one chunk. Flags that change how the engine
  // stores its cache (KV types, window) reach it through
  // engine_options_from, so they apply to the scored run unchanged.
  EngineOptions eo = engine_options_from(args, *model);
  eo.n_ctx = po.n_ctx;
  auto engine = make_engine(*model, eo);
  const int n_vocab = model->config().n_vocab;

  const PplChunk& last = plan.chunks.back();
  std::fprintf(stderr, "model: %s | %s | kv %s/%s | %s mode: %zu chunks of %d tokens%s, %lld tokens scored of %lld\n",
               args["model"].as<std::string>().c_str(), engine->backend_name(), kv_type_name(engine->type_k()),
               kv_type_name(engine->type_v()),
               ppl_mode_name(po.mode), plan.chunks.size(), po.n_ctx,
               last.n < po.n_ctx ? strfmt(" (the last %d)", last.n).c_str() : "",
               static_cast<long long>(plan.n_scored()), static_cast<long long>(plan.n_text_tokens));

  std::fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%d\n", plan.chunks.size(), po.n_ctx);
  const PerplexityResult r =
      run_perplexity(*engine, n_vocab, plan, save_path, base_path, [&](const PerplexityProgress& p) {
        if (p.chunk == 1) {
          const double per_chunk = p.seconds;
          std::fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %s\n", per_chunk,
                       format_eta(per_chunk * (p.n_chunks - p.chunk)).c_str());
        }
        write_stdout(strfmt("[%d]%.4f,", p.chunk, p.running_ppl));
      });
  write_stdout("\n");

  if (args.count("per-chunk"))
    for (size_t c = 0; c < r.chunk_ppl.size(); ++c)
      std::printf("chunk %zu: ppl %.4f (running %.4f)\n", c + 1, r.chunk_ppl[c], r.running_ppl[c]);
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_stderr);
  std::printf("tokens scored: %lld (%s mode, %zu chunks of %d)\n", static_cast<long long>(r.n_scored),
              ppl_mode_name(po.mode), plan.chunks.size(), po.n_ctx);
  if (r.kld) print_kld(*r.kld, base_path);
  if (!save_path.empty()) std::printf("\nlogits saved to %s\n", save_path.c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "time: %.2f s (%.1f tokens/s evaluated, %.2f s/chunk)\n", r.seconds,
               static_cast<double>(plan.n_tokens_used()) / std::max(r.seconds, 1e-9),
               r.seconds / static_cast<double>(plan.chunks.size()));
  return 0;
}

}  // namespace runlm
