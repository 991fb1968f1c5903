// Jinja builtins as jinja2 3.1 and Python define them: filters, tests, the
// str/dict/list methods templates call, and the globals of transformers'
// chat-template environment (range, dict, namespace, raise_exception,
// strftime_now). Methods that modify a list or dict are refused, as the
// ImmutableSandboxedEnvironment refuses them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "common.h"
#include "jinja_builtins.h"
#include "jinja_interpreter.h"

namespace runlm::jinja {
namespace {

using Cps = std::vector<uint32_t>;

// ---- Unicode case, for the alphabets chat text uses most -------------------

uint32_t to_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c >= 0x100 && c <= 0x17f && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17f) {
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    return c;
  }
  if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 32;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}

uint32_t to_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x138 && c != 0x149) {
    const bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e);
    if (odd_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}

bool is_cased(uint32_t c) { return to_upper(c) != c || to_lower(c) != c || c == 0xdf; }
bool is_upper_cp(uint32_t c) { return to_lower(c) != c; }
bool is_lower_cp(uint32_t c) { return to_upper(c) != c || c == 0xdf; }

std::string upper(const std::string& s) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) {
    if (c == 0xdf) out += "SS";
    else utf8_append(&out, to_upper(c));
  }
  return out;
}
std::string lower(const std::string& s) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) utf8_append(&out, to_lower(c));
  return out;
}
// Python's str.title(): a cased letter after a cased letter is lowered.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t c : utf8_decode(s)) {
    utf8_append(&out, prev_cased ? to_lower(c) : to_upper(c));
    prev_cased = is_cased(c);
  }
  return out;
}
// Python's str.capitalize(): first character upper, the rest lower.
std::string py_capitalize(const std::string& s) {
  const Cps cps = utf8_decode(s);
  std::string out;
  for (size_t k = 0; k < cps.size(); ++k) utf8_append(&out, k == 0 ? to_upper(cps[k]) : to_lower(cps[k]));
  return out;
}

// ---- str helpers ------------------------------------------------------------

bool in_chars(uint32_t c, const Cps* chars) {
  if (!chars) return py_isspace(c);
  return std::find(chars->begin(), chars->end(), c) != chars->end();
}

// The byte range str.strip()/lstrip()/rstrip() keeps.
std::pair<size_t, size_t> strip_range(const std::string& s, const Cps* chars, bool left, bool right) {
  const Cps cps = utf8_decode(s);
  std::vector<size_t> offset(cps.size() + 1, 0);
  for (size_t k = 0; k < cps.size(); ++k) {
    std::string one;
    utf8_append(&one, cps[k]);
    offset[k + 1] = offset[k] + one.size();
  }
  size_t a = 0, b = cps.size();
  if (left)
    while (a < b && in_chars(cps[a], chars)) ++a;
  if (right)
    while (b > a && in_chars(cps[b - 1], chars)) --b;
  return {offset[a], offset[b]};
}

std::string py_strip(const std::string& s, const Cps* chars, bool left, bool right) {
  const auto r = strip_range(s, chars, left, right);
  return s.substr(r.first, r.second - r.first);
}

// v stripped, keeping the spans of what remains.
Value strip_value(Interpreter& in, const Value& v, const Cps* chars, bool left, bool right) {
  if (!v.is_string()) return in.make_string(py_strip(py_str(v), chars, left, right));
  const auto r = strip_range(v.str(), chars, left, right);
  Spans sp = sub_spans(v, r.first, r.second);
  return in.make_string(v.str().substr(r.first, r.second - r.first),
                        sp.empty() ? nullptr : std::make_shared<const Spans>(std::move(sp)));
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    for (;;) {
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) break;
      const size_t at = s.find(*sep, start);
      if (at == std::string::npos) break;
      out.push_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  const Cps cps = utf8_decode(s);
  size_t k = 0;
  while (k < cps.size()) {
    while (k < cps.size() && py_isspace(cps[k])) ++k;
    if (k >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = cps.size();
      while (e > k && py_isspace(cps[e - 1])) --e;
      out.push_back(utf8_encode(Cps(cps.begin() + static_cast<std::ptrdiff_t>(k), cps.begin() + static_cast<std::ptrdiff_t>(e))));
      break;
    }
    size_t e = k;
    while (e < cps.size() && !py_isspace(cps[e])) ++e;
    out.push_back(utf8_encode(Cps(cps.begin() + static_cast<std::ptrdiff_t>(k), cps.begin() + static_cast<std::ptrdiff_t>(e))));
    k = e;
  }
  return out;
}

bool is_line_break(uint32_t c) {
  return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

// Python's str.splitlines(keepends).
std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  const Cps cps = utf8_decode(s);
  std::vector<std::string> out;
  size_t start = 0, k = 0;
  while (k < cps.size()) {
    if (!is_line_break(cps[k])) {
      ++k;
      continue;
    }
    size_t end = k;
    size_t next = k + 1;
    if (cps[k] == '\r' && next < cps.size() && cps[next] == '\n') ++next;
    out.push_back(utf8_encode(Cps(cps.begin() + static_cast<std::ptrdiff_t>(start),
                                  cps.begin() + static_cast<std::ptrdiff_t>(keepends ? next : end))));
    start = k = next;
  }
  if (start < cps.size())
    out.push_back(utf8_encode(Cps(cps.begin() + static_cast<std::ptrdiff_t>(start), cps.end())));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count,
                       Interpreter& in) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    // Python inserts repl between every character and at both ends.
    const Cps cps = utf8_decode(s);
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (k < cps.size()) utf8_append(&out, cps[k]);
      if (out.size() > in.options().limits.max_output_bytes) in.make_string(out);
    }
    return out;
  }
  size_t start = 0;
  for (;;) {
    const size_t at = (count >= 0 && done >= count) ? std::string::npos : s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start).append(repl);
    if (out.size() > in.options().limits.max_output_bytes) in.make_string(out);
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- argument helpers ----------------------------------------------------------

