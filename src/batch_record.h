// Output records of `runlm batch`: one JSON object per line, for a completed
// request or for a line that could not be run. Kept apart from cmd_batch.cpp
// so the fuzz target (tests/fuzz/fuzz_batch_input.cpp) checks that whatever a
// request line holds still gives one valid JSON line.
#pragma once

#include <string>

#include "batch_input.h"
#include "scheduler.h"

namespace runlm {

// {"id", "line", "error"}: the line's id (or line number) and why it failed.
std::string batch_error_record(const BatchEntry& e, const std::string& error);

// {"id", "text", "tokens_in", "tokens_out", "finish_reason", "timings"}.
std::string batch_completion_record(const BatchEntry& e, const Completion& c);

}  // namespace runlm
