// runlm bench-decode through the binary: its arguments fail cleanly, naming
// the flag; without CUDA (or a device) it says so. The timing itself runs on
// a GPU (tools/gpu-check.sh).
#include <gtest/gtest.h>

#include "test_support.h"

using namespace runlm::test;

namespace {

std::string bench_decode(const std::string& args) { return runlm_binary() + " bench-decode " + args; }

}  // namespace

TEST(BenchDecode, HelpNamesTheOptions) {
  const CommandResult r = run_command(bench_decode("--help"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* flag : {"--kv", "--points", "--heads", "--hdim", "--block-size", "--kernel", "--output"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST(BenchDecode, BadArgumentsFailNamingThem) {
  for (const char* p : {"64by8192", "64x", "x8192", "0x8192", "64x8192,", "64x8192x2"}) {
    SCOPED_TRACE(p);
    expect_clean_error_no_output(run_command(bench_decode(std::string("--points ") + p)), "--points");
  }
  expect_clean_error_no_output(run_command(bench_decode("--kv f32")), "--kv f32 unsupported");
  expect_clean_error_no_output(run_command(bench_decode("--kv q9_9")), "q9_9");
  expect_clean_error_no_output(run_command(bench_decode("--heads 32/5")), "--heads");
  expect_clean_error_no_output(run_command(bench_decode("--block-size 12")), "--block-size 12");
  expect_clean_error_no_output(run_command(bench_decode("--points 1x100")), "not a multiple of --block-size");
  expect_clean_error_no_output(run_command(bench_decode("-o csv")), "-o csv");
}

#ifndef RUNLM_CUDA
TEST(BenchDecode, SaysWhenBuiltWithoutCuda) {
  expect_clean_error_no_output(run_command(bench_decode("")), "built without CUDA");
}
#else
TEST(BenchDecode, UnknownKernelNamesTheChoices) {
  expect_clean_error_no_output(run_command(bench_decode("--kernel v12")), "supported: auto, simt");
}
#endif
