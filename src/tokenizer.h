// Tokenizer: the sentencepiece library, loaded from a tokenizer.model file or
// built in memory from a GGUF's tokenizer.ggml.* vocabulary (the pieces,
// scores and token types are serialised into a sentencepiece ModelProto).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace runlm {

class GgufFile;

class Tokenizer {
 public:
  static std::unique_ptr<Tokenizer> from_model_file(const std::string& path);
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  // Serialised sentencepiece ModelProto for a GGUF vocabulary (also used by
  // `convert` to go the other way is not needed: see vocab_* accessors).
  ~Tokenizer();

  // Encodes text. With parse_special, control and user-defined token texts
  // ("<s>", "</s>", "<|im_start|>", "[INST]" where it is one token...) that
  // occur in the text become their ids; the text between them is encoded
  // normally. add_bos prepends bos().
  std::vector<int> encode(const std::string& text, bool add_bos, bool parse_special = false) const;

  // Text of one token for streaming output, as llama2.c prints it: after BOS
  // one leading space is stripped; byte tokens <0xXX> become the raw byte;
  // control tokens (BOS/EOS) print nothing.
  std::string token_to_piece(int prev_token, int token) const;
  // Whole-sequence decode (sentencepiece's DecodeIds).
  std::string decode(const std::vector<int>& ids) const;

  int n_vocab() const;
  int bos() const;
  int eos() const;
  // -1 when the piece is not in the vocabulary.
  int piece_to_id(const std::string& piece) const;
  const std::string& id_to_piece(int id) const;
  float score(int id) const;
  // sentencepiece piece types: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte.
  int token_type(int id) const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace runlm
