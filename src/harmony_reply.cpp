#include "harmony_reply.h"

#include <string_view>

namespace runlm {

namespace {
constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kEnd = "<|end|>",
                           kStart = "<|start|>";
}  // namespace

bool is_harmony_reply(const std::string& reply) { return std::string_view(reply).substr(0, kChannel.size()) == kChannel; }

std::string harmony_final_text(const std::string& reply) {
  if (!is_harmony_reply(reply)) return reply;
  const std::string_view text(reply);
  std::string final_text;
  size_t pos = 0;
  while (pos < text.size()) {
    // One message: its header up to <|message|>, its text up to <|end|>
    // (or the end of the reply), then the next <|start|>.
    const size_t body = text.find(kMessage, pos);
    if (body == std::string_view::npos) break;  // a header cut short
    const std::string_view header = text.substr(pos, body - pos);
    const size_t begin = body + kMessage.size();
    size_t end = text.find(kEnd, begin);
    if (end == std::string_view::npos) end = text.size();
    const size_t ch = header.find(kChannel);
    if (ch != std::string_view::npos) {
      std::string_view name = header.substr(ch + kChannel.size());
      name = name.substr(0, name.find_first_of(" <"));
      if (name == "final") final_text.assign(text.substr(begin, end - begin));
    }
    const size_t next = text.find(kStart, end);
    if (next == std::string_view::npos) break;
    pos = next + kStart.size();
  }
  return final_text;
}

}  // namespace runlm
