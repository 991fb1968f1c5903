// Tests for the GGUF reader and writer: real files (the embedded stories260K,
// the shared Llama-2 vocabulary),
// writer round trips, and hand-built corrupt files that must be rejected with
// an Error (never a crash).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>

#include "common.h"
#include "dtype.h"
#include "gguf.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::shared_model;

namespace {



std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A unique path per test (tests of one binary may run in parallel under ctest).
std::string temp_path(const std::string& tag) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "runlm_gguf_" + std::to_string(::getpid()) + "_" + info->name() + "_" + tag;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Builds GGUF images byte by byte, independently of GgufWriter, so the reader
// is tested against the format and not against our own writer.
struct Bytes {
  std::vector<uint8_t> b;
  Bytes& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    b.insert(b.end(), c, c + n);
    return *this;
  }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Bytes& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return raw("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
  }
  Bytes& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(static_cast<uint32_t>(GgufType::U32)).u32(v); }
  Bytes& kv_str(const std::string& key, const std::string& v) {
    return str(key).u32(static_cast<uint32_t>(GgufType::STRING)).str(v);
  }
  Bytes& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Bytes& pad(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

// Expects from_memory to throw an Error whose message contains every word.
void expect_rejected(const std::vector<uint8_t>& img, const std::vector<std::string>& words) {
  try {
    GgufFile::from_memory(img.data(), img.size(), "bad.gguf");
    ADD_FAILURE() << "accepted a bad file; expected an error containing '" << words.at(0) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.gguf"), std::string::npos) << "message does not name the file: " << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
  }
}

// A valid hand-built image: 1 key, two F32 tensors, the last ending at EOF.
Bytes valid_image() {
  Bytes b;
  b.header(3, 2, 1).kv_u32("k", 7);
  b.tensor("a", {8}, 0, 0).tensor("b", {8, 2}, 0, 32);
  b.pad(32).zeros(32 + 64);
  return b;
}

}  // namespace

// ---- real files ---------------------------------------------------------------

TEST(GgufStories, MetadataMatchesSources) {
  auto f = GgufFile::open(shared_model("stories260K.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), 1185376u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 8);
  EXPECT_EQ(f->get_int("llama.context_length"), 2048);
  EXPECT_NEAR(f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_int("tokenizer.ggml.unknown_token_id"), 0);
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 512u);
}

TEST(GgufStories, TensorsMatchSources) {
  auto f = GgufFile::open(shared_model("stories260K.gguf"));
  ASSERT_EQ(f->tensors().size(), 48u);
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.type, DType::F32) << t.name;
    EXPECT_EQ(t.nbytes, static_cast<size_t>(t.n_elements()) * 4) << t.name;
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
  }
  const GgufTensorInfo* k = f->find_tensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(f->find_tensor("no.such.tensor"), nullptr);

  const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
  const GgufTensorInfo* out = f->find_tensor("output.weight");
  ASSERT_NE(emb, nullptr);
  ASSERT_NE(out, nullptr);
  EXPECT_EQ(emb->ne, (std::vector<int64_t>{64, 512}));
  ASSERT_EQ(emb->nbytes, out->nbytes);
  EXPECT_EQ(std::memcmp(f->tensor_data(*emb), f->tensor_data(*out), emb->nbytes), 0);

  // Cross-check against the independent llama2.c export of the same weights:
  // 7 int32 header, then emb[512][64], rms_att[5][64], wq[5][64][64], wk[5][32][64].
  const auto bin = read_file(shared_model("stories260K.bin"));
  const size_t emb_at = 7 * 4;
  ASSERT_GE(bin.size(), emb_at + emb->nbytes);
  EXPECT_EQ(std::memcmp(f->tensor_data(*emb), bin.data() + emb_at, emb->nbytes), 0);
  const size_t wk0_at = emb_at + 4 * (512 * 64 + 5 * 64 + 5 * 64 * 64);
  ASSERT_EQ(k->nbytes, 32u * 64 * 4);
  EXPECT_EQ(std::memcmp(f->tensor_data(*k), bin.data() + wk0_at, k->nbytes), 0);
}

