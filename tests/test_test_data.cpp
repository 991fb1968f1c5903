// How tests find their data: the embedded stories260K in the repository,
// larger assets under $RUNLM_TEST_DATA (default ../shared), and a missing
// asset that skips the test, or fails it when CI=true.
#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

using namespace runlm::test;

namespace {

// Run only as a child of the tests below (disabled in ordinary runs): it
// needs an asset that RUNLM_TEST_DATA, set by the parent, does not hold.
TEST(TestDataProbe, DISABLED_NeedsMissingAsset) {
  RUNLM_REQUIRE_ASSET(test_asset("models/no-such-model.gguf"));
  SUCCEED();
}

// The probe run in a child process with the test data pointed at an empty
// folder; `ci` sets or clears CI.
CommandResult run_probe(bool ci) {
  TempPath empty(".d");
  // The child runs the probe alone: a sharded parent's GTEST_* settings stay out.
  const std::string env = std::string("-u GTEST_TOTAL_SHARDS -u GTEST_SHARD_INDEX -u GTEST_FILTER ") +
                          (ci ? "CI=true" : "-u CI") + " RUNLM_TEST_DATA=" + empty.str();
  return run_command("env " + env + " /proc/" + std::to_string(getpid()) +
                     "/exe --gtest_also_run_disabled_tests --gtest_filter=TestDataProbe.DISABLED_NeedsMissingAsset");
}

}  // namespace

TEST(TestData, EmbeddedModelIsInTheRepository) {
  EXPECT_EQ(missing_asset(shared_model("stories260K.gguf")), "");
  EXPECT_NE(shared_model("stories260K.gguf").find("/models/stories260K/"), std::string::npos);
  EXPECT_NE(shared_model("sotu29m/config.json").find(test_data_root()), std::string::npos);
}

TEST(TestData, MissingAssetSkipsOutsideCi) {
  const CommandResult r = run_probe(false);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  SKIPPED ]"), std::string::npos) << r.out;
  expect_words(r.out, {"missing test asset", "no-such-model.gguf", "RUNLM_TEST_DATA"});
}

TEST(TestData, MissingAssetFailsUnderCi) {
  const CommandResult r = run_probe(true);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  FAILED  ]"), std::string::npos) << r.out;
  expect_words(r.out, {"missing test asset", "no-such-model.gguf"});
}
