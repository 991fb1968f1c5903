// A Jinja template as transformers' apply_chat_template runs it: jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
// the loopcontrols extension, the globals raise_exception(msg) and
// strftime_now(fmt), and transformers' tojson filter (ensure_ascii off).
// Rendering is bounded: nesting, work, output and value sizes have limits,
// and passing one is an Error like any other template error ("line L,
// column C: ...").
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja_value.h"

namespace runlm::jinja {

struct Stmt;

struct RenderLimits {
  size_t max_output_bytes = 16u << 20;  // also the largest string value
  size_t max_list_items = 1u << 20;
  uint64_t max_alloc_bytes = 1ull << 30;  // built over the whole render
  uint64_t max_steps = 20'000'000;      // evaluation steps, plus one per 64 bytes built
  int max_depth = 1000;                 // nested evaluation (expressions, blocks, macro calls)
  int max_macro_depth = 100;
};

struct RenderOptions {
  // The clock strftime_now() reads (local time); tests fix it.
  std::function<std::tm()> now;
  RenderLimits limits;
};

// The current local time, strftime_now()'s default clock.
std::tm local_time_now();

// A rendered template: the text, and where the literal strings passed in
// (Value::literal_string) landed in it, in order.
struct Rendered {
  std::string text;
  Spans literal_spans;
};

class Template {
 public:
  // Parses; throws Error on a syntax error or an unknown filter or test
  // (jinja2 refuses those when it compiles the template, too).
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the given top-level variables; throws Error.
  Rendered render(const std::vector<std::pair<std::string, Value>>& vars, const RenderOptions& options) const;

 private:
  std::unique_ptr<std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace runlm::jinja
