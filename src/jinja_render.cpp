// The Jinja tree walker: statements write text, expressions evaluate with
// Python's semantics (jinja2 compiles templates to Python), and every step
// is counted against the render's limits.
#include <algorithm>
#include <cmath>
#include <set>

#include "common.h"
#include "jinja_interpreter.h"
#include "jinja_lexer.h"

namespace runlm::jinja {

// Sets the position errors report while a node evaluates; restores the
// enclosing node's on the way out, and bounds the nesting.
struct PosGuard {
  Interpreter* in;
  int line, col;
  PosGuard(Interpreter* interp, int l, int c) : in(interp), line(interp->line_), col(interp->col_) {
    if (l > 0) {
      in->line_ = l;
      in->col_ = c;
    }
    if (++in->depth_ > in->opt_.limits.max_depth)
      in->error(strfmt("the template nests too deeply (more than %d levels of evaluation)", in->opt_.limits.max_depth));
    in->charge(1);
  }
  ~PosGuard() {
    --in->depth_;
    in->line_ = line;
    in->col_ = col;
  }
};

void Interpreter::error(const std::string& msg) const { fail_at(line_, col_, msg); }

void Interpreter::undefined_error(const Value& v) const {
  const std::string hint = v.hint ? *v.hint : "undefined value";
  error(v.unsafe ? hint : hint);
}

void Interpreter::charge(uint64_t n) {
  steps_ += n;
  if (steps_ > opt_.limits.max_steps)
    error(strfmt("the template did too much work (more than %llu steps)",
                 static_cast<unsigned long long>(opt_.limits.max_steps)));
}

void Interpreter::charge_alloc(uint64_t bytes) {
  allocated_ += bytes;
  if (allocated_ > opt_.limits.max_alloc_bytes)
    error(strfmt("the template built more than %llu MiB of strings and lists",
                 static_cast<unsigned long long>(opt_.limits.max_alloc_bytes >> 20)));
}

Value Interpreter::make_string(std::string s, std::shared_ptr<const Spans> spans) {
  if (s.size() > opt_.limits.max_output_bytes)
    error(strfmt("a string of %zu bytes is larger than the limit of %zu", s.size(), opt_.limits.max_output_bytes));
  charge(s.size() / 64);
  charge_alloc(s.size());
  Value v = Value::string(std::move(s));
  if (spans && !spans->empty()) v.spans = std::move(spans);
  return v;
}

Spans sub_spans(const Value& v, size_t a, size_t b) {
  Spans out;
  if (!v.spans) return out;
  for (const Span& sp : *v.spans) {
    const size_t x = std::max(sp.first, a), y = std::min(sp.second, b);
    if (x < y) out.emplace_back(x - a, y - a);
  }
  return out;
}

std::shared_ptr<const Spans> concat_spans(const Spans* a, size_t a_size, const Spans* b) {
  if ((!a || a->empty()) && (!b || b->empty())) return nullptr;
  auto out = std::make_shared<Spans>();
  if (a) *out = *a;
  if (b)
    for (const Span& sp : *b) out->emplace_back(sp.first + a_size, sp.second + a_size);
  return out;
}

Value Interpreter::make_list(std::vector<Value> items, bool tuple) {
  if (items.size() > opt_.limits.max_list_items)
    error(strfmt("a list of %zu items is longer than the limit of %zu", items.size(), opt_.limits.max_list_items));
  charge(items.size() / 64);
  charge_alloc(items.size() * sizeof(Value));
  return Value::make_list(std::move(items), tuple);
}

void Interpreter::append(Output* out, const std::string& text) {
  if (out->text.size() + text.size() > opt_.limits.max_output_bytes)
    error(strfmt("the output is larger than the limit of %zu bytes", opt_.limits.max_output_bytes));
  charge(text.size() / 64);
  out->text.append(text);
}

void Interpreter::append(Output* out, const Value& v) {
  const size_t at = out->text.size();
  if (v.is_string()) {
    append(out, v.str());
    if (v.spans)
      for (const Span& sp : *v.spans) out->spans.emplace_back(sp.first + at, sp.second + at);
  } else {
    append(out, py_str(v));
  }
}

Value Interpreter::output_value(Output&& out) {
  return make_string(std::move(out.text), out.spans.empty() ? nullptr : std::make_shared<const Spans>(std::move(out.spans)));
}

Rendered Interpreter::run(const Body& body, const std::vector<std::pair<std::string, Value>>& vars) {
  frame_ = std::make_shared<Frame>();
  for (const auto& kv : vars) frame_->vars[kv.first] = kv.second;
  struct Cleanup {
    Interpreter* in;
    ~Cleanup() {
      in->frame_.reset();
      for (auto& ns : in->namespaces_) ns->items.clear();
      in->namespaces_.clear();
    }
  } cleanup{this};
  Output out;
  exec(body, &out);
  return Rendered{std::move(out.text), std::move(out.spans)};
}

Interpreter::Flow Interpreter::exec(const Body& body, Output* out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Value Interpreter::lookup(const std::string& name) {
  for (const Frame* f = frame_.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  Value g = global(name);
  if (!g.is_undefined()) return g;
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::assign(const std::string& name, Value v) { frame_->vars[name] = std::move(v); }

void Interpreter::unpack_assign(const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    assign(targets[0], v);
    return;
  }
  if (v.is_undefined()) undefined_error(v);
  const std::vector<Value> items = iterate(v);
  if (items.size() != targets.size())
    error(items.size() > targets.size() ? strfmt("too many values to unpack (expected %zu)", targets.size())
                                        : strfmt("not enough values to unpack (expected %zu, got %zu)", targets.size(),
                                                 items.size()));
  for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], items[k]);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return v.items();
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      const std::vector<uint32_t> cps = utf8_decode(v.str());
      if (cps.size() > opt_.limits.max_list_items)
        error(strfmt("a list of %zu characters is longer than the limit of %zu", cps.size(), opt_.limits.max_list_items));
      charge_alloc(cps.size() * (sizeof(Value) + 32));
      std::vector<Value> chars;
      for (uint32_t c : cps) {
        std::string s;
        utf8_append(&s, c);
        chars.push_back(Value::string(std::move(s)));
      }
      charge(chars.size() / 16);
      return chars;
    }
    default: error(std::string("'") + py_type_name(v) + "' object is not iterable");
  }
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, Output* out) {
  PosGuard pg(this, s.line, s.col);
  try {
    return exec_node(s, out);
  } catch (const ValueTooDeep&) {
    error(strfmt("lists and dicts nest too deeply (more than %d levels)", kMaxValueDepth));
  }
}

