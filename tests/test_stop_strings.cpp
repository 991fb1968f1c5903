// Stop strings over streamed text: --stop cuts before the string, -r after
// it, and text that could start one is held back, never printed half.
#include <gtest/gtest.h>

#include "stop_strings.h"

using runlm::StopStringFilter;

namespace {
// Feeds pieces; returns what was shown and whether (and at which piece) it stopped.
std::string feed(StopStringFilter& f, const std::vector<std::string>& pieces, int* stopped_at) {
  std::string shown;
  *stopped_at = -1;
  for (size_t i = 0; i < pieces.size(); ++i) {
    bool stopped = false;
    shown += f.push(pieces[i], &stopped);
    if (stopped) {
      *stopped_at = static_cast<int>(i);
      return shown;
    }
  }
  return shown + f.flush();
}
}  // namespace

TEST(StopStrings, StopCutsBeforeReversePromptAfter) {
  int at = 0;
  StopStringFilter stop({"User:"}, {});
  EXPECT_EQ(feed(stop, {"Hello", " there", "\nUs", "er", ": more"}, &at), "Hello there\n");
  EXPECT_EQ(at, 4);

  StopStringFilter rp({}, {"User:"});
  EXPECT_EQ(feed(rp, {"Hello", "\nUs", "er:", " more"}, &at), "Hello\nUser:");
  EXPECT_EQ(at, 2);
  EXPECT_EQ(rp.matched_reverse_prompt(), "User:");
}

TEST(StopStrings, HeldBackPrefixIsReleasedWhenItIsNotAStop) {
  StopStringFilter f({"STOP"}, {});
  bool stopped = true;
  EXPECT_EQ(f.push("abc ST", &stopped), "abc ");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(f.push("AR", &stopped), "STAR");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(f.push(" ST", &stopped), " ");
  EXPECT_EQ(f.flush(), "ST");  // generation ended for another reason: the tail is output
}

TEST(StopStrings, EarliestMatchWins) {
  int at = 0;
  StopStringFilter f({"b"}, {"a"});
  EXPECT_EQ(feed(f, {"xab"}, &at), "xa");  // -r "a" ends first, kept
  StopStringFilter g({"a"}, {"ab"});
  EXPECT_EQ(feed(g, {"xab"}, &at), "x");  // --stop "a" starts first
  StopStringFilter none({}, {});
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(feed(none, {"a", "b"}, &at), "ab");
  EXPECT_EQ(at, -1);
}
