// Output records of `runlm batch`: one JSON object per line, for a completed
// request or for a line that could not be run. Kept apart from cmd_batch.cpp
// so the fuzz target (tests/fuzz/fuzz_batch_input.cpp) checks that whatever a
// request line holds still gives one valid JSON line.
#pragma once

#include <string>

#include "batch_input.h"
#include "scheduler.h"

namespace runlm {

// Every record has "line" (1-based, in the input) and "id" only when the
// request gave one that could be read: never a made-up id that could
// collide with another request's.

// {"id", "line", "error"}: why the line could not run.
std::string batch_error_record(const BatchEntry& e, const std::string& error);

// {"id", "line", "text", "tokens_in", "tokens_out", "finish_reason", "timings"},
// and "content" (the final answer) for a harmony reply to a conversation.
std::string batch_completion_record(const BatchEntry& e, const Completion& c);

// {"id", "line", "text": "", "tokens_out": 0, "finish_reason": "not_started"}:
// a request the run was stopped (Ctrl-C, SIGTERM) before it began.
std::string batch_not_started_record(const BatchEntry& e);

}  // namespace runlm
