// Jinja lexer: template source -> tokens, with the whitespace rules of
// jinja2's Environment(trim_blocks=True, lstrip_blocks=True) as transformers
// builds it: newlines normalised to "\n" and one trailing newline dropped
// (keep_trailing_newline=False), `{%-`/`-%}`/`{{-`/`-}}`/`{#-`/`-#}` strip
// all whitespace on their side, a block or comment tag alone on its line
// takes the line's leading blanks (lstrip_blocks, not after `{%+`) and the
// newline after `%}`/`#}` (trim_blocks, not before `+%}`). Comments vanish.
#pragma once

#include <string>
#include <vector>

namespace runlm::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Text: the data; String: the decoded value; Op: the operator
  int line = 1, col = 1;
};

// Throws Error "line L, column C: ..." on a lexical error.
std::vector<Token> lex(const std::string& source);

// "line L, column C: msg" as an Error.
[[noreturn]] void fail_at(int line, int col, const std::string& msg);

}  // namespace runlm::jinja
