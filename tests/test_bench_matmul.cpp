// runlm bench-matmul through the binary: its arguments fail cleanly, naming
// the flag; without CUDA it says so. The timing itself runs on a GPU.
#include <gtest/gtest.h>

#include "test_support.h"

using namespace runlm::test;

namespace {

void expect_clean_error(const CommandResult& r, const std::string& words) {
  EXPECT_EQ(r.signal, 0) << "crashed with signal " << r.signal << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(words), std::string::npos) << "expected '" << words << "' in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

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
    expect_clean_error(run_command(bench_matmul(std::string("--gemm-tokens ") + v)), "--gemm-tokens");
  }
  expect_clean_error(run_command(bench_matmul("--gemv-tokens 17")), "--gemv-tokens 17 unsupported");
  expect_clean_error(run_command(bench_matmul("--type q9")), "q9");
  expect_clean_error(run_command(bench_matmul("-o csv")), "-o csv");
}

#ifndef RUNLM_CUDA
TEST(BenchMatmul, SaysWhenBuiltWithoutCuda) {
  expect_clean_error(run_command(bench_matmul("")), "built without CUDA");
}
#endif
