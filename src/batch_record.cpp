#include "batch_record.h"

#include <nlohmann/json.hpp>

#include "generation.h"
#include "harmony_reply.h"

namespace runlm {

namespace {

using nlohmann::json;

// Invalid UTF-8 must not make dump() throw: an error message can quote the
// raw bytes of a bad line (nlohmann's parse errors do: "last read: '...'"),
// and a token-level cut can split a character of the generated text. Such
// bytes become U+FFFD, so every record is valid JSON (and UTF-8).
std::string dump_line(const json& rec) { return rec.dump(-1, ' ', false, json::error_handler_t::replace); }

// "id" (the dump of a scalar: batch_input.cpp refuses anything else) when
// the request has one, and "line" always.
json record_head(const BatchEntry& e) {
  json rec = json::object();
  if (!e.id.empty()) rec["id"] = json::parse(e.id, nullptr, false);
  rec["line"] = e.line;
  return rec;
}

}  // namespace

std::string batch_error_record(const BatchEntry& e, const std::string& error) {
  json rec = record_head(e);
  rec["error"] = error;
  return dump_line(rec);
}

std::string batch_completion_record(const BatchEntry& e, const Completion& c) {
  json rec = record_head(e);
  rec["text"] = c.text;
  // A harmony reply (gpt-oss) to a conversation: its answer alone too, as
  // llama.cpp's server gives it in "content".
  if (e.is_chat() && is_harmony_reply(c.text)) rec["content"] = harmony_final_text(c.text);
  rec["tokens_in"] = c.n_prompt;
  rec["tokens_out"] = c.tokens.size();
  rec["finish_reason"] = finish_reason_name(c.finish);
  rec["timings"] = {{"queue_ms", c.queue_seconds * 1e3}, {"total_ms", c.total_seconds * 1e3},
                    {"prompt_tokens_cached", c.n_prompt_cached}, {"preemptions", c.n_preemptions}};
  return dump_line(rec);
}

std::string batch_not_started_record(const BatchEntry& e) {
  json rec = record_head(e);
  rec["text"] = "";
  rec["tokens_out"] = 0u;
  rec["finish_reason"] = "not_started";
  return dump_line(rec);
}

}  // namespace runlm
