// Limits checked before use: model hyperparameters that would
// overflow or divide to nothing, and KV cache sizes worked out in 64 bits and
// checked against the machine before anything is allocated.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "llama_arch.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {

// The metadata read_model_config needs for a llama model of dim 8.
void set_minimal_llama(GgufWriter& w) {
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.embedding_length", 8);
  w.set_u32("llama.feed_forward_length", 16);
  w.set_u32("llama.block_count", 1);
  w.set_u32("llama.attention.head_count", 2);
  w.set_u32("llama.context_length", 64);
}

// A llama GGUF with only that metadata and a tiny token_embd ([dim, 4]
// f32); `edit` changes the writer before it is saved.
std::string config_error(const std::function<void(GgufWriter&)>& edit) {
  TempPath path(".gguf");
  GgufWriter w;
  set_minimal_llama(w);
  edit(w);
  const std::vector<float> embd(8 * 4, 0.5f);
  w.add_tensor("token_embd.weight", DType::F32, {8, 4}, embd.data());
  w.write(path.str());
  auto g = GgufFile::open(path.str());
  return error_of([&] { read_model_config(*g); });
}

}  // namespace

TEST(Limits, ModelConfigBaseIsValid) {
  EXPECT_EQ(config_error([](GgufWriter&) {}), "<no error>");
}

TEST(Limits, MoreHeadsThanDimensionsIsAnError) {
  // dim / n_heads = 8 / 16 = 0: a zero head dimension passed the "even" check.
  expect_words(config_error([](GgufWriter& w) { w.set_u32("llama.attention.head_count", 16); }),
               {"head dimension is 0", "16"});
}

TEST(Limits, QueryWidthOverflowIsAnError) {
  // 65536 heads of 65536: n_heads * head_dim overflows the int the engines use.
  expect_words(config_error([](GgufWriter& w) {
                 w.set_u32("llama.attention.head_count", 65536);
                 w.set_u32("llama.attention.head_count_kv", 65536);
                 w.set_u32("llama.attention.key_length", 65536);
               }),
               {"65536", "overflows"});
}

TEST(Limits, NonFiniteNormEpsilonAndRopeBaseAreErrors) {
  expect_words(config_error([](GgufWriter& w) {
                 w.set_f32("llama.attention.layer_norm_rms_epsilon", std::numeric_limits<float>::quiet_NaN());
               }),
               {"layer_norm_rms_epsilon"});
  expect_words(config_error([](GgufWriter& w) { w.set_f32("llama.attention.layer_norm_rms_epsilon", -1.0f); }),
               {"layer_norm_rms_epsilon"});
  expect_words(config_error([](GgufWriter& w) {
                 w.set_f32("llama.rope.freq_base", std::numeric_limits<float>::infinity());
               }),
               {"rope.freq_base"});
}

TEST(Limits, HugeSlidingWindowIsAnError) {
  expect_words(config_error([](GgufWriter& w) {
                 w.set("llama.attention.sliding_window", GgufValue::make_u64(uint64_t{1} << 40));
               }),
               {"sliding_window", "1099511627776"});
}

TEST(Limits, SizesOutsideInt32AreErrors) {
  // Engines keep sizes in int: a u64 key past 2^31 must not be truncated.
  expect_words(config_error([](GgufWriter& w) {
                 w.set("llama.block_count", GgufValue::make_u64(uint64_t{1} << 32));
               }),
               {"llama.block_count", "4294967296", "out of range"});
  expect_words(config_error([](GgufWriter& w) { w.set("llama.context_length", GgufValue::make_i32(-1)); }),
               {"llama.context_length", "-1"});
}

TEST(Limits, EmptyVocabularyIsAnError) {
  // token_embd.weight with 0 rows parses (a 0-sized tensor is valid GGUF),
  // but a model with no vocabulary is not.
  TempPath path(".gguf");
  GgufWriter w;
  set_minimal_llama(w);
  w.add_tensor("token_embd.weight", DType::F32, {8, 0}, nullptr);
  w.write(path.str());
  auto g = GgufFile::open(path.str());
  expect_words(error_of([&] { read_model_config(*g); }), {"token_embd.weight has 0 rows"});
}

TEST(Limits, KvCacheBytesAreComputedIn64Bits) {
  // A 7B shape (32 layers, 32 kv heads of 128) at 2e9 tokens: the element
  // count alone is 2.6e14, far past 32 bits.
  ModelConfig c;
  c.n_layers = 32;
  c.n_kv_heads = 32;
  c.head_dim = 128;
  const uint64_t expect = 2ull * 32 * 2000000000ull * 32 * 128 * 2;
  EXPECT_EQ(kv_cache_bytes(c, 2000000000, 2), expect);
  // And an overflow of 64 bits is an Error, not a wrapped small size.
  c.n_layers = c.n_kv_heads = c.head_dim = 1 << 30;
  expect_words(error_of([&] { kv_cache_bytes(c, 1 << 30, 4); }), {"overflows 64 bits", "-c"});
  expect_words(error_of([&] { kv_cache_bytes(c, 0, 4); }), {"context size 0"});
}

TEST(Limits, HostAllocationLargerThanTheMachineIsAnError) {
  const uint64_t ram = host_memory_bytes();
  ASSERT_GT(ram, 0u);
  EXPECT_EQ(error_of([&] { check_host_allocation(ram / 4, "a buffer"); }), "<no error>");
  expect_words(error_of([&] { check_host_allocation(ram + 1, "the KV cache"); }),
               {"the KV cache needs", std::to_string(ram + 1) + " bytes", "use a smaller -c"});
}

TEST(Limits, ImpossibleContextIsAClearErrorNotACrash) {
  // stories260K: 2 x 5 layers x 4 kv heads x 8 x 4 bytes = 1280 bytes per
  // token, so -c 2e9 asks for 2.56e12 bytes (2.3 TiB).
  const CommandResult r = run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                                      " -t 1 -c 2000000000 -p hi -n 1 --temp 0 --device cpu");
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_words(r.err, {"error: ", "KV cache", "2560000000000 bytes", "-c"});
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Limits, GgufMetadataValueCountIsCapped) {
  // One u8 array of 2^24 + 1 elements: 16 MB on disk, but every element
  // becomes a GgufValue (~88 bytes): 1.5 GB of memory from a 16 MB file, and
  // 100 GB from a 1 GB one. The reader refuses it before allocating.
  const uint64_t count = (uint64_t{1} << 24) + 1;
  std::vector<uint8_t> img;
  auto put = [&](const void* p, size_t n) {
    img.insert(img.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const uint32_t version = 3, type_array = 9, type_u8 = 0;
  const uint64_t n_tensors = 0, n_kv = 1, key_len = 1;
  put("GGUF", 4);
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv, 8);
  put(&key_len, 8);
  put("a", 1);
  put(&type_array, 4);
  put(&type_u8, 4);
  put(&count, 8);
  img.resize(img.size() + count, 0);
  expect_words(error_of([&] { GgufFile::from_memory(img.data(), img.size(), "many.gguf"); }),
               {"many.gguf", "key 'a'", "16777217", "limit of 16777216 metadata values"});
}
