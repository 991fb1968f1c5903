// Tests for src/quantize: llama.cpp's quantization mixes (per-tensor type
// choices written out here by hand from llama.cpp's rules, independently of
// the table in quantize.cpp), row-length fallbacks, and quantize_gguf's
// refusals (overwriting its input, re-quantizing without the flag). The
// type-by-type and byte-by-byte comparison with llama-quantize itself is
// tools/compare_quantize.py (it needs a llama.cpp build).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "cpu/quant.h"
#include "engine_compare.h"
#include "gguf.h"
#include "quantize.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::shared_model;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / (std::string("runlm_quantize_") + info->test_suite_name() + "_" +
                                         info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int call_cmd(int (*cmd)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return cmd(static_cast<int>(args.size()), argv.data());
}

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

DType type_of(const char* mix, const std::string& name, const std::vector<int64_t>& ne, const QuantModelInfo& m) {
  return choose_tensor_type(quant_target_from_name(mix), name, ne, m).type;
}

std::string blk(int i, const char* what) { return strfmt("blk.%d.%s.weight", i, what); }

// A small random f32 llama (GQA 4, rows of whole 256-element blocks) in dir.
std::string random_f32_model(const TempDir& dir) {
  const std::string path = dir / "f32.gguf";
  const std::string cmd = std::string(RUNLM_RANDOM_MODEL_BINARY) + " --preset tiny --type f32 --dim 256 --heads 4 " +
                          "--kv-heads 1 --layers 2 --hidden 512 --ctx 64 --tokenizer " +
                          shared_model("stories260K-tok512.model") + " -o " + path + " > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return path;
}

}  // namespace

