// A short, safe rendering of an untrusted JSON value for error messages.
// nlohmann::json::dump() recurses once per nesting level, so dumping a value
// like [[[[...]]]] nested a million deep (a few MB of a safetensors header or
// config.json) overflows the stack: error paths must never dump raw input.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace runlm {

// Values nested deeper than this are described, not dumped.
constexpr size_t kJsonBriefMaxDepth = 16;
// Longer renderings are cut with "...".
constexpr size_t kJsonBriefMaxChars = 120;

// dump() of v when it is shallow (cut to kJsonBriefMaxChars), else
// "an array nested more than 16 deep" (or object).
inline std::string json_brief(const nlohmann::json& v) {
  // Depth by an explicit stack: measuring must not recurse either.
  std::vector<std::pair<const nlohmann::json*, size_t>> stack{{&v, 1}};
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (!node->is_structured()) continue;
    if (depth > kJsonBriefMaxDepth)
      return std::string(v.is_array() ? "an array" : "an object") + " nested more than " + std::to_string(kJsonBriefMaxDepth) + " deep";
    for (const auto& child : *node) stack.emplace_back(&child, depth + 1);
  }
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > kJsonBriefMaxChars) s = s.substr(0, kJsonBriefMaxChars) + "...";
  return s;
}

}  // namespace runlm