TEST(GgufStories, FromMemoryAgreesWithOpen) {
  const auto img = read_file(shared_model("stories260K.gguf"));
  auto m = GgufFile::from_memory(img.data(), img.size(), "mem");
  auto f = GgufFile::open(shared_model("stories260K.gguf"));
  EXPECT_EQ(m->path(), "mem");
  ASSERT_EQ(m->tensors().size(), f->tensors().size());
  // SOURCES.md: tensor data starts at file offset 14176.
  uint64_t min_off = UINT64_MAX;
  for (const auto& t : m->tensors()) min_off = std::min(min_off, t.offset);
  EXPECT_EQ(min_off, 0u);
  for (size_t i = 0; i < m->tensors().size(); ++i) {
    const auto& t = m->tensors()[i];
    EXPECT_EQ(static_cast<size_t>(m->tensor_data(t) - img.data()), 14176 + t.offset) << t.name;
    EXPECT_EQ(std::memcmp(m->tensor_data(t), f->tensor_data(f->tensors()[i]), t.nbytes), 0) << t.name;
  }
}

TEST(GgufStories, RewriteIsByteIdentical) {
  // copy_metadata + the same tensors with the default alignment must
  // reproduce llama.cpp's file exactly: same layout, encoding and padding.
  const std::string src_path = shared_model("stories260K.gguf");
  auto f = GgufFile::open(src_path);
  GgufWriter w;
  w.copy_metadata(*f);
  for (const auto& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, f->tensor_data(t));
  const std::string path = temp_path("rewrite.gguf");
  w.write(path);
  const auto a = read_file(src_path);
  const auto b = read_file(path);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_TRUE(a == b);
  ::unlink(path.c_str());
}

TEST(GgufVocab, LlamaSpmVocabOnly) {
  RUNLM_REQUIRE_ASSET(shared_model("ggml-vocab-llama-spm.gguf"));
  auto f = GgufFile::open(shared_model("ggml-vocab-llama-spm.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 0u);
  const auto tokens = f->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 32000u);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[29871], "\xe2\x96\x81");  // "▁", the SPM space piece
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 32000u);
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(f->get_bool("tokenizer.ggml.add_eos_token"));
  EXPECT_EQ(f->get_int("llama.embedding_length"), 4096);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 11008);
  EXPECT_EQ(f->get_int("llama.block_count"), 32);
}

// ---- getters --------------------------------------------------------------------

TEST(GgufGetters, TypesAndErrors) {
  auto f = GgufFile::open(shared_model("stories260K.gguf"));
  try {
    f->get_int("llama.nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "key not found in model: llama.nope (" + shared_model("stories260K.gguf") + ")");
  }
  EXPECT_EQ(f->find("llama.nope"), nullptr);
  EXPECT_FALSE(f->get_int_opt("llama.nope").has_value());
  EXPECT_FALSE(f->get_float_opt("llama.nope").has_value());
  EXPECT_FALSE(f->get_string_opt("llama.nope").has_value());
  EXPECT_EQ(f->get_int_opt("llama.block_count"), 5);
  EXPECT_EQ(f->get_string_opt("general.architecture"), "llama");
  // Integers read as floats; floats and strings are not integers.
  EXPECT_EQ(f->get_float("llama.block_count"), 5.0);
  EXPECT_THROW(f->get_int("llama.attention.layer_norm_rms_epsilon"), Error);
  EXPECT_THROW(f->get_int_opt("general.architecture"), Error);
  try {
    f->get_string("llama.block_count");
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("llama.block_count"), std::string::npos) << msg;
    EXPECT_NE(msg.find("string"), std::string::npos) << msg;
  }
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.tokens"), Error);
  EXPECT_THROW(f->get_int_array("tokenizer.ggml.scores"), Error);
  EXPECT_THROW(f->get_float_array("general.architecture"), Error);
}

