// Tokenizer tests: llama.cpp's SPM tokenizer vectors through both loaders, the
// stories260K vocabulary, llama2.c's streaming decode rule against a golden
// text, special-token parsing, and GGUF vocabularies that must be refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"
#include "test_support.h"

using namespace runlm;
using runlm::test::error_of;
using runlm::test::shared_model;

namespace {


std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<int> parse_ids(const std::string& line) {
  std::vector<int> ids;
  std::istringstream in(line);
  int id;
  while (in >> id) ids.push_back(id);
  return ids;
}

// llama.cpp's test-tokenizer-0 layout: each test string is followed by the
// separator; the .out file holds one line of ids per string.
struct VocabVector {
  std::string text;
  std::vector<int> ids;
};
std::vector<VocabVector> read_vocab_vectors(const std::string& gguf_path) {
  const std::string inp = read_file(gguf_path + ".inp");
  const std::string out = read_file(gguf_path + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  EXPECT_EQ(texts.size(), lines.size());
  std::vector<VocabVector> v;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) v.push_back({texts[i], parse_ids(lines[i])});
  return v;
}

const char kOnceUponATime[] = "Once upon a time, there was a little girl named Lily.";
// From stories260K-tok512.model with sentencepiece 0.1.97 (SOURCES.md §2).
const std::vector<int> kOnceUponATimeIds = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426};

// Writes a vocab-only GGUF to a temporary file and opens it; the file is
// removed at once (the mapping stays valid), its path kept in messages.
auto open_vocab_gguf(const std::string& name, const std::vector<GgufKV>& kv) {
  GgufWriter w;
  for (const GgufKV& e : kv) w.set(e.key, e.value);
  const runlm::test::TempPath path("_" + name + ".gguf");
  w.write(path.str());
  return GgufFile::open(path.str());
}

// The stories260K vocabulary as GGUF key/values, for editing.
std::vector<GgufKV> stories_vocab_kv() {
  auto g = GgufFile::open(shared_model("stories260K.gguf"));
  std::vector<GgufKV> kv;
  for (const GgufKV& e : g->metadata())
    if (e.key.rfind("tokenizer.", 0) == 0) kv.push_back(e);
  return kv;
}

GgufValue* find_kv(std::vector<GgufKV>& kv, const std::string& key) {
  for (GgufKV& e : kv)
    if (e.key == key) return &e.value;
  return nullptr;
}

// Random text mixing ASCII, whitespace runs, digits and multi-byte UTF-8.
std::string random_text(std::mt19937& rng) {
  static const std::vector<std::string> kAtoms = {
      "a", "e", "t", "the", " ", "  ", "\n", "\t", "7", "42", ",", ".", "'", "\"", "Lily", "ball",
      "\xc3\xa9", "\xc3\x9f", "\xe4\xb8\x96", "\xe7\x95\x8c", "\xf0\x9f\x8c\x8d", "<s>", "~"};
  std::uniform_int_distribution<size_t> len(0, 24), atom(0, kAtoms.size() - 1);
  std::string s;
  for (size_t n = len(rng); n > 0; --n) s += kAtoms[atom(rng)];
  return s;
}

}  // namespace

TEST(TokenizerVocab, GgufMatchesLlamaCppVectors) {
  RUNLM_REQUIRE_ASSET(shared_model("ggml-vocab-llama-spm.gguf"));
  const std::string path = shared_model("ggml-vocab-llama-spm.gguf");
  auto g = GgufFile::open(path);
  auto tok = Tokenizer::from_gguf(*g);
  const auto vectors = read_vocab_vectors(path);
  ASSERT_EQ(vectors.size(), 46u);  // 46 strings, the separator ends each one
  for (const auto& v : vectors) EXPECT_EQ(tok->encode(v.text, false), v.ids) << "text: '" << v.text << "'";
}

TEST(TokenizerVocab, ModelFileMatchesLlamaCppVectors) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  RUNLM_REQUIRE_ASSET(shared_model("ggml-vocab-llama-spm.gguf"));
  auto tok = Tokenizer::from_model_file(shared_model("llama2-tokenizer.model"));
  const auto vectors = read_vocab_vectors(shared_model("ggml-vocab-llama-spm.gguf"));
  ASSERT_EQ(vectors.size(), 46u);
  for (const auto& v : vectors) EXPECT_EQ(tok->encode(v.text, false), v.ids) << "text: '" << v.text << "'";
}