// A 32-layer llama-7B-like model without GQA. use_more_bits(i, 32): i < 4,
// i >= 28 or (i - 4) % 3 == 2, so of layers 0, 1, 2, 5: 0, 1, 2. n/16 = 2,
// n/8 = 4.
TEST(QuantizeMix, PerTensorTypesLikeLlamaCpp) {
  QuantModelInfo m;
  m.n_layers = 32;
  m.n_head = m.n_head_kv = 32;
  const std::vector<int64_t> sq = {4096, 4096}, up = {4096, 11008}, down = {11008, 4096}, emb = {4096, 32000};
  struct Row {
    const char* mix;
    DType tok, out, q, v0, v1, v2, v5, attn_out, ffn_up, d0, d1, d3, d5;
  };
  using D = DType;
  const Row rows[] = {
      //  mix       tok      out      q        v0       v1       v2       v5       attn_out ffn_up   d0      d1      d3      d5
      {"q2_k", D::Q2_K, D::Q6_K, D::Q2_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q2_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K},
      {"q3_k_s", D::Q3_K, D::Q6_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K, D::Q3_K},
      {"q3_k_m", D::Q3_K, D::Q6_K, D::Q3_K, D::Q5_K, D::Q5_K, D::Q4_K, D::Q4_K, D::Q4_K, D::Q3_K, D::Q5_K, D::Q5_K, D::Q4_K, D::Q4_K},
      {"q3_k_l", D::Q3_K, D::Q6_K, D::Q3_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q3_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K},
      {"q4_k_s", D::Q4_K, D::Q6_K, D::Q4_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q4_K, D::Q4_K, D::Q4_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q4_K},
      {"q4_k_m", D::Q4_K, D::Q6_K, D::Q4_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q4_K, D::Q4_K, D::Q4_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q4_K},
      {"q5_k_s", D::Q5_K, D::Q6_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q5_K},
      {"q5_k_m", D::Q5_K, D::Q6_K, D::Q5_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q5_K, D::Q5_K, D::Q5_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q5_K},
      {"q6_k", D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K, D::Q6_K},
      {"q8_0", D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0},
      {"q4_0", D::Q4_0, D::Q6_K, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0, D::Q4_0},
      {"q4_1", D::Q4_1, D::Q6_K, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1, D::Q4_1},
      {"q5_0", D::Q5_0, D::Q6_K, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0, D::Q5_0},
      {"q5_1", D::Q5_1, D::Q6_K, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1, D::Q5_1},
      {"iq4_nl", D::IQ4_NL, D::Q6_K, D::IQ4_NL, D::IQ4_NL, D::IQ4_NL, D::IQ4_NL, D::IQ4_NL, D::IQ4_NL, D::IQ4_NL, D::Q5_K, D::Q5_K, D::Q5_K, D::IQ4_NL},
      {"iq4_xs", D::IQ4_XS, D::Q6_K, D::IQ4_XS, D::IQ4_XS, D::IQ4_XS, D::IQ4_XS, D::IQ4_XS, D::IQ4_XS, D::IQ4_XS, D::Q5_K, D::Q5_K, D::Q5_K, D::IQ4_XS},
      // Dense model: no expert tensors, so everything is Q8_0 (llama.cpp's rule).
      {"mxfp4_moe", D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0, D::Q8_0},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(r.mix);
    EXPECT_EQ(type_of(r.mix, "token_embd.weight", emb, m), r.tok);
    EXPECT_EQ(type_of(r.mix, "output.weight", emb, m), r.out);
    EXPECT_EQ(type_of(r.mix, blk(3, "attn_q"), sq, m), r.q);
    EXPECT_EQ(type_of(r.mix, blk(3, "attn_k"), sq, m), r.q);
    EXPECT_EQ(type_of(r.mix, blk(0, "attn_v"), sq, m), r.v0);
    EXPECT_EQ(type_of(r.mix, blk(1, "attn_v"), sq, m), r.v1);
    EXPECT_EQ(type_of(r.mix, blk(2, "attn_v"), sq, m), r.v2);
    EXPECT_EQ(type_of(r.mix, blk(5, "attn_v"), sq, m), r.v5);
    EXPECT_EQ(type_of(r.mix, blk(5, "attn_output"), sq, m), r.attn_out);
    EXPECT_EQ(type_of(r.mix, blk(5, "ffn_up"), up, m), r.ffn_up);
    EXPECT_EQ(type_of(r.mix, blk(5, "ffn_gate"), up, m), r.ffn_up);
    EXPECT_EQ(type_of(r.mix, blk(0, "ffn_down"), down, m), r.d0);
    EXPECT_EQ(type_of(r.mix, blk(1, "ffn_down"), down, m), r.d1);
    EXPECT_EQ(type_of(r.mix, blk(3, "ffn_down"), down, m), r.d3);
    EXPECT_EQ(type_of(r.mix, blk(5, "ffn_down"), down, m), r.d5);
    // Norms are never quantized; the GGUF's own type is kept.
    const TensorTypeChoice norm = choose_tensor_type(quant_target_from_name(r.mix), blk(0, "attn_norm"), {4096}, m);
    EXPECT_FALSE(norm.quantized);
    EXPECT_FALSE(choose_tensor_type(quant_target_from_name(r.mix), blk(0, "ffn_norm"), {4096, 1}, m).quantized);
  }
  // llama.cpp's file types in general.file_type, and its aliases.
  const std::map<std::string, uint32_t> ftypes = {
      {"q4_0", 2},    {"q4_1", 3},    {"q8_0", 7},    {"q5_0", 8},    {"q5_1", 9},   {"q2_k", 10}, {"q3_k_s", 11},
      {"q3_k_m", 12}, {"q3_k_l", 13}, {"q4_k_s", 14}, {"q4_k_m", 15}, {"q5_k_s", 16}, {"q5_k_m", 17}, {"q6_k", 18},
      {"iq4_nl", 25}, {"iq4_xs", 30}, {"mxfp4_moe", 38}, {"f16", 1}, {"bf16", 32}, {"f32", 0}};
  for (const auto& [name, ftype] : ftypes) EXPECT_EQ(quant_target_from_name(name).ftype, ftype) << name;
  EXPECT_STREQ(quant_target_from_name("Q4_K").name, "q4_k_m");
  EXPECT_STREQ(quant_target_from_name("q3_k").name, "q3_k_m");
  EXPECT_STREQ(quant_target_from_name("Q5_K").name, "q5_k_m");
  const std::string err = error_text([] { quant_target_from_name("iq2_xxs"); });
  EXPECT_NE(err.find("iq2_xxs"), std::string::npos) << err;
  EXPECT_NE(err.find("q3_k_m"), std::string::npos) << err;
}

