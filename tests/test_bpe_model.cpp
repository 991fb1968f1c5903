// A model with a byte-level BPE vocabulary end to end: a small random Llama
// carrying llama.cpp's GPT-2 vocabulary loads (n_vocab = the vocabulary's
// size) and generates on the CPU through `runlm generate`.
#include <gtest/gtest.h>

#include "model.h"
#include "test_support.h"
#include "tokenizer.h"

using namespace runlm;
using namespace runlm::test;

TEST(BpeModel, RandomModelWithGpt2VocabularyGenerates) {
  const std::string vocab = test_asset("vocab/ggml-vocab-gpt-2.gguf");
  RUNLM_REQUIRE_ASSET(vocab);
  TempPath model(".gguf");
  const CommandResult made = run_command(std::string(RUNLM_RANDOM_MODEL_BINARY) +
                                         " --preset tiny --type f32 --layers 1 --threads 2 --vocab-from " + vocab +
                                         " -o " + model.str());
  ASSERT_EQ(made.exit_code, 0) << made.err;

  auto m = Model::load(model.str());
  const Tokenizer& tok = m->tokenizer();
  EXPECT_EQ(tok.model_kind(), "gpt2");
  EXPECT_EQ(tok.n_vocab(), 50257);
  EXPECT_EQ(m->config().n_vocab, tok.n_vocab());

  const CommandResult r = run_command(runlm_binary() + " generate -m " + model.str() +
                                      " --device cpu -p 'Hello world' -n 6 --temp 0 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The prompt is echoed, then six tokens' bytes follow.
  ASSERT_EQ(r.out.rfind("Hello world", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Hello world\n").size()) << r.out;
  expect_words(r.err, {"prompt: 2 tokens", "generation: 6 tokens", "stop: length"});
}