TEST(TokenizerVocab, GgufTablesRoundTripThroughSentencepiece) {
  RUNLM_REQUIRE_ASSET(shared_model("ggml-vocab-llama-spm.gguf"));
  // The accessors are read back from the proto sentencepiece loaded, so this
  // checks the wire writer and reader against the GGUF arrays themselves.
  auto g = GgufFile::open(shared_model("ggml-vocab-llama-spm.gguf"));
  auto tok = Tokenizer::from_gguf(*g);
  const auto tokens = g->get_string_array("tokenizer.ggml.tokens");
  const auto scores = g->get_float_array("tokenizer.ggml.scores");
  const auto types = g->get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tok->n_vocab(), static_cast<int>(tokens.size()));
  for (int i = 0; i < tok->n_vocab(); ++i) {
    ASSERT_EQ(tok->id_to_piece(i), tokens[static_cast<size_t>(i)]) << i;
    ASSERT_EQ(tok->score(i), scores[static_cast<size_t>(i)]) << i;
    ASSERT_EQ(tok->token_type(i), types[static_cast<size_t>(i)]) << i;
  }
  EXPECT_EQ(tok->bos(), g->get_int("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(tok->eos(), g->get_int("tokenizer.ggml.eos_token_id"));
  EXPECT_EQ(tok->piece_to_id("\xe2\x96\x81the"), 278);
  EXPECT_EQ(tok->piece_to_id("no such piece"), -1);
  EXPECT_THROW(tok->id_to_piece(tok->n_vocab()), Error);
  EXPECT_THROW(tok->score(-1), Error);
}

TEST(TokenizerVocab, GgufAndModelFileAgreeOnLlama2) {
  RUNLM_REQUIRE_ASSET(shared_model("ggml-vocab-llama-spm.gguf"));
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  auto g = GgufFile::open(shared_model("ggml-vocab-llama-spm.gguf"));
  auto a = Tokenizer::from_gguf(*g);
  auto b = Tokenizer::from_model_file(shared_model("llama2-tokenizer.model"));
  ASSERT_EQ(a->n_vocab(), b->n_vocab());
  EXPECT_EQ(a->bos(), b->bos());
  EXPECT_EQ(a->eos(), b->eos());
  for (int i = 0; i < a->n_vocab(); ++i) {
    ASSERT_EQ(a->id_to_piece(i), b->id_to_piece(i)) << i;
    ASSERT_EQ(a->score(i), b->score(i)) << i;
    ASSERT_EQ(a->token_type(i), b->token_type(i)) << i;
  }
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_text(rng);
    const std::vector<int> ids = a->encode(s, false);
    ASSERT_EQ(ids, b->encode(s, false)) << "text: '" << s << "'";
    // Byte fallback and the identity normalizer make encoding lossless.
    EXPECT_EQ(a->decode(ids), s);
    std::string streamed;
    int prev = a->bos();
    for (int id : ids) {
      streamed += a->token_to_piece(prev, id);
      prev = id;
    }
    EXPECT_EQ(streamed, s);
  }
}

TEST(TokenizerStories, ModelFileEncodesGoldenSentence) {
  auto tok = Tokenizer::from_model_file(shared_model("stories260K-tok512.model"));
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->encode(kOnceUponATime, false), kOnceUponATimeIds);
  std::vector<int> with_bos = {1};
  with_bos.insert(with_bos.end(), kOnceUponATimeIds.begin(), kOnceUponATimeIds.end());
  EXPECT_EQ(tok->encode(kOnceUponATime, true), with_bos);
}

TEST(TokenizerStories, GgufEncodesGoldenSentence) {
  // stories260K.gguf has no tokenizer.ggml.remove_extra_whitespaces, so the
  // default (false, as llama.cpp) applies; this sentence has no runs of
  // spaces, so both settings give the model file's ids.
  auto g = GgufFile::open(shared_model("stories260K.gguf"));
  ASSERT_EQ(g->find("tokenizer.ggml.remove_extra_whitespaces"), nullptr);
  auto tok = Tokenizer::from_gguf(*g);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->encode(kOnceUponATime, false), kOnceUponATimeIds);
}

TEST(TokenizerStories, RemoveExtraWhitespacesFollowsTheGgufKey) {
  // The tok512.model itself removes extra whitespace; a GGUF that says so
  // must encode like it, and the default must not.
  auto model = Tokenizer::from_model_file(shared_model("stories260K-tok512.model"));
  const std::string spaced = "  Once  upon a   time.  ";
  auto kv = stories_vocab_kv();
  kv.push_back({"tokenizer.ggml.remove_extra_whitespaces", GgufValue::make_bool(true)});
  auto g_on = open_vocab_gguf("rew_on", kv);
  EXPECT_EQ(Tokenizer::from_gguf(*g_on)->encode(spaced, false), model->encode(spaced, false));
  auto g_off = GgufFile::open(shared_model("stories260K.gguf"));
  EXPECT_NE(Tokenizer::from_gguf(*g_off)->encode(spaced, false), model->encode(spaced, false));
}

