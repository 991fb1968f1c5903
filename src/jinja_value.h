// Jinja values: the Python objects a chat template sees (None, bool, int,
// float, str, list/tuple, dict, jinja2's namespace and Undefined, callables),
// with Python's truthiness, equality, ordering and str()/repr() so that what
// a template prints matches jinja2 byte for byte. Lists and dicts are
// immutable once built (the templates run in jinja2's
// ImmutableSandboxedEnvironment); only a namespace's attributes change.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace runlm::jinja {

struct Value;
struct CallArgs;
class Interpreter;

// A byte range [first, second) of a string: where text from the caller's
// literal strings (a message's content) sits in a string built from it.
using Span = std::pair<size_t, size_t>;
using Spans = std::vector<Span>;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

// Lists and dicts nest at most this deep: str(), == and the destructors
// recurse on them (Python's own str() gives up near 1000 levels).
constexpr int kMaxValueDepth = 500;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // prints as (a, b)
  int depth = 1;       // 1 + the deepest item's
};

// Insertion-ordered, like a Python dict; keys are compared with ==.
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;
};

// Thrown by make_list/make_dict past kMaxValueDepth; the interpreter turns
// it into an error at the template's position.
struct ValueTooDeep {};

// A callable: a builtin global, a bound method, a macro or caller().
struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> call;
};

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> s;
  // For strings: where the caller's literal text lies in s (null when none).
  // Concatenation, join, trim and strip carry the ranges along; other
  // string operations drop them.
  std::shared_ptr<const Spans> spans;
  std::shared_ptr<const ListData> list;
  std::shared_ptr<const DictData> dict;
  std::shared_ptr<DictData> ns;  // namespace(): the one mutable kind
  std::shared_ptr<const Callable> fn;
  // For Undefined: what jinja2 would say on use ("'x' is undefined"), and
  // whether using it is a sandbox violation rather than an undefined name.
  std::shared_ptr<const std::string> hint;
  bool unsafe = false;

  Value() = default;
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  // A string that is the caller's literal text from end to end.
  static Value literal_string(std::string v);
  static Value make_list(std::vector<Value> items, bool tuple = false);
  static Value make_dict(std::vector<std::pair<Value, Value>> items);
  static Value make_namespace(std::vector<std::pair<Value, Value>> items);
  static Value callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
  const std::string& str() const { return *s; }
  const std::vector<Value>& items() const { return list->items; }
  const DictData& mapping() const { return kind == Kind::Dict ? *dict : *ns; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(kind == Kind::Bool ? b : i); }

  // Python truthiness (Undefined is false).
  bool truthy() const;
  // Dict/namespace lookup by key; nullptr when absent.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Takes argument `name` (position pos, or keyword); nullptr when absent.
  const Value* get(size_t pos, const std::string& name) const;
};

// Python's str(v) (Undefined prints as ""); repr(v) for list/dict elements.
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
// Python's repr() of a float: the shortest text that reads back the same.
std::string py_float_repr(double d);
// Python's == (1 == 1.0 == True; Undefined equals Undefined).
bool py_equal(const Value& a, const Value& b);
// Python's <: numbers, strings (by code point), lists; otherwise throws
// Error ("'<' not supported between ...") through the caller's fail.
bool py_less(const Value& a, const Value& b, std::string* error);
// Python type names as jinja2 errors print them ("str", "dict", ...).
const char* py_type_name(const Value& v);

// json.dumps(v, ensure_ascii=False, indent, separators, sort_keys), as
// transformers' tojson filter calls it. indent < 0 is None; an indent string
// is used as given. Returns false (with *error) for a value JSON cannot hold.
struct JsonOptions {
  bool has_indent = false;
  std::string indent;
  bool has_separators = false;
  std::string item_sep, key_sep;
  bool sort_keys = false;
  bool ensure_ascii = false;  // non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
};
bool to_json(const Value& v, const JsonOptions& o, std::string* out, std::string* error);

// UTF-8 helpers: Python strings index, slice and count code points.
std::vector<uint32_t> utf8_decode(const std::string& s);
void utf8_append(std::string* out, uint32_t cp);
std::string utf8_encode(const std::vector<uint32_t>& cps);
// Python's str.isspace() for one code point.
bool py_isspace(uint32_t c);

}  // namespace runlm::jinja
