#include "engine_compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "generation.h"
#include "sampler.h"
#include "scheduler.h"

namespace runlm::test {

std::vector<float> cpu_logits(const std::string& path, const std::vector<int>& ids) {
  auto model = Model::load(path);
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_threads = 2;
  eo.n_ctx = static_cast<int>(ids.size());
  auto engine = make_cpu_engine(*model, eo);
  std::vector<float> logits(ids.size() * static_cast<size_t>(engine->n_vocab()));
  engine->forward(ids.data(), static_cast<int>(ids.size()), 0, logits.data(), true);
  return logits;
}

std::unique_ptr<Engine> engine_on(Device d, const Model& m, KvLayout kv) {
  EngineOptions eo;
  eo.device = d;
  eo.n_ctx = 128;
  eo.n_threads = 2;
  eo.kv = kv;
  if (kv == KvLayout::Paged) eo.kv_tokens = 3 * 128;
  return d == Device::Cuda ? make_cuda_engine(m, eo) : make_cpu_engine(m, eo);
}

std::vector<int> prompt(int n_vocab, int n) {
  std::vector<int> ids{1};
  for (int i = 1; i < n; ++i) ids.push_back((i * 37 + 11) % n_vocab);
  return ids;
}

double relative_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

std::vector<int> greedy(Engine& engine, const Model& model, std::vector<int> ids, int n) {
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp);
  GenerationRequest req;
  req.prompt = std::move(ids);
  req.n_predict = n;
  req.ignore_eos = true;
  return generate(engine, sampler, model.tokenizer(), req, nullptr).tokens;
}

void expect_same_greedy(const Model& m, const std::vector<int>& prompt_ids, const std::vector<int>& cpu,
                        const std::vector<int>& gpu, double tolerance) {
  ASSERT_EQ(cpu.size(), gpu.size());
  size_t i = 0;
  while (i < cpu.size() && cpu[i] == gpu[i]) ++i;
  if (i == cpu.size()) return;
  std::vector<int> ids = prompt_ids;
  ids.insert(ids.end(), cpu.begin(), cpu.begin() + long(i));
  auto e = engine_on(Device::Cpu, m);
  std::vector<float> l(size_t(m.config().n_vocab), NAN);
  e->forward(ids.data(), int(ids.size()), 0, l.data(), false);
  double scale = 0;
  for (float v : l) scale = std::max(scale, std::abs(double(v)));
  const double gap = std::abs(double(l[size_t(cpu[i])]) - l[size_t(gpu[i])]);
  EXPECT_LT(gap, tolerance * scale) << "greedy tokens part at step " << i << " (cpu " << cpu[i] << ", gpu " << gpu[i]
                                    << ") where the CPU's logits are not a near tie";
}

std::map<int, std::vector<int>> batch_greedy(Engine& engine, const Model& model,
                                             const std::vector<std::vector<int>>& prompts, int n_predict) {
  SchedulerOptions so;
  so.max_parallel = static_cast<int>(prompts.size());
  so.max_seq_len = engine.n_ctx();
  Scheduler sched(engine, model.tokenizer(), so);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.index = static_cast<int>(i);
    r.prompt = prompts[i];
    r.n_predict = n_predict;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    sched.submit(r);
  }
  std::map<int, std::vector<int>> out;
  sched.run([&](Completion&& c) { out[c.index] = std::move(c.tokens); });
  return out;
}

}  // namespace runlm::test
