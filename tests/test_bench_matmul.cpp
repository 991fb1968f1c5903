// runlm bench-matmul through the binary: its arguments fail cleanly, naming
// the flag; without CUDA it says so. The timing itself runs on a GPU.
#include <gtest/gtest.h>

#include "test_support.h"

using namespace runlm::test;

namespace {

std::string bench_matmul(const std::string& args) { return runlm_binary() + " bench-matmul " + args; }

}  // namespace

TEST(BenchMatmul, HelpNamesTheOptions) {
  const CommandResult r = run_command(bench_matmul("--help"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* flag : {"--type", "--gemv-tokens", "--gemm-tokens", "--output"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST(BenchMatmul, BadArgumentsFailNamingThem) {
  for (const char* v : {"0", "x", "1,", "1,,2", "-4"}) {
    SCOPED_TRACE(v);
    expect_clean_error_no_output(run_command(bench_matmul(std::string("--gemm-tokens ") + v)), "--gemm-tokens");
  }
  expect_clean_error_no_output(run_command(bench_matmul("--gemv-tokens 17")), "--gemv-tokens 17 unsupported");
  expect_clean_error_no_output(run_command(bench_matmul("--type q9")), "q9");
  expect_clean_error_no_output(run_command(bench_matmul("-o csv")), "-o csv");
}

#ifndef RUNLM_CUDA
TEST(BenchMatmul, SaysWhenBuiltWithoutCuda) {
  expect_clean_error_no_output(run_command(bench_matmul("")), "built without CUDA");
}
#endif
