#include "scheduler.h"

#include <algorithm>

#include "cli_common.h"
#include "common.h"
#include "engine.h"
#include "kv_cache.h"
#include "thread_pool.h"
#include "tokenizer.h"

namespace runlm {

struct Scheduler::Sequence {
  Request req;
  int seq_id = -1;              // in the BlockManager; -1 while waiting
  std::vector<int> ctx;         // prompt + generated tokens
  int n_computed = 0;           // leading ctx positions whose K/V are cached
  std::unique_ptr<Sampler> sampler;
  std::vector<int> generated;
  std::string text;
  int n_prompt_cached = 0;
  int n_preemptions = 0;
  bool started = false;
  bool first_token_seen = false;  // sampled at least once (EOS included)
  Stopwatch since_submit;
  double queue_seconds = 0;
  int admit_order = 0;          // larger = admitted later (preempted first)
};

Scheduler::Scheduler(Engine& engine, const Tokenizer& tokenizer, const SchedulerOptions& options)
    : engine_(engine), tok_(tokenizer), opt_(options) {
  RUNLM_CHECK(engine_.blocks(), "continuous batching needs the paged KV cache (--kv paged)");
  RUNLM_CHECK(opt_.max_parallel > 0, "--parallel must be positive, got %d", opt_.max_parallel);
}

Scheduler::~Scheduler() = default;

void Scheduler::submit(Request request) {
  RUNLM_CHECK(!request.prompt.empty(), "request %d: empty prompt", request.index);
  RUNLM_CHECK(static_cast<int>(request.prompt.size()) < opt_.max_seq_len,
              "request %d: prompt is %zu tokens, longer than the context size %d (-c)", request.index,
              request.prompt.size(), opt_.max_seq_len);
  auto s = std::make_unique<Sequence>();
  s->ctx = request.prompt;
  s->sampler = std::make_unique<Sampler>(request.sampling);
  for (int t : request.prompt) s->sampler->accept(t);
  s->req = std::move(request);
  waiting_.push_back(std::move(s));
  ++total_;
}

bool Scheduler::admit(Sequence& s) {
  BlockManager& bm = *engine_.blocks();
  const int id = next_seq_id_++;
  const int covered = bm.add_sequence(id, s.ctx);
  // The first chunk must fit now; later chunks grow page by page.
  const int first_chunk = std::min(static_cast<int>(s.ctx.size()) - covered, engine_.max_batch_tokens());
  if (!bm.grow(id, covered + first_chunk)) {
    bm.free_sequence(id);
    return false;
  }
  s.seq_id = id;
  s.n_computed = covered;
  if (!s.started) {
    s.n_prompt_cached = covered;
    s.queue_seconds = s.since_submit.seconds();
    s.started = true;
  }
  return true;
}

void Scheduler::preempt(Sequence& s) {
  // Recompute later: the context (prompt + generated so far) is kept, its
  // pages go back to the pool.
  engine_.blocks()->free_sequence(s.seq_id);
  s.seq_id = -1;
  s.n_computed = 0;
  ++s.n_preemptions;
  ++preemptions_;
}

void Scheduler::finish(Sequence& s, FinishReason why, const std::function<void(Completion&&)>& on_done) {
  if (s.seq_id >= 0) engine_.blocks()->free_sequence(s.seq_id);
  s.seq_id = -1;
  Completion c;
  c.index = s.req.index;
  c.tokens = std::move(s.generated);
  c.text = std::move(s.text);
  c.finish = why;
  c.n_prompt = static_cast<int>(s.req.prompt.size());
  c.n_prompt_cached = s.n_prompt_cached;
  c.n_preemptions = s.n_preemptions;
  c.queue_seconds = s.queue_seconds;
  c.total_seconds = s.since_submit.seconds();
  ++done_;
  if (on_done) on_done(std::move(c));
}

bool Scheduler::accept_token(Sequence& s, int token, FinishReason* why) {
  s.sampler->accept(token);
  if (tok_.is_eog(token) && !s.req.ignore_eos) {
    *why = FinishReason::Eos;
    return true;
  }
  const int prev = s.ctx.back();
  s.ctx.push_back(token);
  s.generated.push_back(token);
  ++generated_;
  s.text += tok_.token_to_piece(prev, token);
  for (const std::string& stop : s.req.stop) {
    const size_t at = stop.empty() ? std::string::npos : s.text.find(stop);
    if (at != std::string::npos) {
      s.text.resize(at);
      *why = FinishReason::Stop;
      return true;
    }
  }
  if (s.req.n_predict >= 0 && static_cast<int>(s.generated.size()) >= s.req.n_predict) {
    *why = FinishReason::Length;
    return true;
  }
  if (static_cast<int>(s.ctx.size()) >= opt_.max_seq_len) {
    *why = FinishReason::Context;
    return true;
  }
  return false;
}

void Scheduler::run(const std::function<void(Completion&&)>& on_done, const std::atomic<bool>* stop,
                    const std::function<void(const SchedulerProgress&)>& on_progress) {
  BlockManager& bm = *engine_.blocks();
  const int n_vocab = tok_.n_vocab();
  const int window = engine_.sliding_window();
  std::vector<int> sampled;
  int admit_counter = 0;
  Stopwatch run_clock;
  while (!waiting_.empty() || !running_.empty()) {
    if (stop && stop->load()) {
      for (auto& s : running_) finish(*s, FinishReason::Interrupted, on_done);
      running_.clear();
      waiting_.clear();
      break;
    }
    // Admit while there is room; a request that does not fit waits.
    while (!waiting_.empty() && static_cast<int>(running_.size()) < opt_.max_parallel) {
      Sequence& s = *waiting_.front();
      if (!admit(s)) {
        RUNLM_CHECK(!running_.empty(),
                    "KV cache too small: request %d needs %d pages for its first chunk, the pool has %d",
                    s.req.index, bm.pages_for(std::min(static_cast<int>(s.ctx.size()), engine_.max_batch_tokens())),
                    bm.n_pages());
        break;
      }
      s.admit_order = admit_counter++;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }

    // Plan the step: decode tokens first (one per sequence), then prefill
    // chunks, within the token budget.
    int budget = engine_.max_batch_tokens();
    std::vector<std::pair<Sequence*, int>> plan;  // sequence, tokens this step
    std::vector<Sequence*> order;
    for (auto& s : running_) order.push_back(s.get());
    std::stable_sort(order.begin(), order.end(), [](const Sequence* a, const Sequence* b) {
      const bool da = static_cast<int>(a->ctx.size()) - a->n_computed == 1;
      const bool db = static_cast<int>(b->ctx.size()) - b->n_computed == 1;
      return da > db;
    });
    // A sequence decodes when one token is pending and it has sampled before;
    // otherwise it is (re)computing its prompt.
    auto decoding = [](const Sequence* s) {
      return static_cast<int>(s->ctx.size()) - s->n_computed == 1 && !s->generated.empty();
    };
    const bool hold_decode = opt_.prefill_first && std::any_of(order.begin(), order.end(), [&](const Sequence* s) {
                               return s->seq_id >= 0 && !decoding(s);
                             });
    for (Sequence* s : order) {
      if (budget == 0) break;
      if (s->seq_id < 0) continue;  // preempted earlier in this planning pass
      if (hold_decode && decoding(s)) continue;
      const int pending = static_cast<int>(s->ctx.size()) - s->n_computed;
      const int n = std::min(pending, budget);
      // Reserve pages, preempting the latest-admitted other sequences if needed.
      while (!bm.grow(s->seq_id, s->n_computed + n)) {
        Sequence* victim = nullptr;
        for (auto& r : running_)
          if (r.get() != s && r->seq_id >= 0 && (!victim || r->admit_order > victim->admit_order)) victim = r.get();
        if (!victim) break;
        preempt(*victim);
        plan.erase(std::remove_if(plan.begin(), plan.end(), [&](const auto& p) { return p.first == victim; }),
                   plan.end());
      }
      if (s->seq_id < 0 || bm.seq_len(s->seq_id) < s->n_computed + n) continue;  // preempted or still no room
      plan.push_back({s, n});
      budget -= n;
    }
    // Preempted sequences go back to the front of the queue, oldest first.
    std::vector<std::unique_ptr<Sequence>> keep;
    std::vector<std::unique_ptr<Sequence>> requeue;
    for (auto& s : running_) (s->seq_id >= 0 ? keep : requeue).push_back(std::move(s));
    std::sort(requeue.begin(), requeue.end(), [](const auto& a, const auto& b) { return a->admit_order > b->admit_order; });
    for (auto& s : requeue) waiting_.push_front(std::move(s));
    running_ = std::move(keep);
    if (plan.empty()) {
      RUNLM_CHECK(!running_.empty() || !waiting_.empty(), "scheduler: no progress possible");
      RUNLM_CHECK(!running_.empty(), "KV cache too small to run request %d alone", waiting_.front()->req.index);
      continue;
    }

    std::vector<BatchItem> items;
    int n_logits = 0;
    for (auto& [s, n] : plan) {
      BatchItem it;
      it.seq_id = s->seq_id;
      it.tokens = s->ctx.data() + s->n_computed;
      it.n_tokens = n;
      it.pos = s->n_computed;
      it.want_logits = s->n_computed + n == static_cast<int>(s->ctx.size());
      n_logits += it.want_logits;
      items.push_back(it);
    }
    std::vector<Sampler*> samplers;
    for (size_t i = 0; i < plan.size(); ++i)
      if (items[i].want_logits) samplers.push_back(plan[i].first->sampler.get());
    sampled.assign(samplers.size(), -1);
    // A step whose rows are all plain greedy asks the engine for the argmax
    // only (on the GPU: no logits copy, no host scan).
    const bool all_argmax =
        std::all_of(samplers.begin(), samplers.end(), [](const Sampler* s) { return s->is_plain_argmax(); });
    float* logits = all_argmax ? nullptr : engine_.logits_buffer(static_cast<size_t>(n_logits) * n_vocab);
    Stopwatch forward_clock;
    if (all_argmax) engine_.forward_batch_greedy(items, sampled.data());
    else engine_.forward_batch(items, logits);
    times_.forward += forward_clock.seconds();
    ++steps_;

    // Sampling, every row at once (each sequence has its own sampler and
    // random stream, so the threads change no draw); then the tokens are
    // taken in item order.
    Stopwatch sample_clock;
    auto sample_rows = [&](int64_t begin, int64_t end, int) {
      for (int64_t r = begin; r < end; ++r)
        sampled[r] = samplers[r]->sample(logits + static_cast<size_t>(r) * n_vocab, n_vocab);
    };
    constexpr int kRowsPerThread = 16;  // below this the hand-off costs more than it saves
    if (all_argmax) {
      // Done by the engine.
    } else if (samplers.size() >= 2 * kRowsPerThread) {
      if (!sample_pool_)
        sample_pool_ = std::make_unique<ThreadPool>(std::min(16, static_cast<int>(std::thread::hardware_concurrency())));
      sample_pool_->parallel_for(static_cast<int64_t>(samplers.size()), sample_rows);
    } else {
      sample_rows(0, static_cast<int64_t>(samplers.size()), 0);
    }
    times_.sample += sample_clock.seconds();

    int row = 0;
    std::vector<Sequence*> finished;
    std::vector<FinishReason> reasons;
    for (size_t i = 0; i < plan.size(); ++i) {
      Sequence* s = plan[i].first;
      s->n_computed += plan[i].second;
      bm.commit(s->seq_id, s->ctx, s->n_computed);
      // The next query sits at n_computed and sees n_computed - window + 1 on.
      if (window > 0 && !opt_.swa_full) bm.release_before(s->seq_id, s->n_computed - window + 1);
      if (!items[i].want_logits) continue;
      const int token = sampled[row++];
      if (!s->first_token_seen) {
        s->first_token_seen = true;
        ++first_tokens_;
      }
      FinishReason why;
      if (accept_token(*s, token, &why)) {
        finished.push_back(s);
        reasons.push_back(why);
      }
    }
    for (size_t i = 0; i < finished.size(); ++i) {
      finish(*finished[i], reasons[i], on_done);
      running_.erase(std::find_if(running_.begin(), running_.end(),
                                  [&](const auto& p) { return p.get() == finished[i]; }));
    }
    if (on_progress) on_progress({done_, total_, generated_, static_cast<int>(running_.size()), first_tokens_});
  }
  times_.total += run_clock.seconds();
}

}  // namespace runlm