TEST(GgufGetters, ValueConversions) {
  EXPECT_EQ(GgufValue::make_u64(UINT64_MAX).as_uint(), UINT64_MAX);
  EXPECT_THROW(GgufValue::make_u64(UINT64_MAX).as_int(), Error);
  EXPECT_THROW(GgufValue::make_i32(-1).as_uint(), Error);
  EXPECT_EQ(GgufValue::make_i32(-1).as_int(), -1);
  EXPECT_TRUE(GgufValue::make_bool(true).as_bool());
  EXPECT_FALSE(GgufValue::make_bool(true).is_int());
  EXPECT_THROW(GgufValue::make_bool(true).as_int(), Error);
  EXPECT_TRUE(GgufValue::make_u32(1).as_bool());
  EXPECT_THROW(GgufValue::make_u32(2).as_bool(), Error);
  EXPECT_THROW(GgufValue::make_i32(-1).as_bool(), Error);
  EXPECT_EQ(GgufValue::make_f32(0.5f).as_float(), 0.5);
  EXPECT_THROW(GgufValue::make_f32(0.5f).as_int(), Error);
  EXPECT_THROW(GgufValue::make_f32(0.5f).as_string(), Error);
  EXPECT_THROW(GgufValue::make_array(GgufType::I32, {GgufValue::make_u32(1)}), Error);
  EXPECT_STREQ(gguf_type_name(GgufType::STRING), "string");
}

// ---- writer ---------------------------------------------------------------------