Interpreter::Flow Interpreter::exec_node(const Stmt& s, Output* out) {
  switch (s.type) {
    case StmtType::Text: append(out, s.text); return Flow::Normal;
    case StmtType::Output: append(out, eval(*s.expr)); return Flow::Normal;
    case StmtType::If:
      for (size_t k = 0; k < s.conds.size(); ++k)
        if (eval(*s.conds[k]).truthy()) return exec(s.bodies[k], out);
      return exec(s.else_body, out);
    case StmtType::For: exec_for(s, out); return Flow::Normal;
    case StmtType::Set: {
      Value v = eval(*s.expr);
      if (!s.text.empty()) {  // ns.attr = v
        const Value ns = lookup(s.targets[0]);
        if (ns.kind != Kind::Namespace) error("cannot assign attribute on non-namespace object");
        for (auto& kv : ns.ns->items)
          if (kv.first.is_string() && kv.first.str() == s.text) {
            kv.second = std::move(v);
            return Flow::Normal;
          }
        ns.ns->items.emplace_back(Value::string(s.text), std::move(v));
        return Flow::Normal;
      }
      unpack_assign(s.targets, v);
      return Flow::Normal;
    }
    case StmtType::SetBlock:
    case StmtType::FilterBlock: {
      Output text;
      exec(s.body, &text);
      Value v = output_value(std::move(text));
      if (s.filter) {
        auto saved = frame_;
        frame_ = std::make_shared<Frame>(Frame{{}, saved});
        frame_->vars[kBlockValueName] = v;
        try {
          v = eval(*s.filter);
        } catch (...) {
          frame_ = saved;
          throw;
        }
        frame_ = saved;
      }
      if (s.type == StmtType::SetBlock) assign(s.targets[0], v);
      else append(out, v);
      return Flow::Normal;
    }
    case StmtType::Macro: assign(s.text, make_macro(s)); return Flow::Normal;
    case StmtType::CallBlock: {
      const Stmt* stmt = &s;
      std::weak_ptr<Frame> def_frame = frame_;  // weak: a namespace may keep caller
      Value caller = Value::callable("caller", [stmt, def_frame](Interpreter& in, CallArgs& args) {
        auto parent = def_frame.lock();
        if (!parent) in.error("caller() called after its scope ended");
        auto saved = in.frame_;
        in.frame_ = std::make_shared<Frame>(Frame{{}, parent});
        Output text;
        try {
          for (size_t k = 0; k < stmt->targets.size(); ++k) {
            const Value* a = args.get(k, stmt->targets[k]);
            in.assign(stmt->targets[k], a ? *a : stmt->defaults[k] ? in.eval(*stmt->defaults[k])
                                                                      : Value::undefined("'" + stmt->targets[k] + "' is undefined"));
          }
          in.exec(stmt->body, &text);
        } catch (...) {
          in.frame_ = saved;
          throw;
        }
        in.frame_ = saved;
        return in.output_value(std::move(text));
      });
      CallArgs args;
      eval_args(*s.expr, &args);
      args.keyword.emplace_back("caller", caller);
      const Value fn = eval(*s.expr->a);
      append(out, call(fn, args));
      return Flow::Normal;
    }
    case StmtType::With: {
      auto saved = frame_;
      auto inner = std::make_shared<Frame>(Frame{{}, saved});
      for (size_t k = 0; k < s.targets.size(); ++k) inner->vars[s.targets[k]] = eval(*s.defaults[k]);
      frame_ = inner;
      Flow f;
      try {
        f = exec(s.body, out);
      } catch (...) {
        frame_ = saved;
        throw;
      }
      frame_ = saved;
      return f;
    }
    case StmtType::Break: return Flow::Break;
    case StmtType::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

void Interpreter::exec_for(const Stmt& s, Output* out) {
  const Value seq = eval(*s.expr);
  if (seq.is_none() || seq.kind == Kind::Int || seq.kind == Kind::Float || seq.kind == Kind::Bool)
    error(std::string("'") + py_type_name(seq) + "' object is not iterable");
  std::vector<Value> items = iterate(seq);
  auto saved = frame_;
  try {
    if (s.cond) {  // {% for x in xs if cond %}: the loop sees only what passes
      std::vector<Value> kept;
      for (const Value& item : items) {
        frame_ = std::make_shared<Frame>(Frame{{}, saved});
        unpack_assign(s.targets, item);
        if (eval(*s.cond).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      // Each iteration has its own scope: a {% set %} in the body lasts
      // until the iteration ends (jinja2 prints 0 0 0 for
      // {% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}).
      charge(4);  // an empty body still costs its iteration
      frame_ = std::make_shared<Frame>(Frame{{}, saved});
      unpack_assign(s.targets, items[static_cast<size_t>(k)]);
      const size_t uk = static_cast<size_t>(k);
      std::vector<std::pair<Value, Value>> loop = {
          {Value::string("index"), Value::integer(k + 1)},
          {Value::string("index0"), Value::integer(k)},
          {Value::string("revindex"), Value::integer(n - k)},
          {Value::string("revindex0"), Value::integer(n - k - 1)},
          {Value::string("first"), Value::boolean(k == 0)},
          {Value::string("last"), Value::boolean(k == n - 1)},
          {Value::string("length"), Value::integer(n)},
          {Value::string("depth"), Value::integer(1)},
          {Value::string("depth0"), Value::integer(0)},
          {Value::string("previtem"), k > 0 ? items[uk - 1] : Value::undefined("there is no previous item")},
          {Value::string("nextitem"), k + 1 < n ? items[uk + 1] : Value::undefined("there is no next item")},
      };
      loop.emplace_back(Value::string("cycle"), Value::callable("cycle", [k](Interpreter& in, CallArgs& a) {
        if (a.positional.empty()) in.error("no items for cycling given");
        return a.positional[static_cast<size_t>(k) % a.positional.size()];
      }));
      assign("loop", Value::make_dict(std::move(loop)));
      const Flow f = exec(s.body, out);
      if (f == Flow::Break) break;
    }
    frame_ = saved;
    if (items.empty()) exec(s.else_body, out);
  } catch (...) {
    frame_ = saved;
    throw;
  }
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* stmt = &s;
  std::weak_ptr<Frame> def_frame = frame_;  // weak: the frame holds the macro
  return Value::callable(s.text, [stmt, def_frame](Interpreter& in, CallArgs& args) {
    auto parent = def_frame.lock();
    if (!parent) in.error("macro '" + stmt->text + "' called after its scope ended");
    if (in.macro_depth_ >= in.opt_.limits.max_macro_depth)
      in.error(strfmt("macro calls nest too deeply (more than %d)", in.opt_.limits.max_macro_depth));
    const auto& params = stmt->targets;
    if (args.positional.size() > params.size())
      in.error(strfmt("macro '%s' takes not more than %zu argument(s)", stmt->text.c_str(), params.size()));
    for (const auto& kv : args.keyword)
      if (kv.first != "caller" && std::find(params.begin(), params.end(), kv.first) == params.end())
        in.error("macro '" + stmt->text + "' takes no keyword argument '" + kv.first + "'");
    auto saved = in.frame_;
    in.frame_ = std::make_shared<Frame>(Frame{{}, parent});
    ++in.macro_depth_;
    Output text;
    try {
      for (size_t k = 0; k < params.size(); ++k) {
        const Value* a = args.get(k, params[k]);
        if (a) in.assign(params[k], *a);
        else if (stmt->defaults[k]) in.assign(params[k], in.eval(*stmt->defaults[k]));
        else in.assign(params[k], Value::undefined("'" + params[k] + "' is undefined"));
      }
      for (const auto& kv : args.keyword)
        if (kv.first == "caller") in.assign("caller", kv.second);
      in.exec(stmt->body, &text);
    } catch (...) {
      --in.macro_depth_;
      in.frame_ = saved;
      throw;
    }
    --in.macro_depth_;
    in.frame_ = saved;
    return in.output_value(std::move(text));
  });
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) undefined_error(fn);
  if (fn.kind != Kind::Callable) error(std::string("'") + py_type_name(fn) + "' object is not callable");
  return fn.fn->call(*this, args);
}

void Interpreter::eval_args(const Expr& e, CallArgs* args) {
  for (const ExprPtr& a : e.args) args->positional.push_back(eval(*a));
  if (e.star) {
    const Value v = eval(*e.star);
    for (const Value& item : iterate(v)) args->positional.push_back(item);
  }
  for (const auto& kv : e.kwargs) args->keyword.emplace_back(kv.first, eval(*kv.second));
  if (e.dstar) {
    const Value v = eval(*e.dstar);
    if (v.kind != Kind::Dict) error("argument after ** must be a mapping");
    for (const auto& kv : v.dict->items) {
      if (!kv.first.is_string()) error("keywords must be strings");
      args->keyword.emplace_back(kv.first.str(), kv.second);
    }
  }
}

Value Interpreter::eval_call(const Expr& e) {
  const Value fn = eval(*e.a);
  CallArgs args;
  eval_args(e, &args);
  PosGuard pg(this, e.line, e.col);
  return call(fn, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.kind == Kind::Namespace) {
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined("'Namespace' object has no attribute '" + name + "'");
  }
  Value m = method(obj, name);  // Python attributes come first: d.items is the method
  if (!m.is_undefined() || m.unsafe) return m;
  if (obj.kind == Kind::Dict) {
    if (const Value* v = obj.find(name)) return *v;
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  const std::string type = obj.is_none() ? "None" : std::string("'") + py_type_name(obj) + " object'";
  return Value::undefined(type + " has no attribute '" + name + "'");
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.kind == Kind::Dict || obj.kind == Kind::Namespace) {
    if (obj.kind == Kind::Dict)
      if (const Value* v = obj.find(key)) return *v;
    if (key.is_string()) return getattr(obj, key.str());
    return Value::undefined(std::string("'") + py_type_name(obj) + " object' has no attribute '" + py_str(key) + "'");
  }
  if ((obj.is_list() || obj.is_string()) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    const int64_t i = key.kind == Kind::Bool ? key.b : key.i;
    if (obj.is_list()) {
      const int64_t n = static_cast<int64_t>(obj.items().size());
      const int64_t j = i < 0 ? i + n : i;
      if (j >= 0 && j < n) return obj.items()[static_cast<size_t>(j)];
      return Value::undefined(std::string("'") + py_type_name(obj) + " object' has no element " + std::to_string(i));
    }
    const auto cps = utf8_decode(obj.str());
    const int64_t n = static_cast<int64_t>(cps.size());
    const int64_t j = i < 0 ? i + n : i;
    if (j >= 0 && j < n) {
      std::string s;
      utf8_append(&s, cps[static_cast<size_t>(j)]);
      return Value::string(std::move(s));
    }
    return Value::undefined("'str object' has no element " + std::to_string(i));
  }
  if (key.is_string()) return getattr(obj, key.str());
  const std::string type = obj.is_none() ? "None" : std::string("'") + py_type_name(obj) + " object'";
  return Value::undefined(type + " has no element " + py_repr(key));
}

namespace {

// Python slice indices for a sequence of n items.
std::vector<size_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step,
                                  Interpreter& in) {
  auto as_int = [&](const Value* v, int64_t dflt) -> int64_t {
    if (!v || v->is_none()) return dflt;
    if (v->kind == Kind::Bool) return v->b;
    if (v->kind != Kind::Int) in.error("slice indices must be integers or None");
    return v->i;
  };
  const int64_t st = as_int(step, 1);
  if (st == 0) in.error("slice step cannot be zero");
  std::vector<size_t> idx;
  if (st > 0) {
    int64_t a = as_int(start, 0), b = as_int(stop, n);
    if (a < 0) a = std::max<int64_t>(0, a + n);
    if (b < 0) b = std::max<int64_t>(0, b + n);
    a = std::min(a, n);
    b = std::min(b, n);
    for (int64_t k = a; k < b; k += st) idx.push_back(static_cast<size_t>(k));
  } else {
    int64_t a = as_int(start, n - 1), b = stop && !stop->is_none() ? as_int(stop, 0) : -1;
    const bool open_end = !stop || stop->is_none();
    if (start && !start->is_none()) {
      if (a < 0) a += n;
      a = std::min(a, n - 1);
    }
    if (!open_end) {
      if (b < 0) b = std::max<int64_t>(-1, b + n);
    }
    for (int64_t k = a; k > b && k >= 0; k += st) idx.push_back(static_cast<size_t>(k));
  }
  return idx;
}

bool checked(bool overflow, Interpreter& in) {
  if (overflow) in.error("integer overflow");
  return false;
}

int64_t as_int64(const Value& v) { return v.kind == Kind::Bool ? v.b : v.i; }

}  // namespace

Value Interpreter::binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string x = py_str(a);
    const size_t n = x.size();
    return make_string(x + py_str(b), concat_spans(a.is_string() ? a.spans.get() : nullptr, n,
                                                   b.is_string() ? b.spans.get() : nullptr));
  }
  if (op == "==") return Value::boolean(py_equal(a, b));
  if (op == "!=") return Value::boolean(!py_equal(a, b));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string())
        error(std::string("'in <string>' requires string as left operand, not ") + py_type_name(a));
      found = b.str().find(a.str()) != std::string::npos;
      charge(b.str().size() / 64);
    } else if (b.is_list()) {
      for (const Value& x : b.items())
        if (py_equal(x, a)) {
          found = true;
          break;
        }
      charge(b.items().size() / 16);
    } else if (b.is_mapping()) {
      found = b.find(a) != nullptr;
    } else if (b.is_undefined()) {
      found = false;
    } else {
      error(std::string("argument of type '") + py_type_name(b) + "' is not iterable");
    }
    return Value::boolean(op == "in" ? found : !found);
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    std::string err;
    bool r;
    if (op == "<") r = py_less(a, b, &err);
    else if (op == ">") r = py_less(b, a, &err);
    else if (op == "<=") r = !py_less(b, a, &err);
    else r = !py_less(a, b, &err);
    if (!err.empty()) {
      const std::string sym = op;
      error("'" + sym + err.substr(err.find('\'') + 2));
    }
    return Value::boolean(r);
  }
  const bool ints = (a.kind == Kind::Int || a.kind == Kind::Bool) && (b.kind == Kind::Int || b.kind == Kind::Bool);
  const bool nums = a.is_number() && b.is_number();
  auto type_error = [&]() {
    error("unsupported operand type(s) for " + op + ": '" + py_type_name(a) + "' and '" + py_type_name(b) + "'");
  };
  if (op == "+") {
    if (ints) {
      int64_t r;
      checked(__builtin_add_overflow(as_int64(a), as_int64(b), &r), *this);
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string())
      return make_string(a.str() + b.str(), concat_spans(a.spans.get(), a.str().size(), b.spans.get()));
    if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
      std::vector<Value> items = a.items();
      if (items.size() + b.items().size() > opt_.limits.max_list_items) make_list(std::vector<Value>(opt_.limits.max_list_items + 1));
      items.insert(items.end(), b.items().begin(), b.items().end());
      return make_list(std::move(items), a.list->tuple);
    }
    if (a.is_string()) error(std::string("can only concatenate str (not \"") + py_type_name(b) + "\") to str");
    type_error();
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      checked(__builtin_sub_overflow(as_int64(a), as_int64(b), &r), *this);
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() - b.as_double());
    type_error();
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      checked(__builtin_mul_overflow(as_int64(a), as_int64(b), &r), *this);
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() * b.as_double());
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (count->kind == Kind::Int || count->kind == Kind::Bool)) {
      const int64_t n = std::max<int64_t>(0, as_int64(*count));
      if (seq->is_string()) {
        if (n > 0 && seq->str().size() * static_cast<uint64_t>(n) > opt_.limits.max_output_bytes)
          error(strfmt("a string of %llu bytes is larger than the limit of %zu",
                       static_cast<unsigned long long>(seq->str().size() * static_cast<uint64_t>(n)),
                       opt_.limits.max_output_bytes));
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq->str();
        return make_string(std::move(r));
      }
      if (n > 0 && seq->items().size() * static_cast<uint64_t>(n) > opt_.limits.max_list_items)
        error(strfmt("a list of more than %zu items", opt_.limits.max_list_items));
      std::vector<Value> r;
      for (int64_t k = 0; k < n; ++k) r.insert(r.end(), seq->items().begin(), seq->items().end());
      return make_list(std::move(r), seq->list->tuple);
    }
    type_error();
  }
  if (op == "/") {
    if (!nums) type_error();
    if (b.as_double() == 0) error("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (!nums) {
      if (op == "%" && a.is_string()) error("string formatting with % is not supported; use the format filter");
      type_error();
    }
    if (ints) {
      const int64_t x = as_int64(a), y = as_int64(b);
      if (y == 0) error(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      if (x == INT64_MIN && y == -1) error("integer overflow");
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return Value::integer(op == "//" ? q : r);
    }
    const double x = a.as_double(), y = b.as_double();
    if (y == 0) error("float division by zero");
    if (op == "//") return Value::number(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::number(r);
  }
  if (op == "**") {
    if (!nums) type_error();
    if (ints && as_int64(b) >= 0) {
      int64_t base = as_int64(a), e = as_int64(b), r = 1;
      while (e > 0) {
        if (e & 1) checked(__builtin_mul_overflow(r, base, &r), *this);
        e >>= 1;
        if (e > 0) checked(__builtin_mul_overflow(base, base, &base), *this);
      }
      return Value::integer(r);
    }
    if (a.as_double() == 0 && b.as_double() < 0) error("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  error("unknown operator '" + op + "'");
}

Value Interpreter::eval_binary(const Expr& e) {
  if (e.name == "and") {
    Value a = eval(*e.a);
    return a.truthy() ? eval(*e.b) : a;
  }
  if (e.name == "or") {
    Value a = eval(*e.a);
    return a.truthy() ? a : eval(*e.b);
  }
  if (e.name == "chain") {
    Value left = eval(*e.a);
    for (const auto& [op, operand] : e.kwargs) {
      Value right = eval(*operand);
      if (!binary_op(op, left, right).truthy()) return Value::boolean(false);
      left = std::move(right);
    }
    return Value::boolean(true);
  }
  const Value a = eval(*e.a);
  const Value b = eval(*e.b);
  return binary_op(e.name, a, b);
}

Value Interpreter::eval(const Expr& e) {
  PosGuard pg(this, e.line, e.col);
  try {
    return eval_node(e);
  } catch (const ValueTooDeep&) {
    error(strfmt("lists and dicts nest too deeply (more than %d levels)", kMaxValueDepth));
  }
}

Value Interpreter::eval_node(const Expr& e) {
  switch (e.type) {
    case ExprType::Literal: return e.value;
    case ExprType::Name: return lookup(e.name);
    case ExprType::List:
    case ExprType::Tuple: {
      std::vector<Value> items;
      for (const ExprPtr& a : e.args) items.push_back(eval(*a));
      return make_list(std::move(items), e.type == ExprType::Tuple);
    }
    case ExprType::Dict: {
      std::vector<std::pair<Value, Value>> items;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k]);
        if (key.is_list() && !key.list->tuple) error("unhashable type: 'list'");
        if (key.kind == Kind::Dict) error("unhashable type: 'dict'");
        items.emplace_back(std::move(key), eval(*e.args[k + 1]));
      }
      charge_alloc(items.size() * 2 * sizeof(Value));
      return Value::make_dict(std::move(items));
    }
    case ExprType::GetAttr: return getattr(eval(*e.a), e.name);
    case ExprType::GetItem: {
      const Value obj = eval(*e.a);
      return getitem(obj, eval(*e.b));
    }
    case ExprType::Slice: {
      const Value obj = eval(*e.a);
      Value start = e.b ? eval(*e.b) : Value::none(), stop = e.c ? eval(*e.c) : Value::none(),
            step = e.d ? eval(*e.d) : Value::none();
      if (obj.is_undefined()) undefined_error(obj);
      if (obj.is_list()) {
        const auto idx = slice_indices(static_cast<int64_t>(obj.items().size()), &start, &stop, &step, *this);
        std::vector<Value> items;
        for (size_t k : idx) items.push_back(obj.items()[k]);
        return make_list(std::move(items), obj.list->tuple);
      }
      if (obj.is_string()) {
        const auto cps = utf8_decode(obj.str());
        const auto idx = slice_indices(static_cast<int64_t>(cps.size()), &start, &stop, &step, *this);
        std::string s;
        for (size_t k : idx) utf8_append(&s, cps[k]);
        return make_string(std::move(s));
      }
      error(std::string("'") + py_type_name(obj) + "' object is not subscriptable");
    }
    case ExprType::Call: return eval_call(e);
    case ExprType::Filter: {
      const Value v = eval(*e.a);
      CallArgs args;
      eval_args(e, &args);
      PosGuard inner(this, e.line, e.col);
      return filter(e.name, v, args);
    }
    case ExprType::Test: {
      const Value v = eval(*e.a);
      CallArgs args;
      eval_args(e, &args);
      PosGuard inner(this, e.line, e.col);
      const bool r = test(e.name, v, args);
      return Value::boolean(e.negated ? !r : r);
    }
    case ExprType::Unary: {
      const Value a = eval(*e.a);
      if (e.name == "not") return Value::boolean(!a.truthy());
      if (a.is_undefined()) undefined_error(a);
      if (!a.is_number()) error(std::string("bad operand type for unary ") + e.name + ": '" + py_type_name(a) + "'");
      if (e.name == "+") return a.kind == Kind::Bool ? Value::integer(a.b) : a;
      if (a.kind == Kind::Float) return Value::number(-a.f);
      if (as_int64(a) == INT64_MIN) error("integer overflow");
      return Value::integer(-as_int64(a));
    }
    case ExprType::Binary: return eval_binary(e);
    case ExprType::CondExpr:
      if (eval(*e.a).truthy()) return eval(*e.b);
      if (e.c) return eval(*e.c);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
  }
  error("unknown expression");
}

}  // namespace runlm::jinja
