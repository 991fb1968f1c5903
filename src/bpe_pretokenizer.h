// The regex pre-tokenizer of byte-level BPE vocabularies: tokenizer.ggml.pre
// names a list of regexes (llama.cpp's LLAMA_VOCAB_PRE_TYPE_* lists in
// llama-vocab.cpp), applied one after the other; each regex splits every
// word so far into its matches and the text between them, as llama.cpp's
// unicode_regex_split does. The regexes run on PCRE2 (UTF + UCP).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace runlm {

struct BpePreTokenizerSpec {
  std::vector<std::string> regexes;
  // llama.cpp's per-pre flags that matter here.
  bool ignore_merges = false;  // a word that is a whole token is taken as it is
  bool clean_spaces = true;    // detokenize removes " ," " ." etc. (clean_up_tokenization_spaces)
  bool add_bos = false;        // default for tokenizer.ggml.add_bos_token
};

// The spec llama.cpp gives a tokenizer.ggml.pre name; an unknown name is an
// Error naming the supported ones (source names the file).
BpePreTokenizerSpec bpe_pre_tokenizer_spec(const std::string& pre, const std::string& source);
// The names accepted, comma separated (for messages and docs).
std::string bpe_supported_pre_names();

class BpePreTokenizer {
 public:
  // Compiles the regexes (an Error naming source on a PCRE2 compile error).
  BpePreTokenizer(const std::vector<std::string>& regexes, const std::string& source);
  ~BpePreTokenizer();
  BpePreTokenizer(const BpePreTokenizer&) = delete;
  BpePreTokenizer& operator=(const BpePreTokenizer&) = delete;

  // Splits text into words. The text is read as llama.cpp reads UTF-8: a
  // byte that does not start a complete sequence becomes U+FFFD (so do code
  // points above U+10FFFF); the words are the UTF-8 of the code points, so
  // their concatenation is the text when it was valid UTF-8. Thread-safe.
  std::vector<std::string> split(const std::string& text) const;

 private:
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> compiled_;
  std::string source_;
};

// Decodes UTF-8 as llama.cpp's unicode_cpts_from_utf8 does (lenient on
// overlong forms and surrogates, U+FFFD for a byte that starts no complete
// sequence); code points above U+10FFFF become U+FFFD.
std::vector<uint32_t> utf8_to_codepoints_lenient(const std::string& text);
void append_utf8(uint32_t cpt, std::string* out);

}  // namespace runlm
