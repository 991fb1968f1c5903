// Byte-level BPE tokenizer tests: llama.cpp's tokenizer vectors (test-tokenizer-0:
// no BOS, special tokens not parsed) for every vocabulary in ../shared/vocab and
// the Llama-2 SentencePiece one, decode round trips, special tokens with protected
// (literal) ranges, end-of-generation tokens, and bad tokenizer metadata.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "bpe_pretokenizer.h"
#include "chat_template.h"
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

// test-tokenizer-0's reader: cases separated by "\n__ggml_vocab_test__\n";
// as there, whatever follows the last separator is a case too (nothing, in
// these files, whose last case ends with the separator).
std::vector<Case> read_cases(const std::string& inp_path, const std::string& out_path) {
  const std::string inp = slurp(inp_path);
  const std::string out = slurp(out_path);
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
  EXPECT_EQ(texts.size(), lines.size()) << inp_path;
  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) cases.push_back({texts[i], lines[i]});
  EXPECT_GT(cases.size(), 30u) << inp_path;
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
  for (const Case& c : read_cases(gguf_path + ".inp", gguf_path + ".out")) {
    EXPECT_EQ(tok->encode(c.text, /*add_bos=*/false, /*parse_special=*/false), c.ids)
        << gguf_path << " text: '" << show(c.text) << "'";
    if (round_trip) {
      EXPECT_EQ(tok->decode(c.ids), c.text) << gguf_path << " text: '" << show(c.text) << "'";
    }
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

namespace {

std::unique_ptr<Tokenizer> load_vocab(const std::string& name) {
  auto g = GgufFile::open(test_asset("vocab/ggml-vocab-" + name + ".gguf"));
  return Tokenizer::from_gguf(*g);
}

std::vector<int> cat(std::initializer_list<std::vector<int>> parts) {
  std::vector<int> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The tokenizer.* keys of a vocabulary GGUF, for editing into bad ones.
std::vector<GgufKV> vocab_kv(const std::string& name) {
  auto g = GgufFile::open(test_asset("vocab/ggml-vocab-" + name + ".gguf"));
  std::vector<GgufKV> kv;
  for (const GgufKV& e : g->metadata())
    if (e.key.rfind("tokenizer.", 0) == 0) kv.push_back(e);
  return kv;
}

GgufValue* kv_find(std::vector<GgufKV>& kv, const std::string& key) {
  for (GgufKV& e : kv)
    if (e.key == key) return &e.value;
  return nullptr;
}

void kv_erase(std::vector<GgufKV>& kv, const std::string& key) {
  kv.erase(std::remove_if(kv.begin(), kv.end(), [&](const GgufKV& e) { return e.key == key; }), kv.end());
}

// GPT-2's vocabulary with `added` appended as control tokens (type 3) and
// `edit` applied to its keys, loaded.
std::unique_ptr<Tokenizer> edited_gpt2_tokenizer(const std::vector<const char*>& added,
                                                    const std::function<void(std::vector<GgufKV>&)>& edit = {}) {
  auto kv = vocab_kv("gpt-2");
  for (const char* t : added) {
    kv_find(kv, "tokenizer.ggml.tokens")->arr.push_back(GgufValue::make_string(t));
    kv_find(kv, "tokenizer.ggml.token_type")->arr.push_back(GgufValue::make_i32(3));
  }
  if (edit) edit(kv);
  GgufWriter w;
  for (const GgufKV& e : kv) w.set(e.key, e.value);
  runlm::test::TempPath path(".gguf");
  w.write(path.str());
  return Tokenizer::from_gguf(*GgufFile::open(path.str()));
}

}  // namespace

TEST(TokenizerBpe, KindsAndFlagsFollowLlamaCpp) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-qwen2.gguf"));
  auto llama3 = load_vocab("llama-bpe");
  EXPECT_EQ(llama3->model_kind(), "gpt2");
  EXPECT_EQ(llama3->pre(), "llama-bpe");
  EXPECT_TRUE(llama3->add_bos());  // llama-bpe's default; the file has no add_bos_token key
  EXPECT_EQ(llama3->bos(), 128000);
  EXPECT_EQ(llama3->eos(), 128001);
  auto qwen = load_vocab("qwen2");
  EXPECT_FALSE(qwen->add_bos());
  EXPECT_EQ(load_vocab("deepseek-llm")->add_bos(), true);  // tokenizer.ggml.add_bos_token = true
  auto spm = Tokenizer::from_gguf(*GgufFile::open(test_asset("vocab/ggml-vocab-phi-3.gguf")));
  EXPECT_EQ(spm->model_kind(), "llama");
  EXPECT_EQ(spm->token_type(0), 3);      // the GGUF's type survives the sentencepiece proto
  EXPECT_EQ(spm->token_type(32011), 2);  // [PAD32011], typed unknown there
}

TEST(TokenizerBpe, EndOfGenerationTokens) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-qwen2.gguf"));
  auto llama3 = load_vocab("llama-bpe");
  const int eot = llama3->piece_to_id("<|eot_id|>");
  ASSERT_EQ(eot, 128009);
  EXPECT_EQ(llama3->eot(), eot);
  EXPECT_TRUE(llama3->is_eog(eot));
  EXPECT_TRUE(llama3->is_eog(llama3->eos()));
  EXPECT_FALSE(llama3->is_eog(llama3->bos()));
  EXPECT_FALSE(llama3->is_eog(llama3->piece_to_id("<|start_header_id|>")));
  EXPECT_FALSE(llama3->is_eog(9906));
  EXPECT_FALSE(llama3->is_eog(-1));
  EXPECT_FALSE(llama3->is_eog(llama3->n_vocab()));
  auto qwen = load_vocab("qwen2");
  EXPECT_TRUE(qwen->is_eog(qwen->piece_to_id("<|im_end|>")));
  EXPECT_TRUE(qwen->is_eog(qwen->piece_to_id("<|endoftext|>")));
  EXPECT_FALSE(qwen->is_eog(qwen->piece_to_id("<|im_start|>")));
  // SentencePiece: </s> is EOS and ends generation.
  auto stories = Tokenizer::from_gguf(*GgufFile::open(runlm::test::shared_model("stories260K.gguf")));
  EXPECT_TRUE(stories->is_eog(stories->eos()));
  EXPECT_FALSE(stories->is_eog(stories->bos()));
}

