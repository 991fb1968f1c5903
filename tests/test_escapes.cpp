// -e: escapes as llama.cpp's string_process_escapes reads them.
#include <gtest/gtest.h>

#include "escapes.h"

using runlm::process_escapes;

TEST(Escapes, Table) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plain", "plain"},
      {"a\\nb", "a\nb"},
      {"a\\tb\\rc", "a\tb\rc"},
      {"back\\\\slash", "back\\slash"},
      {"\\\"quoted\\\"", "\"quoted\""},
      {"it\\'s", "it's"},
      {"\\x41\\x62c", "Abc"},
      {"\\x4", "\\x4"},         // one hex digit: kept as it is
      {"\\xZZ", "\\xZZ"},       // not hex: kept
      {"\\q", "\\q"},           // unknown escape: kept
      {"end\\", "end\\"},       // a lone backslash at the end stays
      {"\\\\n", "\\n"},         // an escaped backslash, then n
      {"\\x0a", "\n"},
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(process_escapes(in), out) << in;
}
