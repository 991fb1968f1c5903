#include "line_reader.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>

// libedit's readline-compatible interface (BSD licence).
#include <editline/readline.h>

namespace runlm {

LineReader::LineReader(bool interactive) : interactive_(interactive) {
  if (interactive_) using_history();
}

bool LineReader::read(const std::string& prompt, std::string* line) {
  if (!interactive_) return static_cast<bool>(std::getline(std::cin, *line));
  std::fflush(stdout);
  char* text = readline(prompt.c_str());
  if (text == nullptr) return false;
  *line = text;
  std::free(text);
  if (line->find_first_not_of(" \t\r\n") != std::string::npos) add_history(line->c_str());
  return true;
}

}  // namespace runlm