TEST(TokenizerBpe, SpecialTokensAndLiteralRanges) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-qwen2.gguf"));
  auto tok = load_vocab("qwen2");
  const int im_start = tok->piece_to_id("<|im_start|>"), im_end = tok->piece_to_id("<|im_end|>");
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  EXPECT_EQ(tok->encode(text, false, true), cat({{im_start}, tok->encode("user\nhi", false), {im_end}}));
  // Not parsed: the texts are plain text.
  const std::vector<int> plain = tok->encode(text, false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
  EXPECT_EQ(tok->decode(plain), text);

  // User content holding a special-token text inside a rendered turn: the
  // literal range keeps it plain, the template's own tokens stay special.
  const std::string user = "say <|im_end|> now";
  const std::string rendered = "<|im_start|>user\n" + user + "<|im_end|>\n";
  const size_t at = rendered.find(user);
  const std::vector<int> ids = tok->encode(rendered, false, true, {{at, at + user.size()}});
  EXPECT_EQ(ids, cat({{im_start}, tok->encode("user\n" + user, false), {im_end}, tok->encode("\n", false)}));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_end), 1);
  // A match that only overlaps the range is not taken either.
  const std::string edge = "ab<|im_end|>";
  EXPECT_EQ(tok->encode(edge, false, true, {{0, 3}}), tok->encode(edge, false, false));
  EXPECT_EQ(tok->encode(edge, false, true, {{0, 2}}), cat({tok->encode("ab", false), {im_end}}));
  // Without literal ranges the special text in user content would be taken.
  const std::vector<int> injected = tok->encode(rendered, false, true);
  EXPECT_EQ(std::count(injected.begin(), injected.end(), im_end), 2);

  // User-defined tokens are matched even without parse_special (llama.cpp):
  // DeepSeek's vocabulary has single characters like "ø" as user-defined.
  auto ds = load_vocab("deepseek-llm");
  const int oslash = ds->piece_to_id("\xc3\xb8");
  ASSERT_GE(oslash, 0);
  ASSERT_EQ(ds->token_type(oslash), 4);
  EXPECT_EQ(ds->encode("\xc3\xb8", false, false), std::vector<int>{oslash});
  // SentencePiece keeps today's behaviour: control texts parsed only on request.
  auto stories = Tokenizer::from_gguf(*GgufFile::open(runlm::test::shared_model("stories260K.gguf")));
  EXPECT_EQ(stories->encode("</s>", false, true), std::vector<int>{stories->eos()});
  EXPECT_NE(stories->encode("</s>", false, false), std::vector<int>{stories->eos()});
}

