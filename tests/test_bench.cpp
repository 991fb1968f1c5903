// runlm bench through the binary on stories260K on the CPU: the pp/tg
// table's JSON, and -npl (parallel sequences, llama-batched-bench style):
// the rows, their token counts, the JSON, and bad values that must fail
// cleanly.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_support.h"

using namespace runlm::test;

namespace {

std::string bench_cmd(const std::string& extra) {
  return runlm_binary() + " bench -m " + shared_model("stories260K.gguf") + " --device cpu -t 2 " + extra;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

TEST(BenchParallel, JsonRows) {
  const CommandResult r = run_command(bench_cmd("-npl 1,4 -npp 16 -ntg 8 -o json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  const int pls[] = {1, 4};
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    const int pl = pls[i];
    EXPECT_EQ(j["pl"], pl);
    EXPECT_EQ(j["pp"], 16);
    EXPECT_EQ(j["tg"], 8);
    EXPECT_EQ(j["n_kv"], pl * (16 + 8));
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_EQ(j["decode_kernel"], "cpu");  // the decode attention that ran
    EXPECT_EQ(j["kv"], "paged");
    EXPECT_FALSE(j["model"].get<std::string>().empty());
    EXPECT_FALSE(j["type"].get<std::string>().empty());
    const double t_pp = j["t_pp"], t_tg = j["t_tg"], t = j["t"];
    EXPECT_GT(t_pp, 0);
    EXPECT_GT(t_tg, 0);
    EXPECT_NEAR(t, t_pp + t_tg, 1e-9);
    EXPECT_NEAR(j["speed_pp"].get<double>(), pl * 16 / t_pp, 1e-6 * pl * 16 / t_pp);
    EXPECT_NEAR(j["speed_tg"].get<double>(), pl * 8 / t_tg, 1e-6 * pl * 8 / t_tg);
    EXPECT_NEAR(j["speed"].get<double>(), pl * 24 / t, 1e-6 * pl * 24 / t);
    EXPECT_GE(j["n_kv_max"].get<int>(), pl * 24);
    EXPECT_GT(j["load_s"].get<double>(), 0);
    EXPECT_EQ(j["device_mem_bytes"], 0);  // host memory: no device to report
  }
  EXPECT_NE(r.err.find("bench: model loaded and engine ready in "), std::string::npos) << r.err;
}

// The pp/tg table's JSON: one row per test, each with its speed, the share
// of copy bandwidth of decode, and the load time.
TEST(Bench, JsonRowsCarryTheLoadTime) {
  const CommandResult r = run_command(bench_cmd("-p 8 -n 4 -r 1 -o json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  const char* tests[] = {"pp8", "tg4"};
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(j["test"], tests[i]);
    EXPECT_EQ(j["backend"], "cpu");
    EXPECT_GT(j["tps_mean"].get<double>(), 0);
    EXPECT_GT(j["load_s"].get<double>(), 0);
    EXPECT_EQ(j["device_mem_bytes"], 0);
  }
  EXPECT_GT(nlohmann::json::parse(lines[1])["bytes_per_s"].get<double>(), 0);
  EXPECT_NE(r.err.find("bench: model loaded and engine ready in "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("device memory"), std::string::npos) << r.err;
}

TEST(BenchParallel, MarkdownRows) {
  const CommandResult r = run_command(bench_cmd("-npl 1,4 -npp 16 -ntg 8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;  // header, separator, two rows
  EXPECT_NE(lines[0].find("| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |"),
            std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("| backend | attn | decode kernel | type_k |"), std::string::npos) << lines[0];
  EXPECT_NE(lines[2].find("| cpu | cpu | cpu | f32 | f32 | 16 | 8 | 1 | 24 |"), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("| cpu | cpu | cpu | f32 | f32 | 16 | 8 | 4 | 96 |"), std::string::npos) << lines[3];
}

TEST(BenchParallel, BadValues) {
  for (const char* v : {"0", "-3", "abc", "1,0", "4,x", "1,,4", ","}) {
    SCOPED_TRACE(v);
    expect_clean_error_no_output(run_command(bench_cmd(std::string("-npl ") + v + " -npp 16 -ntg 8")), "-npl");
  }
  expect_clean_error_no_output(run_command(bench_cmd("-npl 2 -npp 0 -ntg 8")), "-npp");
  expect_clean_error_no_output(run_command(bench_cmd("-npl 2 -npp 16 -ntg -1")), "-ntg");
  expect_clean_error_no_output(run_command(bench_cmd("-npl 2 -p 16")), "-p");
  expect_clean_error_no_output(run_command(bench_cmd("-npp 16")), "-npl");
  expect_clean_error_no_output(run_command(bench_cmd("-npl 2 --kv contiguous")), "paged");
}

TEST(BenchParallel, KvDoesNotFit) {
  // -c is per sequence: 16 + 8 tokens need 25 positions.
  expect_clean_error_no_output(run_command(bench_cmd("-npl 1,4 -npp 16 -ntg 8 -c 20")), "-c is 20");
  // 1 MiB of f32 KV holds about 50 pages of stories260K; 64 x 2 pages do not fit.
  expect_clean_error_no_output(run_command(bench_cmd("-npl 1,64 -npp 16 -ntg 8 --kv-mem 1")), "-npl 64");
}