TEST(TokenizerStories, AddSpacePrefixFollowsTheGgufKey) {
  // Without the dummy prefix, " text" must encode as "text" does with it.
  auto kv = stories_vocab_kv();
  kv.push_back({"tokenizer.ggml.add_space_prefix", GgufValue::make_bool(false)});
  auto g_off = open_vocab_gguf("no_prefix", kv);
  auto g_on = GgufFile::open(shared_model("stories260K.gguf"));
  auto off = Tokenizer::from_gguf(*g_off);
  auto on = Tokenizer::from_gguf(*g_on);
  EXPECT_EQ(off->encode(std::string(" ") + kOnceUponATime, false), kOnceUponATimeIds);
  EXPECT_EQ(on->encode(kOnceUponATime, false), kOnceUponATimeIds);
  EXPECT_NE(off->encode(kOnceUponATime, false), kOnceUponATimeIds);
}

TEST(TokenizerStories, StreamingDecodeMatchesGreedyGolden) {
  const std::vector<int> ids = parse_ids(read_file(shared_model("stories260K.greedy200.ids.txt")));
  ASSERT_EQ(ids.size(), 200u);
  const std::string golden = read_file(shared_model("stories260K.greedy200.txt"));
  auto g = GgufFile::open(shared_model("stories260K.gguf"));
  std::unique_ptr<Tokenizer> toks[] = {Tokenizer::from_model_file(shared_model("stories260K-tok512.model")),
                                       Tokenizer::from_gguf(*g)};
  for (const auto& tok : toks) {
    std::string text;
    int prev = tok->bos();  // the run fed BOS at position 0
    for (int id : ids) {
      text += tok->token_to_piece(prev, id);
      prev = id;
    }
    EXPECT_EQ(text, golden);
  }
}

TEST(TokenizerPieces, StreamingRules) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  auto tok = Tokenizer::from_model_file(shared_model("llama2-tokenizer.model"));
  const int once = tok->piece_to_id("\xe2\x96\x81Once");
  ASSERT_GE(once, 0);
  EXPECT_EQ(tok->token_to_piece(tok->bos(), once), "Once");  // dummy prefix dropped after BOS
  EXPECT_EQ(tok->token_to_piece(once, once), " Once");
  EXPECT_EQ(tok->token_to_piece(once, tok->bos()), "");
  EXPECT_EQ(tok->token_to_piece(once, tok->eos()), "");
  EXPECT_EQ(tok->token_to_piece(once, tok->piece_to_id("<0x0A>")), "\n");
  EXPECT_EQ(tok->token_to_piece(once, tok->piece_to_id("<0xE4>")), "\xe4");
  EXPECT_EQ(tok->token_type(tok->piece_to_id("<0xE4>")), 6);
  EXPECT_EQ(tok->token_type(tok->bos()), 3);
  EXPECT_EQ(tok->token_type(0), 2);
  EXPECT_THROW(tok->token_to_piece(once, 32000), Error);
  EXPECT_THROW(tok->decode({5, -1}), Error);
}

TEST(TokenizerSpecial, ParsesControlTokens) {
  RUNLM_REQUIRE_ASSET(shared_model("llama2-tokenizer.model"));
  auto tok = Tokenizer::from_model_file(shared_model("llama2-tokenizer.model"));
  const std::vector<int> ids = tok->encode("<s>[INST] hi [/INST]", false, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok->bos());
  // The text after a special token is encoded as its own fragment.
  std::vector<int> expect = {tok->bos()};
  const auto rest = tok->encode("[INST] hi [/INST]", false);
  expect.insert(expect.end(), rest.begin(), rest.end());
  EXPECT_EQ(ids, expect);
  // Without parse_special "<s>" is plain text.
  const auto plain = tok->encode("<s>[INST] hi [/INST]", false, false);
  EXPECT_NE(plain[0], tok->bos());
  EXPECT_EQ(tok->decode(plain), "<s>[INST] hi [/INST]");

  const auto turns = tok->encode("a</s><s>b</s>", true, true);
  const auto a = tok->encode("a", false), b = tok->encode("b", false);
  std::vector<int> want = {tok->bos()};
  want.insert(want.end(), a.begin(), a.end());
  want.push_back(tok->eos());
  want.push_back(tok->bos());
  want.insert(want.end(), b.begin(), b.end());
  want.push_back(tok->eos());
  EXPECT_EQ(turns, want);
}

