// libFuzzer target: the byte-level BPE tokenizer on arbitrary bytes (valid
// and invalid UTF-8): pre-tokenizer regexes (PCRE2), merges, special-token
// partition with and without parse_special, literal ranges, decode,
// token_to_piece, and decode of arbitrary (also out-of-range) ids, on three
// of llama.cpp's vocabularies: Qwen 2 (qwen2), Llama 3 (llama-bpe), GPT-2
// (gpt-2).
//
// Input: byte 0 picks the vocabulary (bits 0-1) and the flags (bit 2
// parse_special, bit 3 add_bos, bit 4 a literal range over the text's first
// half); the rest is the text, and is also read as little-endian int32 token
// ids. Besides "no crash", it checks properties that hold for any input: ids
// are in range, the streamed pieces add up to the decode for Qwen 2 (which,
// unlike llama-bpe and gpt-2, does not clean up spaces in decode), and with
// Qwen 2 without parse_special
// decode(encode(text)) is the text as llama.cpp reads it (each byte that
// starts no complete UTF-8 sequence becomes U+FFFD).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bpe_pretokenizer.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

using namespace runlm;

namespace {

// The test-data root as the tests find it: $RUNLM_TEST_DATA, else ../shared
// beside the source tree.
std::string vocab_dir() {
  const char* env = std::getenv("RUNLM_TEST_DATA");
  return (env && *env ? std::string(env) : std::string(RUNLM_SOURCE_DIR) + "/../shared") + "/vocab/";
}

struct Vocabs {
  std::unique_ptr<Tokenizer> tok[3];
  Vocabs() {
    const std::string kVocab = vocab_dir();
    tok[0] = Tokenizer::from_gguf(*GgufFile::open(kVocab + "ggml-vocab-qwen2.gguf"));
    tok[1] = Tokenizer::from_gguf(*GgufFile::open(kVocab + "ggml-vocab-llama-bpe.gguf"));
    tok[2] = Tokenizer::from_gguf(*GgufFile::open(kVocab + "ggml-vocab-gpt-2.gguf"));
  }
};

const Vocabs& vocabs() {
  static const Vocabs v;  // loaded once: 150k-token vocabularies take a while
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] & 3;
  if (which == 3) return 0;
  const bool parse_special = data[0] & 4, add_bos = data[0] & 8, literal = data[0] & 16;
  const Tokenizer& tok = *vocabs().tok[which];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int n_vocab = tok.n_vocab();

  std::vector<int> ids;
  try {
    ids = literal ? tok.encode(text, add_bos, parse_special, {{0, text.size() / 2}})
                  : tok.encode(text, add_bos, parse_special);
  } catch (const Error&) {
    return 0;
  }
  for (int id : ids)
    if (id < 0 || id >= n_vocab) __builtin_trap();
  std::string streamed;
  int prev = -1;
  for (int id : ids) {
    streamed += tok.token_to_piece(prev, id);
    prev = id;
  }
  const std::string decoded = tok.decode(ids);
  if (which == 0 && streamed != decoded) {  // llama-bpe and gpt-2 clean up spaces in decode only
    std::fprintf(stderr, "streamed pieces (%zu bytes) differ from decode (%zu bytes)\n", streamed.size(),
                 decoded.size());
    std::abort();
  }
  if (which == 0 && !parse_special) {
    std::string expect;
    for (uint32_t c : utf8_to_codepoints_lenient(text)) append_utf8(c, &expect);
    if (decoded != expect) {
      std::fprintf(stderr, "round trip failed: %zu bytes in, %zu out, %zu expected\n", text.size(), decoded.size(),
                   expect.size());
      std::abort();
    }
  }

  // Arbitrary ids, in range or not: each is either decoded or an Error.
  std::vector<int> raw;
  for (size_t i = 1; i + 3 < size; i += 4)
    raw.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) |
                                       (static_cast<uint32_t>(data[i + 3]) << 24)) %
                  (n_vocab + 16));
  try {
    (void)tok.decode(raw);
  } catch (const Error&) {
  }
  for (int id : raw) {
    try {
      (void)tok.token_to_piece(-1, id);
      (void)tok.token_text(id);
      (void)tok.is_eog(id);
    } catch (const Error&) {
    }
  }
  return 0;
}