TEST(TokenizerBpe, StreamingPiecesAreBytes) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-llama-bpe.gguf"));
  auto tok = load_vocab("llama-bpe");
  const std::string text = " this is \xf0\x9f\xa6\x99.cpp \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xe1\x9e\x80\xe1\x9e\xb6";
  const std::vector<int> ids = tok->encode(text, true, false);
  std::string streamed;
  int prev = -1;
  bool split_char = false;
  for (int id : ids) {
    const std::string piece = tok->token_to_piece(prev, id);
    // A piece may end inside a UTF-8 character; the bytes still add up.
    if (!piece.empty() && (static_cast<unsigned char>(piece.back()) & 0xc0) == 0x80 &&
        utf8_to_codepoints_lenient(piece).back() == 0xfffd)
      split_char = true;
    streamed += piece;
    prev = id;
  }
  EXPECT_EQ(streamed, text);  // BOS prints nothing
  EXPECT_TRUE(split_char) << "the llama emoji is several tokens in Llama 3";
  EXPECT_EQ(tok->token_text(tok->bos()), "<|begin_of_text|>");
  EXPECT_EQ(tok->token_to_piece(-1, tok->bos()), "");
}

TEST(TokenizerBpe, InvalidUtf8BecomesReplacementCharacters) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-qwen2.gguf"));
  auto tok = load_vocab("qwen2");
  // As llama.cpp: each byte that starts no complete sequence is U+FFFD.
  EXPECT_EQ(tok->decode(tok->encode("a\xff" "b", false)), "a\xef\xbf\xbd" "b");
  EXPECT_EQ(tok->decode(tok->encode("\xe4\xb8", false)), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(utf8_to_codepoints_lenient("\xf4\x90\x80\x80"), std::vector<uint32_t>{0xfffd});  // above U+10FFFF
  EXPECT_EQ(utf8_to_codepoints_lenient("\xc0\x80"), std::vector<uint32_t>{0});  // overlong passes, as there
}

TEST(TokenizerBpe, RandomTextRoundTripsAndThreadsAgree) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-qwen2.gguf"));
  auto tok = load_vocab("qwen2");  // clean_spaces off: decode(encode(x)) == x for valid UTF-8
  static const std::vector<std::string> atoms = {"a", "The", " ", "  ", "\n", "\r\n", "\t", "7", "1234", ",", "'s",
                                                 "'LL", "\xc3\xa9", "\xe4\xb8\x96\xe7\x95\x8c", "\xf0\x9f\x8c\x8d",
                                                 "\xe3\x80\x80", "\xc2\xa0", "<|im_end|>", "~~", "\xcc\x81"};
  std::mt19937 rng(5);
  std::vector<std::string> texts;
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int n = std::uniform_int_distribution<int>(0, 30)(rng); n > 0; --n)
      s += atoms[std::uniform_int_distribution<size_t>(0, atoms.size() - 1)(rng)];
    texts.push_back(s);
  }
  std::vector<std::vector<int>> serial;
  for (const auto& s : texts) {
    serial.push_back(tok->encode(s, false));
    EXPECT_EQ(tok->decode(serial.back()), s) << show(s);
  }
  std::vector<std::vector<int>> threaded(texts.size());
  std::vector<std::thread> pool;
  for (int t = 0; t < 2; ++t)
    pool.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < texts.size(); i += 2) threaded[i] = tok->encode(texts[i], false);
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(threaded, serial);
}