struct ArgReader {
  Interpreter& in;
  const CallArgs& args;
  const char* fname;
  std::vector<std::string> known;

  // Records parameter `name` at position pos and returns it (or nullptr).
  const Value* get(size_t pos, const char* name) {
    known.emplace_back(name);
    return args.get(pos, name);
  }
  // After all get()s: refuses extra positional or unknown keyword arguments.
  void done() {
    if (args.positional.size() > known.size())
      in.error(strfmt("%s() takes at most %zu argument(s), %zu given", fname, known.size(), args.positional.size()));
    for (const auto& kv : args.keyword)
      if (std::find(known.begin(), known.end(), kv.first) == known.end())
        in.error(strfmt("%s() got an unexpected keyword argument '%s'", fname, kv.first.c_str()));
  }
  int64_t int_or(const Value* v, int64_t dflt) {
    if (!v || v->is_none()) return dflt;
    if (v->kind == Kind::Bool) return v->b;
    if (v->kind != Kind::Int) in.error(strfmt("%s(): expected an integer, got %s", fname, py_type_name(*v)));
    return v->i;
  }
  std::string str_arg(const Value* v, const char* what) {
    if (!v || !v->is_string()) in.error(strfmt("%s(): %s must be a string", fname, what));
    return v->str();
  }
};

int64_t py_len(Interpreter& in, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(utf8_decode(v.str()).size());
    case Kind::List: return static_cast<int64_t>(v.items().size());
    case Kind::Dict:
    case Kind::Namespace: return static_cast<int64_t>(v.mapping().items.size());
    default: in.error(std::string("object of type '") + py_type_name(v) + "' has no len()");
  }
}

// jinja2's attribute paths for map/selectattr/sort: "a.b.0".
Value get_attribute_path(Interpreter& in, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = digits ? in.getitem(v, Value::integer(std::atoll(part.c_str()))) : in.getitem(v, Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sort key: lowercased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(lower(v.str()));
  return v;
}

std::vector<Value> sorted(Interpreter& in, std::vector<Value> items, bool reverse,
                          const std::function<Value(const Value&)>& key) {
  std::string err;
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), std::move(v));
  in.charge(keyed.size() * 4);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? py_less(b.first, a.first, &err) : py_less(a.first, b.first, &err);
  });
  if (!err.empty()) in.error(err);
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

// printf-style formatting for the format filter: %s %r %d %i %f %x %%.
std::string percent_format(Interpreter& in, const std::string& fmt, const std::vector<Value>& args) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    size_t j = k + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::strchr("-+ #0123456789.", fmt[j])) spec += fmt[j++];
    if (j >= fmt.size()) in.error("incomplete format");
    const char conv = fmt[j];
    k = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) in.error("not enough arguments for format string");
    const Value& a = args[next++];
    char buf[512];
    if (spec.size() > 20) in.error("format specification too long");
    if (conv == 's' || conv == 'r') {
      const std::string s = conv == 's' ? py_str(a) : py_repr(a);
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), "");
      if (spec == "%") out += s;
      else in.error("width and precision on %s are not supported in the format filter");
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      if (!a.is_number()) in.error(std::string("%") + conv + " format: a number is required, not " + py_type_name(a));
      const long long v = a.kind == Kind::Float ? static_cast<long long>(a.f) : (a.kind == Kind::Bool ? a.b : a.i);
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
      out += buf;
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      if (!a.is_number()) in.error(std::string("must be real number, not ") + py_type_name(a));
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), a.as_double());
      out += buf;
    } else {
      in.error(std::string("unsupported format character '") + conv + "'");
    }
  }
  if (next < args.size()) in.error("not all arguments converted during string formatting");
  return out;
}

