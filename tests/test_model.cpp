// Model loading: hyperparameters from GGUF metadata, and clear errors for an
// unknown architecture, a missing tensor or a tensor of the wrong shape.
#include <gtest/gtest.h>

#include <cmath>

#include "common.h"
#include "gguf.h"
#include "model.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

TEST(Model, Stories260KHyperparameters) {
  auto m = Model::load(shared_model("stories260K.gguf"));
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_FALSE(c.tied_embeddings);  // this file carries output.weight
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
}

// Both engines take the softmax scale from ModelConfig::attn_scale.
TEST(Model, AttentionScaleIsOneOverSqrtHeadDim) {
  ModelConfig c;
  for (int hd : {8, 64, 128, 256}) {
    c.head_dim = hd;
    EXPECT_FLOAT_EQ(c.attn_scale(), 1.0f / std::sqrt(static_cast<float>(hd))) << hd;
  }
  c.head_dim = 64;
  EXPECT_FLOAT_EQ(c.attn_scale(), 0.125f);
}

TEST(Model, UnknownArchitectureIsNamed) {
  TempPath p(".gguf");
  const std::string e =
      load_error(rewritten_stories260k(p, [](GgufWriter& w) { w.set_string("general.architecture", "gpt2"); }));
  EXPECT_NE(e.find("unknown architecture 'gpt2'"), std::string::npos) << e;
}

TEST(Model, MissingTensorIsNamed) {
  TempPath p(".gguf");
  const std::string e = load_error(rewritten_stories260k(p, [](GgufWriter&) {}, "blk.2.ffn_up.weight"));
  EXPECT_NE(e.find("tensor not found in model: blk.2.ffn_up.weight"), std::string::npos) << e;
}

TEST(Model, WrongShapeIsNamed) {
  TempPath p(".gguf");
  const std::string e = load_error(rewritten_stories260k(p, [](GgufWriter&) {}, "", "blk.0.attn_k.weight"));
  EXPECT_NE(e.find("blk.0.attn_k.weight has shape [32, 64], expected [64, 32]"), std::string::npos) << e;
}

TEST(Model, MissingHyperparameterIsNamed) {
  TempPath p(".gguf");
  auto src = GgufFile::open(shared_model("stories260K.gguf"));
  GgufWriter w;
  for (const auto& kv : src->metadata())
    if (kv.key != "llama.block_count") w.set(kv.key, kv.value);
  for (const auto& t : src->tensors()) w.add_tensor(t.name, t.type, t.ne, src->tensor_data(t));
  w.write(p.str());
  const std::string e = load_error(p.str());
  EXPECT_NE(e.find("key not found in model: llama.block_count"), std::string::npos) << e;
}

TEST(Model, MistralStyleSlidingWindowAndTiedEmbeddings) {
  TempPath p(".gguf");
  auto m = Model::load(rewritten_stories260k(
      p, [](GgufWriter& w) { w.set_u32("llama.attention.sliding_window", 32); }, "output.weight"));
  EXPECT_EQ(m->config().sliding_window, 32);
  EXPECT_TRUE(m->config().tied_embeddings);
  EXPECT_EQ(m->weights().output.data, m->weights().tok_embd.data);
}

TEST(Model, UnsupportedRopeScalingIsNamed) {
  TempPath p(".gguf");
  const std::string e =
      load_error(rewritten_stories260k(p, [](GgufWriter& w) { w.set_string("llama.rope.scaling.type", "dynamic"); }));
  EXPECT_NE(e.find("dynamic"), std::string::npos) << e;
}