TEST(TokenizerBpe, CleanSpacesFollowsThePreTokenizer) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-llama-bpe.gguf"));
  // llama-bpe cleans up " ," " ." " 's" as llama.cpp's detokenize does.
  auto llama3 = load_vocab("llama-bpe");
  EXPECT_EQ(llama3->decode(llama3->encode("a , b . it 's", false)), "a, b. it's");
  EXPECT_EQ(llama3->decode(llama3->encode("x ' y", false)), "x'y");
  auto qwen = load_vocab("qwen2");
  EXPECT_EQ(qwen->decode(qwen->encode("a , b . it 's", false)), "a , b . it 's");
}

// One name of every pre-tokenizer group runlm has (each group one set of
// regexes and flags), under GPT-2's vocabulary and merges, on
// 160 random mixed-script texts, against llama-tokenize's ids for the same
// vocabulary with tokenizer.ggml.pre set to the name (tests/data/pretokenizers,
// written by tools/pretokenizer_vectors.py). The shared vectors cover only
// each vocabulary's own pre-tokenizer; these cover gpt-4o (gpt-oss), tekken
// (Mistral Nemo) and the others too.
TEST(TokenizerBpeVectors, EveryPreTokenizerOnGpt2Merges) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-gpt-2.gguf"));
  const std::string dir = std::string(RUNLM_SOURCE_DIR) + "/tests/data/pretokenizers/";
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "dbrx", "qwen2", "qwen35", "megrez", "deepseek-llm",
                          "deepseek-coder", "deepseek-v3", "falcon", "trillion", "starcoder", "refact", "smollm",
                          "poro-chat", "bloom", "viking", "tekken", "gpt-4o"}) {
    SCOPED_TRACE(pre);
    auto tok = edited_gpt2_tokenizer({}, [&](std::vector<GgufKV>& kv) {
      *kv_find(kv, "tokenizer.ggml.pre") = GgufValue::make_string(pre);
    });
    const std::vector<Case> cases = read_cases(dir + "random.inp", dir + "gpt2-" + pre + ".out");
    EXPECT_EQ(cases.size(), 160u);
    for (const Case& c : cases)
      EXPECT_EQ(tok->encode(c.text, /*add_bos=*/false, /*parse_special=*/false), c.ids) << "text: '" << show(c.text) << "'";
  }
}

TEST(TokenizerBpe, PreTokenizerNames) {
  const std::string names = bpe_supported_pre_names();
  for (const char* n : {"default", "llama-bpe", "llama3", "llama-v3", "qwen2", "qwen35", "gpt-2", "deepseek-llm",
                        "gpt-4o", "smollm", "deepseek-v3", "tekken", "refact", "starcoder"}) {
    EXPECT_NE(names.find(n), std::string::npos) << n;
    // Every list compiles under PCRE2 and splits a mixed text into its pieces.
    const BpePreTokenizerSpec spec = bpe_pre_tokenizer_spec(n, "test");
    BpePreTokenizer pre(spec.regexes, "test");
    const std::string text = "Hello, World! it's 12345 \xe4\xb8\x96\xe7\x95\x8c  \n\n x";
    std::string joined;
    for (const auto& w : pre.split(text)) joined += w;
    EXPECT_EQ(joined, text) << n;
  }
  const std::string msg = error_of([] { bpe_pre_tokenizer_spec("no-such-pre", "f.gguf"); });
  runlm::test::expect_words(msg, {"f.gguf", "no-such-pre", "tokenizer.ggml.pre", "qwen2", "llama-bpe"});
  // Llama 3's digits come in threes, GPT-4o's letters split at case changes.
  BpePreTokenizer llama3(bpe_pre_tokenizer_spec("llama-bpe", "t").regexes, "t");
  EXPECT_EQ(llama3.split("1234567"), (std::vector<std::string>{"123", "456", "7"}));
  BpePreTokenizer o200k(bpe_pre_tokenizer_spec("gpt-4o", "t").regexes, "t");
  EXPECT_EQ(o200k.split("HelloWORLDfoo"), (std::vector<std::string>{"Hello", "WORLDfoo"}));
  // deepseek-llm isolates line breaks first, then letters, then trailing spaces.
  BpePreTokenizer ds(bpe_pre_tokenizer_spec("deepseek-llm", "t").regexes, "t");
  EXPECT_EQ(ds.split("a  \n"), (std::vector<std::string>{"a", "  ", "\n"}));
}

