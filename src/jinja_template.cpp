#include "jinja_template.h"

#include "jinja_ast.h"
#include "jinja_builtins.h"
#include "jinja_interpreter.h"
#include "jinja_lexer.h"

namespace runlm::jinja {
namespace {

// jinja2 refuses an unknown filter or test when it compiles the template,
// except inside an if statement or an inline if (a "soft" frame: there it
// fails when it runs); the body of a for loop, macro, call or block starts a
// frame that is not soft again.
void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->type == ExprType::CondExpr) soft = true;
  if (!soft && e->type == ExprType::Filter && e->name != kBlockValueName && !filter_exists(e->name))
    fail_at(e->line, e->col, "No filter named '" + e->name + "'.");
  if (!soft && e->type == ExprType::Test && !test_exists(e->name))
    fail_at(e->line, e->col, "No test named '" + e->name + "'.");
  for (const Expr* x : {e->a.get(), e->b.get(), e->c.get(), e->d.get(), e->star.get(), e->dstar.get()})
    check_names(x, soft);
  for (const auto& x : e->args) check_names(x.get(), soft);
  for (const auto& kv : e->kwargs) check_names(kv.second.get(), soft);
}

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    const bool if_stmt = s->type == StmtType::If;
    check_names(s->expr.get(), soft);
    check_names(s->cond.get(), soft);
    check_names(s->filter.get(), soft);
    for (const auto& x : s->defaults) check_names(x.get(), soft);
    for (const auto& x : s->conds) check_names(x.get(), true);
    for (const auto& b : s->bodies) check_names(b, true);
    check_names(s->body, false);
    check_names(s->else_body, if_stmt);
  }
}

}  // namespace

Template::Template(const std::string& source) : body_(std::make_unique<Body>(parse(source))) { check_names(*body_, false); }
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Rendered Template::render(const std::vector<std::pair<std::string, Value>>& vars, const RenderOptions& options) const {
  Interpreter in(options);
  return in.run(*body_, vars);
}

}  // namespace runlm::jinja
