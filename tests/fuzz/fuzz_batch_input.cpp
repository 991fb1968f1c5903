// libFuzzer target: the request file of `runlm batch` (parse_batch_input:
// text or JSONL detection, line splitting, parse_batch_json_line) and the
// JSONL records written for each entry (batch_error_record,
// batch_completion_record). A runlm::Error (no requests at all) is a correct
// rejection; any other exception, a crash, or a property below failing is a
// bug. Properties: a bad line becomes an entry with an error, never a
// failure of the whole file; a usable entry's values are in range; and every
// record is one line of valid JSON with a scalar id, whatever bytes the
// request (or the generated text) holds.
//
// Input: byte 0 bit 0 picks the file name (requests.jsonl: every line is
// JSON; prompts.txt: JSON only when the first line starts with '{'), the
// rest is the file.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "batch_input.h"
#include "batch_record.h"
#include "common.h"

using namespace runlm;

namespace {

[[noreturn]] void property_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_batch_input: %s: %s\n", what, detail.c_str());
  std::abort();
}

// One line of JSON, an object with an integer "line" and, when present, a
// string or number "id".
nlohmann::json check_record(const std::string& rec) {
  if (rec.find('\n') != std::string::npos) property_failed("record spans lines", rec);
  nlohmann::json j = nlohmann::json::parse(rec, nullptr, false);
  if (j.is_discarded() || !j.is_object()) property_failed("record is not a JSON object", rec);
  if (j.contains("id") && !(j["id"].is_string() || j["id"].is_number())) property_failed("bad id", rec);
  if (!j.contains("line") || !j["line"].is_number_integer()) property_failed("no line", rec);
  return j;
}

bool in_unit(float x) { return x >= 0 && x <= 1; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string path = (data[0] & 1) ? "fuzz/requests.jsonl" : "fuzz/prompts.txt";
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<BatchEntry> entries;
  try {
    entries = parse_batch_input(text, path);
  } catch (const Error&) {
    return 0;
  }
  int prev_line = 0;
  for (const BatchEntry& e : entries) {
    if (e.line <= prev_line) property_failed("line numbers not increasing", std::to_string(e.line));
    prev_line = e.line;
    if (e.error.empty()) {
      if (e.n_predict && *e.n_predict < -1) property_failed("n_predict", std::to_string(*e.n_predict));
      if (e.temperature && !(std::isfinite(*e.temperature) && *e.temperature >= 0)) property_failed("temperature", e.id);
      if (e.top_p && !in_unit(*e.top_p)) property_failed("top_p", e.id);
      if (e.min_p && !in_unit(*e.min_p)) property_failed("min_p", e.id);
      if (e.repeat_penalty && !(std::isfinite(*e.repeat_penalty) && *e.repeat_penalty > 0))
        property_failed("repeat_penalty", e.id);
      if (e.seed && *e.seed < 0) property_failed("seed", std::to_string(*e.seed));
    }
    const nlohmann::json err = check_record(batch_error_record(e, e.error.empty() ? "test error" : e.error));
    if (err["line"] != e.line) property_failed("error record line", std::to_string(e.line));
    // The id goes out as it came in, and only when there was one.
    if (e.id.empty() ? err.contains("id")
                     : err["id"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) != e.id)
      property_failed("id changed", e.id);
    // The generated text can be any bytes (a token boundary can split a
    // UTF-8 character): use the prompt and the raw input.
    Completion c;
    c.text = (e.is_chat() ? e.messages.back().content : e.prompt) + text.substr(0, 64);
    c.tokens.assign(3, 1);
    check_record(batch_completion_record(e, c));
  }
  return 0;
}
