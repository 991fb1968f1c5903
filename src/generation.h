// The decode loop shared by generate, chat and batch: evaluate the prompt
// (re-using a cached prefix), then sample token by token until EOS, a stop
// token, the token limit, a full context or an interrupt.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace runlm {

class Engine;
class Sampler;
class Tokenizer;

struct GenerationRequest {
  std::vector<int> prompt;       // whole context, BOS included
  int n_cached = 0;              // leading prompt tokens already in the engine's cache
  int n_predict = -1;            // -1: until EOS or a full context
  bool ignore_eos = false;
  std::vector<int> stop_tokens;  // besides EOS
};

enum class FinishReason { Eos, Stop, Length, Context, Interrupted };
const char* finish_reason_name(FinishReason r);

struct GenerationResult {
  std::vector<int> tokens;  // generated tokens, the stop token excluded
  FinishReason finish = FinishReason::Length;
  int n_prompt_evaluated = 0;  // prompt tokens actually run (not cached)
  int n_generated_cached = 0;  // leading generated tokens whose K/V are in the cache
  double prompt_seconds = 0;
  double generation_seconds = 0;
};

// on_token(token, piece) is called for each generated token with its text;
// returning false stops generation (FinishReason::Stop). interrupt, when set,
// is polled between tokens.
GenerationResult generate(Engine& engine, Sampler& sampler, const Tokenizer& tokenizer,
                          const GenerationRequest& request,
                          const std::function<bool(int, const std::string&)>& on_token,
                          const std::atomic<bool>* interrupt = nullptr);

// "prompt: 12 tokens, 3.1 ms (3870.97 t/s) | generation: ..." for stderr.
std::string format_timings(const GenerationResult& r);

}  // namespace runlm