// The rules that look at the model: GQA (n_head / n_head_kv >= 4), the 70B
// attn_v bump, 8 experts, MXFP4 for expert tensors, tied embeddings, --pure.
TEST(QuantizeMix, ModelDependentRules) {
  QuantModelInfo gqa;
  gqa.n_layers = 32;
  gqa.n_head = 32;
  gqa.n_head_kv = 8;
  const std::vector<int64_t> v = {4096, 1024};
  EXPECT_EQ(type_of("q2_k", blk(9, "attn_v"), v, gqa), DType::Q4_K);
  EXPECT_EQ(type_of("iq4_nl", blk(9, "attn_v"), v, gqa), DType::Q5_K);
  EXPECT_EQ(type_of("iq4_xs", blk(9, "attn_v"), v, gqa), DType::Q5_K);
  EXPECT_EQ(type_of("q3_k_s", blk(9, "attn_v"), v, gqa), DType::Q3_K);

  QuantModelInfo l70 = gqa;
  l70.n_layers = 80;
  l70.is_70b = true;
  EXPECT_EQ(type_of("q3_k_s", blk(40, "attn_v"), {8192, 1024}, l70), DType::Q5_K);
  EXPECT_EQ(type_of("q4_k_s", blk(40, "attn_v"), {8192, 1024}, l70), DType::Q5_K);
  EXPECT_EQ(type_of("q4_k_m", blk(40, "attn_v"), {8192, 1024}, l70), DType::Q5_K);  // 40: not more bits
  EXPECT_EQ(type_of("q4_k_m", blk(0, "attn_v"), {8192, 1024}, l70), DType::Q6_K);
  EXPECT_EQ(type_of("q3_k_s", blk(40, "attn_q"), {8192, 8192}, l70), DType::Q3_K);

  QuantModelInfo moe = gqa;
  moe.n_expert = 8;
  EXPECT_EQ(type_of("q4_k_m", blk(3, "attn_v"), v, moe), DType::Q8_0);
  EXPECT_EQ(type_of("q4_k_m", blk(3, "attn_k"), v, moe), DType::Q8_0);
  EXPECT_EQ(type_of("q4_k_m", blk(3, "attn_output"), {4096, 4096}, moe), DType::Q5_K);
  EXPECT_EQ(type_of("q5_k_m", blk(3, "attn_output"), {4096, 4096}, moe), DType::Q5_K);  // base
  EXPECT_EQ(type_of("mxfp4_moe", blk(3, "ffn_up_exps"), {4096, 14336, 8}, moe), DType::MXFP4);
  EXPECT_EQ(type_of("mxfp4_moe", blk(3, "ffn_down_exps"), {14336, 4096, 8}, moe), DType::MXFP4);
  EXPECT_EQ(type_of("mxfp4_moe", blk(3, "attn_q"), {4096, 4096}, moe), DType::Q8_0);
  EXPECT_EQ(type_of("mxfp4_moe", "output.weight", {4096, 32000}, moe), DType::Q8_0);
  EXPECT_FALSE(choose_tensor_type(quant_target_from_name("q4_k_m"), blk(3, "ffn_gate_inp"), {4096, 8}, moe).quantized);

  QuantModelInfo tied = gqa;
  tied.has_output = false;
  EXPECT_EQ(type_of("q4_0", "token_embd.weight", {4096, 32000}, tied), DType::Q6_K);
  EXPECT_EQ(type_of("q4_0", "token_embd.weight", {4096, 32000}, gqa), DType::Q4_0);

  const QuantTarget& q4km = quant_target_from_name("q4_k_m");
  EXPECT_EQ(choose_tensor_type(q4km, "output.weight", {4096, 32000}, gqa, true).type, DType::Q4_K);
  EXPECT_EQ(choose_tensor_type(q4km, blk(0, "attn_v"), v, gqa, true).type, DType::Q4_K);
}

