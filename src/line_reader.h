// The chat's input: on a terminal, libedit's readline (line editing, and
// history of this session's lines with the arrow keys); otherwise plain
// lines from stdin (a pipe or a file), with no prompt echoed.
#pragma once

#include <string>

namespace runlm {

class LineReader {
 public:
  // interactive: stdin is a terminal.
  explicit LineReader(bool interactive);
  // Reads one line (without its newline) after showing `prompt` (terminal
  // only). False at the end of input (Ctrl-D).
  bool read(const std::string& prompt, std::string* line);
  bool interactive() const { return interactive_; }

 private:
  bool interactive_;
};

}  // namespace runlm