// str.format with {} / {0} / {name} fields (no format specs).
std::string brace_format(Interpreter& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    const char c = fmt[k];
    if (c == '{' && k + 1 < fmt.size() && fmt[k + 1] == '{') {
      out += '{';
      ++k;
    } else if (c == '}' && k + 1 < fmt.size() && fmt[k + 1] == '}') {
      out += '}';
      ++k;
    } else if (c == '{') {
      const size_t e = fmt.find('}', k);
      if (e == std::string::npos) in.error("Single '{' encountered in format string");
      const std::string field = fmt.substr(k + 1, e - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos) in.error("format specs in str.format are not supported");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        const size_t i = static_cast<size_t>(std::atoll(field.c_str()));
        v = i < args.positional.size() ? &args.positional[i] : nullptr;
      } else {
        for (const auto& kv : args.keyword)
          if (kv.first == field) v = &kv.second;
      }
      if (!v) in.error("Replacement index " + field + " out of range for positional args tuple");
      out += py_str(*v);
      k = e;
    } else if (c == '}') {
      in.error("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

Value unsafe(const Value& obj, const std::string& name) {
  Value u = Value::undefined("access to attribute '" + name + "' of '" + py_type_name(obj) + "' object is unsafe.");
  u.unsafe = true;
  return u;
}

bool truthy_test(Interpreter& in, const std::string& test, const Value& v, const std::vector<Value>& targs) {
  CallArgs a;
  a.positional = targs;
  return in.test(test, v, a);
}

// select/reject/selectattr/rejectattr.
Value select_items(Interpreter& in, const Value& seq, CallArgs& args, bool attr, bool keep_if) {
  std::string attribute;
  size_t first_test_arg = 0;
  if (attr) {
    if (args.positional.empty() || !args.positional[0].is_string())
      in.error("selectattr/rejectattr need an attribute name");
    attribute = args.positional[0].str();
    first_test_arg = 1;
  }
  std::string test_name;
  std::vector<Value> targs;
  if (args.positional.size() > first_test_arg) {
    if (!args.positional[first_test_arg].is_string()) in.error("the test name must be a string");
    test_name = args.positional[first_test_arg].str();
    if (!test_exists(test_name)) in.error("No test named '" + test_name + "'.");
    targs.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(first_test_arg + 1), args.positional.end());
  }
  std::vector<Value> out;
  for (const Value& item : in.iterate(seq)) {
    const Value v = attr ? get_attribute_path(in, item, attribute) : item;
    const bool r = test_name.empty() ? v.truthy() : truthy_test(in, test_name, v, targs);
    if (r == keep_if) out.push_back(item);
  }
  return in.make_list(std::move(out));
}

Value range_of(Interpreter& in, CallArgs& a) {
  if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3) in.error("range() takes 1 to 3 integers");
  int64_t v[3] = {0, 0, 1};
  for (const Value& x : a.positional)
    if (x.kind != Kind::Int && x.kind != Kind::Bool)
      in.error(std::string("'") + py_type_name(x) + "' object cannot be interpreted as an integer");
  auto iv = [](const Value& x) { return x.kind == Kind::Bool ? static_cast<int64_t>(x.b) : x.i; };
  if (a.positional.size() == 1) v[1] = iv(a.positional[0]);
  else {
    v[0] = iv(a.positional[0]);
    v[1] = iv(a.positional[1]);
    if (a.positional.size() == 3) v[2] = iv(a.positional[2]);
  }
  if (v[2] == 0) in.error("range() arg 3 must not be zero");
  const long double count = v[2] > 0 ? std::ceil(static_cast<long double>(v[1] - static_cast<long double>(v[0])) / v[2])
                                     : std::ceil(static_cast<long double>(v[0] - static_cast<long double>(v[1])) / -v[2]);
  // jinja2's sandbox refuses ranges longer than MAX_RANGE.
  if (count > 100000) in.error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) out.push_back(Value::integer(v[0] + k * v[2]));
  return in.make_list(std::move(out));
}


const std::set<std::string>& filter_names() {
  static const std::set<std::string> k = {
      "abs", "attr", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
      "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max",
      "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string",
      "sum", "title", "tojson", "trim", "unique", "upper", "wordcount"};
  return k;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
      "float", "ge", ">=", "gt", "greaterthan", ">", "in", "integer", "iterable", "le", "<=", "lower", "lt",
      "lessthan", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test",
      "true", "undefined", "upper"};
  return k;
}

}  // namespace

bool filter_exists(const std::string& name) { return filter_names().count(name) > 0; }
bool test_exists(const std::string& name) { return test_names().count(name) > 0; }

