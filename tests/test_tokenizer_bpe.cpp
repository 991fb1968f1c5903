// Byte-level BPE tokenizer tests: llama.cpp's tokenizer vectors (test-tokenizer-0:
// no BOS, special tokens not parsed) for every vocabulary in ../shared/vocab and
// the Llama-2 SentencePiece one, decode round trips, special tokens with protected
// (literal) ranges, end-of-generation tokens, and bad tokenizer metadata.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "bpe_pretokenizer.h"
#include "common.h"
#include "gguf.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using runlm::test::error_of;
using runlm::test::test_asset;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<int> ids;
};

// test-tokenizer-0's reader: cases separated by "\n__ggml_vocab_test__\n", the
// text after the last separator is a case too when non-empty... as there, it is
// whatever follows (empty for these files, and then .out has no line for it).
std::vector<Case> read_cases(const std::string& gguf) {
  const std::string inp = slurp(gguf + ".inp");
  const std::string out = slurp(gguf + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::vector<int>> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::vector<int> ids;
    std::istringstream ls(line);
    for (int id; ls >> id;) ids.push_back(id);
    lines.push_back(ids);
  }
  EXPECT_EQ(texts.size(), lines.size()) << gguf;
  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) cases.push_back({texts[i], lines[i]});
  EXPECT_GT(cases.size(), 30u) << gguf;
  return cases;
}

std::string show(const std::string& s) {
  std::string o;
  for (unsigned char c : s) o += (c < 0x20 || c == 0x7f) ? strfmt("\\x%02x", c) : std::string(1, static_cast<char>(c));
  return o;
}

void expect_vectors(const std::string& gguf_path, bool round_trip) {
  auto g = GgufFile::open(gguf_path);
  auto tok = Tokenizer::from_gguf(*g);
  int n = 0;
  for (const Case& c : read_cases(gguf_path)) {
    EXPECT_EQ(tok->encode(c.text, /*add_bos=*/false, /*parse_special=*/false), c.ids)
        << gguf_path << " text: '" << show(c.text) << "'";
    if (round_trip) EXPECT_EQ(tok->decode(c.ids), c.text) << gguf_path << " text: '" << show(c.text) << "'";
    ++n;
  }
  EXPECT_GT(n, 30);
}

}  // namespace

// Llama 3: llama-bpe pre-tokenizer (clean_spaces on, so no exact round trip).
TEST(TokenizerBpeVectors, LlamaBpe) {
  const std::string p = test_asset("vocab/ggml-vocab-llama-bpe.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, false);
}

TEST(TokenizerBpeVectors, Qwen2) {
  const std::string p = test_asset("vocab/ggml-vocab-qwen2.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, true);
}

TEST(TokenizerBpeVectors, Qwen35) {
  const std::string p = test_asset("vocab/ggml-vocab-qwen35.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, true);
}

TEST(TokenizerBpeVectors, Gpt2) {
  const std::string p = test_asset("vocab/ggml-vocab-gpt-2.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, false);
}

TEST(TokenizerBpeVectors, DeepseekLlm) {
  const std::string p = test_asset("vocab/ggml-vocab-deepseek-llm.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, true);
}

TEST(TokenizerSpmVectors, Phi3) {
  const std::string p = test_asset("vocab/ggml-vocab-phi-3.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, false);
}

TEST(TokenizerSpmVectors, LlamaSpm) {
  const std::string p = test_asset("models/ggml-vocab-llama-spm.gguf");
  RUNLM_REQUIRE_ASSET(p);
  expect_vectors(p, false);
}
