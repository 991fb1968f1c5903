// Bad input through the command line: each case is a clear message on
// stderr and exit code 1, never a crash (no signal) and no partial output.
#include <gtest/gtest.h>

#include <fstream>

#include "test_support.h"

using namespace runlm::test;

namespace {

std::string generate_cmd(const std::string& model, const std::string& extra) {
  return runlm_binary() + " generate -m " + model + " -t 2 " + extra;
}

// Writes the first `n` bytes of `src` (or all, with `patch` applied) to a temp file.
void write_variant(const std::string& dst, const std::string& bytes) {
  std::ofstream f(dst, std::ios::binary);
  f << bytes;
}

}  // namespace

TEST(Cli, MissingModelFile) {
  expect_clean_error(run_command(generate_cmd("/nonexistent/model.gguf", "-p hi")), "/nonexistent/model.gguf");
}

TEST(Cli, BadMagic) {
  TempPath p(".gguf");
  std::string bytes = read_file(shared_model("stories260K.gguf"));
  bytes[0] = 'X';
  write_variant(p.str(), bytes);
  expect_clean_error(run_command(generate_cmd(p.str(), "-p hi")), "magic");
}

TEST(Cli, TruncatedGguf) {
  const std::string bytes = read_file(shared_model("stories260K.gguf"));
  for (size_t cut : {size_t{3}, size_t{100}, size_t{14000}, bytes.size() / 2, bytes.size() - 1}) {
    TempPath p(".gguf");
    write_variant(p.str(), bytes.substr(0, cut));
    const CommandResult r = run_command(generate_cmd(p.str(), "-p hi -n 4"));
    expect_clean_error(r, p.str());
  }
}

TEST(Cli, NotAGgufAtAll) {
  expect_clean_error(run_command(generate_cmd(shared_model("stories260K.bin"), "-p hi")), "magic");
}

TEST(Cli, BadFlagValues) {
  const std::string m = shared_model("stories260K.gguf");
  expect_clean_error(run_command(generate_cmd(m, "-n abc")), "-n");
  expect_clean_error(run_command(generate_cmd(m, "-n -5")), "-n");
  expect_clean_error(run_command(generate_cmd(m, "--temp -1")), "--temp");
  expect_clean_error(run_command(generate_cmd(m, "--top-p 2")), "--top-p");
  expect_clean_error(run_command(generate_cmd(m, "-c -3")), "-c");
  expect_clean_error(run_command(generate_cmd(m, "--device tpu")), "tpu");
  expect_clean_error(run_command(generate_cmd(m, "--swa banana")), "--swa");
  expect_clean_error(run_command(generate_cmd(m, "--no-such-flag")), "no-such-flag");
  expect_clean_error(run_command(runlm_binary() + " generate -p hi"), "-m");
  expect_clean_error(run_command(generate_cmd(m, "-f /nonexistent/prompt.txt")), "/nonexistent/prompt.txt");
}

TEST(Cli, PromptLongerThanContext) {
  const CommandResult r = run_command(
      generate_cmd(shared_model("stories260K.gguf"), "-c 8 -p 'Once upon a time there was a little girl named Lily'"));
  expect_clean_error(r, "context");
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, UnknownSubcommand) {
  const CommandResult r = run_command(runlm_binary() + " frobnicate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos);
}

// --verbose: the engine says which decode attention kernel it runs, once.
TEST(Cli, VerboseNamesTheDecodeKernel) {
  const std::string m = shared_model("stories260K.gguf");
  const CommandResult r = run_command(generate_cmd(m, "--device cpu --verbose -n 2 --temp 0 -p hi"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find("decode attention: cpu");
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("decode attention:", at + 1), std::string::npos) << "said more than once: " << r.err;
  const CommandResult quiet = run_command(generate_cmd(m, "--device cpu -n 2 --temp 0 -p hi"));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("decode attention:"), std::string::npos) << quiet.err;
}

TEST(Cli, HelpExitsZero) {
  const CommandResult r = run_command(runlm_binary() + " generate --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--top-p"), std::string::npos);
}
