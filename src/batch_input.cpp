#include "batch_input.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_flags.h"
#include "common.h"

namespace runlm {

namespace {

using nlohmann::json;

template <typename T>
std::optional<T> number_field(const json& j, const char* key, BatchEntry& e) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (!v.is_number()) {
    e.error = strfmt("\"%s\" must be a number", key);
    return std::nullopt;
  }
  if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) {
      e.error = strfmt("\"%s\" must be an integer", key);
      return std::nullopt;
    }
    // get<T>() would wrap a larger value silently (n_predict 4294967301 as
    // 5), so the range is checked on the 64-bit value first.
    const bool fits = v.is_number_unsigned()
                          ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                          : v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                v.get<int64_t>() <= std::numeric_limits<T>::max();
    if (!fits) {
      e.error = strfmt("\"%s\" = %s is out of range", key, v.dump().c_str());
      return std::nullopt;
    }
    return v.get<T>();
  } else {
    // A double beyond float range (1e300) would become inf and pass the
    // ">= 0" checks below.
    const double d = v.get<double>();
    if (!(std::abs(d) <= FLT_MAX)) {
      e.error = strfmt("\"%s\" = %s is out of range", key, v.dump().c_str());
      return std::nullopt;
    }
    return static_cast<T>(d);
  }
}

constexpr const char* kFields[] = {"prompt", "messages", "n_predict", "temperature", "top_p", "top_k",
                                   "min_p",  "repeat_penalty", "seed", "stop", "id"};

}  // namespace

BatchEntry parse_batch_json_line(const std::string& line, int line_number, bool allow_extra_fields) {
  BatchEntry e;
  e.line = line_number;
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& ex) {
    e.error = strfmt("invalid JSON: %s", ex.what());
    return e;
  }
  if (!j.is_object()) {
    e.error = "a request must be a JSON object";
    return e;
  }
  if (j.contains("id")) {
    // Only scalars: the id is echoed in the output record, and dumping a
    // value nested a million deep ([[[[...]]]]) would overflow the stack.
    const json& id = j["id"];
    if (!id.is_string() && !id.is_number()) {
      e.error = "\"id\" must be a string or a number";
      return e;
    }
    e.id = id.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (!allow_extra_fields)
    for (const auto& [key, value] : j.items()) {
      if (std::find(std::begin(kFields), std::end(kFields), key) != std::end(kFields)) continue;
      std::string near;
      int best = 3;  // suggest only a near miss
      for (const char* f : kFields)
        if (const int d = edit_distance(key, f); d < best) best = d, near = f;
      e.error = strfmt("unknown field \"%s\"%s (known: prompt, messages, n_predict, temperature, top_p, top_k, min_p, "
                       "repeat_penalty, seed, stop, id; --allow-extra-fields ignores others)",
                       key.c_str(), near.empty() ? "" : strfmt("; did you mean \"%s\"?", near.c_str()).c_str());
      return e;
    }
  const bool has_prompt = j.contains("prompt"), has_messages = j.contains("messages");
  if (has_prompt == has_messages) {
    e.error = "a request needs exactly one of \"prompt\" and \"messages\"";
    return e;
  }
  if (has_prompt) {
    if (!j["prompt"].is_string()) {
      e.error = "\"prompt\" must be a string";
      return e;
    }
    e.prompt = j["prompt"].get<std::string>();
  } else {
    const json& m = j["messages"];
    if (!m.is_array() || m.empty()) {
      e.error = "\"messages\" must be a non-empty array";
      return e;
    }
    for (const json& msg : m) {
      if (!msg.is_object() || !msg.contains("role") || !msg.contains("content") || !msg["role"].is_string() ||
          !msg["content"].is_string()) {
        e.error = "each message needs string \"role\" and \"content\"";
        e.messages.clear();
        return e;
      }
      e.messages.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
    }
  }
  e.n_predict = number_field<int>(j, "n_predict", e);
  e.temperature = number_field<float>(j, "temperature", e);
  e.top_p = number_field<float>(j, "top_p", e);
  e.top_k = number_field<int>(j, "top_k", e);
  e.min_p = number_field<float>(j, "min_p", e);
  e.repeat_penalty = number_field<float>(j, "repeat_penalty", e);
  e.seed = number_field<int64_t>(j, "seed", e);
  if (!e.error.empty()) return e;
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      e.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const json& x : s) {
        if (!x.is_string()) {
          e.error = "\"stop\" must be a string or an array of strings";
          return e;
        }
        e.stop.push_back(x.get<std::string>());
      }
    } else {
      e.error = "\"stop\" must be a string or an array of strings";
      return e;
    }
  }
  if (e.n_predict && *e.n_predict < -1) e.error = "\"n_predict\" must be >= -1";
  if (e.temperature && !(*e.temperature >= 0)) e.error = "\"temperature\" must be >= 0";
  if (e.top_p && !(*e.top_p >= 0 && *e.top_p <= 1)) e.error = "\"top_p\" must be in [0, 1]";
  if (e.min_p && !(*e.min_p >= 0 && *e.min_p <= 1)) e.error = "\"min_p\" must be in [0, 1]";
  if (e.repeat_penalty && !(*e.repeat_penalty > 0)) e.error = "\"repeat_penalty\" must be positive";
  if (e.seed && *e.seed < 0) e.error = "\"seed\" must be >= 0";
  return e;
}

std::vector<BatchEntry> read_batch_input(const std::string& path, bool allow_extra_fields) {
  std::ifstream in(path, std::ios::binary);
  RUNLM_CHECK(in, "cannot open batch input %s", path.c_str());
  std::stringstream text;
  text << in.rdbuf();
  RUNLM_CHECK(!in.bad(), "cannot read batch input %s", path.c_str());
  return parse_batch_input(text.str(), path, allow_extra_fields);
}

std::vector<BatchEntry> parse_batch_input(const std::string& text, const std::string& path, bool allow_extra_fields) {
  std::istringstream in(text);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  if (!jsonl)
    for (const auto& l : lines) {
      const size_t k = l.find_first_not_of(" \t");
      if (k == std::string::npos) continue;
      jsonl = l[k] == '{';
      break;
    }
  std::vector<BatchEntry> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are not requests
    const int n = static_cast<int>(i) + 1;
    if (jsonl) {
      out.push_back(parse_batch_json_line(lines[i], n, allow_extra_fields));
    } else {
      BatchEntry e;
      e.line = n;
      e.prompt = lines[i];
      out.push_back(std::move(e));
    }
  }
  RUNLM_CHECK(!out.empty(), "batch input %s has no requests", path.c_str());
  return out;
}

}  // namespace runlm
