// Jinja syntax tree: what jinja_parser builds from tokens and jinja_render
// walks. Every node keeps the line and column it starts at, for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_value.h"

namespace runlm::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprType {
  Literal,    // value
  Name,       // name
  List,       // args
  Tuple,      // args
  Dict,       // args: key, value, key, value...
  GetAttr,    // a . name
  GetItem,    // a [ b ]
  Slice,      // a [ b : c : d ] (absent parts are null)
  Call,       // a ( args, kwargs, *star, **dstar )
  Filter,     // a | name ( args... )
  Test,       // a is [not] name ( args... )
  Unary,      // op a  (op: "-", "+", "not")
  Binary,     // a op b  (arithmetic, ~, and, or, in, not in, comparisons)
  CondExpr,   // b if a else c (c may be null)
};

struct Expr {
  ExprType type;
  int line = 0, col = 0;
  Value value;       // Literal
  std::string name;  // Name, GetAttr, Filter, Test; the operator for Unary/Binary
  bool negated = false;  // Test: `is not`
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr star, dstar;  // *args, **kwargs in a call
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtType {
  Text,     // text
  Output,   // {{ expr }}
  If,       // conds[k] -> bodies[k]; else_body
  For,      // targets in expr [if cond] body [else else_body]
  Set,      // targets (or ns.attr) = expr
  SetBlock, // {% set name | filters %} body {% endset %}
  Macro,    // name(params = defaults) body
  CallBlock,// {% call(params) expr %} body
  FilterBlock,  // {% filter f %} body
  With,     // {% with a = x %} body
  Break,
  Continue,
};

struct Stmt {
  StmtType type;
  int line = 0, col = 0;
  std::string text;                 // Text; Macro's name; Set's namespace attribute
  ExprPtr expr;                     // Output, For's iterable, Set's value, CallBlock's call
  ExprPtr cond;                     // For's filter
  ExprPtr filter;                   // SetBlock/FilterBlock: filters applied to a Name placeholder
  std::vector<std::string> targets; // For/Set names; Macro/CallBlock params
  std::vector<ExprPtr> defaults;    // Macro/CallBlock param defaults (null when none); With values
  std::vector<ExprPtr> conds;       // If
  std::vector<Body> bodies;         // If branches
  Body body, else_body;
  bool recursive = false;
};

// Parses a template; throws Error "line L, column C: ...".
Body parse(const std::string& source);

// Name of the placeholder a SetBlock/FilterBlock's filter chain reads the
// rendered body from.
inline const char* kBlockValueName = "\x01block";

}  // namespace runlm::jinja