namespace {
GgufValue scalar(GgufType t, uint64_t u, int64_t i, double f) {
  GgufValue v;
  v.type = t;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

void expect_same_value(const GgufValue& a, const GgufValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  switch (a.type) {
    case GgufType::STRING: EXPECT_EQ(a.s, b.s) << where; break;
    case GgufType::F32: EXPECT_EQ(static_cast<float>(a.f), static_cast<float>(b.f)) << where; break;
    case GgufType::F64: EXPECT_EQ(a.f, b.f) << where; break;
    case GgufType::ARRAY:
      EXPECT_EQ(a.elem_type, b.elem_type) << where;
      ASSERT_EQ(a.arr.size(), b.arr.size()) << where;
      for (size_t k = 0; k < a.arr.size(); ++k) expect_same_value(a.arr[k], b.arr[k], where + "[" + std::to_string(k) + "]");
      break;
    default:
      EXPECT_EQ(a.u, b.u) << where;
      EXPECT_EQ(a.i, b.i) << where;
  }
}

std::vector<GgufKV> every_kind_of_metadata() {
  using T = GgufType;
  std::vector<GgufKV> kv;
  kv.push_back({"t.u8", scalar(T::U8, 250, 0, 0)});
  kv.push_back({"t.i8", scalar(T::I8, 0, -100, 0)});
  kv.push_back({"t.u16", scalar(T::U16, 65000, 0, 0)});
  kv.push_back({"t.i16", scalar(T::I16, 0, -32000, 0)});
  kv.push_back({"t.u32", GgufValue::make_u32(4000000000u)});
  kv.push_back({"t.i32", GgufValue::make_i32(-2000000000)});
  kv.push_back({"t.u64", GgufValue::make_u64(0xfedcba9876543210ull)});
  kv.push_back({"t.i64", scalar(T::I64, 0, INT64_MIN + 3, 0)});
  kv.push_back({"t.f32", GgufValue::make_f32(-1.25e-7f)});
  kv.push_back({"t.f64", scalar(T::F64, 0, 0, 3.141592653589793)});
  kv.push_back({"t.true", GgufValue::make_bool(true)});
  kv.push_back({"t.false", GgufValue::make_bool(false)});
  kv.push_back({"t.string", GgufValue::make_string("héllo \n wörld")});
  kv.push_back({"t.empty_string", GgufValue::make_string("")});
  kv.push_back({"t.empty_array", GgufValue::make_array(T::F32, {})});
  kv.push_back({"t.strings", GgufValue::make_string_array({"a", "", "longer string", "\xe2\x96\x81x"})});
  kv.push_back({"t.f32s", GgufValue::make_f32_array({1.5f, -0.0f, 1e30f})});
  kv.push_back({"t.i32s", GgufValue::make_i32_array({-1, 0, INT32_MAX})});
  kv.push_back({"t.u8s", GgufValue::make_array(T::U8, {scalar(T::U8, 1, 0, 0), scalar(T::U8, 255, 0, 0)})});
  kv.push_back({"t.i8s", GgufValue::make_array(T::I8, {scalar(T::I8, 0, -128, 0)})});
  kv.push_back({"t.u16s", GgufValue::make_array(T::U16, {scalar(T::U16, 65535, 0, 0)})});
  kv.push_back({"t.i16s", GgufValue::make_array(T::I16, {scalar(T::I16, 0, -32768, 0)})});
  kv.push_back({"t.u32s", GgufValue::make_array(T::U32, {GgufValue::make_u32(7), GgufValue::make_u32(0)})});
  kv.push_back({"t.u64s", GgufValue::make_array(T::U64, {GgufValue::make_u64(UINT64_MAX)})});
  kv.push_back({"t.i64s", GgufValue::make_array(T::I64, {scalar(T::I64, 0, -5, 0)})});
  kv.push_back({"t.f64s", GgufValue::make_array(T::F64, {scalar(T::F64, 0, 0, -2.5)})});
  kv.push_back({"t.bools", GgufValue::make_array(T::BOOL, {GgufValue::make_bool(false), GgufValue::make_bool(true)})});
  kv.push_back({"t.nested", GgufValue::make_array(T::ARRAY, {GgufValue::make_i32_array({1, 2, 3}),
                                                              GgufValue::make_i32_array({}),
                                                              GgufValue::make_string_array({"x", ""})})});
  kv.push_back({"t.nested2", GgufValue::make_array(
                                 T::ARRAY, {GgufValue::make_array(T::ARRAY, {GgufValue::make_f32_array({9.f})})})});
  return kv;
}

struct TensorCase {
  std::string name;
  DType type;
  std::vector<int64_t> ne;
  std::vector<uint8_t> data;
};

std::vector<TensorCase> tensor_cases() {
  std::vector<TensorCase> cs = {
      {"f32.matrix", DType::F32, {7, 3}, {}},        {"f16.vec", DType::F16, {13}, {}},
      {"q4_0.w", DType::Q4_0, {64, 3}, {}},          {"q8_0.w", DType::Q8_0, {32, 2, 2}, {}},
      {"q4_k.w", DType::Q4_K, {256, 2, 1, 1}, {}},   {"empty", DType::F32, {0, 4}, {}},
  };
  uint32_t seed = 1234;
  for (auto& c : cs) {
    const DTypeInfo& info = dtype_info(c.type);
    size_t n = c.ne[0] / info.block_size * info.type_size;
    for (size_t d = 1; d < c.ne.size(); ++d) n *= static_cast<size_t>(c.ne[d]);
    c.data = random_bytes(n, seed++);
  }
  return cs;
}
}  // namespace

TEST(GgufWriter, RoundTripEveryTypeWithAlignment64) {
  const auto kvs = every_kind_of_metadata();
  const auto cases = tensor_cases();
  GgufWriter w(64);
  w.set_string("general.architecture", "test");
  for (const auto& kv : kvs) w.set(kv.key, kv.value);
  w.set_u32("t.u32", 4000000000u);  // set twice: replaced in place, order kept
  for (const auto& c : cases) w.add_tensor(c.name, c.type, c.ne, c.data.data());
  std::vector<std::pair<size_t, size_t>> progress;
  const std::string path = temp_path("rt.gguf");
  w.write(path, [&](size_t done, size_t total) { progress.emplace_back(done, total); });
  EXPECT_FALSE(file_exists(path + ".tmp"));

  ASSERT_EQ(progress.size(), cases.size());
  for (size_t k = 0; k < progress.size(); ++k) {
    EXPECT_EQ(progress[k].first, k + 1);
    EXPECT_EQ(progress[k].second, cases.size());
  }

  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_int("general.alignment"), 64);
  ASSERT_EQ(f->metadata().size(), kvs.size() + 2);
  EXPECT_EQ(f->metadata()[0].key, "general.architecture");
  for (size_t k = 0; k < kvs.size(); ++k) {
    EXPECT_EQ(f->metadata()[k + 1].key, kvs[k].key);
    expect_same_value(f->metadata()[k + 1].value, kvs[k].value, kvs[k].key);
  }
  EXPECT_EQ(f->metadata().back().key, "general.alignment");
  EXPECT_EQ(f->metadata().back().value.type, GgufType::U32);
  EXPECT_EQ(f->get_string("t.empty_string"), "");
  EXPECT_EQ(f->get_float_array("t.empty_array").size(), 0u);
  EXPECT_EQ(f->get_int("t.i64"), INT64_MIN + 3);
  EXPECT_EQ(f->get("t.u64").as_uint(), 0xfedcba9876543210ull);
  EXPECT_TRUE(f->get_bool("t.true"));
  EXPECT_FALSE(f->get_bool("t.false"));
  EXPECT_EQ(f->get_int_array("t.u8s"), (std::vector<int64_t>{1, 255}));