// A row that is not a whole number of blocks: llama.cpp's
// tensor_type_fallback, then F16 when even the fallback does not fit.
TEST(QuantizeMix, RowFallbacksLikeLlamaCpp) {
  QuantModelInfo m;
  m.n_layers = 32;
  const std::vector<int64_t> odd = {4096 + 32, 64}, odd16 = {4096 + 16, 64};
  EXPECT_EQ(type_of("q2_k", blk(5, "attn_q"), odd, m), DType::Q4_0);
  EXPECT_EQ(type_of("q3_k_s", blk(5, "attn_q"), odd, m), DType::Q4_0);
  EXPECT_EQ(type_of("q4_k_s", blk(5, "attn_q"), odd, m), DType::Q5_0);
  EXPECT_EQ(type_of("q5_k_s", blk(5, "attn_q"), odd, m), DType::Q5_1);
  EXPECT_EQ(type_of("q6_k", blk(5, "attn_q"), odd, m), DType::Q8_0);
  EXPECT_EQ(type_of("iq4_xs", blk(5, "attn_q"), odd, m), DType::IQ4_NL);
  for (const char* mix : {"q2_k", "q4_k_m", "q6_k", "q4_0", "iq4_nl", "iq4_xs", "q8_0"})
    EXPECT_EQ(type_of(mix, blk(5, "attn_q"), odd16, m), DType::F16) << mix;
  // The output rule itself picks Q8_0 when the base type's block does not fit.
  const TensorTypeChoice out = choose_tensor_type(quant_target_from_name("q4_k_m"), "output.weight", odd, m);
  EXPECT_EQ(out.type, DType::Q8_0);
  EXPECT_TRUE(out.note.empty());
  const TensorTypeChoice fb = choose_tensor_type(quant_target_from_name("q4_k_m"), blk(5, "attn_q"), odd, m);
  EXPECT_EQ(fb.wanted, DType::Q4_K);
  EXPECT_NE(fb.note.find("blk.5.attn_q.weight"), std::string::npos) << fb.note;
  EXPECT_NE(fb.note.find("q5_0"), std::string::npos) << fb.note;
}

// `runlm quantize a.gguf a.gguf TYPE` (or to a link to a.gguf) is an error,
// and a.gguf is left as it was.
TEST(QuantizeGguf, RefusesToOverwriteItsInput) {
  TempDir dir;
  const std::string a = dir / "a.gguf";
  fs::copy_file(shared_model("stories260K.gguf"), a);
  const std::string before = read_bytes(a);
  fs::create_symlink(a, dir / "sym.gguf");
  fs::create_hard_link(a, dir / "hard.gguf");
  for (const std::string& out : {a, dir / "sym.gguf", dir / "hard.gguf", dir / "./a.gguf"}) {
    const std::string err = error_text([&] { quantize_gguf(a, out, "q8_0"); });
    EXPECT_NE(err.find("is the input file"), std::string::npos) << out << ": " << err;
  }
  EXPECT_THROW(call_cmd(cmd_quantize, {"runlm quantize", a, a, "q4_0"}), Error);
  EXPECT_EQ(read_bytes(a), before);
}

