// The Jinja interpreter's state while one template renders: scopes, the
// limits' counters, and the operations that builtins (jinja_builtins.cpp)
// share with the tree walker (jinja_render.cpp). Internal to the jinja_*
// files.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "jinja_ast.h"
#include "jinja_template.h"
#include "jinja_value.h"

namespace runlm::jinja {

// Variables of one scope; lookups go up the parent chain. A for loop's
// iteration, a macro call and {% with %} open one.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

// Text being written (the template's output, a macro's, a block's), with
// the spans of literal text in it.
struct Output {
  std::string text;
  Spans spans;
};

// Spans of a string's bytes [a, b), shifted to start at 0.
Spans sub_spans(const Value& v, size_t a, size_t b);
// a's and b's spans as in the concatenation a + b (a's bytes first).
std::shared_ptr<const Spans> concat_spans(const Spans* a, size_t a_size, const Spans* b);

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : opt_(options) {}

  Rendered run(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);

  // Throws Error at the position being evaluated.
  [[noreturn]] void error(const std::string& msg) const;
  // Throws the error an Undefined carries (UndefinedError or SecurityError).
  [[noreturn]] void undefined_error(const Value& v) const;
  // Counts work; n is one step per call plus the bytes or items built / 64.
  void charge(uint64_t n);
  // A string value within the size limit.
  Value make_string(std::string s, std::shared_ptr<const Spans> spans = nullptr);
  Value make_list(std::vector<Value> items, bool tuple = false);

  Value call(const Value& fn, CallArgs& args);
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  // Python iteration: list items, dict keys, string characters; Undefined is
  // empty; anything else is an error.
  std::vector<Value> iterate(const Value& v);
  const RenderOptions& options() const { return opt_; }
  // Namespaces can hold themselves or chains of each other; run() keeps
  // every one it made and empties them all at the end, so that no cycle
  // outlives the render and no chain is destroyed recursively.
  void track_namespace(const Value& ns) { namespaces_.push_back(ns.ns); }
  // Counts bytes the template builds (strings, list and dict slots), live or
  // not: a bound on the memory it can hold.
  void charge_alloc(uint64_t bytes);

  // Builtins (jinja_builtins.cpp).
  Value filter(const std::string& name, const Value& v, CallArgs& args);
  bool test(const std::string& name, const Value& v, CallArgs& args);
  // A method of a str/dict/list as a bound callable; Undefined when none.
  Value method(const Value& obj, const std::string& name);
  Value global(const std::string& name);

 private:
  enum class Flow { Normal, Break, Continue };
  friend struct PosGuard;

  Flow exec(const Body& body, Output* out);
  Flow exec_stmt(const Stmt& s, Output* out);
  Flow exec_node(const Stmt& s, Output* out);
  Value eval(const Expr& e);
  Value eval_node(const Expr& e);
  Value eval_binary(const Expr& e);
  Value binary_op(const std::string& op, const Value& a, const Value& b);
  Value eval_call(const Expr& e);
  void eval_args(const Expr& e, CallArgs* args);
  Value lookup(const std::string& name);
  void assign(const std::string& name, Value v);
  void unpack_assign(const std::vector<std::string>& targets, const Value& v);
  Value make_macro(const Stmt& s);
  void append(Output* out, const std::string& text);
  void append(Output* out, const Value& v);  // str(v), with v's spans
  Value output_value(Output&& out);          // a block's output as a string value
  void exec_for(const Stmt& s, Output* out);

  const RenderOptions& opt_;
  std::shared_ptr<Frame> frame_;
  std::vector<std::shared_ptr<DictData>> namespaces_;
  uint64_t allocated_ = 0;
  uint64_t steps_ = 0;
  int depth_ = 0;
  int macro_depth_ = 0;
  int line_ = 0, col_ = 0;
};

}  // namespace runlm::jinja