  ASSERT_EQ(f->tensors().size(), cases.size());
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& t = f->tensors()[k];
    EXPECT_EQ(t.name, cases[k].name);
    EXPECT_EQ(t.type, cases[k].type) << t.name;
    EXPECT_EQ(t.ne, cases[k].ne) << t.name;
    EXPECT_EQ(t.offset % 64, 0u) << t.name;
    ASSERT_EQ(t.nbytes, cases[k].data.size()) << t.name;
    if (t.nbytes > 0) {
      EXPECT_EQ(std::memcmp(f->tensor_data(t), cases[k].data.data(), t.nbytes), 0) << t.name;
    }
  }
  // Tensors are packed in order at the first aligned offset after the previous.
  for (size_t k = 1; k < cases.size(); ++k) {
    const auto& p = f->tensors()[k - 1];
    EXPECT_EQ(f->tensors()[k].offset, (p.offset + p.nbytes + 63) / 64 * 64);
  }
  // Padding between tensors is zeros.
  const auto bytes = read_file(path);
  // The file ends with the last tensor's padded data.
  const auto& last = f->tensors().back();
  ASSERT_GE(bytes.size(), (last.offset + last.nbytes + 63) / 64 * 64);
  const size_t data_start = bytes.size() - (last.offset + last.nbytes + 63) / 64 * 64;
  EXPECT_EQ(data_start % 64, 0u);
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& t = f->tensors()[k];
    const size_t end = data_start + t.offset + t.nbytes;
    const size_t next = data_start + (t.offset + t.nbytes + 63) / 64 * 64;
    ASSERT_LE(next, bytes.size());
    for (size_t i = end; i < next; ++i) ASSERT_EQ(bytes[i], 0) << "padding after " << t.name << " at " << i;
  }
  ::unlink(path.c_str());
}

TEST(GgufWriter, DefaultAlignmentWritesNoKeyAndFillsInOrder) {
  GgufWriter w;
  w.set_f32("x", 2.5f);
  w.set_bool("b", true);
  std::vector<std::string> order;
  for (int k = 0; k < 3; ++k) {
    const std::string name = "t" + std::to_string(k);
    w.add_tensor(name, DType::F32, {5}, [&order, name, k](uint8_t* dst) {
      order.push_back(name);
      for (int i = 0; i < 5; ++i) {
        const float v = static_cast<float>(10 * k + i);
        std::memcpy(dst + 4 * i, &v, 4);
      }
    });
  }
  EXPECT_TRUE(order.empty());  // data is produced at write() time only
  const std::string path = temp_path("d.gguf");
  w.write(path);
  EXPECT_EQ(order, (std::vector<std::string>{"t0", "t1", "t2"}));
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->find("general.alignment"), nullptr);
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->get_float("x"), 2.5);
  const auto* t2 = f->find_tensor("t2");
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(t2->offset, 64u);
  float v;
  std::memcpy(&v, f->tensor_data(*t2) + 4 * 3, 4);
  EXPECT_EQ(v, 23.0f);
  ::unlink(path.c_str());
}