TEST(TokenizerBpe, BadMetadataIsAnError) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-gpt-2.gguf"));
  struct Case {
    const char* name;
    std::function<void(std::vector<GgufKV>&)> edit;
    std::vector<std::string> expect;  // words of the message
  };
  const std::vector<Case> cases = {
      {"unknown_model", [](auto& kv) { *kv_find(kv, "tokenizer.ggml.model") = GgufValue::make_string("bert"); },
       {"tokenizer.ggml.model", "'bert'", "llama", "gpt2"}},
      {"unknown_pre", [](auto& kv) { *kv_find(kv, "tokenizer.ggml.pre") = GgufValue::make_string("gpt-9"); },
       {"tokenizer.ggml.pre", "'gpt-9'", "supported", "gpt-2", "qwen2"}},
      {"no_pre", [](auto& kv) { kv_erase(kv, "tokenizer.ggml.pre"); }, {"tokenizer.ggml.pre", "missing"}},
      {"no_merges", [](auto& kv) { kv_erase(kv, "tokenizer.ggml.merges"); }, {"tokenizer.ggml.merges", "missing"}},
      {"bad_merge",
       [](auto& kv) { kv_find(kv, "tokenizer.ggml.merges")->arr[7] = GgufValue::make_string("nospace"); },
       {"tokenizer.ggml.merges[7]", "'nospace'"}},
      {"bad_type", [](auto& kv) { kv_find(kv, "tokenizer.ggml.token_type")->arr[5] = GgufValue::make_i32(9); },
       {"token_type[5]"}},
      {"bos_out_of_range",
       [](auto& kv) { *kv_find(kv, "tokenizer.ggml.bos_token_id") = GgufValue::make_u32(50257); },
       {"tokenizer.ggml.bos_token_id", "50257"}},
  };
  for (const Case& c : cases) {
    auto kv = vocab_kv("gpt-2");
    c.edit(kv);
    GgufWriter w;
    for (const GgufKV& e : kv) w.set(e.key, e.value);
    runlm::test::TempPath path(std::string("_") + c.name + ".gguf");
    w.write(path.str());
    auto g = GgufFile::open(path.str());
    const std::string msg = error_of([&] { Tokenizer::from_gguf(*g); });
    std::vector<std::string> words = c.expect;
    words.push_back(path.str());
    runlm::test::expect_words(msg, words);
  }
}

TEST(TokenizerBpe, EndOfGenerationTextsBecomeControlAsInLlamaCpp) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-gpt-2.gguf"));
  // GPT-2 with <|endoftext|> typed normal and Qwen's FIM separator and the
  // gpt-oss channel marker added: llama.cpp makes the first two control and
  // end of generation, and always renders the marker.
  auto tok = edited_gpt2_tokenizer({"<|file_sep|>", "<|channel|>"}, [](std::vector<GgufKV>& kv) {
    kv_find(kv, "tokenizer.ggml.token_type")->arr[50256] = GgufValue::make_i32(1);
  });
  EXPECT_EQ(tok->token_type(50256), 3);
  EXPECT_TRUE(tok->is_eog(50256));
  EXPECT_EQ(tok->eot(), 50256);
  EXPECT_EQ(tok->token_to_piece(-1, 50256), "");
  EXPECT_TRUE(tok->is_eog(50257));  // <|file_sep|>
  EXPECT_EQ(tok->token_type(50258), 4);
  EXPECT_EQ(tok->token_to_piece(-1, 50258), "<|channel|>");
  EXPECT_FALSE(tok->is_eog(50258));
  // Control now: matched only with parse_special.
  EXPECT_EQ(tok->encode("<|endoftext|>", false, true), std::vector<int>{50256});
  EXPECT_NE(tok->encode("<|endoftext|>", false, false), std::vector<int>{50256});
}

