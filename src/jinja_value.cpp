#include "jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace runlm::jinja {

Value Value::undefined(std::string hint) {
  Value v;
  v.hint = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  v.s = std::make_shared<const std::string>(std::move(x));
  return v;
}
Value Value::literal_string(std::string x) {
  Value v = string(std::move(x));
  if (!v.s->empty()) v.spans = std::make_shared<const Spans>(Spans{{0, v.s->size()}});
  return v;
}
namespace {
// Nesting depth a container adds to; namespaces do not count (they are
// emptied after each render, which breaks their chains and cycles).
int depth_of(const Value& v) {
  if (v.kind == Kind::List) return v.list->depth;
  if (v.kind == Kind::Dict) return v.dict->depth;
  return 0;
}
}  // namespace

Value Value::make_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  auto d = std::make_shared<ListData>();
  for (const Value& x : items) d->depth = std::max(d->depth, depth_of(x) + 1);
  if (d->depth > kMaxValueDepth) throw ValueTooDeep{};
  d->items = std::move(items);
  d->tuple = tuple;
  v.list = std::move(d);
  return v;
}
Value Value::make_dict(std::vector<std::pair<Value, Value>> items) {
  Value v;
  v.kind = Kind::Dict;
  auto d = std::make_shared<DictData>();
  for (const auto& kv : items) d->depth = std::max({d->depth, depth_of(kv.first) + 1, depth_of(kv.second) + 1});
  if (d->depth > kMaxValueDepth) throw ValueTooDeep{};
  // A repeated key keeps its first position and its last value, as in Python.
  for (auto& kv : items) {
    auto it = std::find_if(d->items.begin(), d->items.end(), [&](const auto& e) { return py_equal(e.first, kv.first); });
    if (it != d->items.end()) it->second = std::move(kv.second);
    else d->items.push_back(std::move(kv));
  }
  v.dict = std::move(d);
  return v;
}
Value Value::make_namespace(std::vector<std::pair<Value, Value>> items) {
  Value v = make_dict(std::move(items));
  v.kind = Kind::Namespace;
  v.ns = std::make_shared<DictData>(*v.dict);
  v.dict.reset();
  return v;
}
Value Value::callable(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s->empty();
    case Kind::List: return !list->items.empty();
    case Kind::Dict: return !dict->items.empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

const Value* Value::find(const Value& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& kv : mapping().items)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Value::find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& kv : mapping().items)
    if (kv.first.kind == Kind::String && *kv.first.s == key) return &kv.second;
  return nullptr;
}

const Value* CallArgs::get(size_t pos, const std::string& name) const {
  for (const auto& kv : keyword)
    if (kv.first == name) return &kv.second;
  return pos < positional.size() ? &positional[pos] : nullptr;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf is "-d.ddde+XX": split into sign, digits and exponent.
  std::string s = buf;
  std::string sign;
  if (s[0] == '-') {
    sign = "-";
    s = s.substr(1);
  }
  const size_t epos = s.find('e');
  const int exp = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (s[k] != '.') digits += s[k];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
  return sign + out;
}

namespace {

// Python's repr() of a str: single quotes unless the text has ' and no ".
std::string repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : utf8_decode(s)) {
    if (c == static_cast<uint32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == 0xad) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      utf8_append(&out, c);
    }
  }
  out += q;
  return out;
}

}  // namespace

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::String: return repr_string(*v.s);
    case Kind::Undefined: return "Undefined";
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return py_float_repr(v.f);
    case Kind::String: return *v.s;
    case Kind::List: {
      std::string out = v.list->tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->items.size(); ++k) out += (k ? ", " : "") + py_repr(v.list->items[k]);
      if (v.list->tuple && v.list->items.size() == 1) out += ",";
      return out + (v.list->tuple ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k)
        out += (k ? ", " : "") + py_repr(v.dict->items[k].first) + ": " + py_repr(v.dict->items[k].second);
      return out + "}";
    }
    case Kind::Namespace: return "<Namespace>";
    case Kind::Callable: return "<function " + v.fn->name + ">";
  }
  return "";
}

