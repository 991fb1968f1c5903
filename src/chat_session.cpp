#include "chat_session.h"

#include <algorithm>

#include "common.h"
#include "engine.h"
#include "harmony_reply.h"
#include "sampler.h"
#include "stop_strings.h"
#include "tokenizer.h"

namespace runlm {

ChatSession::ChatSession(Engine& engine, const Tokenizer& tokenizer, Sampler& sampler,
                         const ChatTemplate& chat_template, std::string system_prompt)
    : engine_(engine), tok_(tokenizer), sampler_(sampler), template_(chat_template),
      system_(std::move(system_prompt)) {
  template_.check_system_prompt(system_);
  // End-of-turn tokens of the vocabulary end generation by their ids; the
  // texts of those it lacks are watched for in the reply (spelled out).
  end_markers_ = chat_end_markers(tok_);
  reset();
}

void ChatSession::reset() {
  messages_.clear();
  if (!system_.empty()) messages_.push_back({"system", system_});
  // The cache keeps its contents; cached_ tracks what is still valid, and a
  // new conversation shares at most the system prompt's tokens with it.
}

std::vector<int> ChatSession::render_prompt() const {
  const RenderedPrompt prompt = template_.apply(messages_, /*add_generation_prompt=*/true);
  std::vector<int> tokens = tokenize_prompt(tok_, prompt);
  if (observer_) observer_(prompt.text, tokens.size());
  return tokens;
}

std::vector<int> ChatSession::fit_context(int reserve) {
  std::vector<int> prompt = render_prompt();
  const size_t first = !messages_.empty() && messages_.front().role == "system" ? 1 : 0;
  while (static_cast<int>(prompt.size()) + reserve > engine_.n_ctx() && messages_.size() > first + 1) {
    // Drop the oldest turn: a user message and the reply after it.
    size_t n = 1;
    if (messages_.size() > first + 2 && messages_[first + 1].role == "assistant") n = 2;
    messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first),
                    messages_.begin() + static_cast<std::ptrdiff_t>(first + n));
    dropped_ += static_cast<int>(n);
    prompt = render_prompt();
  }
  return prompt;
}

GenerationResult ChatSession::reply(const std::string& user_text, int n_predict,
                                    const std::function<void(const std::string&)>& on_text,
                                    const std::atomic<bool>* interrupt) {
  const std::vector<ChatMessage> before = messages_;
  dropped_ = 0;
  messages_.push_back({"user", user_text});
  GenerationRequest req;
  // Room kept for the reply: its -n, at most half the context; a quarter
  // of it when -n is -1.
  const int reserve = n_predict > 0 ? std::min(n_predict, engine_.n_ctx() / 2) : engine_.n_ctx() / 4;
  try {
    req.prompt = fit_context(reserve);
  } catch (...) {
    messages_ = before;  // a conversation the template rejects is not kept
    dropped_ = 0;
    throw;
  }
  req.n_cached = static_cast<int>(
      std::mismatch(cached_.begin(), cached_.end(), req.prompt.begin(), req.prompt.end()).first - cached_.begin());
  req.n_predict = n_predict;
  if (static_cast<int>(req.prompt.size()) >= engine_.n_ctx()) {
    const size_t n = req.prompt.size();
    messages_ = before;
    dropped_ = 0;
    fail("the message is %zu tokens with the system prompt, no room in the context size %d (-c)", n,
         engine_.n_ctx());
  }

  // The end markers and --stop strings end the reply before them; -r strings
  // after them. A tail that could start one is held back until it cannot.
  std::vector<std::string> stop_before = stop_;
  stop_before.insert(stop_before.end(), end_markers_.begin(), end_markers_.end());
  StopStringFilter filter(stop_before, reverse_prompts_);
  std::string text;
  GenerationResult r = generate(engine_, sampler_, tok_, req, [&](int, const std::string& piece) {
    bool stopped = false;
    const std::string out = filter.push(piece, &stopped);
    text += out;
    if (on_text && !out.empty()) on_text(out);
    return !stopped;
  }, interrupt);
  if (r.finish != FinishReason::Stop) {
    const std::string rest = filter.flush();
    text += rest;
    if (on_text && !rest.empty()) on_text(rest);
  }

  cached_.assign(req.prompt.begin(), req.prompt.end());
  cached_.insert(cached_.end(), r.tokens.begin(), r.tokens.begin() + r.n_generated_cached);
  // A harmony reply (gpt-oss) goes back into the conversation as its answer
  // alone: the template writes the channels around it.
  messages_.push_back({"assistant", harmony_final_text(text)});
  return r;
}

}  // namespace runlm
