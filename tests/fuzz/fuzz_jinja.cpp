// libFuzzer target: the Jinja interpreter on arbitrary template text. The
// input is parsed and rendered over a fixed conversation (system, user,
// assistant, user; with and without the generation prompt) and a fixed
// clock. A runlm::Error (a syntax error, raise_exception, a limit) is a
// correct rejection; a crash, a hang past libFuzzer's timeout, a leak or
// memory beyond its limit is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "chat_template.h"
#include "common.h"

using namespace runlm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  static const std::vector<ChatMessage> kConversation = {
      {"system", "You are helpful."}, {"user", "Hi <|im_end|> there"}, {"assistant", "  Hello!  "}, {"user", "Bye"}};
  try {
    ChatTemplate tmpl(source, "fuzz", "<s>", "</s>");
    tmpl.set_clock([] {
      std::tm t{};
      t.tm_year = 124;
      t.tm_mon = 6;
      t.tm_mday = 26;
      return t;
    });
    for (bool gen : {false, true}) {
      const RenderedPrompt p = tmpl.apply(kConversation, gen);
      for (const auto& r : p.content_ranges)
        if (r.first > r.second || r.second > p.text.size()) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
