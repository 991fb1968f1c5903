#include "chat_session.h"

#include <algorithm>

#include "common.h"
#include "engine.h"
#include "sampler.h"
#include "tokenizer.h"

namespace runlm {

ChatSession::ChatSession(Engine& engine, const Tokenizer& tokenizer, Sampler& sampler,
                         const ChatTemplate& chat_template, std::string system_prompt)
    : engine_(engine), tok_(tokenizer), sampler_(sampler), template_(chat_template),
      system_(std::move(system_prompt)) {
  template_.check_system_prompt(system_);
  // End-of-turn tokens of the vocabulary stop on their ids; their texts are
  // also watched for in the reply (a vocabulary without them spells them).
  end_markers_ = chat_end_markers(tok_);
  stop_tokens_ = chat_stop_tokens(tok_);
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

GenerationResult ChatSession::reply(const std::string& user_text, int n_predict,
                                    const std::function<void(const std::string&)>& on_text,
                                    const std::atomic<bool>* interrupt) {
  messages_.push_back({"user", user_text});
  GenerationRequest req;
  try {
    req.prompt = render_prompt();
  } catch (...) {
    messages_.pop_back();  // a conversation the template rejects is not kept
    throw;
  }
  req.n_cached = static_cast<int>(
      std::mismatch(cached_.begin(), cached_.end(), req.prompt.begin(), req.prompt.end()).first - cached_.begin());
  req.n_predict = n_predict;
  req.stop_tokens = stop_tokens_;
  if (static_cast<int>(req.prompt.size()) > engine_.n_ctx()) {
    messages_.pop_back();
    fail("the conversation is %zu tokens, longer than the context size %d (-c); use /reset", req.prompt.size(),
         engine_.n_ctx());
  }

  std::string text;
  size_t shown = 0;  // text already passed to on_text
  GenerationResult r = generate(engine_, sampler_, tok_, req, [&](int, const std::string& piece) {
    text += piece;
    size_t at = std::string::npos;
    for (const std::string& m : end_markers_) at = std::min(at, text.find(m));
    if (at != std::string::npos) {
      text.resize(at);
      if (on_text && text.size() > shown) on_text(text.substr(shown));
      return false;
    }
    // Hold back a tail that could be the start of an end marker.
    size_t hold = 0;
    for (const std::string& m : end_markers_)
      for (size_t k = std::min(m.size() - 1, text.size()); k > hold; --k)
        if (text.compare(text.size() - k, k, m, 0, k) == 0) {
          hold = k;
          break;
        }
    if (on_text && text.size() - hold > shown) {
      on_text(text.substr(shown, text.size() - hold - shown));
      shown = text.size() - hold;
    }
    return true;
  }, interrupt);
  if (on_text && r.finish != FinishReason::Stop && text.size() > shown) on_text(text.substr(shown));

  cached_.assign(req.prompt.begin(), req.prompt.end());
  cached_.insert(cached_.end(), r.tokens.begin(), r.tokens.begin() + r.n_generated_cached);
  messages_.push_back({"assistant", text});
  return r;
}

}  // namespace runlm
