#include "jinja_lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common.h"
#include "jinja_value.h"

namespace runlm::jinja {

void fail_at(int line, int col, const std::string& msg) {
  fail("line %d, column %d: %s", line, col, msg.c_str());
}

namespace {

// jinja2 splits the source on \r\n, \r and \n and joins it with "\n",
// dropping one trailing newline (keep_trailing_newline=False).
std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < s_.size(); ++k)
      if (s_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      // The next tag start: {{, {% or {#.
      size_t at = pos;
      for (;;) {
        at = s_.find('{', at);
        if (at == std::string::npos || at + 1 >= s_.size()) {
          at = std::string::npos;
          break;
        }
        const char c = s_[at + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++at;
      }
      if (at == std::string::npos) {
        emit_text(s_.substr(pos), pos);
        break;
      }
      std::string text = s_.substr(pos, at - pos);
      const char kind = s_[at + 1];
      size_t p = at + 2;
      char sign = 0;
      if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) sign = s_[p++];
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && py_isspace_byte(text, e)) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only blanks between the line start and the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t k = l_pos; k < text.size() && blank; ++k)
            if (!is_space(text[k])) blank = false;
          if (blank) text.resize(l_pos);
        }
      }
      emit_text(text, pos);
      if (kind == '#') {
        pos = comment(at, p);
      } else if (kind == '%' && is_raw_begin(p)) {
        pos = raw(at, p);
      } else {
        pos = tag(kind, at, p);
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    out_.push_back({Tok::Eof, "", line_of(s_.size()), col_of(s_.size())});
    return std::move(out_);
  }

 private:
  // Python's str.rstrip() on the byte before e: ASCII whitespace and the
  // multi-byte Unicode spaces.
  static bool py_isspace_byte(const std::string& t, size_t e) {
    const unsigned char c = static_cast<unsigned char>(t[e - 1]);
    if (c < 0x80) return py_isspace(c);
    size_t b = e - 1;
    while (b > 0 && e - b < 4 && (static_cast<unsigned char>(t[b]) & 0xc0) == 0x80) --b;
    const auto cps = utf8_decode(t.substr(b, e - b));
    return cps.size() == 1 && py_isspace(cps[0]);
  }
  // rstrip for multi-byte spaces removes the whole code point.
  void emit_text(const std::string& text, size_t pos) {
    if (text.empty()) return;
    out_.push_back({Tok::Text, text, line_of(pos), col_of(pos)});
  }

  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  }
  int col_of(size_t pos) const { return static_cast<int>(pos - line_starts_[static_cast<size_t>(line_of(pos)) - 1]) + 1; }
  [[noreturn]] void error(size_t pos, const std::string& msg) const { fail_at(line_of(pos), col_of(pos), msg); }

  size_t skip_ws(size_t p) const {
    while (p < s_.size() && is_space(s_[p])) ++p;
    return p;
  }

  // After a block end: `-%}` strips what follows, `%}` takes one newline.
  size_t after_end(size_t p, bool strip, bool plus) const {
    if (strip) return skip_ws(p);
    if (!plus && p < s_.size() && s_[p] == '\n') return p + 1;
    return p;
  }

  size_t comment(size_t at, size_t p) {
    for (size_t e = s_.find("#}", p); e != std::string::npos; e = s_.find("#}", e + 1)) {
      const bool strip = e > p && s_[e - 1] == '-';
      const bool plus = e > p && s_[e - 1] == '+';
      return after_end(e + 2, strip, plus);
    }
    error(at, "the comment is not closed (missing #})");
  }

  bool is_raw_begin(size_t p) const {
    p = skip_ws(p);
    if (s_.compare(p, 3, "raw") != 0) return false;
    p = skip_ws(p + 3);
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0;
  }

  size_t raw(size_t at, size_t p) {
    p = skip_ws(p) + 3;
    p = skip_ws(p);
    if (s_[p] == '-') p = skip_ws(p + 3);
    else p += 2;
    for (size_t e = s_.find("{%", p); e != std::string::npos; e = s_.find("{%", e + 2)) {
      size_t q = e + 2;
      char sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      q = skip_ws(q);
      if (s_.compare(q, 6, "endraw") != 0) continue;
      q = skip_ws(q + 6);
      char end_sign = 0;
      if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) end_sign = s_[q++];
      if (s_.compare(q, 2, "%}") != 0) continue;
      std::string text = s_.substr(p, e - p);
      if (sign == '-') {
        size_t n = text.size();
        while (n > 0 && py_isspace_byte(text, n)) --n;
        text.resize(n);
      }
      emit_text(text, p);
      return after_end(q + 2, end_sign == '-', end_sign == '+');
    }
    error(at, "the raw block is not closed (missing {% endraw %})");
  }

  size_t tag(char kind, size_t at, size_t p) {
    const bool block = kind == '%';
    out_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", line_of(at), col_of(at)});
    std::string balance;
    for (;;) {
      if (balance.empty()) {
        // The end rule comes first, before whitespace: "-%}" ends the tag.
        const char* close = block ? "%}" : "}}";
        if (s_.compare(p, 3, std::string("-") + close) == 0) {
          out_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", line_of(p), col_of(p)});
          return skip_ws(p + 3);
        }
        if (block && s_.compare(p, 3, "+%}") == 0) {
          out_.push_back({Tok::BlockEnd, "", line_of(p), col_of(p)});
          return p + 3;
        }
        if (s_.compare(p, 2, close) == 0) {
          out_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", line_of(p), col_of(p)});
          return block ? after_end(p + 2, false, false) : p + 2;
        }
      }
      if (p >= s_.size()) error(at, block ? "the tag is not closed (missing %})" : "the expression is not closed (missing }})");
      const char c = s_[p];
      if (is_space(c)) {
        ++p;
        continue;
      }
      const int line = line_of(p), col = col_of(p);
      if (std::isdigit(static_cast<unsigned char>(c))) {
        p = number(p, line, col);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        out_.push_back({Tok::Name, s_.substr(p, e - p), line, col});
        p = e;
      } else if (c == '\'' || c == '"') {
        p = string(p, line, col);
      } else {
        static const char* const kOps2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : kOps2)
          if (s_.compare(p, 2, o) == 0) op = o;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}<>=.:|,;", c)) error(p, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          if (balance.size() >= 1000) error(p, "brackets nested too deeply");
          balance += op == "(" ? ')' : op == "[" ? ']' : '}';
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty() || balance.back() != op[0]) error(p, "unexpected '" + op + "'");
          balance.pop_back();
        }
        out_.push_back({Tok::Op, op, line, col});
        p += op.size();
      }
    }
  }

  size_t digits(size_t p) const {
    while (p < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[p])) ||
                             (s_[p] == '_' && p + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p + 1])))))
      ++p;
    return p;
  }

  size_t number(size_t p, int line, int col) {
    size_t e = digits(p);
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      is_float = true;
      e = digits(e + 1);
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t q = e + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        is_float = true;
        e = digits(q);
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (s_[k] != '_') text += s_[k];
    out_.push_back({is_float ? Tok::Float : Tok::Int, text, line, col});
    return e;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal, decoded as Python's unicode-escape codec does.
  size_t string(size_t p, int line, int col) {
    const char q = s_[p];
    std::string v;
    size_t k = p + 1;
    for (;;) {
      if (k >= s_.size()) error(p, "the string literal is not closed");
      const char c = s_[k];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++k;
        continue;
      }
      if (k + 1 >= s_.size()) error(p, "the string literal is not closed");
      const char e = s_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'n': v += '\n'; break;
        case 'r': v += '\r'; break;
        case 't': v += '\t'; break;
        case 'v': v += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int j = 0; j < n; ++j) {
            const int h = k < s_.size() ? hex_value(s_[k]) : -1;
            if (h < 0) error(k, std::string("truncated \\") + e + " escape in a string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++k;
          }
          if (cp > 0x10ffff) error(k, "illegal Unicode character in a string literal");
          utf8_append(&v, cp);
          break;
        }
        case 'N': error(k, "\\N{...} escapes are not supported in a string literal");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int j = 0; j < 2 && k < s_.size() && s_[k] >= '0' && s_[k] <= '7'; ++j, ++k)
              cp = cp * 8 + static_cast<uint32_t>(s_[k] - '0');
            utf8_append(&v, cp);
          } else {
            v += '\\';
            v += e;
          }
      }
    }
    out_.push_back({Tok::String, v, line, col});
    return k + 1;
  }

  std::string s_;
  std::vector<size_t> line_starts_;  // offset of each line's first byte
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace runlm::jinja
