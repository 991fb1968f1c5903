// Jinja parser: tokens -> syntax tree, following jinja2's grammar and
// operator precedence (jinja2/parser.py): conditional < or < and < not <
// comparisons (in, not in, ==...) < + - < ~ < * / // % < ** < unary - + <
// postfix (. [] ()) with filters (|) and tests (is) binding tightest.
#include <algorithm>
#include <cstdlib>
#include <set>

#include "jinja_ast.h"
#include "jinja_lexer.h"

namespace runlm::jinja {
namespace {

// Deeper nesting than this (of expressions or blocks) is refused: the
// parser and the renderer recurse on it.
constexpr int kMaxDepth = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_template() {
    Body body = parse_body({});
    if (cur().type != Tok::Eof) error("unexpected '" + describe(cur()) + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  void next() {
    if (pos_ + 1 < t_.size()) ++pos_;
  }
  [[noreturn]] void error(const std::string& msg) const { fail_at(cur().line, cur().col, msg); }
  [[noreturn]] void error_at(const Token& t, const std::string& msg) const { fail_at(t.line, t.col, msg); }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "{{";
      case Tok::VarEnd: return "}}";
      case Tok::BlockBegin: return "{%";
      case Tok::BlockEnd: return "%}";
      case Tok::Eof: return "end of template";
      case Tok::String: return "string";
      default: return t.text;
    }
  }

  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "', got '" + describe(cur()) + "'");
    next();
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error("expected a name, got '" + describe(cur()) + "'");
    std::string n = cur().text;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error("expected '%}', got '" + describe(cur()) + "'");
    next();
  }

  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > kMaxDepth) p->error("the template nests too deeply (more than 200 levels)");
    }
    ~DepthGuard() { --p->depth_; }
  };

  template <typename T>
  T* node(T* n, const Token& at) {
    n->line = at.line;
    n->col = at.col;
    return n;
  }
  ExprPtr make(ExprType type, const Token& at) {
    ExprPtr e = std::make_unique<Expr>();
    e->type = type;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  StmtPtr make_stmt(StmtType type, const Token& at) {
    StmtPtr s = std::make_unique<Stmt>();
    s->type = type;
    s->line = at.line;
    s->col = at.col;
    return s;
  }

  // ---- statements ----------------------------------------------------------

  // Parses until a {% NAME %} whose NAME is in `ends` (left unconsumed, at
  // the name) or the end of the template.
  Body parse_body(const std::set<std::string>& ends) {
    DepthGuard g(this);
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!ends.empty()) {
          std::string list;
          for (const auto& e : ends) list += (list.empty() ? "" : " or ") + e;
          error("unexpected end of template; expected {% " + list + " %}");
        }
        return body;
      }
      if (t.type == Tok::Text) {
        StmtPtr s = make_stmt(StmtType::Text, t);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        StmtPtr s = make_stmt(StmtType::Output, t);
        next();
        s->expr = parse_tuple_expr();
        if (cur().type != Tok::VarEnd) error("expected '}}', got '" + describe(cur()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        next();
        if (cur().type != Tok::Name) error("expected a statement name, got '" + describe(cur()) + "'");
        if (ends.count(cur().text)) return body;
        body.push_back(parse_statement());
      } else {
        error("unexpected '" + describe(t) + "'");
      }
    }
  }

  void expect_end_tag(const char* name) {
    // parse_body stopped on the name.
    if (!is_name(name)) error(std::string("expected {% ") + name + " %}");
    next();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token at = cur();
    const std::string kw = at.text;
    if (kw == "if") return parse_if(at);
    if (kw == "for") return parse_for(at);
    if (kw == "set") return parse_set(at);
    if (kw == "macro") return parse_macro(at);
    if (kw == "call") return parse_call_block(at);
    if (kw == "filter") return parse_filter_block(at);
    if (kw == "with") return parse_with(at);
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) error("'" + kw + "' outside a for loop");
      next();
      expect_block_end();
      return make_stmt(kw == "break" ? StmtType::Break : StmtType::Continue, at);
    }
    if (kw == "generation") {
      // transformers' AssistantTracker: the body renders as it is.
      next();
      expect_block_end();
      StmtPtr s = make_stmt(StmtType::With, at);
      s->body = parse_body({"endgeneration"});
      expect_end_tag("endgeneration");
      return s;
    }
    error("unsupported statement '" + kw + "'");
  }

  StmtPtr parse_if(const Token& at) {
    StmtPtr s = make_stmt(StmtType::If, at);
    next();
    for (;;) {
      s->conds.push_back(parse_tuple_expr());
      expect_block_end();
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      if (is_name("elif")) {
        next();
        continue;
      }
      if (is_name("else")) {
        next();
        expect_block_end();
        s->else_body = parse_body({"endif"});
      }
      expect_end_tag("endif");
      return s;
    }
  }

  // Assignment targets: a name, or names separated by commas (optionally in
  // parentheses).
  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = is_op("(");
    if (paren) next();
    for (;;) {
      names.push_back(expect_name());
      if (!is_op(",")) break;
      next();
      if (cur().type != Tok::Name) break;
    }
    if (paren) expect_op(")");
    for (const auto& n : names)
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None")
        error("cannot assign to '" + n + "'");
    return names;
  }

  StmtPtr parse_for(const Token& at) {
    StmtPtr s = make_stmt(StmtType::For, at);
    next();
    s->targets = parse_targets();
    if (!is_name("in")) error("expected 'in' in the for loop, got '" + describe(cur()) + "'");
    next();
    s->expr = parse_tuple_expr(/*no_condexpr=*/true);
    if (is_name("if")) {
      next();
      s->cond = parse_expr();
    }
    if (is_name("recursive")) error("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (is_name("else")) {
      next();
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;  // break/continue in the else branch are outside the loop
      s->else_body = parse_body({"endfor"});
      loop_depth_ = saved;
    }
    expect_end_tag("endfor");
    return s;
  }

  StmtPtr parse_set(const Token& at) {
    next();
    // {% set ns.attr = value %}
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == ".") {
      StmtPtr s = make_stmt(StmtType::Set, at);
      s->targets.push_back(expect_name());
      next();
      s->text = expect_name();
      expect_op("=");
      s->expr = parse_tuple_expr();
      expect_block_end();
      return s;
    }
    std::vector<std::string> targets = parse_targets();
    if (is_op("=")) {
      next();
      StmtPtr s = make_stmt(StmtType::Set, at);
      s->targets = std::move(targets);
      s->expr = parse_tuple_expr();
      expect_block_end();
      return s;
    }
    if (targets.size() != 1) error("expected '=' after the set targets");
    StmtPtr s = make_stmt(StmtType::SetBlock, at);
    s->targets = std::move(targets);
    if (is_op("|")) s->filter = parse_filter_chain(at);
    expect_block_end();
    s->body = parse_body({"endset"});
    expect_end_tag("endset");
    return s;
  }

  // `| f(args) | g` applied to the block-value placeholder.
  ExprPtr parse_filter_chain(const Token& at) {
    ExprPtr e = make(ExprType::Name, at);
    e->name = kBlockValueName;
    while (is_op("|")) {
      next();
      e = parse_filter(std::move(e));
    }
    return e;
  }

  void parse_params(Stmt* s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s->targets.empty()) expect_op(",");
      if (is_op(")")) break;
      s->targets.push_back(expect_name());
      if (is_op("=")) {
        next();
        s->defaults.push_back(parse_expr());
      } else {
        if (!s->defaults.empty() && s->defaults.back()) error("a parameter without a default follows one with a default");
        s->defaults.push_back(nullptr);
      }
    }
    next();
  }

  StmtPtr parse_macro(const Token& at) {
    StmtPtr s = make_stmt(StmtType::Macro, at);
    next();
    s->text = expect_name();
    parse_params(s.get());
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    expect_end_tag("endmacro");
    return s;
  }

  StmtPtr parse_call_block(const Token& at) {
    StmtPtr s = make_stmt(StmtType::CallBlock, at);
    next();
    if (is_op("(")) parse_params(s.get());
    s->expr = parse_expr();
    if (s->expr->type != ExprType::Call) error_at(at, "{% call %} needs a macro call");
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endcall"});
    loop_depth_ = saved;
    expect_end_tag("endcall");
    return s;
  }

  StmtPtr parse_filter_block(const Token& at) {
    StmtPtr s = make_stmt(StmtType::FilterBlock, at);
    next();
    ExprPtr e = make(ExprType::Name, at);
    e->name = kBlockValueName;
    e = parse_filter(std::move(e));
    while (is_op("|")) {
      next();
      e = parse_filter(std::move(e));
    }
    s->filter = std::move(e);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    expect_end_tag("endfilter");
    return s;
  }

  StmtPtr parse_with(const Token& at) {
    StmtPtr s = make_stmt(StmtType::With, at);
    next();
    while (cur().type != Tok::BlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(expect_name());
      expect_op("=");
      s->defaults.push_back(parse_expr());
    }
    expect_block_end();
    s->body = parse_body({"endwith"});
    expect_end_tag("endwith");
    return s;
  }

  // ---- expressions ---------------------------------------------------------

  // An expression, or a tuple when commas follow (`{{ a, b }}`, `for x in a, b`).
  ExprPtr parse_tuple_expr(bool no_condexpr = false) {
    const Token at = cur();
    ExprPtr first = no_condexpr ? parse_or() : parse_expr();
    if (!is_op(",")) return first;
    ExprPtr t = make(ExprType::Tuple, at);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_op("=") || is_name("if")) break;
      t->args.push_back(no_condexpr ? parse_or() : parse_expr());
    }
    return t;
  }

  ExprPtr parse_expr() {
    DepthGuard g(this);
    const Token at = cur();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      next();
      ExprPtr c = make(ExprType::CondExpr, at);
      c->a = parse_or();
      c->b = std::move(e);
      if (is_name("else")) {
        next();
        c->c = parse_expr();
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, const Token& at) {
    ExprPtr e = make(ExprType::Binary, at);
    e->name = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_or() {
    const Token at = cur();
    ExprPtr e = parse_and();
    while (is_name("or")) {
      next();
      e = binary("or", std::move(e), parse_and(), at);
    }
    return e;
  }

  ExprPtr parse_and() {
    const Token at = cur();
    ExprPtr e = parse_not();
    while (is_name("and")) {
      next();
      e = binary("and", std::move(e), parse_not(), at);
    }
    return e;
  }

  ExprPtr parse_not() {
    DepthGuard g(this);
    if (is_name("not")) {
      const Token at = cur();
      next();
      ExprPtr e = make(ExprType::Unary, at);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token at = cur();
    ExprPtr e = parse_math1();
    // Chained comparisons: a < b < c is (a < b) and (b < c), b evaluated once.
    std::vector<std::pair<std::string, ExprPtr>> ops;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" || cur().text == ">" ||
           cur().text == ">=")) {
        op = cur().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      ops.emplace_back(op, parse_math1());
    }
    if (ops.empty()) return e;
    if (ops.size() == 1) return binary(ops[0].first, std::move(e), std::move(ops[0].second), at);
    ExprPtr chain = make(ExprType::Binary, at);
    chain->name = "chain";
    chain->a = std::move(e);
    chain->kwargs = std::move(ops);
    return chain;
  }

  ExprPtr parse_math1() {
    const Token at = cur();
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      next();
      e = binary(op, std::move(e), parse_concat(), at);
    }
    return e;
  }

  ExprPtr parse_concat() {
    const Token at = cur();
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      next();
      e = binary("~", std::move(e), parse_math2(), at);
    }
    return e;
  }

  ExprPtr parse_math2() {
    const Token at = cur();
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      next();
      e = binary(op, std::move(e), parse_pow(), at);
    }
    return e;
  }

  ExprPtr parse_pow() {
    const Token at = cur();
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      next();
      e = binary("**", std::move(e), parse_unary(true), at);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(this);
    const Token at = cur();
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(ExprType::Unary, at);
      e->name = cur().text;
      next();
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token at = cur();
    switch (at.type) {
      case Tok::Name: {
        next();
        if (at.text == "true" || at.text == "True") return literal(Value::boolean(true), at);
        if (at.text == "false" || at.text == "False") return literal(Value::boolean(false), at);
        if (at.text == "none" || at.text == "None") return literal(Value::none(), at);
        ExprPtr e = make(ExprType::Name, at);
        e->name = at.text;
        return e;
      }
      case Tok::String: {
        std::string s;
        while (cur().type == Tok::String) {  // adjacent literals join
          s += cur().text;
          next();
        }
        return literal(Value::string(std::move(s)), at);
      }
      case Tok::Int: {
        next();
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(at.text.c_str(), &end, 10);
        if (errno == ERANGE) error_at(at, "integer literal " + at.text + " is too large");
        return literal(Value::integer(v), at);
      }
      case Tok::Float: {
        next();
        return literal(Value::number(std::strtod(at.text.c_str(), nullptr)), at);
      }
      case Tok::Op: {
        if (at.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return make(ExprType::Tuple, at);
          }
          ExprPtr first = parse_expr();
          if (is_op(")")) {
            next();
            return first;
          }
          ExprPtr t = make(ExprType::Tuple, at);
          t->args.push_back(std::move(first));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            t->args.push_back(parse_expr());
          }
          expect_op(")");
          return t;
        }
        if (at.text == "[") {
          next();
          ExprPtr l = make(ExprType::List, at);
          while (!is_op("]")) {
            if (!l->args.empty()) expect_op(",");
            if (is_op("]")) break;
            l->args.push_back(parse_expr());
          }
          next();
          return l;
        }
        if (at.text == "{") {
          next();
          ExprPtr d = make(ExprType::Dict, at);
          while (!is_op("}")) {
            if (!d->args.empty()) expect_op(",");
            if (is_op("}")) break;
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
          }
          next();
          return d;
        }
        break;
      }
      default: break;
    }
    error("unexpected '" + describe(at) + "'");
  }

  ExprPtr literal(Value v, const Token& at) {
    ExprPtr e = make(ExprType::Literal, at);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      const Token at = cur();
      if (is_op(".")) {
        next();
        if (cur().type == Tok::Name) {
          ExprPtr g = make(ExprType::GetAttr, at);
          g->name = cur().text;
          next();
          g->a = std::move(e);
          e = std::move(g);
        } else if (cur().type == Tok::Int) {
          ExprPtr g = make(ExprType::GetItem, at);
          g->b = literal(Value::integer(std::strtoll(cur().text.c_str(), nullptr, 10)), cur());
          next();
          g->a = std::move(e);
          e = std::move(g);
        } else {
          error("expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), at);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), at);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, const Token& at) {
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        slice = true;
        if (++n > 2) error("a slice has at most three parts");
        next();
        continue;
      }
      if (parts[n]) error("expected ':' or ']' in the subscript");
      parts[n] = parse_expr();
    }
    next();
    if (!slice) {
      if (!parts[0]) error_at(at, "empty subscript");
      ExprPtr g = make(ExprType::GetItem, at);
      g->a = std::move(obj);
      g->b = std::move(parts[0]);
      return g;
    }
    ExprPtr s = make(ExprType::Slice, at);
    s->a = std::move(obj);
    s->b = std::move(parts[0]);
    s->c = std::move(parts[1]);
    s->d = std::move(parts[2]);
    return s;
  }

  // Call arguments: positional, name=value, *list, **dict.
  void parse_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*")) {
        next();
        e->star = parse_expr();
      } else if (is_op("**")) {
        next();
        e->dstar = parse_expr();
      } else if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string name = cur().text;
        next();
        next();
        e->kwargs.emplace_back(std::move(name), parse_expr());
      } else {
        if (!e->kwargs.empty()) error("a positional argument follows a keyword argument");
        e->args.push_back(parse_expr());
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee, const Token& at) {
    ExprPtr c = make(ExprType::Call, at);
    c->line = callee->line;  // errors point at what is called
    c->col = callee->col;
    c->a = std::move(callee);
    parse_args(c.get());
    return c;
  }

  ExprPtr parse_filter(ExprPtr obj) {
    const Token at = cur();
    ExprPtr f = make(ExprType::Filter, at);
    f->name = expect_name();
    while (is_op(".")) {  // dotted filter names
      next();
      f->name += "." + expect_name();
    }
    f->a = std::move(obj);
    if (is_op("(")) parse_args(f.get());
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        const Token at = cur();
        next();
        ExprPtr t = make(ExprType::Test, at);
        if (is_name("not")) {
          t->negated = true;
          next();
        }
        t->name = expect_name();
        while (is_op(".")) {
          next();
          t->name += "." + expect_name();
        }
        t->a = std::move(e);
        if (is_op("(")) {
          parse_args(t.get());
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          // A single argument without parentheses: `is divisibleby 3`.
          if (is_name("is")) error("expected a test argument");
          ExprPtr arg = parse_primary();
          t->args.push_back(parse_postfix(std::move(arg)));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), cur());
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser(lex(source)).parse_template(); }

}  // namespace runlm::jinja
