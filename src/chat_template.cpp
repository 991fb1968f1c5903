// Chat templates: each known template is its model family's official Jinja
// chat template written out in C++, statement by statement, so that the text
// matches transformers' apply_chat_template byte for byte (including the
// templates' raise_exception rules, Python's str.strip() in `.strip()` and
// `| trim`, and what they silently skip). The Jinja sources are kept in
// tests/data/chat_templates/<name>.jinja; tools/render_chat_goldens.py renders
// them with jinja2 into the goldens the tests compare against.
#include "chat_template.h"

#include <cstdint>

#include "common.h"

namespace runlm {
namespace {

const char kAlternateRoles[] = "Conversation roles must alternate user/assistant/user/assistant/...";

[[noreturn]] void raise_exception(const char* name, const char* message) {
  // The template's own words, so users can look them up.
  fail("chat template %s: %s", name, message);
}

// The template reads messages[0] unguarded; jinja2 raises UndefinedError.
void require_messages(const char* name, const std::vector<ChatMessage>& messages) {
  if (messages.empty()) fail("chat template %s: the conversation is empty (the template reads messages[0])", name);
}

std::string joined_names() {
  std::string s;
  for (const std::string& n : chat_template_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Python's str.isspace() for one code point: what str.strip() and Jinja's
// trim filter remove.
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Decodes the UTF-8 code point at s[i..], setting *len; invalid sequences are
// one byte of code point 0xFFFD (never whitespace).
uint32_t decode_utf8(const std::string& s, size_t i, size_t* len) {
  const uint8_t b = static_cast<uint8_t>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + static_cast<size_t>(n) > s.size()) {
    *len = 1;
    return 0xfffd;
  }
  uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1fu) : n == 3 ? (b & 0x0fu) : (b & 0x07u);
  for (int k = 1; k < n; ++k) {
    const uint8_t cb = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
    if ((cb & 0xc0) != 0x80) {
      *len = 1;
      return 0xfffd;
    }
    c = (c << 6) | (cb & 0x3fu);
  }
  *len = static_cast<size_t>(n);
  return c;
}

// Python's str.strip() with no argument, on UTF-8 text.
std::string py_strip(const std::string& s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len;
    if (!is_python_space(decode_utf8(s, begin, &len))) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last code point
    while (start > begin && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xc0) == 0x80) --start;
    size_t len;
    const uint32_t c = decode_utf8(s, start, &len);
    if (start + len != end || !is_python_space(c)) break;  // invalid UTF-8 is never whitespace
    end = start;
  }
  return s.substr(begin, end - begin);
}

// (message['role'] == 'user') != (loop.index0 % 2 == 0)
bool breaks_alternation(const ChatMessage& m, size_t index0) { return (m.role == "user") != (index0 % 2 == 0); }

// meta-llama/Llama-2-7b-chat-hf tokenizer_config.json. The system message is
// folded into the first user turn and the whole turn is stripped; the template
// has no generation prompt (the prompt ends with " [/INST]").
std::string render_llama2(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) {
  require_messages("llama2", messages);
  const bool has_system = messages[0].role == "system";  // `system_message != false` holds even for ""
  const size_t first = has_system ? 1 : 0;
  std::string out;
  for (size_t k = first; k < messages.size(); ++k) {
    const ChatMessage& m = messages[k];
    const size_t index0 = k - first;
    if (breaks_alternation(m, index0)) raise_exception("llama2", kAlternateRoles);
    std::string content;
    if (index0 == 0 && has_system) {
      content.append("<<SYS>>\n").append(messages[0].content).append("\n<</SYS>>\n\n").append(m.content);
    } else {
      content = m.content;
    }
    if (m.role == "user")
      out.append(bos).append("[INST] ").append(py_strip(content)).append(" [/INST]");
    else if (m.role == "assistant")
      out.append(" ").append(py_strip(content)).append(" ").append(eos);
    // Any other role at an odd position passes the alternation check and is
    // dropped by the template.
  }
  return out;
}

// teknium/OpenHermes-2.5-Mistral-7B tokenizer_config.json: every role as is.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages)
    out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// HuggingFaceH4/zephyr-7b-beta tokenizer_config.json. Under trim_blocks the
