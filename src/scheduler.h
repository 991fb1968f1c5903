// Continuous batching (vLLM-style): requests wait in a queue, are admitted
// while there are free sequence slots and KV pages, and every step packs the
// decode tokens of running sequences plus prefill chunks of new ones into one
// forward pass under a token budget. A finished sequence frees its pages at
// once and the next request takes its place. When pages run out, the most
// recently admitted sequence is preempted: its pages are freed and it is
// queued again to be recomputed later (its text so far is kept), so no
// sequence is ever dropped or corrupted.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "generation.h"
#include "sampler.h"

namespace runlm {

class Engine;
class Tokenizer;

struct Request {
  int index = 0;               // position in the input; results are reported with it
  std::vector<int> prompt;     // BOS included
  int n_predict = -1;          // -1: until EOS or the context is full
  SamplingParams sampling;
  std::vector<std::string> stop;  // stop strings (the text is cut before them)
  bool ignore_eos = false;
};

struct Completion {
  int index = 0;
  std::vector<int> tokens;     // generated (EOS excluded)
  std::string text;
  FinishReason finish = FinishReason::Length;
  int n_prompt = 0;
  int n_prompt_cached = 0;     // prompt tokens served by shared pages
  int n_preemptions = 0;
  double queue_seconds = 0;    // submit -> first admitted
  double total_seconds = 0;    // submit -> finished
};

struct SchedulerOptions {
  int max_parallel = 32;       // sequences running at once
  int max_seq_len = 4096;      // positions per sequence (the context size)
  // With a sliding window, pages that fall out of the window go back to the
  // pool (KV memory is window-sized) unless swa_full keeps them.
  bool swa_full = false;
  // Benchmark hook (runlm bench -npl): while any running sequence still has
  // prompt tokens to evaluate, steps carry prefill chunks only and decode
  // waits, so prefill and decode are separate phases that can be timed
  // apart (llama-batched-bench's split). Off for serving: decode latency
  // would suffer.
  bool prefill_first = false;
};

struct SchedulerProgress {
  int done = 0;
  int total = 0;
  int64_t tokens_generated = 0;
  int running = 0;
  int first_tokens = 0;        // requests that have sampled at least one token (prefill done)
};

// Where a run's time went (seconds, host clock): the forward passes (GPU
// work included: forward_batch returns with the logits on the host),
// sampling, and the rest (planning, pages, detokenizing, callbacks).
struct SchedulerTimes {
  double forward = 0;
  double sample = 0;
  double total = 0;
};

class ThreadPool;

class Scheduler {
 public:
  Scheduler(Engine& engine, const Tokenizer& tokenizer, const SchedulerOptions& options);
  ~Scheduler();

  void submit(Request request);
  // Runs until every request is done. With `stop` set, no new request starts
  // and the running ones end as FinishReason::Interrupted at the next step.
  void run(const std::function<void(Completion&&)>& on_done, const std::atomic<bool>* stop = nullptr,
           const std::function<void(const SchedulerProgress&)>& on_progress = nullptr);

  // Steps taken and preemptions so far (for reports and tests).
  int64_t steps() const { return steps_; }
  int64_t preemptions() const { return preemptions_; }
  const SchedulerTimes& times() const { return times_; }

 private:
  struct Sequence;
  bool admit(Sequence& s);
  void preempt(Sequence& s);
  void finish(Sequence& s, FinishReason why, const std::function<void(Completion&&)>& on_done);
  // Appends a sampled token; returns true when the sequence is done.
  bool accept_token(Sequence& s, int token, FinishReason* why);

  Engine& engine_;
  const Tokenizer& tok_;
  SchedulerOptions opt_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  int next_seq_id_ = 1;  // 0 is Engine::forward's own sequence
  int64_t steps_ = 0;
  int64_t preemptions_ = 0;
  int total_ = 0;
  int done_ = 0;
  int64_t generated_ = 0;
  int first_tokens_ = 0;
  SchedulerTimes times_;
  std::unique_ptr<ThreadPool> sample_pool_;  // made when a step has many rows to sample
};

}  // namespace runlm
