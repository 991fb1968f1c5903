// libFuzzer target: the built-in chat templates (ChatTemplate::apply) with
// fuzzed conversations, and the rendered prompt tokenized as chat does it
// (tokenize_prompt, stories260K vocabulary). A runlm::Error (e.g. a role
// order the template forbids) is a correct rejection; anything else is a
// bug. tests/fuzz/fuzz_jinja.cpp fuzzes the template text itself.
//
// Input: byte 0 picks the template (0-4 the known ones, 5 an unknown name)
// and bit 3 add_generation_prompt; the rest is split at 0x00 into messages,
// whose first byte picks the role (system, user, assistant, "tool", "")
// and whose remaining bytes are the content.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chat_template.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

using namespace runlm;

namespace {

const Tokenizer& tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(
      *GgufFile::open(std::string(RUNLM_SOURCE_DIR) + "/models/stories260K/stories260K.gguf"));
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& names = chat_template_names();
  const size_t pick = (data[0] & 7) % (names.size() + 1);
  const std::string name = pick < names.size() ? names[pick] : std::string("no-such-template");
  const bool add_generation_prompt = data[0] & 8;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);

  static const char* const kRoles[] = {"system", "user", "assistant", "tool", ""};
  std::vector<ChatMessage> messages;
  size_t start = 0;
  while (start < rest.size()) {
    size_t end = rest.find('\0', start);
    if (end == std::string::npos) end = rest.size();
    const std::string part = rest.substr(start, end - start);
    if (!part.empty())
      messages.push_back({kRoles[static_cast<uint8_t>(part[0]) % 5], part.substr(1)});
    start = end + 1;
  }

  try {
    const ChatTemplate tmpl(builtin_chat_template(name), name, "<s>", "</s>");
    const RenderedPrompt prompt = tmpl.apply(messages, add_generation_prompt);
    for (const auto& r : prompt.content_ranges)
      if (r.first > r.second || r.second > prompt.text.size()) __builtin_trap();
    const std::vector<int> ids = tokenize_prompt(tokenizer(), prompt);
    (void)tokenizer().decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