// A quantized tensor is only re-encoded with --allow-requantize; tensors
// that keep their type are copied either way.
TEST(QuantizeGguf, RequantizingNeedsTheFlag) {
  TempDir dir;
  const std::string q8 = dir / "q8.gguf", q4 = dir / "q4.gguf";
  testing::internal::CaptureStderr();
  quantize_gguf(shared_model("stories260K.gguf"), q8, "q8_0");
  const std::string err = error_text([&] { quantize_gguf(q8, q4, "q4_0"); });
  EXPECT_NE(err.find("--allow-requantize"), std::string::npos) << err;
  EXPECT_NE(err.find("q8_0"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(q4));  // refused before writing anything
  EXPECT_THROW(call_cmd(cmd_quantize, {"runlm quantize", q8, q4, "q4_0"}), Error);
  EXPECT_EQ(call_cmd(cmd_quantize, {"runlm quantize", q8, q4, "q4_0", "--allow-requantize"}), 0);
  testing::internal::GetCapturedStderr();
  auto g = GgufFile::open(q4);
  EXPECT_EQ(g->find_tensor("blk.0.attn_q.weight")->type, DType::Q4_0);
}

// Every mix on a model whose rows are whole k-quant blocks: the file opens,
// each tensor has the type choose_tensor_type names, and decodes close to
// the source (relative RMS error within a bound per type: the round-trip
// bounds of test_quant.cpp's ErrorWithinFormatStepSize for normal data,
// loosened to 0.4 for the coarsest, Q2_K).
TEST(QuantizeGguf, EveryMixWritesItsTypes) {
  TempDir dir;
  const std::string src = random_f32_model(dir);
  auto ref = GgufFile::open(src);
  const QuantModelInfo info = quant_model_info(*ref);
  EXPECT_EQ(info.n_gqa(), 4);
  for (const char* mix : {"q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m", "q6_k",
                          "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "iq4_xs", "mxfp4_moe"}) {
    SCOPED_TRACE(mix);
    const std::string out = dir / (std::string(mix) + ".gguf");
    testing::internal::CaptureStderr();
    const QuantizeReport rep = quantize_gguf(src, out, mix);
    testing::internal::GetCapturedStderr();
    EXPECT_TRUE(rep.fallbacks.empty());
    auto g = GgufFile::open(out);
    EXPECT_EQ(g->get_int("general.file_type"), static_cast<int64_t>(quant_target_from_name(mix).ftype));
    for (const GgufTensorInfo& t : g->tensors()) {
      const GgufTensorInfo* rt = ref->find_tensor(t.name);
      ASSERT_TRUE(rt);
      const TensorTypeChoice c = choose_tensor_type(quant_target_from_name(mix), t.name, t.ne, info);
      ASSERT_EQ(t.type, c.quantized ? c.type : rt->type) << t.name;
      const int64_t n = t.n_elements();
      std::vector<float> got(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      dequantize_row(t.type, g->tensor_data(t), got.data(), n);
      dequantize_row(rt->type, ref->tensor_data(*rt), want.data(), n);
      double e2 = 0, r2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        e2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
        r2 += static_cast<double>(want[i]) * want[i];
      }
      const double bound = t.type == DType::Q2_K ? 0.4 : t.type == DType::Q3_K ? 0.2 : t.type == DType::MXFP4 ? 0.15 : 0.1;
      EXPECT_LT(std::sqrt(e2 / r2), bound) << t.name << " " << dtype_name(t.type);
    }
  }
}

// A quantized file and its f32 re-encoding (`runlm quantize Q.gguf D.gguf f32
// --allow-requantize`) give bit-equal CPU logits, in every mix: the CPU
// engine multiplies the decoded weights in f32, so D holds exactly the
// function runlm computes from Q. This is what makes D the yardstick for a
// perplexity gap between runlm and llama.cpp on Q: where the two programs
// agree on D but not on Q, the gap is llama.cpp rounding its activations in
// quantized dot products (tools/compare_quantize.py --decoded measures both).
TEST(QuantizeGguf, DequantizedFileGivesTheSameLogits) {
  TempDir dir;
  const std::string src = random_f32_model(dir);
  const std::vector<int> ids = {1, 37, 402, 11, 250, 3, 97, 480};
  const std::vector<float> f32_logits = runlm::test::cpu_logits(src, ids);
  QuantizeOptions requantize;
  requantize.allow_requantize = true;
  for (const char* mix : {"q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                          "iq4_nl", "iq4_xs"}) {
    SCOPED_TRACE(mix);
    const std::string q = dir / (std::string(mix) + ".gguf"), d = dir / (std::string(mix) + "-f32.gguf");
    testing::internal::CaptureStderr();
    quantize_gguf(src, q, mix);
    quantize_gguf(q, d, "f32", requantize);
    testing::internal::GetCapturedStderr();
    auto gq = GgufFile::open(q);
    auto gd = GgufFile::open(d);
    int n_quantized = 0;
    for (const GgufTensorInfo& t : gd->tensors()) {
      EXPECT_EQ(t.type, DType::F32) << t.name;
      n_quantized += dtype_info(gq->find_tensor(t.name)->type).block_size > 1;
    }
    EXPECT_GT(n_quantized, 0);  // the mix did quantize, so D's weights are decoded ones
    const std::vector<float> lq = runlm::test::cpu_logits(q, ids), ld = runlm::test::cpu_logits(d, ids);
    ASSERT_EQ(lq.size(), ld.size());
    size_t n_diff = 0;
    for (size_t i = 0; i < lq.size(); ++i) n_diff += std::memcmp(&lq[i], &ld[i], sizeof(float)) != 0;
    EXPECT_EQ(n_diff, 0u) << "of " << lq.size() << " logits";
    EXPECT_NE(lq, f32_logits);  // and quantizing did change the function
  }
}
