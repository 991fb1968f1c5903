// libFuzzer target: the tokenizer front on arbitrary bytes (valid and invalid
// UTF-8): encode with parse_special on and off and with/without BOS, decode,
// token_to_piece, and decode of arbitrary (also out-of-range) ids, on three
// vocabularies: stories260K (512 tokens, built from the GGUF), Llama 2 (32000,
// from tokenizer.model) and Llama 2 again from ggml-vocab-llama-spm.gguf.
//
// Input: byte 0 picks the vocabulary (bits 0-1) and the flags (bit 2
// parse_special, bit 3 add_bos); the rest is the text, and is also read as
// little-endian int16 token ids. Besides "no crash", it checks properties
// that must hold for any input: ids are in range, and with Llama 2's
// tokenizer.model (identity normalizer, byte fallback, no whitespace
// folding) decode(encode(text)) == text for valid UTF-8 text without NUL
// or U+2581.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

using namespace runlm;

namespace {

// The embedded stories260K, and the Llama-2 vocabularies of the test data
// ($RUNLM_TEST_DATA, default ../shared beside the source tree).
const std::string kEmbedded = std::string(RUNLM_SOURCE_DIR) + "/models/stories260K/";
std::string test_data_models() {
  const char* env = std::getenv("RUNLM_TEST_DATA");
  return (env != nullptr && *env != '\0' ? std::string(env) : std::string(RUNLM_SOURCE_DIR) + "/../shared") + "/models/";
}
constexpr char kSpaceMarker[] = "\xe2\x96\x81";  // U+2581

struct Vocabs {
  std::unique_ptr<Tokenizer> tok[3];
  Vocabs() {
    tok[0] = Tokenizer::from_gguf(*GgufFile::open(kEmbedded + "stories260K.gguf"));
    tok[1] = Tokenizer::from_model_file(test_data_models() + "llama2-tokenizer.model");
    tok[2] = Tokenizer::from_gguf(*GgufFile::open(test_data_models() + "ggml-vocab-llama-spm.gguf"));
  }
};

const Vocabs& vocabs() {
  static const Vocabs v;  // loaded once: a 32000-token vocabulary takes a while
  return v;
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t b = static_cast<uint8_t>(s[i]);
    int n;
    uint32_t c;
    if (b < 0x80) n = 1, c = b;
    else if ((b & 0xe0) == 0xc0) n = 2, c = b & 0x1f;
    else if ((b & 0xf0) == 0xe0) n = 3, c = b & 0x0f;
    else if ((b & 0xf8) == 0xf0) n = 4, c = b & 0x07;
    else return false;
    if (i + n > s.size()) return false;
    for (int k = 1; k < n; ++k) {
      const uint8_t cb = static_cast<uint8_t>(s[i + k]);
      if ((cb & 0xc0) != 0x80) return false;
      c = (c << 6) | (cb & 0x3f);
    }
    if ((n == 2 && c < 0x80) || (n == 3 && c < 0x800) || (n == 4 && c < 0x10000) || c > 0x10ffff ||
        (c >= 0xd800 && c <= 0xdfff))
      return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] & 3;
  if (which == 3) return 0;
  const bool parse_special = data[0] & 4, add_bos = data[0] & 8;
  const Tokenizer& tok = *vocabs().tok[which];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const int n_vocab = tok.n_vocab();

  std::vector<int> ids;
  try {
    ids = tok.encode(text, add_bos, parse_special);
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
  std::string decoded;
  try {
    decoded = tok.decode(ids);
  } catch (const Error&) {
  }
  // Round trip: sentencepiece drops the dummy-prefix space it added, and
  // everything else must come back byte for byte, except its own space
  // marker U+2581, which it decodes to a space by design (as llama.cpp does).
  if (which == 1 && !parse_special && is_valid_utf8(text) && text.find('\0') == std::string::npos &&
      text.find(kSpaceMarker) == std::string::npos && decoded != text) {
    std::fprintf(stderr, "round trip failed: %zu bytes in, %zu out\n", text.size(), decoded.size());
    std::abort();
  }

  // Arbitrary ids, in range or not: each is either decoded or an Error.
  std::vector<int> raw;
  for (size_t i = 1; i + 1 < size; i += 2) raw.push_back(static_cast<int16_t>(data[i] | (data[i + 1] << 8)));
  try {
    (void)tok.decode(raw);
  } catch (const Error&) {
  }
  prev = -1;
  for (int id : raw) {
    try {
      (void)tok.token_to_piece(prev, id);
      (void)tok.id_to_piece(id);
      (void)tok.token_type(id);
    } catch (const Error&) {
    }
    prev = id;
  }
  return 0;
}