Value Interpreter::filter(const std::string& name, const Value& v, CallArgs& args) {
  ArgReader r{*this, args, name.c_str(), {}};
  if (name == "trim") {
    const Value* chars = r.get(0, "chars");
    r.done();
    if (chars && !chars->is_none()) {
      const Cps cs = utf8_decode(r.str_arg(chars, "chars"));
      return strip_value(*this, v, &cs, true, true);
    }
    return strip_value(*this, v, nullptr, true, true);
  }
  if (name == "tojson") {
    const Value* ea = r.get(0, "ensure_ascii");
    const Value* indent = r.get(1, "indent");
    const Value* seps = r.get(2, "separators");
    const Value* sort = r.get(3, "sort_keys");
    r.done();
    JsonOptions o;
    o.ensure_ascii = ea && ea->truthy();
    o.sort_keys = sort && sort->truthy();
    if (indent && !indent->is_none()) {
      o.has_indent = true;
      if (indent->is_string()) o.indent = indent->str();
      else if (indent->kind == Kind::Int || indent->kind == Kind::Bool) o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(r.int_or(indent, 0), 0, 64)), ' ');
      else error("tojson(): indent must be an integer or a string");
    }
    if (seps && !seps->is_none()) {
      if (!seps->is_list() || seps->items().size() != 2 || !seps->items()[0].is_string() || !seps->items()[1].is_string())
        error("tojson(): separators must be a pair of strings");
      o.has_separators = true;
      o.item_sep = seps->items()[0].str();
      o.key_sep = seps->items()[1].str();
    }
    std::string out, err;
    if (!to_json(v, o, &out, &err)) error(err);
    return make_string(std::move(out));
  }
  if (name == "length" || name == "count") {
    r.done();
    return Value::integer(py_len(*this, v));
  }
  if (name == "string" || name == "safe") {
    r.done();
    if (v.is_string()) return v;
    return make_string(py_str(v));
  }
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    r.done();
    const std::string s = py_str(v);
    if (name == "upper") return make_string(upper(s));
    if (name == "lower") return make_string(lower(s));
    if (name == "capitalize") return make_string(py_capitalize(s));
    // jinja2's title: each word (split at whitespace, -, (, {, [, <) gets
    // its first character upper and the rest lower.
    std::string out;
    bool word_start = true;
    for (uint32_t c : utf8_decode(s)) {
      const bool sep = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      utf8_append(&out, sep ? c : word_start ? to_upper(c) : to_lower(c));
      word_start = sep;
    }
    return make_string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* dflt = r.get(0, "default_value");
    const Value* boolean = r.get(1, "boolean");
    r.done();
    const bool use = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    if (!use) return v;
    return dflt ? *dflt : Value::string("");
  }
  if (name == "join") {
    const Value* sep = r.get(0, "d");
    const Value* attribute = r.get(1, "attribute");
    r.done();
    std::string out;
    auto spans = std::make_shared<Spans>();
    const std::string s = sep ? py_str(*sep) : "";
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += s;
      first = false;
      const Value x = attribute && !attribute->is_none() ? get_attribute_path(*this, item, py_str(*attribute)) : item;
      if (x.is_string() && x.spans)
        for (const Span& sp : *x.spans) spans->emplace_back(sp.first + out.size(), sp.second + out.size());
      out += py_str(x);
      if (out.size() > opt_.limits.max_output_bytes) make_string(out);
    }
    return make_string(std::move(out), spans);
  }
  if (name == "first" || name == "last") {
    r.done();
    if (v.is_none() || v.is_number()) error(std::string("'") + py_type_name(v) + "' object is not iterable");
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(std::string("No ") + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    r.done();
    if (v.is_none() || v.is_number()) error(std::string("'") + py_type_name(v) + "' object is not iterable");
    return make_list(iterate(v));
  }
  if (name == "items") {
    r.done();
    if (v.is_undefined()) return make_list({});
    if (!v.is_mapping()) error("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& kv : v.mapping().items) out.push_back(Value::make_list({kv.first, kv.second}, true));
    return make_list(std::move(out));
  }
  if (name == "dictsort") {
    const Value* cs = r.get(0, "case_sensitive");
    const Value* by = r.get(1, "by");
    const Value* rev = r.get(2, "reverse");
    r.done();
    if (!v.is_mapping()) error("You can only sort by either \"key\" or \"value\"");
    const bool by_value = by && by->is_string() && by->str() == "value";
    if (by && !(by->is_string() && (by->str() == "key" || by->str() == "value")))
      error("You can only sort by either \"key\" or \"value\"");
    std::vector<Value> pairs;
    for (const auto& kv : v.mapping().items) pairs.push_back(Value::make_list({kv.first, kv.second}, true));
    const bool case_sensitive = cs && cs->truthy();
    return make_list(sorted(*this, std::move(pairs), rev && rev->truthy(), [&](const Value& p) {
      return sort_key(p.items()[by_value ? 1 : 0], case_sensitive);
    }));
  }
  if (name == "sort") {
    const Value* rev = r.get(0, "reverse");
    const Value* cs = r.get(1, "case_sensitive");
    const Value* attribute = r.get(2, "attribute");
    r.done();
    const bool case_sensitive = cs && cs->truthy();
    return make_list(sorted(*this, iterate(v), rev && rev->truthy(), [&](const Value& x) {
      return sort_key(attribute && !attribute->is_none() ? get_attribute_path(*this, x, py_str(*attribute)) : x,
                      case_sensitive);
    }));
  }
  if (name == "unique") {
    const Value* cs = r.get(0, "case_sensitive");
    const Value* attribute = r.get(1, "attribute");
    r.done();
    const bool case_sensitive = cs && cs->truthy();
    std::vector<Value> seen, out;
    for (const Value& item : iterate(v)) {
      const Value key = sort_key(
          attribute && !attribute->is_none() ? get_attribute_path(*this, item, py_str(*attribute)) : item, case_sensitive);
      charge(seen.size() / 16);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return make_list(std::move(out));
  }
  if (name == "reverse") {
    r.done();
    if (v.is_string()) {
      Cps cps = utf8_decode(v.str());
      std::reverse(cps.begin(), cps.end());
      return make_string(utf8_encode(cps));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return make_list(std::move(items));
  }
  if (name == "replace") {
    const Value* old = r.get(0, "old");
    const Value* repl = r.get(1, "new");
    const Value* count = r.get(2, "count");
    r.done();
    if (!old || !repl) error("replace() needs old and new");
    return make_string(py_replace(py_str(v), py_str(*old), py_str(*repl), r.int_or(count, -1), *this));
  }
  if (name == "indent") {
    const Value* width = r.get(0, "width");
    const Value* first = r.get(1, "first");
    const Value* blank = r.get(2, "blank");
    r.done();
    std::string ind;
    if (width && width->is_string()) ind = width->str();
    else ind = std::string(static_cast<size_t>(std::clamp<int64_t>(r.int_or(width, 4), 0, 1 << 16)), ' ');
    const std::vector<std::string> lines = py_splitlines(py_str(v) + "\n", false);
    std::string out;
    if (blank && blank->truthy()) {
      for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + ind : "") + lines[k];
    } else {
      for (size_t k = 0; k < lines.size(); ++k) {
        if (k == 0) out = lines[0];
        else out += "\n" + (lines[k].empty() ? "" : ind) + lines[k];
        if (out.size() > opt_.limits.max_output_bytes) make_string(out);
      }
    }
    if (first && first->truthy()) out = ind + out;
    return make_string(std::move(out));
  }
  if (name == "int") {
    const Value* dflt = r.get(0, "default");
    const Value* base = r.get(1, "base");
    r.done();
    const Value d = dflt ? *dflt : Value::integer(0);
    if (v.kind == Kind::Int) return v;
    if (v.kind == Kind::Bool) return Value::integer(v.b);
    if (v.kind == Kind::Float) {
      if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) return d;
      return Value::integer(static_cast<int64_t>(v.f));
    }
    if (v.is_string()) {
      const std::string s = py_strip(v.str(), nullptr, true, true);
      const int b = static_cast<int>(r.int_or(base, 10));
      if (b < 2 || b > 36) return d;
      errno = 0;
      char* end = nullptr;
      const long long x = std::strtoll(s.c_str(), &end, b);
      if (!s.empty() && end && *end == 0 && errno == 0 && s.find_first_of(" \t") == std::string::npos)
        return Value::integer(x);
      char* fend = nullptr;
      const double f = std::strtod(s.c_str(), &fend);
      if (!s.empty() && fend && *fend == 0 && std::isfinite(f) && std::fabs(f) < 9.2e18 &&
          s.find_first_of("xXpP") == std::string::npos)
        return Value::integer(static_cast<int64_t>(f));
    }
    return d;
  }
  if (name == "float") {
    const Value* dflt = r.get(0, "default");
    r.done();
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      const std::string s = py_strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      const double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0 && s.find_first_of("xXpP") == std::string::npos) return Value::number(f);
    }
    return dflt ? *dflt : Value::number(0.0);
  }
  if (name == "abs") {
    r.done();
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    if (v.kind == Kind::Int || v.kind == Kind::Bool) {
      const int64_t x = v.kind == Kind::Bool ? v.b : v.i;
      if (x == INT64_MIN) error("integer overflow");
      return Value::integer(x < 0 ? -x : x);
    }
    error(std::string("bad operand type for abs(): '") + py_type_name(v) + "'");
  }
  if (name == "round") {
    const Value* prec = r.get(0, "precision");
    const Value* method = r.get(1, "method");
    r.done();
    if (!v.is_number()) error("round(): a number is required");
    const int64_t p = std::clamp<int64_t>(r.int_or(prec, 0), -300, 300);
    const std::string m = method ? py_str(*method) : "common";
    if (m != "common" && m != "ceil" && m != "floor") error("method must be common, ceil or floor");
    if (m == "common") {
      // Python's round(): an int stays an int; a float is rounded half to
      // even on its exact binary value, which is what %.*f does.
      if (v.kind != Kind::Float) return p >= 0 ? Value::integer(v.kind == Kind::Bool ? v.b : v.i) : Value::number(std::nearbyint(v.as_double() / std::pow(10.0, static_cast<double>(-p))) * std::pow(10.0, static_cast<double>(-p)));
      if (!std::isfinite(v.f)) return v;
      if (p < 0) {
        const double scale = std::pow(10.0, static_cast<double>(-p));
        return Value::number(std::nearbyint(v.f / scale) * scale);
      }
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(p, 100)), v.f);
      return Value::number(std::strtod(buf, nullptr));
    }
    // jinja2: math.ceil/floor(value * 10**precision) / 10**precision.
    const double scale = std::pow(10.0, static_cast<double>(p));
    return Value::number((m == "ceil" ? std::ceil(v.as_double() * scale) : std::floor(v.as_double() * scale)) / scale);
  }
  if (name == "map") {
    std::vector<Value> out;
    const Value* attribute = nullptr;
    for (const auto& kv : args.keyword)
      if (kv.first == "attribute") attribute = &kv.second;
    if (attribute) {
      const Value* dflt = nullptr;
      for (const auto& kv : args.keyword)
        if (kv.first == "default") dflt = &kv.second;
        else if (kv.first != "attribute") error("map(): unexpected keyword argument '" + kv.first + "'");
      for (const Value& item : iterate(v)) {
        Value x = get_attribute_path(*this, item, py_str(*attribute));
        if (x.is_undefined() && dflt) x = *dflt;
        out.push_back(x);
      }
      return make_list(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) error("map(): a filter name or attribute= is needed");
    const std::string f = args.positional[0].str();
    if (!filter_exists(f)) error("No filter named '" + f + "'.");
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : iterate(v)) {
      CallArgs a = rest;
      out.push_back(filter(f, item, a));
    }
    return make_list(std::move(out));
  }
  if (name == "select" || name == "reject") return select_items(*this, v, args, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_items(*this, v, args, true, name == "selectattr");
  if (name == "attr") {
    const Value* n = r.get(0, "name");
    r.done();
    return getattr(v, r.str_arg(n, "name"));
  }
  if (name == "max" || name == "min") {
    const Value* cs = r.get(0, "case_sensitive");
    const Value* attribute = r.get(1, "attribute");
    r.done();
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
    const bool case_sensitive = cs && cs->truthy();
    auto key = [&](const Value& x) {
      return sort_key(attribute && !attribute->is_none() ? get_attribute_path(*this, x, py_str(*attribute)) : x,
                      case_sensitive);
    };
    std::string err;
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
      const bool better = name == "max" ? py_less(key(items[best]), key(items[k]), &err)
                                        : py_less(key(items[k]), key(items[best]), &err);
      if (!err.empty()) error(err);
      if (better) best = k;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value* attribute = r.get(0, "attribute");
    const Value* start = r.get(1, "start");
    r.done();
    Value total = start ? *start : Value::integer(0);
    for (const Value& item : iterate(v))
      total = binary_op("+", total,
                        attribute && !attribute->is_none() ? get_attribute_path(*this, item, py_str(*attribute)) : item);
    return total;
  }
  if (name == "center") {
    const Value* width = r.get(0, "width");
    r.done();
    const std::string s = py_str(v);
    const int64_t n = static_cast<int64_t>(utf8_decode(s).size());
    const int64_t w = std::min<int64_t>(r.int_or(width, 80), 1 << 20);
    if (w <= n) return make_string(s);
    // Python's str.center puts the odd space on the right when the
    // padding is odd and the width is even... as left = pad/2 + (pad & w & 1).
    const int64_t pad = w - n;
    const int64_t left = pad / 2 + (pad & w & 1);
    return make_string(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "wordcount") {
    r.done();
    // jinja2 counts \w+ runs.
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t c : utf8_decode(py_str(v))) {
      const bool w = c == '_' || (c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : !py_isspace(c));
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "e" || name == "escape" || name == "forceescape") {
    r.done();
    return make_string(html_escape(py_str(v)));
  }
  if (name == "format") {
    return make_string(percent_format(*this, py_str(v), args.positional));
  }
  error("No filter named '" + name + "'.");
}

bool Interpreter::test(const std::string& name, const Value& v, CallArgs& args) {
  ArgReader r{*this, args, name.c_str(), {}};
  auto arg = [&]() -> Value {
    const Value* a = r.get(0, "other");
    r.done();
    if (!a) error("test '" + name + "' needs an argument");
    return *a;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind == Kind::Dict;
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::Int;
  if (name == "float") return v.kind == Kind::Float;
  if (name == "boolean") return v.kind == Kind::Bool;
  if (name == "true") return v.kind == Kind::Bool && v.b;
  if (name == "false") return v.kind == Kind::Bool && !v.b;
  if (name == "callable") return v.kind == Kind::Callable;
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) error(std::string("'") + py_type_name(v) + "' object has no attribute '" + name + "'");
    bool any_cased = false;
    for (uint32_t c : utf8_decode(v.str())) {
      if (name == "lower" ? is_upper_cp(c) : is_lower_cp(c)) return false;
      any_cased = any_cased || is_cased(c);
    }
    return any_cased;
  }
  if (name == "even" || name == "odd") {
    if (v.kind != Kind::Int && v.kind != Kind::Bool) error("even/odd tests need an integer");
    const int64_t x = v.kind == Kind::Bool ? v.b : v.i;
    return (x % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") {
    const Value a = arg();
    const Value m = binary_op("%", v, a);
    return py_equal(m, Value::integer(0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, arg());
  if (name == "ne" || name == "!=") return !py_equal(v, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return binary_op("<", v, arg()).b;
  if (name == "le" || name == "<=") return binary_op("<=", v, arg()).b;
  if (name == "gt" || name == "greaterthan" || name == ">") return binary_op(">", v, arg()).b;
  if (name == "ge" || name == ">=") return binary_op(">=", v, arg()).b;
  if (name == "in") return binary_op("in", v, arg()).b;
  if (name == "sameas") {
    const Value a = arg();
    if (v.kind != a.kind) return false;
    if (v.is_none() || v.kind == Kind::Bool || v.kind == Kind::Int) return py_equal(v, a);
    if (v.is_string()) return v.s == a.s;
    if (v.is_list()) return v.list == a.list;
    if (v.kind == Kind::Dict) return v.dict == a.dict;
    return py_equal(v, a);
  }
  if (name == "filter") return v.is_string() && filter_exists(v.str());
  if (name == "test") return v.is_string() && test_exists(v.str());
  error("No test named '" + name + "'.");
}

Value Interpreter::method(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    static const std::set<std::string> kStr = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "replace", "upper",
        "lower", "title", "capitalize", "find", "rfind", "index", "rindex", "count", "join", "isdigit", "isalpha",
        "isalnum", "isspace", "isupper", "islower", "format", "removeprefix", "removesuffix", "partition",
        "rpartition", "zfill", "casefold", "swapcase", "isnumeric", "isdecimal", "ljust", "rjust", "center"};
    if (!kStr.count(name)) return Value::undefined("'str object' has no attribute '" + name + "'");
    const Value self = obj;
    return Value::callable(name, [self, name](Interpreter& in, CallArgs& args) -> Value {
      const std::string& s = self.str();
      ArgReader r{in, args, name.c_str(), {}};
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = r.get(0, "chars");
        r.done();
        Cps cs;
        const bool has = chars && !chars->is_none();
        if (has) cs = utf8_decode(r.str_arg(chars, "chars"));
        return strip_value(in, self, has ? &cs : nullptr, name != "rstrip", name != "lstrip");
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = r.get(0, "sep");
        const Value* maxsplit = r.get(1, "maxsplit");
        r.done();
        std::string sep_s;
        const bool has_sep = sep && !sep->is_none();
        if (has_sep) {
          sep_s = r.str_arg(sep, "sep");
          if (sep_s.empty()) in.error("empty separator");
        }
        const int64_t m = r.int_or(maxsplit, -1);
        std::vector<std::string> parts;
        if (name == "rsplit" && m >= 0) {
          // Split from the right: reverse, split, reverse back.
          Cps cps = utf8_decode(s);
          std::reverse(cps.begin(), cps.end());
          Cps sc = utf8_decode(sep_s);
          std::reverse(sc.begin(), sc.end());
          const std::string rs = utf8_encode(sc);
          parts = py_split(utf8_encode(cps), has_sep ? &rs : nullptr, m);
          std::reverse(parts.begin(), parts.end());
          for (auto& p : parts) {
            Cps pc = utf8_decode(p);
            std::reverse(pc.begin(), pc.end());
            p = utf8_encode(pc);
          }
        } else {
          parts = py_split(s, has_sep ? &sep_s : nullptr, m);
        }
        std::vector<Value> out;
        for (auto& p : parts) out.push_back(Value::string(std::move(p)));
        return in.make_list(std::move(out));
      }
      if (name == "splitlines") {
        const Value* keep = r.get(0, "keepends");
        r.done();
        std::vector<Value> out;
        for (auto& p : py_splitlines(s, keep && keep->truthy())) out.push_back(Value::string(std::move(p)));
        return in.make_list(std::move(out));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = r.get(0, "prefix");
        r.done();
        if (!p) in.error(name + "() takes at least 1 argument");
        std::vector<Value> options = p->is_list() && p->list->tuple ? p->items() : std::vector<Value>{*p};
        for (const Value& o : options) {
          if (!o.is_string())
            in.error(name + " first arg must be str or a tuple of str, not " + py_type_name(o));
          const std::string& x = o.str();
          if (x.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "replace") {
        const Value* old = r.get(0, "old");
        const Value* repl = r.get(1, "new");
        const Value* count = r.get(2, "count");
        r.done();
        return in.make_string(py_replace(s, r.str_arg(old, "old"), r.str_arg(repl, "new"), r.int_or(count, -1), in));
      }
      if (name == "upper") return r.done(), in.make_string(upper(s));
      if (name == "lower" || name == "casefold") return r.done(), in.make_string(lower(s));
      if (name == "title") return r.done(), in.make_string(py_title(s));
      if (name == "capitalize") return r.done(), in.make_string(py_capitalize(s));
      if (name == "swapcase") {
        r.done();
        std::string out;
        for (uint32_t c : utf8_decode(s)) utf8_append(&out, is_upper_cp(c) ? to_lower(c) : to_upper(c));
        return in.make_string(std::move(out));
      }
      if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
        const Value* sub = r.get(0, "sub");
        r.done();
        const std::string x = r.str_arg(sub, "sub");
        if (name == "count") {
          if (x.empty()) return Value::integer(static_cast<int64_t>(utf8_decode(s).size()) + 1);
          int64_t n = 0;
          for (size_t at = s.find(x); at != std::string::npos; at = s.find(x, at + x.size())) ++n;
          return Value::integer(n);
        }
        const size_t at = name[0] == 'r' ? s.rfind(x) : s.find(x);
        if (at == std::string::npos) {
          if (name == "index" || name == "rindex") in.error("substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(utf8_decode(s.substr(0, at)).size()));
      }
      if (name == "join") {
        const Value* it = r.get(0, "iterable");
        r.done();
        if (!it) in.error("join() takes exactly one argument");
        std::string out;
        bool first = true;
        for (const Value& item : in.iterate(*it)) {
          if (!item.is_string()) in.error(std::string("sequence item: expected str instance, ") + py_type_name(item) + " found");
          if (!first) out += s;
          first = false;
          out += item.str();
          if (out.size() > in.options().limits.max_output_bytes) in.make_string(out);
        }
        return in.make_string(std::move(out));
      }
      if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isnumeric" ||
          name == "isdecimal") {
        r.done();
        const Cps cps = utf8_decode(s);
        if (cps.empty()) return Value::boolean(false);
        for (uint32_t c : cps) {
          bool ok;
          if (name == "isspace") ok = py_isspace(c);
          else if (name == "isdigit" || name == "isnumeric" || name == "isdecimal") ok = c >= '0' && c <= '9';
          else if (name == "isalpha") ok = c < 0x80 ? std::isalpha(static_cast<int>(c)) != 0 : is_cased(c);
          else ok = c < 0x80 ? std::isalnum(static_cast<int>(c)) != 0 : is_cased(c);
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      }
      if (name == "isupper" || name == "islower") {
        r.done();
        bool any = false;
        for (uint32_t c : utf8_decode(s)) {
          if (name == "isupper" ? is_lower_cp(c) : is_upper_cp(c)) return Value::boolean(false);
          any = any || is_cased(c);
        }
        return Value::boolean(any);
      }
      if (name == "format") return in.make_string(brace_format(in, s, args));
      if (name == "removeprefix" || name == "removesuffix") {
        const Value* a = r.get(0, "affix");
        r.done();
        const std::string x = r.str_arg(a, "argument");
        if (name == "removeprefix") return in.make_string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
        if (x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
          return in.make_string(s.substr(0, s.size() - x.size()));
        return in.make_string(s);
      }
      if (name == "partition" || name == "rpartition") {
        const Value* a = r.get(0, "sep");
        r.done();
        const std::string x = r.str_arg(a, "sep");
        if (x.empty()) in.error("empty separator");
        const size_t at = name == "partition" ? s.find(x) : s.rfind(x);
        if (at == std::string::npos) {
          return name == "partition"
                     ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
                     : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
        }
        return Value::make_list({Value::string(s.substr(0, at)), Value::string(x), Value::string(s.substr(at + x.size()))},
                                true);
      }
      if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
        const Value* w = r.get(0, "width");
        const Value* fill = r.get(1, "fillchar");
        r.done();
        const int64_t width = std::min<int64_t>(r.int_or(w, 0), 1 << 20);
        const int64_t n = static_cast<int64_t>(utf8_decode(s).size());
        if (width <= n) return in.make_string(s);
        const size_t pad = static_cast<size_t>(width - n);
        std::string f = " ";
        if (fill) f = r.str_arg(fill, "fillchar");
        auto rep = [&](size_t k) {
          std::string out;
          for (size_t j = 0; j < k; ++j) out += f;
          return out;
        };
        if (name == "zfill") {
          if (!s.empty() && (s[0] == '-' || s[0] == '+')) return in.make_string(s.substr(0, 1) + std::string(pad, '0') + s.substr(1));
          return in.make_string(std::string(pad, '0') + s);
        }
        if (name == "ljust") return in.make_string(s + rep(pad));
        if (name == "rjust") return in.make_string(rep(pad) + s);
        const size_t left = pad / 2 + (pad & static_cast<size_t>(width) & 1);
        return in.make_string(rep(left) + s + rep(pad - left));
      }
      in.error("str." + name + "() is not supported");
    });
  }
  if (obj.kind == Kind::Dict) {
    static const std::set<std::string> kMutating = {"pop", "popitem", "setdefault", "update", "clear"};
    if (kMutating.count(name)) return unsafe(obj, name);
    if (name != "items" && name != "keys" && name != "values" && name != "get" && name != "copy")
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    const Value self = obj;
    return Value::callable(name, [self, name](Interpreter& in, CallArgs& args) -> Value {
      ArgReader r{in, args, name.c_str(), {}};
      if (name == "get") {
        const Value* key = r.get(0, "key");
        const Value* dflt = r.get(1, "default");
        r.done();
        if (!key) in.error("get expected at least 1 argument, got 0");
        if (const Value* v = self.find(*key)) return *v;
        return dflt ? *dflt : Value::none();
      }
      r.done();
      if (name == "copy") return self;
      std::vector<Value> out;
      for (const auto& kv : self.dict->items) {
        if (name == "items") out.push_back(Value::make_list({kv.first, kv.second}, true));
        else out.push_back(name == "keys" ? kv.first : kv.second);
      }
      return in.make_list(std::move(out));
    });
  }
  if (obj.is_list()) {
    static const std::set<std::string> kMutating = {"append", "extend", "insert", "pop", "remove", "sort", "reverse",
                                                    "clear"};
    if (kMutating.count(name) && !obj.list->tuple) return unsafe(obj, name);
    if (name != "index" && name != "count")
      return Value::undefined(std::string("'") + py_type_name(obj) + " object' has no attribute '" + name + "'");
    const Value self = obj;
    return Value::callable(name, [self, name](Interpreter& in, CallArgs& args) -> Value {
      ArgReader r{in, args, name.c_str(), {}};
      const Value* x = r.get(0, "value");
      r.done();
      if (!x) in.error(name + "() takes exactly one argument");
      int64_t n = 0;
      for (size_t k = 0; k < self.items().size(); ++k)
        if (py_equal(self.items()[k], *x)) {
          if (name == "index") return Value::integer(static_cast<int64_t>(k));
          ++n;
        }
      if (name == "index") in.error("the value is not in the list");
      return Value::integer(n);
    });
  }
  return Value::undefined("");
}

Value Interpreter::global(const std::string& name) {
  if (name == "range") return Value::callable("range", range_of);
  if (name == "dict")
    return Value::callable("dict", [](Interpreter& in, CallArgs& a) {
      if (a.positional.size() > 1) in.error("dict expected at most 1 argument");
      std::vector<std::pair<Value, Value>> items;
      if (!a.positional.empty()) {
        const Value& src = a.positional[0];
        if (src.kind == Kind::Dict) items = src.dict->items;
        else
          for (const Value& pair : in.iterate(src)) {
            if (!pair.is_list() || pair.items().size() != 2) in.error("dictionary update sequence element has length != 2");
            items.emplace_back(pair.items()[0], pair.items()[1]);
          }
      }
      for (const auto& kv : a.keyword) items.emplace_back(Value::string(kv.first), kv.second);
      return Value::make_dict(std::move(items));
    });
  if (name == "namespace")
    return Value::callable("namespace", [](Interpreter& in, CallArgs& a) {
      std::vector<std::pair<Value, Value>> items;
      if (a.positional.size() > 1) in.error("namespace() takes at most one positional argument");
      if (!a.positional.empty()) {
        if (a.positional[0].kind != Kind::Dict) in.error("namespace() needs a dict as its positional argument");
        items = a.positional[0].dict->items;
      }
      for (const auto& kv : a.keyword) items.emplace_back(Value::string(kv.first), kv.second);
      Value ns = Value::make_namespace(std::move(items));
      in.track_namespace(ns);
      return ns;
    });
  if (name == "raise_exception")
    return Value::callable("raise_exception", [](Interpreter& in, CallArgs& a) -> Value {
      in.error(a.positional.empty() ? std::string("raise_exception() called") : py_str(a.positional[0]));
    });
  if (name == "strftime_now")
    return Value::callable("strftime_now", [](Interpreter& in, CallArgs& a) -> Value {
      if (a.positional.size() != 1 || !a.positional[0].is_string()) in.error("strftime_now() takes one format string");
      const std::string& fmt = a.positional[0].str();
      if (fmt.size() > 256) in.error("strftime_now(): the format is too long");
      const std::tm t = in.options().now ? in.options().now() : local_time_now();
      if (fmt.empty()) return Value::string("");
      char buf[4096];
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &t);
      return in.make_string(std::string(buf, n));
    });
  return Value::undefined("'" + name + "' is undefined");
}

std::tm local_time_now() {
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  localtime_r(&now, &t);
  return t;
}

}  // namespace runlm::jinja
