#include "chat_template.h"

#include "common.h"
#include "tokenizer.h"

namespace runlm {

// Generated from src/chat_templates/*.jinja (CMakeLists.txt), name -> source.
const std::vector<std::pair<std::string, std::string>>& builtin_chat_template_sources();

namespace {

std::string joined_names() {
  std::string s;
  for (const std::string& n : chat_template_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

jinja::Value message_value(const ChatMessage& m) {
  return jinja::Value::make_dict({{jinja::Value::string("role"), jinja::Value::string(m.role)},
                                  {jinja::Value::string("content"), jinja::Value::literal_string(m.content)}});
}

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& kv : builtin_chat_template_sources()) names.push_back(kv.first);
    return names;
  }();
  return kNames;
}

const std::string& builtin_chat_template(const std::string& name) {
  for (const auto& kv : builtin_chat_template_sources())
    if (kv.first == name) return kv.second;
  fail("unknown chat template '%s' (--chat-template); known: %s", name.c_str(), joined_names().c_str());
}

namespace {
jinja::Template parse_named(const std::string& source, const std::string& origin) {
  try {
    return jinja::Template(source);
  } catch (const Error& e) {
    fail("%s: %s", origin.c_str(), e.what());
  }
}
}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string origin, std::string bos_text, std::string eos_text)
    : tmpl_(parse_named(source, origin)), origin_(std::move(origin)), bos_(std::move(bos_text)),
      eos_(std::move(eos_text)) {}

RenderedPrompt ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::vector<jinja::Value> list;
  for (const ChatMessage& m : messages) list.push_back(message_value(m));
  // What transformers passes: the conversation, the flag, tools and
  // documents (None when absent) and the special tokens' texts.
  const std::vector<std::pair<std::string, jinja::Value>> vars = {
      {"messages", jinja::Value::make_list(std::move(list))},
      {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
      {"tools", jinja::Value::none()},
      {"documents", jinja::Value::none()},
      {"bos_token", jinja::Value::string(bos_)},
      {"eos_token", jinja::Value::string(eos_)},
  };
  jinja::Rendered r;
  try {
    r = tmpl_.render(vars, options_);
  } catch (const Error& e) {
    fail("%s: %s", origin_.c_str(), e.what());
  }
  RenderedPrompt out;
  out.text = std::move(r.text);
  // The interpreter tracks where content text went (through concatenation,
  // join and trimming); adjacent pieces are one range.
  for (const jinja::Span& sp : r.literal_spans) {
    if (!out.content_ranges.empty() && out.content_ranges.back().second == sp.first)
      out.content_ranges.back().second = sp.second;
    else
      out.content_ranges.emplace_back(sp.first, sp.second);
  }
  return out;
}

void ChatTemplate::check_system_prompt(const std::string& system_prompt) const {
  if (system_prompt.empty()) return;
  try {
    apply({{"system", system_prompt}, {"user", "Hello"}}, true);
  } catch (const Error& e) {
    // Blame the system prompt only when the same turn renders without it.
    apply({{"user", "Hello"}}, true);
    fail("the chat template does not take a system prompt (-sys): %s", e.what());
  }
}

std::vector<int> tokenize_prompt(const Tokenizer& tok, const RenderedPrompt& prompt) {
  const std::string bos_text = tok.bos() >= 0 ? tok.id_to_piece(tok.bos()) : "";
  const bool starts_with_bos = !bos_text.empty() && prompt.text.rfind(bos_text, 0) == 0;
  // The template's own text is parsed for special tokens, the messages'
  // contents are not: user text cannot inject a control token. BOS is
  // prepended where the vocabulary asks for it and the template did not
  // write it already.
  return tok.encode(prompt.text, /*add_bos=*/tok.add_bos() && !starts_with_bos, /*parse_special=*/true,
                    prompt.content_ranges);
}

namespace {
// End-of-turn token texts of the common chat formats (ChatML, Gemma, Llama
// 3, Phi-3, GPT-2 style, Granite, gpt-oss, Command-R).
const char* const kEndOfTurnTexts[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                       "<|endoftext|>", "<|end_of_text|>", "<|return|>", "<|END_OF_TURN_TOKEN|>"};
}  // namespace

std::vector<std::string> chat_end_markers(const Tokenizer& tok) {
  std::vector<std::string> out;
  const std::string eos = tok.eos() >= 0 ? tok.id_to_piece(tok.eos()) : "";
  if (!eos.empty()) out.push_back(eos);
  for (const char* t : kEndOfTurnTexts) {
    const int id = tok.piece_to_id(t);
    if (t != eos && (id < 0 || tok.is_eog(id))) out.emplace_back(t);
  }
  return out;
}

}  // namespace runlm