TEST(GgufWriter, CopyMetadataKeepsWriterAlignment) {
  Bytes b;
  b.header(3, 0, 2).kv_str("general.name", "src").kv_u32("general.alignment", 128);
  auto src = GgufFile::from_memory(b.b.data(), b.b.size(), "src");
  EXPECT_EQ(src->alignment(), 128u);
  GgufWriter w2(16);
  w2.copy_metadata(*src);
  const auto data = random_bytes(12, 5);
  w2.add_tensor("t", DType::F32, {3}, data.data());
  const std::string path = temp_path("c.gguf");
  w2.write(path);
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->alignment(), 16u);
  EXPECT_EQ(f->get_string("general.name"), "src");
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[1].key, "general.alignment");
  EXPECT_EQ(std::memcmp(f->tensor_data(f->tensors()[0]), data.data(), 12), 0);
  ::unlink(path.c_str());
}

TEST(GgufWriter, RejectsBadInput) {
  GgufWriter w;
  w.add_tensor("t", DType::F32, {4}, [](uint8_t*) {});
  EXPECT_THROW(w.add_tensor("t", DType::F32, {4}, [](uint8_t*) {}), Error);      // duplicate
  EXPECT_THROW(w.add_tensor("q", DType::Q4_0, {33}, [](uint8_t*) {}), Error);    // not a block multiple
  EXPECT_THROW(w.add_tensor("z", DType::F32, {}, [](uint8_t*) {}), Error);       // 0 dims
  EXPECT_THROW(w.add_tensor("z", DType::F32, {1, 1, 1, 1, 1}, [](uint8_t*) {}), Error);
  EXPECT_THROW(w.add_tensor("n", DType::F32, {-1}, [](uint8_t*) {}), Error);
  EXPECT_THROW(w.add_tensor("o", DType::F32, {INT64_MAX, 2}, [](uint8_t*) {}), Error);

  const std::string path = temp_path("bad_align.gguf");
  GgufWriter odd(48);
  try {
    odd.write(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(file_exists(path));

  GgufWriter range;
  GgufValue v;
  v.type = GgufType::U8;
  v.u = 300;
  range.set("too.big", v);
  EXPECT_THROW(range.write(path), Error);
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(path + ".tmp"));
}

TEST(GgufWriter, UnwritablePathThrowsAndLeavesNoFile) {
  const std::string dir = temp_path("no_such_dir");
  const std::string path = dir + "/model.gguf";
  GgufWriter w;
  w.set_u32("a", 1);
  try {
    w.write(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::strerror(ENOENT)), std::string::npos) << msg;
  }
  EXPECT_FALSE(file_exists(path));
  EXPECT_FALSE(file_exists(path + ".tmp"));

  // Rename onto a non-empty directory fails: the temporary must be removed.
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  const std::string inner = dir + "/keep";
  { std::ofstream(inner) << "x"; }
  try {
    w.write(dir);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rename"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(file_exists(dir + ".tmp"));
  ::unlink(inner.c_str());
  ::rmdir(dir.c_str());
}

TEST(GgufWriter, FailingFillKeepsOldFile) {
  const std::string path = temp_path("keep.gguf");
  { std::ofstream(path) << "old contents"; }
  GgufWriter w;
  w.add_tensor("t", DType::F32, {4}, [](uint8_t*) { fail("fill failed on purpose"); });
  EXPECT_THROW(w.write(path), Error);
  EXPECT_FALSE(file_exists(path + ".tmp"));
  const auto bytes = read_file(path);
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "old contents");
  ::unlink(path.c_str());
}

// ---- corrupt input ----------------------------------------------------------------

TEST(GgufBadInput, HandBuiltImageIsValid) {
  // The base image used by the corruption tests must itself parse.
  const auto img = valid_image();
  auto f = GgufFile::from_memory(img.b.data(), img.b.size(), "ok.gguf");
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->get_int("k"), 7);
  EXPECT_EQ(f->tensors()[1].ne, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(f->tensor_data(f->tensors()[1]) + 64, img.b.data() + img.b.size());
}

TEST(GgufBadInput, MagicAndVersion) {
  auto img = valid_image().b;
  img[0] = 'X';
  expect_rejected(img, {"magic"});
  for (uint32_t v : {1u, 99u, 0u}) {
    auto bad = valid_image().b;
    std::memcpy(bad.data() + 4, &v, 4);
    expect_rejected(bad, {"version", std::to_string(v)});
  }
  auto v2 = valid_image().b;
  v2[4] = 2;
  EXPECT_NO_THROW(GgufFile::from_memory(v2.data(), v2.size()));
  expect_rejected({}, {"truncated"});
}