TEST(TokenizerSpecial, LongestSpecialTokenWins) {
  // Adds user-defined "<|im_start|>" and "<|im_end|>" and a control "<|im" to
  // the stories vocabulary: at "<|im_start|>" the longer text must win.
  auto kv = stories_vocab_kv();
  auto tokens = find_kv(kv, "tokenizer.ggml.tokens");
  auto scores = find_kv(kv, "tokenizer.ggml.scores");
  auto types = find_kv(kv, "tokenizer.ggml.token_type");
  ASSERT_TRUE(tokens && scores && types);
  const std::vector<std::pair<std::string, int>> extra = {{"<|im", 3}, {"<|im_start|>", 4}, {"<|im_end|>", 4}};
  for (const auto& [text, type] : extra) {
    tokens->arr.push_back(GgufValue::make_string(text));
    scores->arr.push_back(GgufValue::make_f32(0));
    types->arr.push_back(GgufValue::make_i32(type));
  }
  auto g = open_vocab_gguf("specials", kv);
  auto tok = Tokenizer::from_gguf(*g);
  auto plain = Tokenizer::from_model_file(shared_model("stories260K-tok512.model"));
  ASSERT_EQ(tok->n_vocab(), 515);
  const int im = 512, im_start = 513, im_end = 514;
  EXPECT_EQ(tok->token_type(im), 3);
  EXPECT_EQ(tok->token_type(im_start), 4);
  std::vector<int> want = {im_start};
  const auto mid = plain->encode("user\nhi", false);
  want.insert(want.end(), mid.begin(), mid.end());
  want.push_back(im_end);
  want.push_back(im);
  const auto tail = plain->encode("x", false);
  want.insert(want.end(), tail.begin(), tail.end());
  EXPECT_EQ(tok->encode("<|im_start|>user\nhi<|im_end|><|imx", false, true), want);
}

TEST(TokenizerErrors, BadModelPathNamesThePath) {
  const std::string path = "/nonexistent/dir/tokenizer.model";
  const std::string msg = error_of([&] { Tokenizer::from_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  // A file that is not a sentencepiece model.
  const std::string bad = error_of([&] { Tokenizer::from_model_file(shared_model("stories260K.greedy200.txt")); });
  EXPECT_NE(bad.find("stories260K.greedy200.txt"), std::string::npos) << bad;
}

TEST(TokenizerErrors, UnsupportedTokenizerModelIsNamed) {
  auto kv = stories_vocab_kv();
  *find_kv(kv, "tokenizer.ggml.model") = GgufValue::make_string("bert");
  auto g = open_vocab_gguf("bert", kv);
  const std::string msg = error_of([&] { Tokenizer::from_gguf(*g); });
  EXPECT_NE(msg.find("'bert'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported: llama (SentencePiece), gpt2 (byte-level BPE)"), std::string::npos) << msg;
}

TEST(TokenizerErrors, InconsistentVocabularies) {
  struct Case {
    const char* name;
    std::function<void(std::vector<GgufKV>&)> edit;
    const char* expect;  // in the message
  };
  const std::vector<Case> cases = {
      {"short_scores", [](auto& kv) { find_kv(kv, "tokenizer.ggml.scores")->arr.pop_back(); },
       "tokenizer.ggml.scores"},
      {"short_types", [](auto& kv) { find_kv(kv, "tokenizer.ggml.token_type")->arr.pop_back(); },
       "tokenizer.ggml.token_type"},
      {"empty",
       [](auto& kv) {
         find_kv(kv, "tokenizer.ggml.tokens")->arr.clear();
         find_kv(kv, "tokenizer.ggml.scores")->arr.clear();
         find_kv(kv, "tokenizer.ggml.token_type")->arr.clear();
       },
       "empty"},
      {"no_tokens",
       [](auto& kv) {
         for (size_t i = 0; i < kv.size(); ++i)
           if (kv[i].key == "tokenizer.ggml.tokens") kv.erase(kv.begin() + static_cast<long>(i));
       },
       "tokenizer.ggml.tokens"},
      {"bad_type", [](auto& kv) { find_kv(kv, "tokenizer.ggml.token_type")->arr[300] = GgufValue::make_i32(9); },
       "token_type[300]"},
      {"bos_out_of_range",
       [](auto& kv) { *find_kv(kv, "tokenizer.ggml.bos_token_id") = GgufValue::make_u32(512); },
       "tokenizer.ggml.bos_token_id"},
      {"duplicate_piece",
       [](auto& kv) { find_kv(kv, "tokenizer.ggml.tokens")->arr[300] = GgufValue::make_string("he"); },
       "sentencepiece"},
      {"no_unknown", [](auto& kv) { find_kv(kv, "tokenizer.ggml.token_type")->arr[0] = GgufValue::make_i32(1); },
       "unknown"},
  };
  for (const Case& c : cases) {
    auto kv = stories_vocab_kv();
    c.edit(kv);
    auto g = open_vocab_gguf(c.name, kv);
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*g); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(g->path()), std::string::npos) << c.name << ": " << msg;
  }
}
