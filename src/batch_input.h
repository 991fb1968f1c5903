// Input of `runlm batch`: a text file with one prompt per line, or JSONL
// with one request object per line. A bad line becomes an entry with an
// error (reported in its own output record), never a failure of the run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "chat_template.h"

namespace runlm {

struct BatchEntry {
  int line = 0;                  // 1-based line in the input file
  std::string id;                // the request's "id" (JSON text); "" when it has none (or it is unreadable)
  std::string error;             // non-empty: the line could not be used
  std::string prompt;            // plain prompt ...
  std::vector<ChatMessage> messages;  // ... or a conversation for the chat template
  std::optional<int> n_predict;
  std::optional<float> temperature, top_p, min_p, repeat_penalty;
  std::optional<int> top_k;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  bool is_chat() const { return !messages.empty(); }
};

// Parses one JSONL line (fields: prompt | messages, n_predict, temperature,
// top_p, top_k, min_p, repeat_penalty, seed, stop (string or array), id).
// Any other field is an error naming it (a misspelt "n_predit" must not run
// with the default), unless allow_extra_fields.
BatchEntry parse_batch_json_line(const std::string& line, int line_number, bool allow_extra_fields = false);

// Reads the whole input. JSONL when the file name ends in .jsonl or its first
// non-blank line starts with '{'; otherwise each non-empty line is a prompt.
std::vector<BatchEntry> read_batch_input(const std::string& path, bool allow_extra_fields = false);

// The same on the file's contents; `path` decides .jsonl and names the file
// in errors. (The fuzz target tests/fuzz/fuzz_batch_input.cpp calls this.)
std::vector<BatchEntry> parse_batch_input(const std::string& text, const std::string& path,
                                          bool allow_extra_fields = false);

}  // namespace runlm
