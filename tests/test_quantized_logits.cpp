// Quantized copies of one random 110M-parameter model (stories110m shape)
// give logits close to the F32 model's. The same seed gives the same random
// weights, which make_random_model then encodes in each type.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_compare.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {

double relative_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

std::string make_model(const TempPath& out, const std::string& type) {
  const CommandResult r = run_command(std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset stories110m --seed 7 --threads 2" +
                                      " --tokenizer " + shared_model("llama2-tokenizer.model") + " --type " + type +
                                      " -o " + out.str());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return out.str();
}

}  // namespace

// Thresholds. make_random_model draws weights uniform in [-a, a]. A format
// with step q per block has an RMS rounding error of q / sqrt(12), against a
// weight RMS of a / sqrt(3): Q8_0 (q = a/127) gives 0.39% per weight, Q4_0
// (q = a/8) 6.3%, Q4_K (15 levels between a fitted min and max, q ~ 2a/15)
// 6.7% -- on uniform weights Q4_K has no edge over Q4_0; its fitted scales pay
// on bell-shaped real weights. Through 12 random layers the logits carry
// about 4x the per-weight error (measured: q8_0 1.6%, q4_k 24%, q4_0 26%):
// the random residual stream is chaotic, unlike a trained model's. The bounds
// are those measurements with ~1.5x margin; a wrong decode (a swapped nibble,
// a wrong scale) drives the error to ~100%, far past them.
TEST(QuantizedLogits, CloseToF32OnARandom110MModel) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  TempPath f32(".gguf"), q8(".gguf"), q4(".gguf"), q4k(".gguf");
  const std::vector<int> ids = {1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889};
  const auto ref = cpu_logits(make_model(f32, "f32"), ids);
  const double e_q8 = relative_error(cpu_logits(make_model(q8, "q8_0"), ids), ref);
  const double e_q4k = relative_error(cpu_logits(make_model(q4k, "q4_k"), ids), ref);
  const double e_q4 = relative_error(cpu_logits(make_model(q4, "q4_0"), ids), ref);
  std::printf("relative logit error vs f32: q8_0 %.4f, q4_k %.4f, q4_0 %.4f\n", e_q8, e_q4k, e_q4);
  EXPECT_LT(e_q8, 0.025);
  EXPECT_LT(e_q4k, 0.36);
  EXPECT_LT(e_q4, 0.40);
  EXPECT_LT(e_q8 * 8, e_q4k);  // 8 bits against 4: an order of magnitude apart
  EXPECT_LT(e_q8 * 8, e_q4);
}
