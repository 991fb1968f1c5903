// Faults `runlm batch` must survive, run as a user would: a failed
// write on the output is an error with exit code 1 that leaves only complete
// records behind, and Ctrl-C (SIGINT) stops the run with exit code 130 and an
// output of complete, valid JSONL records. (A full KV cache under batch is
// Batch.PreemptionWhenPagesRunOutChangesNoResult in test_batch.cpp.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

using namespace runlm::test;

namespace {

// n JSONL requests with ids 0..n-1; stories260K does not stop early on these.
void write_requests(const std::string& path, int n, int n_predict) {
  std::ofstream f(path);
  const char* starts[] = {"Once upon a time", "Tom had a big red ball.", "The cat sat on the mat and", "One day, Lily"};
  for (int i = 0; i < n; ++i)
    f << nlohmann::json{{"id", i}, {"prompt", starts[i % 4]}, {"n_predict", n_predict}}.dump() << "\n";
}

// Every line of `text` is one complete JSON record of a request: newline
// terminated, an object with a known id (increasing: input order), a text
// and a documented finish reason. Returns the records.
std::vector<nlohmann::json> complete_records(const std::string& text, int n_requests) {
  std::vector<nlohmann::json> recs;
  if (text.empty()) return recs;
  EXPECT_EQ(text.back(), '\n') << "the last record is cut:\n" << text.substr(text.size() > 300 ? text.size() - 300 : 0);
  const std::set<std::string> reasons = {"eos", "stop", "length", "context", "interrupted", "not_started"};
  int prev_id = -1;
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; start = nl + 1, nl = text.find('\n', start)) {
    const std::string line = text.substr(start, nl - start);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ADD_FAILURE() << "not a JSON record: " << line;
      continue;
    }
    EXPECT_TRUE(j.contains("id") && j["id"].is_number_integer()) << line;
    const int id = j.value("id", -1);
    EXPECT_TRUE(id > prev_id && id < n_requests) << "id " << id << " after " << prev_id << ": " << line;
    prev_id = id;
    EXPECT_TRUE(j.contains("text") && j["text"].is_string()) << line;
    EXPECT_TRUE(j.contains("tokens_out") && j["tokens_out"].is_number_unsigned()) << line;
    EXPECT_TRUE(reasons.count(j.value("finish_reason", ""))) << line;
    recs.push_back(j);
  }
  return recs;
}

}  // namespace

TEST(BatchFaults, WriteErrorOnTheOutputIsAnError) {
  struct stat st;
  if (stat("/dev/full", &st) != 0) GTEST_SKIP() << "no /dev/full on this system";
  TempPath in(".jsonl");
  write_requests(in.str(), 4, 8);
  const CommandResult r = run_command(runlm_binary() + " batch -m " + shared_model("stories260K.gguf") + " -f " +
                                      in.str() + " -o /dev/full -t 1 --temp 0");
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: cannot write to /dev/full: No space left on device"), std::string::npos) << r.err;
}

// A file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so the write fails
// with EFBIG instead of killing the process) stops the writes part of the
// way through a record: the file must still hold only complete records.
TEST(BatchFaults, WriteErrorMidRecordLeavesOnlyCompleteRecords) {
  TempPath in(".jsonl"), out(".jsonl");
  const int n = 60;
  write_requests(in.str(), n, 32);
  // ulimit -f counts 512-byte blocks in sh (dash), 1024 in bash: 4 or 8 KB,
  // against ~60 records of 150-300 bytes.
  const CommandResult r = run_command("trap '' XFSZ; ulimit -f 8 && " + runlm_binary() + " batch -m " +
                                      shared_model("stories260K.gguf") + " -f " + in.str() + " -o " + out.str() +
                                      " -t 1 --temp 0 -np 4");
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: cannot write to " + out.str() + ": File too large"), std::string::npos) << r.err;
  const std::string text = read_file(out.str());
  const auto recs = complete_records(text, n);
  EXPECT_GT(recs.size(), 0u);
  EXPECT_LT(recs.size(), static_cast<size_t>(n)) << "the limit never hit";
  EXPECT_NE(r.err.find("the file keeps its " + std::to_string(recs.size()) + " complete records"), std::string::npos)
      << r.err;
}

namespace {

// Starts a long batch run, sends `sig` once two records are out, and checks
// that the run stops with exit code 128 + sig, a summary counting every
// request, and one complete record per request: done, interrupted or
// not_started.
void stop_batch_with_signal(int sig) {
  TempPath in(".jsonl"), out(".jsonl"), err(".err");
  // ~256k tokens, tens of seconds on one thread: the SIGINT comes long
  // before the end.
  const int n = 1000;
  write_requests(in.str(), n, 256);
  const std::vector<std::string> argv = {runlm_binary(), "batch", "-m", shared_model("stories260K.gguf"), "-f",
                                         in.str(), "-o", out.str(), "-t", "1", "--temp", "0", "-np", "4"};
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int e = open(err.str().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(e, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  // The SIGINT handler is installed before the first record is written:
  // wait for two records, so the run is under way.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::string text;
  while (std::count(text.begin(), text.end(), '\n') < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    text = read_file(out.str());
  }
  kill(pid, sig);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 3000 && done == 0; ++i) {  // up to 60 s
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "batch did not stop after signal " << sig << "\n" << read_file(err.str());
  }
  const std::string msg = read_file(err.str());
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << "\n" << msg;
  EXPECT_EQ(WEXITSTATUS(status), 128 + sig) << msg;
  EXPECT_EQ(msg.find("error:"), std::string::npos) << msg;
  const auto recs = complete_records(read_file(out.str()), n);
  ASSERT_EQ(recs.size(), static_cast<size_t>(n)) << "every request gets a record";
  size_t finished = 0, interrupted = 0, not_started = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& j = recs[i];
    EXPECT_EQ(j["id"], static_cast<int>(i)) << "records in input order";
    if (j["finish_reason"] == "interrupted") ++interrupted;
    else if (j["finish_reason"] == "not_started") ++not_started;
    else ++finished;
    if (j["finish_reason"] == "length") {
      EXPECT_EQ(j["tokens_out"], 256) << j.dump();
    }
  }
  EXPECT_GE(finished, 2u);
  EXPECT_GT(not_started, 0u) << "the run ended before the signal";
  // The summary counts every request.
  EXPECT_NE(msg.find(runlm::strfmt("batch: %d requests: %zu done, 0 errors, %zu interrupted, %zu not started", n, finished,
                            interrupted, not_started)),
            std::string::npos)
      << msg;
}

}  // namespace

TEST(BatchFaults, SigintStopsTheRunWithARecordForEveryRequest) { stop_batch_with_signal(SIGINT); }

TEST(BatchFaults, SigtermStopsTheRunWithARecordForEveryRequest) { stop_batch_with_signal(SIGTERM); }
