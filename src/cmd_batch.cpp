// runlm batch: generate for every prompt of a file with continuous batching
// (src/scheduler.h), writing one JSON line per request in input order. A bad
// line gets an error record and the others still run; records are written
// (and flushed) as soon as every earlier one is out, so an interrupted run
// keeps every completed record; after SIGINT or SIGTERM every request still
// gets one (interrupted or not_started). Progress on stderr when it is a
// terminal. Exit code: 0 when every request succeeded, 2 when some failed
// (error records), 130 after SIGINT, 143 after SIGTERM, 1 when the run
// itself failed.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>

#include "batch_input.h"
#include "batch_record.h"
#include "chat_template.h"
#include "chat_template_cli.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "model.h"
#include "scheduler.h"
#include "tokenizer.h"

namespace runlm {

namespace {

// The signal that stopped the run (SIGINT or SIGTERM), 0 while running.
std::atomic<int> g_batch_signal{0};
std::atomic<bool> g_batch_interrupt{false};
extern "C" void on_batch_signal(int sig) {
  g_batch_signal.store(sig);
  g_batch_interrupt.store(true);
}

// Writes records in input order; out-of-order completions wait in `pending`.
// A failed write (disk full, file size limit) stops the run with an error,
// and a file we opened is cut back to its last complete record, so what is
// there stays valid JSONL (a partial write would leave half a line).
class OrderedWriter {
 public:
  // truncatable: f is a regular file written from offset 0 (not stdout).
  OrderedWriter(std::FILE* f, std::string path, std::vector<int> order, bool truncatable)
      : f_(f), path_(std::move(path)), truncatable_(truncatable) {
    for (int idx : order) order_.push_back(idx);
  }
  void put(int index, const std::string& record) {
    pending_[index] = record;
    while (next_ < order_.size() && pending_.count(order_[next_])) {
      write(pending_[order_[next_]]);
      pending_.erase(order_[next_]);
      ++next_;
    }
  }
  // After an interrupt: whatever completed, still in input order.
  void flush_rest() {
    for (auto& [idx, rec] : pending_) write(rec);
    pending_.clear();
  }

