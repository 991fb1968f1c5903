// `runlm tokenize` as a user runs it: llama-tokenize's output formats, a
// vocabulary-only GGUF, the BOS and special-token switches, and bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "test_support.h"

using namespace runlm::test;

namespace {

CommandResult tokenize(const std::string& args) { return run_command(runlm_binary() + " tokenize " + args); }

std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

}  // namespace

TEST(CmdTokenize, IdsOfAVocabularyOnlyGguf) {
  const std::string vocab = test_asset("vocab/ggml-vocab-qwen2.gguf");
  RUNLM_REQUIRE_ASSET(vocab);
  const CommandResult r = tokenize("-m " + vocab + " -p '<|im_start|>user\nhi<|im_end|>' --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(last_line(r.out), "[151644, 872, 198, 6023, 151645]");
  // Without special tokens the texts are plain text (no 151644).
  const CommandResult plain = tokenize("-m " + vocab + " -p '<|im_start|>' --ids --no-parse-special");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(last_line(plain.out).find("151644"), std::string::npos) << plain.out;
}

TEST(CmdTokenize, PiecesBosAndCount) {
  const std::string vocab = test_asset("vocab/ggml-vocab-llama-bpe.gguf");
  RUNLM_REQUIRE_ASSET(vocab);
  const CommandResult r = tokenize("-m " + vocab + " -p 'Hello world' --show-count");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Llama 3 asks for BOS; llama-tokenize shows special tokens by their text.
  EXPECT_EQ(r.out, "128000 -> '<|begin_of_text|>'\n  9906 -> 'Hello'\n  1917 -> ' world'\nTotal number of tokens: 3\n");
  const CommandResult no_bos = tokenize("-m " + vocab + " -p 'Hello world' --ids --no-bos");
  ASSERT_EQ(no_bos.exit_code, 0) << no_bos.err;
  EXPECT_EQ(last_line(no_bos.out), "[9906, 1917]");
}

TEST(CmdTokenize, FileAndSentencePieceModel) {
  const std::string model = shared_model("stories260K.gguf");
  TempPath text(".txt");
  {
    std::ofstream f(text.str(), std::ios::binary);
    f << "Once upon a time";
  }
  const CommandResult r = tokenize("-m " + model + " -f " + text.str() + " --ids");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(last_line(r.out), "[1, 403, 407, 261, 378]");
}

TEST(CmdTokenize, BadInputIsAnError) {
  const std::string model = shared_model("stories260K.gguf");
  const CommandResult no_text = tokenize("-m " + model);
  EXPECT_EQ(no_text.exit_code, 1);
  expect_words(no_text.err, {"-p", "-f"});
  const CommandResult no_model = tokenize("-p hi");
  EXPECT_EQ(no_model.exit_code, 1);
  expect_words(no_model.err, {"-m"});
  const CommandResult missing = tokenize("-m /nonexistent/v.gguf -p hi");
  EXPECT_EQ(missing.exit_code, 1);
  expect_words(missing.err, {"/nonexistent/v.gguf"});
}
