// The vocabulary-kind side of Tokenizer (internal): the SentencePiece and the
// byte-level BPE implementations fill the shared tables and encode/decode
// plain text; tokenizer.cpp does special tokens and end-of-generation on top.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace runlm {

class GgufFile;

// tokenizer.ggml.token_type values (sentencepiece's piece types).
constexpr int kTokenNormal = 1;
constexpr int kTokenUnknown = 2;
constexpr int kTokenControl = 3;
constexpr int kTokenUserDefined = 4;
constexpr int kTokenUnused = 5;
constexpr int kTokenByte = 6;

struct VocabPiece {
  std::string text;
  float score = 0;
  int type = kTokenNormal;
};

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;

  // Appends the ids of a plain-text fragment (one piece of the text between
  // special tokens; SentencePiece gives each its dummy-prefix space, as
  // llama.cpp does).
  virtual void encode_fragment(const std::string& text, std::vector<int>* out) const = 0;
  // True when plain text needs no user-defined-token partition of ours (the
  // sentencepiece library matches user-defined pieces itself).
  virtual bool encodes_user_defined_itself() const = 0;
  virtual std::string token_to_piece(int prev_token, int token) const = 0;
  virtual std::string decode(const std::vector<int>& ids) const = 0;

  // Checks id against the vocabulary (an Error naming the source otherwise).
  void check_id(int id) const;

  std::string source;  // the file, for error messages
  std::string model_kind;  // "llama" or "gpt2"
  std::string pre;         // tokenizer.ggml.pre for gpt2
  std::vector<VocabPiece> pieces;
  std::unordered_map<std::string, int> piece_ids;  // the first id of a text wins
  int bos = -1, eos = -1, eot = -1, eom = -1;
  bool add_bos = false;
  std::vector<char> eog;  // per id
  // Per id: whitespace after this special token's text is dropped when the
  // text is partitioned (llama.cpp's RSTRIP attribute; empty: none).
  std::vector<char> rstrip;
};

// Built from a tokenizer.model file or a GGUF with tokenizer.ggml.model = llama.
std::unique_ptr<TokenizerBackend> make_spm_backend_from_file(const std::string& path);
std::unique_ptr<TokenizerBackend> make_spm_backend_from_gguf(const GgufFile& gguf);
// A GGUF with tokenizer.ggml.model = gpt2.
std::unique_ptr<TokenizerBackend> make_bpe_backend_from_gguf(const GgufFile& gguf);

}  // namespace runlm
