// Running one model on the CPU and on the GPU engine and comparing them:
// what the whole-model GPU tests (test_cuda_families.cpp, test_gpu_moe.cpp)
// share, and a whole-model CPU run the CPU tests share.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine.h"
#include "model.h"

namespace runlm::test {

// An engine of 128 tokens of context on device d; a paged one holds three
// such sequences.
std::unique_ptr<Engine> engine_on(Device d, const Model& m, KvLayout kv = KvLayout::Contiguous);

// The logits of every position of ids ([ids.size(), n_vocab]) on a CPU
// engine (2 threads) of the GGUF at path.
std::vector<float> cpu_logits(const std::string& path, const std::vector<int>& ids);

// n token ids: BOS, then a fixed walk through the vocabulary.
std::vector<int> prompt(int n_vocab, int n);

// max |a - b| / max |b|; infinite when a has a non-finite value.
double relative_max_diff(const std::vector<float>& a, const std::vector<float>& b);

// n greedy tokens after ids.
std::vector<int> greedy(Engine& engine, const Model& model, std::vector<int> ids, int n);

// The GPU's greedy tokens against the CPU's after the prompt: equal, or they
// part where the CPU's two candidates are within tolerance * max |logit| (a
// near tie that rounding may break either way).
void expect_same_greedy(const Model& m, const std::vector<int>& prompt_ids, const std::vector<int>& cpu,
                        const std::vector<int>& gpu, double tolerance);

// The prompts through the continuous-batching scheduler on a paged engine,
// greedily, all at once: each request's tokens by index.
std::map<int, std::vector<int>> batch_greedy(Engine& engine, const Model& model,
                                             const std::vector<std::vector<int>>& prompts, int n_predict);

}  // namespace runlm::test