 private:
  void write(const std::string& rec) {
    const std::string line = rec + "\n";
    if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0) {
      const int err = errno;
      const bool cut = truncatable_ && ftruncate(fileno(f_), static_cast<off_t>(bytes_ok_)) == 0;
      fail("cannot write to %s: %s (%s %d complete records)", path_.c_str(), std::strerror(err),
           cut ? "the file keeps its" : "written so far:", records_ok_);
    }
    bytes_ok_ += line.size();
    ++records_ok_;
  }
  std::FILE* f_;
  std::string path_;
  bool truncatable_;
  size_t bytes_ok_ = 0;  // bytes of complete records in the file
  int records_ok_ = 0;
  std::vector<int> order_;
  size_t next_ = 0;
  std::map<int, std::string> pending_;
};

void show_progress(const SchedulerProgress& p, double seconds) {
  const int width = 30;
  const int filled = p.total ? width * p.done / p.total : 0;
  const double tps = seconds > 0 ? static_cast<double>(p.tokens_generated) / seconds : 0;
  const double eta = p.done > 0 ? seconds * (p.total - p.done) / p.done : 0;
  std::fprintf(stderr, "\r[%s%s] %d/%d | %d running | %.1f tok/s | ETA %.0f s\033[K",
               std::string(static_cast<size_t>(filled), '=').c_str(),
               std::string(static_cast<size_t>(width - filled), ' ').c_str(), p.done, p.total, p.running, tps, eta);
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  cxxopts::Options opts("runlm batch", "Generate for every prompt of a file (one per line, or JSONL)");
  add_model_options(opts);
  add_sampling_options(opts);
  opts.add_options("batch")
      ("f,file", "prompts: text (one per line) or JSONL", cxxopts::value<std::string>())
      ("o,output", "output JSONL (default: stdout)", cxxopts::value<std::string>()->default_value("-"))
      ("parallel", "sequences decoded at once", cxxopts::value<int>()->default_value("32"))
      ("n,n-predict", "default tokens per request (-1 = until EOS or the context is full)",
       cxxopts::value<int>()->default_value("128"))
      ("ignore-eos", "keep generating after EOS")
      ("no-parse-special", "encode special-token texts in plain prompts (<|im_start|>, </s>...) as plain text")
      ("allow-extra-fields", "ignore unknown fields of JSONL requests (default: a request naming one is an error)")
      ("swa-full", "with a sliding window, keep every page (default: pages that leave the window are freed)")
      ("kv-mem", "KV cache size in MiB (default: parallel x context, within 90% of free GPU memory or 8 GiB on the CPU)",
       cxxopts::value<int64_t>()->default_value("0"));
  add_chat_template_options(opts, "batch");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  RUNLM_CHECK(args.count("file"), "no input: use -f prompts.txt or -f prompts.jsonl");
  const int parallel = args["parallel"].as<int>();
  RUNLM_CHECK(parallel > 0, "--parallel must be positive, got %d", parallel);
  const int n_predict = args["n-predict"].as<int>();
  RUNLM_CHECK(n_predict >= -1, "-n must be >= -1, got %d", n_predict);
  const SamplingParams defaults = sampling_params_from(args);
  const auto entries = read_batch_input(args["file"].as<std::string>(), args.count("allow-extra-fields") > 0);
  const bool parse_special = args.count("no-parse-special") == 0;

  auto model = load_model_from_options(args);
  const Tokenizer& tok = model->tokenizer();
  EngineOptions eo = engine_options_from(args, *model);
  RUNLM_CHECK(eo.kv == KvLayout::Paged || args.count("kv") == 0, "batch runs on the paged KV cache; drop --kv contiguous");
  eo.kv = KvLayout::Paged;
  const int64_t kv_mem_mib = args["kv-mem"].as<int64_t>();
  RUNLM_CHECK(kv_mem_mib >= 0, "--kv-mem must be >= 0, got %lld", static_cast<long long>(kv_mem_mib));
  // Room for every running sequence at full context, within --kv-mem (or
  // the backend's default share of memory); the scheduler preempts if less.
  eo.kv_tokens = static_cast<int64_t>(parallel) * eo.n_ctx;
  eo.kv_bytes = kv_mem_mib << 20;
  auto engine = make_engine(*model, eo);

  // Plain prompts need no template: a model without one, or with one that
  // does not parse, fails only its "messages" requests. A template chosen
  // by flag must be right.
  std::optional<ChatTemplate> chat_template;
  std::string template_error = no_chat_template_message();
  try {
    chat_template = chat_template_from_options(args, model->chat_template_source(), args["model"].as<std::string>(),
                                               tok.bos() >= 0 ? tok.id_to_piece(tok.bos()) : "",
                                               tok.eos() >= 0 ? tok.id_to_piece(tok.eos()) : "");
  } catch (const Error& e) {
    if (args.count("chat-template") || args.count("chat-template-file")) throw;
    template_error = e.what();
  }
  const bool verbose_prompt = args.count("verbose-prompt") > 0;

  SchedulerOptions so;
  so.max_parallel = parallel;
  so.max_seq_len = engine->n_ctx();
  so.swa_full = args.count("swa-full") > 0;
  Scheduler scheduler(*engine, tok, so);

  // Builds each request; a line that cannot become one gets an error record.
  std::vector<int> order;
  std::map<int, std::string> errors;
  for (size_t i = 0; i < entries.size(); ++i) {
    const BatchEntry& e = entries[i];
    const int index = static_cast<int>(i);
    order.push_back(index);
    std::string error = e.error;
    Request r;
    r.index = index;
    if (error.empty()) {
      try {
        if (e.is_chat()) {
          RUNLM_CHECK(chat_template.has_value(), "\"messages\" needs a chat template: %s", template_error.c_str());
          const RenderedPrompt prompt = chat_template->apply(e.messages, /*add_generation_prompt=*/true);
          r.prompt = tokenize_prompt(tok, prompt);
          for (const std::string& m : chat_end_markers(tok)) r.stop.push_back(m);
          if (verbose_prompt) print_verbose_prompt(prompt.text, r.prompt.size());
        } else {
          r.prompt = tok.encode(e.prompt, tok.add_bos(), parse_special);
          if (verbose_prompt) print_verbose_prompt(e.prompt, r.prompt.size());
        }
        r.n_predict = e.n_predict.value_or(n_predict);
        r.sampling = defaults;
        if (e.temperature) r.sampling.temperature = *e.temperature;
        if (e.top_p) r.sampling.top_p = *e.top_p;
        if (e.top_k) r.sampling.top_k = *e.top_k;
        if (e.min_p) r.sampling.min_p = *e.min_p;
        if (e.repeat_penalty) r.sampling.repeat_penalty = *e.repeat_penalty;
        if (e.seed) r.sampling.seed = static_cast<uint64_t>(*e.seed);
        for (const auto& s : e.stop) r.stop.push_back(s);
        r.ignore_eos = args.count("ignore-eos") > 0;
        scheduler.submit(std::move(r));
      } catch (const Error& ex) {
        error = ex.what();
      }
    }
    if (!error.empty()) {
      errors[index] = batch_error_record(e, error);
    }
  }

  const std::string out_path = args["output"].as<std::string>();
  std::FILE* out = out_path == "-" ? stdout : std::fopen(out_path.c_str(), "w");
  RUNLM_CHECK(out, "cannot open %s for writing: %s", out_path.c_str(), std::strerror(errno));
  // Unbuffered: each record is one write() anyway (it is flushed at once),
  // and after a failed write no half-written rest may linger in a buffer to
  // be flushed at exit, behind the truncation.
  std::setvbuf(out, nullptr, _IONBF, 0);
  struct stat st = {};
  const bool regular = out != stdout && fstat(fileno(out), &st) == 0 && S_ISREG(st.st_mode);
  OrderedWriter writer(out, out_path, order, regular);
  for (const auto& [index, rec] : errors) writer.put(index, rec);

  struct sigaction sa = {};
  sa.sa_handler = on_batch_signal;
  // SA_RESTART: a Ctrl-C during a write to a full pipe must not fail the
  // write with EINTR; the flag is polled between steps.
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = stderr_is_tty();
  Stopwatch clock;
  int64_t tokens_out = 0;
  int n_ok = 0, n_interrupted = 0, n_not_started = 0;
  std::vector<bool> recorded(entries.size(), false);
  for (const auto& [index, rec] : errors) recorded[static_cast<size_t>(index)] = true;
  scheduler.run(
      [&](Completion&& c) {
        const BatchEntry& e = entries[static_cast<size_t>(c.index)];
        tokens_out += static_cast<int64_t>(c.tokens.size());
        (c.finish == FinishReason::Interrupted ? n_interrupted : n_ok)++;
        recorded[static_cast<size_t>(c.index)] = true;
        writer.put(c.index, batch_completion_record(e, c));
      },
      &g_batch_interrupt,
      [&](const SchedulerProgress& p) {
        if (tty) show_progress(p, clock.seconds());
      });
  // A stopped run drops the requests that had not started: each still gets
  // its record, so the output accounts for every input line.
  for (size_t i = 0; i < entries.size(); ++i)
    if (!recorded[i]) {
      ++n_not_started;
      writer.put(static_cast<int>(i), batch_not_started_record(entries[i]));
    }
  writer.flush_rest();
  if (out != stdout) RUNLM_CHECK(std::fclose(out) == 0, "cannot write to %s: %s", out_path.c_str(), std::strerror(errno));
  if (tty) std::fprintf(stderr, "\n");
  const double secs = clock.seconds();
  std::fprintf(stderr,
               "batch: %zu requests: %d done, %zu errors, %d interrupted, %d not started | %lld tokens out in %.2f s (%.1f tok/s) | %lld steps, "
               "%lld preemptions (forward %.2f s, sampling %.2f s) | %s, parallel %d, %lld KV pages of %d\n",
               entries.size(), n_ok, errors.size(), n_interrupted, n_not_started,
               static_cast<long long>(tokens_out), secs, secs > 0 ? tokens_out / secs : 0.0,
               static_cast<long long>(scheduler.steps()), static_cast<long long>(scheduler.preemptions()),
               scheduler.times().forward, scheduler.times().sample, engine->backend_name(), parallel,
               static_cast<long long>(engine->blocks()->n_pages()), eo.block_size);
  if (g_batch_signal.load() != 0) return 128 + g_batch_signal.load();
  return errors.empty() ? 0 : 2;
}

}  // namespace runlm
