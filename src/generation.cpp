#include "generation.h"

#include <algorithm>

#include "cli_common.h"
#include "common.h"
#include "engine.h"
#include "sampler.h"
#include "tokenizer.h"

namespace runlm {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Interrupted: return "interrupted";
  }
  return "?";
}

GenerationResult generate(Engine& engine, Sampler& sampler, const Tokenizer& tokenizer,
                          const GenerationRequest& req,
                          const std::function<bool(int, const std::string&)>& on_token,
                          const std::atomic<bool>* interrupt) {
  GenerationResult result;
  const int n_prompt = static_cast<int>(req.prompt.size());
  RUNLM_CHECK(n_prompt > 0, "empty prompt (not even BOS)");
  RUNLM_CHECK(n_prompt <= engine.n_ctx(), "prompt is %d tokens, longer than the context size %d (-c)", n_prompt,
              engine.n_ctx());
  // At least the last prompt token is evaluated, to get its logits.
  const int n_cached = std::clamp(req.n_cached, 0, n_prompt - 1);

  const int n_vocab = tokenizer.n_vocab();
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  Stopwatch prompt_clock;
  engine.forward(req.prompt.data() + n_cached, n_prompt - n_cached, n_cached, logits.data(), false);
  result.prompt_seconds = prompt_clock.seconds();
  result.n_prompt_evaluated = n_prompt - n_cached;
  for (int t : req.prompt) sampler.accept(t);

  Stopwatch gen_clock;
  int pos = n_prompt;
  int prev = req.prompt.back();
  for (;;) {
    if (interrupt && interrupt->load()) {
      result.finish = FinishReason::Interrupted;
      break;
    }
    if (req.n_predict >= 0 && static_cast<int>(result.tokens.size()) >= req.n_predict) {
      result.finish = FinishReason::Length;
      break;
    }
    const int tok = sampler.sample(logits.data(), n_vocab);
    sampler.accept(tok);
    if (tokenizer.is_eog(tok) && !req.ignore_eos) {
      result.finish = FinishReason::Eos;
      break;
    }
    if (std::find(req.stop_tokens.begin(), req.stop_tokens.end(), tok) != req.stop_tokens.end()) {
      result.finish = FinishReason::Stop;
      break;
    }
    result.tokens.push_back(tok);
    if (on_token && !on_token(tok, tokenizer.token_to_piece(prev, tok))) {
      result.finish = FinishReason::Stop;
      break;
    }
    prev = tok;
    if (req.n_predict >= 0 && static_cast<int>(result.tokens.size()) >= req.n_predict) {
      result.finish = FinishReason::Length;
      break;
    }
    if (pos >= engine.n_ctx()) {
      result.finish = FinishReason::Context;
      break;
    }
    engine.forward(&tok, 1, pos, logits.data(), false);
    ++pos;
    ++result.n_generated_cached;
  }
  result.generation_seconds = gen_clock.seconds();
  return result;
}

std::string format_timings(const GenerationResult& r) {
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  return strfmt("prompt: %d tokens in %.1f ms (%.2f t/s) | generation: %zu tokens in %.1f ms (%.2f t/s)",
                r.n_prompt_evaluated, r.prompt_seconds * 1e3, rate(r.n_prompt_evaluated, r.prompt_seconds),
                r.tokens.size(), r.generation_seconds * 1e3,
                rate(static_cast<double>(r.tokens.size()), r.generation_seconds));
}

}  // namespace runlm