TEST(GgufBadInput, TruncatedAtEveryPrefix) {
  GgufWriter w(32);
  for (const auto& kv : every_kind_of_metadata()) w.set(kv.key, kv.value);
  const auto a = random_bytes(18 * 2, 9);
  const auto b = random_bytes(4 * 8, 10);  // 32 bytes: ends the file with no padding
  w.add_tensor("q", DType::Q4_0, {64}, a.data());
  w.add_tensor("f", DType::F32, {8}, b.data());
  const std::string path = temp_path("trunc.gguf");
  w.write(path);
  const auto img = read_file(path);
  ::unlink(path.c_str());
  ASSERT_NO_THROW(GgufFile::from_memory(img.data(), img.size()));
  for (size_t n = 0; n < img.size(); ++n) {
    // A fresh heap copy of exactly n bytes lets ASan catch any overread.
    std::vector<uint8_t> prefix(img.begin(), img.begin() + n);
    EXPECT_THROW(GgufFile::from_memory(prefix.data(), prefix.size(), "bad.gguf"), Error) << "prefix " << n;
  }
}

TEST(GgufBadInput, StringAndArrayLengths) {
  {
    Bytes b;
    b.header(3, 0, 1).u64(1000).raw("abc", 3).zeros(20);  // key length past the end
    expect_rejected(b.b, {"string length 1000"});
  }
  {
    Bytes b;
    b.header(3, 0, 1).str("k").u32(static_cast<uint32_t>(GgufType::STRING)).u64(UINT64_MAX).raw("x", 1);
    expect_rejected(b.b, {"string length", "'k'"});
  }
  {
    Bytes b;  // huge array count: must fail before allocating
    b.header(3, 0, 1).str("arr").u32(static_cast<uint32_t>(GgufType::ARRAY)).u32(static_cast<uint32_t>(GgufType::U32));
    b.u64(uint64_t(1) << 60).zeros(16);
    expect_rejected(b.b, {"array count", "'arr'"});
  }
  {
    Bytes b;  // count just one more than the bytes allow
    b.header(3, 0, 1).str("arr").u32(static_cast<uint32_t>(GgufType::ARRAY)).u32(static_cast<uint32_t>(GgufType::U32));
    b.u64(5).zeros(16);
    expect_rejected(b.b, {"array count 5"});
  }
  {
    Bytes b;
    b.header(3, 0, 1).str("v").u32(13).u32(0);
    expect_rejected(b.b, {"unknown value type 13"});
  }
  {
    Bytes b;
    b.header(3, 0, 2).kv_u32("dup", 1).kv_u32("dup", 2);
    expect_rejected(b.b, {"duplicate", "dup"});
  }
  {
    Bytes b;  // arrays nested 1000 deep must not recurse without bound
    b.header(3, 0, 1).str("deep").u32(static_cast<uint32_t>(GgufType::ARRAY));
    for (int k = 0; k < 1000; ++k) b.u32(static_cast<uint32_t>(GgufType::ARRAY)).u64(1);
    b.u32(static_cast<uint32_t>(GgufType::U8)).u64(0);
    expect_rejected(b.b, {"nested"});
  }
  {
    Bytes b;
    b.header(3, uint64_t(1) << 40, 0).zeros(64);
    expect_rejected(b.b, {"tensor count"});
  }
  {
    Bytes b;
    b.header(3, 0, UINT64_MAX).zeros(64);
    expect_rejected(b.b, {"metadata count"});
  }
}