const char* py_type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.list->tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "object";
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float)
      return (a.kind == Kind::Bool ? a.b : a.i) == (b.kind == Kind::Bool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return *a.s == *b.s;
    case Kind::List: {
      if (a.list->tuple != b.list->tuple || a.list->items.size() != b.list->items.size()) return false;
      for (size_t k = 0; k < a.list->items.size(); ++k)
        if (!py_equal(a.list->items[k], b.list->items[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.find(kv.first);
        if (!o || !py_equal(kv.second, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace: return a.ns == b.ns;
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

bool py_less(const Value& a, const Value& b, std::string* error) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float)
      return (a.kind == Kind::Bool ? a.b : a.i) < (b.kind == Kind::Bool ? b.b : b.i);
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return *a.s < *b.s;  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (py_equal(x[k], y[k])) continue;
      return py_less(x[k], y[k], error);
    }
    return x.size() < y.size();
  }
  *error = std::string("'<' not supported between instances of '") + py_type_name(a) + "' and '" + py_type_name(b) + "'";
  return false;
}

namespace {

void json_char(uint32_t c, bool ensure_ascii, std::string* out) {
  char buf[16];
  switch (c) {
    case '"': *out += "\\\""; return;
    case '\\': *out += "\\\\"; return;
    case '\n': *out += "\\n"; return;
    case '\r': *out += "\\r"; return;
    case '\t': *out += "\\t"; return;
    case '\b': *out += "\\b"; return;
    case '\f': *out += "\\f"; return;
    default: break;
  }
  if (c < 0x20 || (ensure_ascii && c >= 0x7f && c < 0x10000)) {
    if (c == 0x7f) {
      *out += static_cast<char>(c);
      return;
    }
    std::snprintf(buf, sizeof buf, "\\u%04x", c);
    *out += buf;
  } else if (ensure_ascii && c >= 0x110000u) {
    *out += "\\ufffd";  // a byte that is not UTF-8
  } else if (ensure_ascii && c >= 0x10000) {
    const uint32_t v = c - 0x10000;
    std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
    *out += buf;
  } else {
    utf8_append(out, c);
  }
}

void json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (uint32_t c : utf8_decode(s)) json_char(c, ensure_ascii, out);
  *out += '"';
}

bool json_value(const Value& v, const JsonOptions& o, int depth, std::string* out, std::string* error) {
  if (depth > 256) {
    *error = "maximum recursion depth exceeded while encoding a JSON object";
    return false;
  }
  const std::string item_sep = o.has_separators ? o.item_sep : (o.has_indent ? "," : ", ");
  const std::string key_sep = o.has_separators ? o.key_sep : ": ";
  auto newline = [&](int level) {
    if (!o.has_indent) return;
    *out += '\n';
    for (int k = 0; k < level; ++k) *out += o.indent;
  };
  switch (v.kind) {
    case Kind::None: *out += "null"; return true;
    case Kind::Bool: *out += v.b ? "true" : "false"; return true;
    case Kind::Int: *out += std::to_string(v.i); return true;
    case Kind::Float:
      if (std::isnan(v.f)) *out += "NaN";
      else if (std::isinf(v.f)) *out += v.f < 0 ? "-Infinity" : "Infinity";
      else *out += py_float_repr(v.f);
      return true;
    case Kind::String: json_string(*v.s, o.ensure_ascii, out); return true;
    case Kind::List: {
      if (v.list->items.empty()) {
        *out += "[]";
        return true;
      }
      *out += '[';
      for (size_t k = 0; k < v.list->items.size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        if (!json_value(v.list->items[k], o, depth + 1, out, error)) return false;
      }
      newline(depth);
      *out += ']';
      return true;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        *out += "{}";
        return true;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      for (const auto* kv : items)
        if (!kv->first.is_string() && !kv->first.is_number() && !kv->first.is_none()) {
          *error = std::string("keys must be str, int, float, bool or None, not ") + py_type_name(kv->first);
          return false;
        }
      if (o.sort_keys) {
        std::string err;
        std::stable_sort(items.begin(), items.end(),
                         [&](const auto* x, const auto* y) { return py_less(x->first, y->first, &err); });
        if (!err.empty()) {
          *error = err;
          return false;
        }
      }
      *out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) *out += item_sep;
        newline(depth + 1);
        const Value& key = items[k]->first;
        if (key.is_string()) json_string(*key.s, o.ensure_ascii, out);
        else if (key.kind == Kind::Bool) *out += key.b ? "\"true\"" : "\"false\"";
        else if (key.is_none()) *out += "\"null\"";
        else *out += "\"" + py_str(key) + "\"";
        *out += key_sep;
        if (!json_value(items[k]->second, o, depth + 1, out, error)) return false;
      }
      newline(depth);
      *out += '}';
      return true;
    }
    default:
      *error = std::string("Object of type ") + py_type_name(v) + " is not JSON serializable";
      return false;
  }
}

}  // namespace

bool to_json(const Value& v, const JsonOptions& o, std::string* out, std::string* error) {
  return json_value(v, o, 0, out, error);
}

std::vector<uint32_t> utf8_decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xe ? 3 : (b >> 3) == 0x1e ? 4 : 0;
    bool ok = n > 0 && i + static_cast<size_t>(n) <= s.size();
    uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1fu) : n == 3 ? (b & 0x0fu) : (b & 0x07u);
    for (int k = 1; ok && k < n; ++k) {
      const uint8_t cb = static_cast<uint8_t>(s[i + static_cast<size_t>(k)]);
      if ((cb & 0xc0) != 0x80) ok = false;
      c = (c << 6) | (cb & 0x3fu);
    }
    if (!ok) {
      // Invalid UTF-8 keeps its byte as a lone code point in the private
      // range so that it re-encodes to the same byte.
      out.push_back(0x110000u + b);
      ++i;
      continue;
    }
    out.push_back(c);
    i += static_cast<size_t>(n);
  }
  return out;
}

void utf8_append(std::string* out, uint32_t c) {
  if (c >= 0x110000u) {
    out->push_back(static_cast<char>(c - 0x110000u));
  } else if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3f)));
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t c : cps) utf8_append(&out, c);
  return out;
}

bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace runlm::jinja
