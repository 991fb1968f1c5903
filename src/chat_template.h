// Chat templates: renders a conversation into the prompt text a model was
// trained on with the model's own Jinja template, byte for byte as
// transformers' apply_chat_template renders it (see jinja_template.h). The
// template is the GGUF's tokenizer.chat_template, a file, or one of the
// built-in sources (src/chat_templates/NAME.jinja: llama2, chatml, zephyr,
// mistral, gemma), all rendered by the same interpreter.
#pragma once

#include <ctime>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "jinja_template.h"

namespace runlm {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

// The rendered prompt and the byte ranges [first, second) where message
// content landed in it, in order (tracked through the template's
// concatenation, join and trimming; content the template transforms
// otherwise counts as the template's text): text the tokenizer must take
// literally (a user typing "<|im_end|>" must not end the turn).
struct RenderedPrompt {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content_ranges;
};

// Names accepted by --chat-template.
const std::vector<std::string>& chat_template_names();
// The Jinja source of a built-in template; throws Error for an unknown name
// (listing the known ones).
const std::string& builtin_chat_template(const std::string& name);

class ChatTemplate {
 public:
  // Parses the source; throws Error naming `origin` (e.g. "built-in template
  // chatml", "tokenizer.chat_template of model.gguf") and the line and column.
  // bos/eos are the vocabulary's token texts the template may write.
  ChatTemplate(const std::string& source, std::string origin, std::string bos_text, std::string eos_text);

  // Renders messages (plus add_generation_prompt, bos_token, eos_token,
  // tools=None, documents=None); throws Error when the template raises or
  // goes wrong, with the template's own words and the line and column.
  RenderedPrompt apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // Refuses, before a chat starts, a system prompt the template rejects
  // (Gemma's "System role not supported"): renders a probe conversation.
  void check_system_prompt(const std::string& system_prompt) const;

  const std::string& origin() const { return origin_; }
  const std::string& bos_text() const { return bos_; }
  // The clock strftime_now() reads; tests fix it.
  void set_clock(std::function<std::tm()> now) { options_.now = std::move(now); }

 private:
  jinja::Template tmpl_;
  std::string origin_, bos_, eos_;
  jinja::RenderOptions options_;
};

class Tokenizer;

// The prompt's tokens. Templates that write the BOS text themselves get it
// as a token; the others get BOS prepended, as llama.cpp does. Text from the
// template is parsed for special tokens.
std::vector<int> tokenize_prompt(const Tokenizer& tok, const RenderedPrompt& prompt);

// Texts that end an assistant turn, watched for in generated text whichever
// template is used: the EOS token's text and the usual end-of-turn texts
// ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", ...) that are no token of
// the vocabulary (a model may spell them) or a token that ends generation
// in it. Generation stops at those tokens' ids by itself; a token that does
// not end generation is no end of turn (gpt-oss's <|end|> closes one
// message of a reply, its analysis, before the final one).
std::vector<std::string> chat_end_markers(const Tokenizer& tok);

}  // namespace runlm
