// A chat conversation on one engine: renders the whole conversation with the
// chat template, re-uses the KV cache for the longest common token prefix
// with what was evaluated before (earlier turns are not recomputed), and
// generates the assistant's reply. When the conversation no longer leaves
// room for a reply, the oldest turns are dropped (the system prompt stays),
// as llama.cpp's context shift keeps its first n_keep tokens and drops the
// oldest after them, but whole turns at a time so the template stays valid.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "chat_template.h"
#include "generation.h"

namespace runlm {

class Engine;
class Sampler;
class Tokenizer;

class ChatSession {
 public:
  // Throws Error when the template refuses the system prompt.
  ChatSession(Engine& engine, const Tokenizer& tokenizer, Sampler& sampler, const ChatTemplate& chat_template,
              std::string system_prompt);

  // Adds the user's message, streams the reply's text through on_text and
  // records it in the conversation. interrupt stops the reply early (what was
  // generated so far is kept).
  GenerationResult reply(const std::string& user_text, int n_predict,
                         const std::function<void(const std::string&)>& on_text,
                         const std::atomic<bool>* interrupt = nullptr);
  // Forgets the conversation (the system prompt stays).
  void reset();
  // Replaces the conversation with earlier messages (a saved chat); the next
  // reply evaluates whatever of it is not in the cache.
  void load_history(std::vector<ChatMessage> messages) { messages_ = std::move(messages); }

  const std::vector<ChatMessage>& messages() const { return messages_; }
  // --stop strings end a reply before them; -r (reverse prompt) strings end
  // it after them, returning control to the user as llama-cli does.
  void set_stop_strings(std::vector<std::string> stop, std::vector<std::string> reverse_prompts) {
    stop_ = std::move(stop);
    reverse_prompts_ = std::move(reverse_prompts);
  }
  // Earlier messages dropped to make room for the last reply (0 if none).
  int dropped_messages() const { return dropped_; }
  // Called with each rendered prompt and its token count (--verbose-prompt).
  void set_prompt_observer(std::function<void(const std::string&, size_t)> f) { observer_ = std::move(f); }
  // Tokens of the conversation whose K/V are in the engine's cache.
  const std::vector<int>& cached_tokens() const { return cached_; }

 private:
  std::vector<int> render_prompt() const;
  // Drops the oldest user/assistant messages (never the system prompt or
  // the new user message) until the prompt leaves `reserve` tokens for the
  // reply; returns the prompt.
  std::vector<int> fit_context(int reserve);

  Engine& engine_;
  const Tokenizer& tok_;
  Sampler& sampler_;
  const ChatTemplate& template_;
  std::string system_;
  std::vector<std::string> end_markers_;  // texts that end an assistant turn
  std::vector<ChatMessage> messages_;
  std::vector<int> cached_;
  std::vector<std::string> stop_, reverse_prompts_;
  int dropped_ = 0;
  std::function<void(const std::string&, size_t)> observer_;
};

}  // namespace runlm