// newline after each `{{ ... }}` survives, so every turn ends "</s>\n"; the
// generation prompt is emitted inside the loop, on its last message only.
std::string render_zephyr(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& eos) {
  std::string out;
  for (size_t k = 0; k < messages.size(); ++k) {
    const ChatMessage& m = messages[k];
    if (m.role == "user")
      out.append("<|user|>\n").append(m.content).append(eos).append("\n");
    else if (m.role == "system")
      out.append("<|system|>\n").append(m.content).append(eos).append("\n");
    else if (m.role == "assistant")
      out.append("<|assistant|>\n").append(m.content).append(eos).append("\n");
    if (k + 1 == messages.size() && add_generation_prompt) out += "<|assistant|>\n";
  }
  return out;
}

// mistralai/Mistral-7B-Instruct-v0.2, the tokenizer_config.json it was
// released with (the same template as Mixtral-8x7B-Instruct-v0.1): no system
// role (it raises), no space before the assistant text, none after </s>, no
// generation prompt. Later revisions of the v0.2 repository changed this to
// " [INST] " turns that take a system message; that is not this template.
std::string render_mistral(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) {
  std::string out = bos;
  for (size_t k = 0; k < messages.size(); ++k) {
    const ChatMessage& m = messages[k];
    if (breaks_alternation(m, k)) raise_exception("mistral", kAlternateRoles);
    if (m.role == "user")
      out.append("[INST] ").append(m.content).append(" [/INST]");
    else if (m.role == "assistant")
      out.append(m.content).append(eos);
    else
      raise_exception("mistral", "Only user and assistant roles are supported!");
  }
  return out;
}

// google/gemma-7b-it tokenizer_config.json. No system role; the assistant is
// "model"; content is trimmed (`message['content'] | trim`).
std::string render_gemma(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         const std::string& bos) {
  require_messages("gemma", messages);
  if (messages[0].role == "system") raise_exception("gemma", "System role not supported");
  std::string out = bos;
  for (size_t k = 0; k < messages.size(); ++k) {
    const ChatMessage& m = messages[k];
    if (breaks_alternation(m, k)) raise_exception("gemma", kAlternateRoles);
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out.append("<start_of_turn>").append(role).append("\n").append(py_strip(m.content)).append("<end_of_turn>\n");
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

}  // namespace

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> kNames = {"llama2", "chatml", "zephyr", "mistral", "gemma"};
  return kNames;
}

std::string chat_template_detect(const std::string& jinja_source) {
  // Most specific marker first: several templates share "[INST]".
  if (contains(jinja_source, "<start_of_turn>")) return "gemma";
  if (contains(jinja_source, "<|im_start|>")) return "chatml";
  if (contains(jinja_source, "<|user|>") && contains(jinja_source, "<|assistant|>")) return "zephyr";
  if (contains(jinja_source, "[INST]") && contains(jinja_source, "<<SYS>>")) return "llama2";
  if (contains(jinja_source, "[INST]")) return "mistral";
  fail("unknown chat template in the model (no known markers); choose one with --chat-template NAME, known: %s",
       joined_names().c_str());
}

std::string chat_template_apply(const std::string& name, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos, const std::string& eos) {
  if (name == "llama2") return render_llama2(messages, bos, eos);
  if (name == "chatml") return render_chatml(messages, add_generation_prompt);
  if (name == "zephyr") return render_zephyr(messages, add_generation_prompt, eos);
  if (name == "mistral") return render_mistral(messages, bos, eos);
  if (name == "gemma") return render_gemma(messages, add_generation_prompt, bos);
  fail("unknown chat template '%s' (--chat-template); known: %s", name.c_str(), joined_names().c_str());
}

std::string chat_template_end_marker(const std::string& name) {
  // What each template writes after an assistant reply. For the "</s>"
  // templates that is the EOS token's text in the Llama/Mistral vocabularies.
  if (name == "llama2" || name == "zephyr" || name == "mistral") return "</s>";
  if (name == "chatml") return "<|im_end|>";
  if (name == "gemma") return "<end_of_turn>";
  fail("unknown chat template '%s' (--chat-template); known: %s", name.c_str(), joined_names().c_str());
}

}  // namespace runlm
