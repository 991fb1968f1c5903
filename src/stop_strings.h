// Stop strings for streamed text (generate and chat): --stop strings end the
// output before them, -r (reverse prompt, as llama-cli) strings end it after
// them. Text that could be the start of one is held back until it is known
// not to be, so a stop string is never half printed.
#pragma once

#include <string>
#include <vector>

namespace runlm {

class StopStringFilter {
 public:
  StopStringFilter(std::vector<std::string> stop_before, std::vector<std::string> stop_after);

  // Adds generated text; returns the text that can be shown now. Sets
  // *stopped when the output now holds a stop string (the returned text
  // then ends where the output ends: before a --stop string, after a -r one).
  std::string push(const std::string& piece, bool* stopped);
  // What is still held back, once generation has ended for another reason.
  std::string flush();
  bool empty() const { return before_.empty() && after_.empty(); }
  // The -r string that ended the output ("" if none did).
  const std::string& matched_reverse_prompt() const { return matched_after_; }

 private:
  std::vector<std::string> before_, after_;
  std::string text_;   // all generated text
  size_t shown_ = 0;   // bytes of text_ already returned
  std::string matched_after_;
};

}  // namespace runlm
