#include "chat_session.h"

#include <algorithm>

#include "common.h"
#include "engine.h"
#include "sampler.h"
#include "tokenizer.h"

namespace runlm {

ChatSession::ChatSession(Engine& engine, const Tokenizer& tokenizer, Sampler& sampler, std::string template_name,
                         std::string system_prompt)
    : engine_(engine), tok_(tokenizer), sampler_(sampler), template_(std::move(template_name)),
      system_(std::move(system_prompt)) {
  end_marker_ = chat_template_end_marker(template_);
  // Where the end marker is one token of the vocabulary, stop on its id;
  // otherwise the text is watched for it.
  const int id = tok_.piece_to_id(end_marker_);
  if (id >= 0 && !tok_.is_eog(id)) stop_tokens_.push_back(id);
  reset();
}

void ChatSession::reset() {
  messages_.clear();
  if (!system_.empty()) messages_.push_back({"system", system_});
  // The cache keeps its contents; cached_ tracks what is still valid, and a
  // new conversation shares at most the system prompt's tokens with it.
}

std::vector<int> ChatSession::render_prompt() const {
  const std::string bos_text = tok_.bos() >= 0 ? tok_.id_to_piece(tok_.bos()) : "";
  const std::string eos_text = tok_.eos() >= 0 ? tok_.id_to_piece(tok_.eos()) : "";
  const std::string text = chat_template_apply(template_, messages_, /*add_generation_prompt=*/true, bos_text, eos_text);
  // Templates that write the BOS text themselves get it as a token through
  // parse_special; the others get BOS prepended, as llama.cpp does.
  const bool starts_with_bos = !bos_text.empty() && text.rfind(bos_text, 0) == 0;
  return tok_.encode(text, /*add_bos=*/tok_.add_bos() && !starts_with_bos, /*parse_special=*/true);
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
    const size_t at = text.find(end_marker_);
    if (at != std::string::npos) {
      text.resize(at);
      if (on_text && text.size() > shown) on_text(text.substr(shown));
      return false;
    }
    // Hold back a tail that could be the start of the end marker.
    size_t hold = 0;
    for (size_t k = std::min(end_marker_.size() - 1, text.size()); k > 0; --k)
      if (text.compare(text.size() - k, k, end_marker_, 0, k) == 0) {
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
