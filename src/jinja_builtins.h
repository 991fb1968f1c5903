// Names of the Jinja filters and tests jinja_builtins.cpp implements; the
// template checks its filters and tests against them when it is parsed, as
// jinja2 does when it compiles one.
#pragma once

#include <string>

namespace runlm::jinja {

bool filter_exists(const std::string& name);
bool test_exists(const std::string& name);

}  // namespace runlm::jinja
