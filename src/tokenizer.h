// Tokenizer: one API over the two vocabulary kinds a GGUF can carry,
// chosen by tokenizer.ggml.model as llama.cpp chooses:
//   llama  SentencePiece (the sentencepiece library; src/tokenizer_spm.cpp)
//   gpt2   byte-level BPE: ranked merges, the GPT-2 byte-to-unicode map and a
//          regex pre-tokenizer named by tokenizer.ggml.pre (src/tokenizer_bpe.cpp)
// Special tokens (control, user-defined and unknown pieces), BOS/EOS, the
// end-of-generation set and the special-token partition of the text are
// shared by both (src/tokenizer.cpp).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace runlm {

class GgufFile;
class TokenizerBackend;

class Tokenizer {
 public:
  // A sentencepiece tokenizer.model file.
  static std::unique_ptr<Tokenizer> from_model_file(const std::string& path);
  // The GGUF's tokenizer.ggml.* vocabulary; needs only the metadata, so a
  // vocabulary-only GGUF (no tensors) loads too.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  ~Tokenizer();

  // Encodes text. With parse_special, control, user-defined and unknown
  // token texts ("<s>", "<|im_start|>", "<|eot_id|>"...) that occur in the
  // text become their ids, the longest texts first, as llama.cpp's
  // tokenizer_st_partition does; the text between them is encoded normally.
  // User-defined token texts are matched even without parse_special
  // (llama.cpp and Hugging Face do; for a tokenizer.model file the
  // sentencepiece library matches them itself). add_bos prepends bos().
  std::vector<int> encode(const std::string& text, bool add_bos, bool parse_special = false) const;
  // As above, but a special-token match that overlaps one of the byte ranges
  // [first, second) of literal_ranges is not taken: text there is encoded as
  // plain text (user content inside a rendered chat template cannot inject
  // special tokens).
  std::vector<int> encode(const std::string& text, bool add_bos, bool parse_special,
                          const std::vector<std::pair<size_t, size_t>>& literal_ranges) const;

  // Bytes of one token for streaming output. Control and unknown tokens
  // print nothing. SentencePiece: after BOS one leading space is stripped,
  // byte tokens <0xXX> become the raw byte. BPE: the piece's GPT-2 byte
  // characters become the bytes they stand for, so one UTF-8 character may be
  // split across tokens (the bytes are emitted as they come).
  std::string token_to_piece(int prev_token, int token) const;
  // The token as llama.cpp's token_to_piece with special = true renders it:
  // control, unknown and user-defined tokens as their text, the others as
  // token_to_piece without any space stripping.
  std::string token_text(int id) const;
  // Whole-sequence decode (sentencepiece's DecodeIds; for BPE llama.cpp's
  // detokenize without special tokens, including its clean-up of spaces
  // before punctuation where the pre-tokenizer asks for it).
  std::string decode(const std::vector<int>& ids) const;

  int n_vocab() const;
  int bos() const;
  int eos() const;
  // End of turn (e.g. <|eot_id|>, <|im_end|>), -1 when the vocabulary has none.
  int eot() const;
  // True for every token that ends generation: EOS, EOT, EOM and the tokens
  // llama.cpp recognises by text (<|eot_id|>, <|im_end|>, <|endoftext|>...).
  bool is_eog(int id) const;
  // tokenizer.ggml.add_bos_token, or the vocabulary kind's default (llama.cpp's).
  bool add_bos() const;
  // "llama" or "gpt2" (tokenizer.ggml.model); pre is tokenizer.ggml.pre ("" for llama).
  const std::string& model_kind() const;
  const std::string& pre() const;
  // -1 when the piece is not in the vocabulary.
  int piece_to_id(const std::string& piece) const;
  const std::string& id_to_piece(int id) const;
  float score(int id) const;
  // Piece types as in tokenizer.ggml.token_type: 1 normal, 2 unknown,
  // 3 control, 4 user defined, 5 unused, 6 byte.
  int token_type(int id) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerBackend> backend);
  std::vector<int> encode_impl(const std::string& text, bool add_bos, bool parse_special,
                               const std::vector<std::pair<size_t, size_t>>* literal_ranges) const;
  std::unique_ptr<TokenizerBackend> b_;
};

}  // namespace runlm