TEST(GgufBadInput, TensorInfos) {
  auto one_tensor = [](const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset, size_t data) {
    Bytes b;
    b.header(3, 1, 0).tensor("blk.0.w", ne, type, offset).pad(32).zeros(data);
    return b.b;
  };
  const auto good = one_tensor({8}, 0, 0, 32);
  EXPECT_NO_THROW(GgufFile::from_memory(good.data(), good.size()));
  expect_rejected(one_tensor({}, 0, 0, 32), {"n_dims = 0"});
  expect_rejected(one_tensor({1, 1, 1, 1, 8}, 0, 0, 32), {"n_dims = 5"});
  expect_rejected(one_tensor({8}, 77, 0, 32), {"'blk.0.w'", "type", "77"});
  expect_rejected(one_tensor({8}, 0, 0, 31), {"'blk.0.w'", "outside the file"});
  expect_rejected(one_tensor({8}, 0, 32, 32), {"outside the file"});
  expect_rejected(one_tensor({8}, 0, UINT64_MAX - 31, 32), {"outside the file"});
  expect_rejected(one_tensor({8}, 0, 16, 64), {"misaligned"});
  expect_rejected(one_tensor({uint64_t(1) << 32, uint64_t(1) << 32}, 0, 0, 32), {"overflow"});
  expect_rejected(one_tensor({uint64_t(1) << 62, 1}, 0, 0, 32), {"overflow"});  // bytes overflow
  expect_rejected(one_tensor({uint64_t(1) << 63}, 0, 0, 32), {"ne[0]", "negative"});
  expect_rejected(one_tensor({33}, 2, 0, 32), {"block size"});

  Bytes dup;
  dup.header(3, 2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad(32).zeros(64);
  expect_rejected(dup.b, {"duplicate tensor name", "'w'"});
}

TEST(GgufBadInput, Alignment) {
  auto with_alignment = [](uint32_t align) {
    Bytes b;
    b.header(3, 1, 1).kv_u32("general.alignment", align).tensor("w", {8}, 0, 0).pad(align ? align : 1).zeros(32);
    return b.b;
  };
  auto ok = with_alignment(256);
  auto f = GgufFile::from_memory(ok.data(), ok.size());
  EXPECT_EQ(f->alignment(), 256u);
  EXPECT_EQ(static_cast<size_t>(f->tensor_data(f->tensors()[0]) - ok.data()) % 256, 0u);
  expect_rejected(with_alignment(48), {"general.alignment", "power of two"});
  expect_rejected(with_alignment(0), {"power of two"});
  Bytes s;
  s.header(3, 0, 1).kv_str("general.alignment", "32");
  expect_rejected(s.b, {"general.alignment"});
}

TEST(GgufBadInput, RandomCorruptionNeverCrashes) {
  // Bytes flipped at random in a valid file: each result either parses or
  // throws Error; anything else (crash, other exception) fails the test.
  GgufWriter w;
  w.set("s", GgufValue::make_string_array({"ab", "c"}));
  w.set("n", GgufValue::make_array(GgufType::ARRAY, {GgufValue::make_i32_array({1, 2})}));
  w.set_u32("general.alignment", 32);
  const auto data = random_bytes(18, 3);
  w.add_tensor("t", DType::Q4_0, {32}, data.data());
  const std::string path = temp_path("fuzz.gguf");
  w.write(path);
  const auto img = read_file(path);
  ::unlink(path.c_str());
  std::mt19937 rng(42);
  int parsed = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    auto bad = img;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % bad.size();
      bad[at] = (rng() % 4 == 0) ? 0xff : static_cast<uint8_t>(rng());
    }
    try {
      auto f = GgufFile::from_memory(bad.data(), bad.size(), "fuzz");
      for (const auto& t : f->tensors()) {
        const uint8_t* p = f->tensor_data(t);
        ASSERT_GE(p, bad.data());
        ASSERT_LE(p + t.nbytes, bad.data() + bad.size());
      }
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(parsed, 0);  // flips inside tensor data are harmless
}

TEST(GgufBadInput, OpenErrorsNameThePath) {
  const std::string missing = temp_path("missing.gguf");
  try {
    GgufFile::open(missing);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  EXPECT_THROW(GgufFile::open(testing::TempDir()), Error);  // a directory
  const std::string tiny = temp_path("tiny.gguf");
  { std::ofstream(tiny) << "GGUF"; }
  try {
    GgufFile::open(tiny);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tiny), std::string::npos) << e.what();
  }
  ::unlink(tiny.c_str());
}