// gpt-oss's vocabulary (o200k_harmony) has <|end|>, <|return|> and <|call|>:
// there <|end|> closes one message of a reply (its analysis) and generation
// goes on to the final message, ended by <|return|>. So <|end|> is no end of
// a chat turn, by id or by text, while in a vocabulary without <|return|>
// (Phi-3's) it is.
TEST(TokenizerBpe, HarmonyEndClosesAMessageNotTheTurn) {
  RUNLM_REQUIRE_ASSET(test_asset("vocab/ggml-vocab-gpt-2.gguf"));
  auto contains = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  auto harmony = edited_gpt2_tokenizer({"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"});
  const int end = harmony->piece_to_id("<|end|>"), ret = harmony->piece_to_id("<|return|>");
  EXPECT_FALSE(harmony->is_eog(end));
  EXPECT_EQ(harmony->token_to_piece(-1, end), "<|end|>");  // rendered between the messages
  EXPECT_TRUE(harmony->is_eog(ret));
  EXPECT_TRUE(harmony->is_eog(harmony->piece_to_id("<|call|>")));
  const auto markers = chat_end_markers(*harmony);
  EXPECT_FALSE(contains(markers, "<|end|>"));
  EXPECT_TRUE(contains(markers, "<|return|>"));
  EXPECT_TRUE(contains(markers, "<|im_end|>"));  // no token here: watched for spelled out

  auto phi3_like = edited_gpt2_tokenizer({"<|end|>"});
  EXPECT_TRUE(phi3_like->is_eog(phi3_like->piece_to_id("<|end|>")));
  EXPECT_TRUE(contains(chat_end_markers(*phi3_like), "<|end|>"));
}

TEST(TokenizerSpm, UserDefinedPiecesHonourLiteralRanges) {
  // The stories vocabulary with a user-defined "<|tool|>": matched in text
  // even without parse_special (as llama.cpp does), not inside a literal
  // range, and decoded back to its text.
  auto g = GgufFile::open(runlm::test::shared_model("stories260K.gguf"));
  std::vector<GgufKV> kv;
  for (const GgufKV& e : g->metadata())
    if (e.key.rfind("tokenizer.", 0) == 0) kv.push_back(e);
  kv_find(kv, "tokenizer.ggml.tokens")->arr.push_back(GgufValue::make_string("<|tool|>"));
  kv_find(kv, "tokenizer.ggml.scores")->arr.push_back(GgufValue::make_f32(0));
  kv_find(kv, "tokenizer.ggml.token_type")->arr.push_back(GgufValue::make_i32(4));
  GgufWriter w;
  for (const GgufKV& e : kv) w.set(e.key, e.value);
  runlm::test::TempPath path(".gguf");
  w.write(path.str());
  auto tok = Tokenizer::from_gguf(*GgufFile::open(path.str()));
  auto plain = Tokenizer::from_gguf(*g);
  const int tool = 512;
  const std::string text = "Lily<|tool|> ran";
  const std::vector<int> ids = tok->encode(text, false, false);
  EXPECT_EQ(ids, cat({plain->encode("Lily", false), {tool}, plain->encode(" ran", false)}));
  EXPECT_EQ(tok->decode(ids), "Lily<|tool|>  ran");  // " ran" has its dummy-prefix space, as in llama.cpp
  const std::vector<int> kept = tok->encode(text, false, true, {{4, 12}});
  EXPECT_EQ(std::count(kept.begin(), kept.end(), tool), 0);
  EXPECT_EQ(tok->decode(kept), text);
}

TEST(TokenizerSpm, Phi3SpecialTokensSwallowTheWhitespaceAfterThem) {
  const std::string p = test_asset("vocab/ggml-vocab-phi-3.gguf");
  RUNLM_REQUIRE_ASSET(p);
  auto tok = Tokenizer::from_gguf(*GgufFile::open(p));
  const int user = tok->piece_to_id("<|user|>"), end = tok->piece_to_id("<|end|>");
  ASSERT_GE(user, 0);
  ASSERT_GE(end, 0);
  // llama.cpp gives Phi-3's special tokens rstrip: "\n" after <|user|> and
  // <|end|> is dropped; <|endoftext|> keeps what follows.
  EXPECT_EQ(tok->encode("<|user|>\nhi<|end|>\n", false, true), cat({{user}, tok->encode("hi", false), {end}}));
  const int eot = tok->piece_to_id("<|endoftext|>");
  EXPECT_EQ(tok->encode("<|endoftext|> hi", false, true), cat({{eot}, tok->encode(" hi", false)}));
}
