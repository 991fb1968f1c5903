// SentencePiece tokenizer (tokenizer.ggml.model = llama): the sentencepiece
// library behind the TokenizerBackend interface. A tokenizer.model file is
// loaded as it is; a GGUF vocabulary (tokenizer.ggml.*) is turned into a
// sentencepiece ModelProto in memory, serialised with the small protobuf wire
// writer below (no protobuf headers are installed), and loaded from those
// bytes. The piece tables behind the accessors are always read back from the
// loaded model's own serialised proto, so both paths share one decoder and a
// GGUF vocabulary is checked to survive the round trip.
#include "tokenizer_backend.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "common.h"
#include "gguf.h"

namespace runlm {
namespace {

// ModelProto.SentencePiece.Type; llama.cpp's tokenizer.ggml.token_type uses the
// same numbers.
constexpr int kTypeNormal = kTokenNormal;
constexpr int kTypeUnknown = kTokenUnknown;
constexpr int kTypeControl = kTokenControl;
constexpr int kTypeUserDefined = kTokenUserDefined;
constexpr int kTypeByte = kTokenByte;

// Field numbers of sentencepiece_model.proto (as in Debian's
// python3-sentencepiece sentencepiece_model_pb2.py).
constexpr int kModelPieces = 1;
constexpr int kModelTrainerSpec = 2;
constexpr int kModelNormalizerSpec = 3;
constexpr int kPiecePiece = 1;
constexpr int kPieceScore = 2;
constexpr int kPieceType = 3;
constexpr int kTrainerModelType = 3;
constexpr int kTrainerVocabSize = 4;
constexpr int kTrainerSplitDigits = 25;
constexpr int kTrainerAllowWhitespaceOnlyPieces = 26;
constexpr int kTrainerByteFallback = 35;
constexpr int kTrainerUnkId = 40;
constexpr int kTrainerBosId = 41;
constexpr int kTrainerEosId = 42;
constexpr int kTrainerPadId = 43;
constexpr int kTrainerUnkPiece = 45;
constexpr int kTrainerBosPiece = 46;
constexpr int kTrainerEosPiece = 47;
constexpr int kNormalizerName = 1;
constexpr int kNormalizerAddDummyPrefix = 3;
constexpr int kNormalizerRemoveExtraWhitespaces = 4;
constexpr int kNormalizerEscapeWhitespaces = 5;
constexpr int kModelTypeBpe = 2;

constexpr int kWireVarint = 0;
constexpr int kWireFixed64 = 1;
constexpr int kWireLengthDelimited = 2;
constexpr int kWireFixed32 = 5;

// "▁" (U+2581), sentencepiece's visible space.
constexpr char kSpaceMarker[] = "\xe2\x96\x81";

// Protobuf wire-format writer for the few field kinds a ModelProto needs.
class ProtoWriter {
 public:
  void varint_field(int field, uint64_t v) {
    tag(field, kWireVarint);
    varint(v);
  }
  // int32 fields are sign-extended to 64 bits on the wire, as protobuf does,
  // so -1 takes ten bytes.
  void int32_field(int field, int32_t v) { varint_field(field, static_cast<uint64_t>(static_cast<int64_t>(v))); }
  void bool_field(int field, bool v) { varint_field(field, v ? 1 : 0); }
  void float_field(int field, float v) {
    tag(field, kWireFixed32);
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    for (int k = 0; k < 4; ++k) out_.push_back(static_cast<char>((u >> (8 * k)) & 0xff));  // little endian
  }
  void bytes_field(int field, const std::string& s) {
    tag(field, kWireLengthDelimited);
    varint(s.size());
    out_.append(s);
  }
  const std::string& bytes() const { return out_; }

 private:
  void tag(int field, int wire) { varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire)); }
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// Protobuf wire-format reader: walks the fields of one message, every length
// checked against the bytes that remain.
class ProtoReader {
 public:
  ProtoReader(const char* data, size_t size, const std::string& what) : p_(data), end_(data + size), what_(what) {}

  // Reads the next field; false at the end of the message.
  bool next(int* field, int* wire) {
    if (p_ == end_) return false;
    const uint64_t key = varint();
    *field = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    return true;
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      RUNLM_CHECK(p_ < end_, "%s: truncated varint in the sentencepiece model", what_.c_str());
      const uint8_t b = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return v;
    }
    fail("%s: varint longer than 10 bytes in the sentencepiece model", what_.c_str());
  }
  float fixed32_float() {
    RUNLM_CHECK(end_ - p_ >= 4, "%s: truncated float in the sentencepiece model", what_.c_str());
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<uint8_t>(p_[k])) << (8 * k);
    p_ += 4;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  std::pair<const char*, size_t> length_delimited() {
    const uint64_t n = varint();
    RUNLM_CHECK(n <= static_cast<uint64_t>(end_ - p_),
                "%s: field length %llu runs past the end of the sentencepiece model", what_.c_str(),
                static_cast<unsigned long long>(n));
    const char* start = p_;
    p_ += n;
    return {start, static_cast<size_t>(n)};
  }
  void skip(int wire) {
    switch (wire) {
      case kWireVarint: varint(); return;
      case kWireFixed64:
        RUNLM_CHECK(end_ - p_ >= 8, "%s: truncated fixed64 in the sentencepiece model", what_.c_str());
        p_ += 8;
        return;
      case kWireLengthDelimited: length_delimited(); return;
      case kWireFixed32:
        RUNLM_CHECK(end_ - p_ >= 4, "%s: truncated fixed32 in the sentencepiece model", what_.c_str());
        p_ += 4;
        return;
      default: fail("%s: unsupported protobuf wire type %d in the sentencepiece model", what_.c_str(), wire);
    }
  }

 private:
  const char* p_;
  const char* end_;
  const std::string& what_;
};

using Piece = VocabPiece;

// The pieces of a serialised ModelProto, in id order.
std::vector<Piece> read_pieces(const std::string& proto, const std::string& what) {
  std::vector<Piece> pieces;
  ProtoReader model(proto.data(), proto.size(), what);
  int field, wire;
  while (model.next(&field, &wire)) {
    if (field != kModelPieces || wire != kWireLengthDelimited) {
      model.skip(wire);
      continue;
    }
    auto [data, size] = model.length_delimited();
    ProtoReader pr(data, size, what);
    Piece piece;
    int f, w;
    while (pr.next(&f, &w)) {
      if (f == kPiecePiece && w == kWireLengthDelimited) {
        auto [s, n] = pr.length_delimited();
        piece.text.assign(s, n);
      } else if (f == kPieceScore && w == kWireFixed32) {
        piece.score = pr.fixed32_float();
      } else if (f == kPieceType && w == kWireVarint) {
        piece.type = static_cast<int>(pr.varint());
      } else {
        pr.skip(w);
      }
    }
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int> types;
  int unk = 0, bos = 1, eos = 2;
  std::vector<int> gguf_types;  // types as the GGUF has them (types: as the proto has them)
  bool add_space_prefix = true;
  bool remove_extra_whitespaces = false;
};

// Mirrors the trainer and normalizer specs of the Llama 2 tokenizer.model
// (BPE, identity normalizer, escaped whitespace), with the switches the GGUF
// carries. split_digits and allow_whitespace_only_pieces are training options
// that sentencepiece ignores when encoding; they are set as Llama 2 sets them.
std::string serialise_model_proto(const GgufVocab& v) {
  const bool has_bytes = std::find(v.types.begin(), v.types.end(), kTypeByte) != v.types.end();
  ProtoWriter model;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    ProtoWriter piece;
    piece.bytes_field(kPiecePiece, v.tokens[i]);
    piece.float_field(kPieceScore, v.scores[i]);
    piece.varint_field(kPieceType, static_cast<uint64_t>(v.types[i]));
    model.bytes_field(kModelPieces, piece.bytes());
  }
  ProtoWriter trainer;
  trainer.varint_field(kTrainerModelType, kModelTypeBpe);
  trainer.int32_field(kTrainerVocabSize, static_cast<int32_t>(v.tokens.size()));
  trainer.bool_field(kTrainerSplitDigits, true);
  trainer.bool_field(kTrainerAllowWhitespaceOnlyPieces, true);
  trainer.bool_field(kTrainerByteFallback, has_bytes);
  trainer.int32_field(kTrainerUnkId, v.unk);
  trainer.int32_field(kTrainerBosId, v.bos);
  trainer.int32_field(kTrainerEosId, v.eos);
  trainer.int32_field(kTrainerPadId, -1);
  // sentencepiece finds unk/bos/eos by these piece texts, not by the ids.
  trainer.bytes_field(kTrainerUnkPiece, v.tokens[static_cast<size_t>(v.unk)]);
  trainer.bytes_field(kTrainerBosPiece, v.tokens[static_cast<size_t>(v.bos)]);
  trainer.bytes_field(kTrainerEosPiece, v.tokens[static_cast<size_t>(v.eos)]);
  model.bytes_field(kModelTrainerSpec, trainer.bytes());
  ProtoWriter normalizer;
  normalizer.bytes_field(kNormalizerName, "identity");
  normalizer.bool_field(kNormalizerAddDummyPrefix, v.add_space_prefix);
  normalizer.bool_field(kNormalizerRemoveExtraWhitespaces, v.remove_extra_whitespaces);
  normalizer.bool_field(kNormalizerEscapeWhitespaces, true);
  model.bytes_field(kModelNormalizerSpec, normalizer.bytes());
  return model.bytes();
}

GgufVocab read_gguf_vocab(const GgufFile& g) {
  const char* path = g.path().c_str();
  const std::optional<std::string> model = g.get_string_opt("tokenizer.ggml.model");
  RUNLM_CHECK(model.has_value(), "key not found in model: tokenizer.ggml.model (%s)", path);
  GgufVocab v;
  v.tokens = g.get_string_array("tokenizer.ggml.tokens");
  v.scores = g.get_float_array("tokenizer.ggml.scores");
  const std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
  const size_t n = v.tokens.size();
  RUNLM_CHECK(n > 0, "%s: tokenizer.ggml.tokens is empty", path);
  RUNLM_CHECK(n <= static_cast<size_t>(INT32_MAX), "%s: tokenizer.ggml.tokens has %zu tokens, more than int32 holds",
              path, n);
  RUNLM_CHECK(v.scores.size() == n, "%s: tokenizer.ggml.scores has %zu entries but tokenizer.ggml.tokens has %zu",
              path, v.scores.size(), n);
  RUNLM_CHECK(types.size() == n, "%s: tokenizer.ggml.token_type has %zu entries but tokenizer.ggml.tokens has %zu",
              path, types.size(), n);
  v.types.resize(n);
  for (size_t i = 0; i < n; ++i) {
    RUNLM_CHECK(types[i] >= kTypeNormal && types[i] <= kTypeByte,
                "%s: tokenizer.ggml.token_type[%zu] = %lld; supported: 1 normal, 2 unknown, 3 control, "
                "4 user defined, 5 unused, 6 byte",
                path, i, static_cast<long long>(types[i]));
    v.types[i] = static_cast<int>(types[i]);
    RUNLM_CHECK(!v.tokens[i].empty(), "%s: tokenizer.ggml.tokens[%zu] is empty", path, i);
  }
  auto id = [&](const char* key, int def) {
    const int64_t x = g.get_int_opt(key).value_or(def);
    RUNLM_CHECK(x >= 0 && x < static_cast<int64_t>(n), "%s: %s = %lld is not a token id (vocabulary of %zu)", path,
                key, static_cast<long long>(x), n);
    return static_cast<int>(x);
  };
  v.unk = id("tokenizer.ggml.unknown_token_id", 0);
  v.bos = id("tokenizer.ggml.bos_token_id", 1);
  v.eos = id("tokenizer.ggml.eos_token_id", 2);
  // sentencepiece needs exactly one piece typed unknown, the unknown id.
  // Some GGUFs (Phi-3) type <unk> control and padding pieces unknown; neither
  // kind is ever produced from text, so the proto swaps them (unknown id:
  // unknown, other unknowns: control) and the table keeps the GGUF's types.
  const int unk_type = v.types[static_cast<size_t>(v.unk)];
  RUNLM_CHECK(unk_type == kTypeUnknown || unk_type == kTypeControl,
              "%s: tokenizer.ggml.unknown_token_id = %d is not a token of type unknown (2) or control (3)", path, v.unk);
  v.gguf_types = v.types;
  for (size_t i = 0; i < n; ++i)
    if (v.types[i] == kTypeUnknown || v.types[i] == kTypeUserDefined) v.types[i] = kTypeControl;
  v.types[static_cast<size_t>(v.unk)] = kTypeUnknown;
  if (const GgufValue* x = g.find("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = x->as_bool();
  if (const GgufValue* x = g.find("tokenizer.ggml.remove_extra_whitespaces")) v.remove_extra_whitespaces = x->as_bool();
  return v;
}

// "▁" spelled back as spaces.
std::string unescape_spaces(const std::string& text) {
  std::string s;
  s.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, kSpaceMarker) == 0) {
      s.push_back(' ');
      i += 3;
    } else {
      s.push_back(text[i++]);
    }
  }
  return s;
}

class SpmBackend : public TokenizerBackend {
 public:
  sentencepiece::SentencePieceProcessor sp;

  // Fills the tables from the loaded model's serialised proto.
  void init_tables() {
    pieces = read_pieces(sp.serialized_model_proto(), source);
    RUNLM_CHECK(static_cast<int>(pieces.size()) == sp.GetPieceSize(),
                "%s: sentencepiece reports %d pieces but its model proto holds %zu", source.c_str(), sp.GetPieceSize(),
                pieces.size());
    for (size_t i = 0; i < pieces.size(); ++i) piece_ids.emplace(pieces[i].text, static_cast<int>(i));
  }

  // sentencepiece adds the dummy-prefix space to every fragment it is given,
  // which is also what llama.cpp does for SPM vocabularies: it prefixes a
  // space to each text fragment that follows a special token (or starts the
  // text).
  void encode_fragment(const std::string& text, std::vector<int>* out) const override {
    if (text.empty()) return;
    std::vector<int> ids;
    const auto status = sp.Encode(text, &ids);
    RUNLM_CHECK(status.ok(), "%s: sentencepiece encode failed: %s", source.c_str(), status.ToString().c_str());
    out->insert(out->end(), ids.begin(), ids.end());
  }

  bool encodes_user_defined_itself() const override { return matches_user_defined; }
  // A tokenizer.model keeps its user-defined pieces, which sentencepiece
  // matches in any text; a GGUF vocabulary's are control pieces in the proto
  // (never produced from text) and tokenizer.cpp partitions the text at them
  // as llama.cpp does, so literal ranges hold for them too.
  bool matches_user_defined = true;
  bool strips_dummy_prefix = true;  // the normalizer's add_dummy_prefix: decode drops one leading space

  std::string token_to_piece(int prev_token, int token) const override {
    check_id(token);
    const Piece& p = pieces[static_cast<size_t>(token)];
    if (p.type == kTypeControl || p.type == kTypeUnknown) return "";
    if (p.type == kTypeByte) {
      // sentencepiece checked at load that byte pieces read <0xXX>.
      auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
      };
      if (p.text.size() == 6 && p.text.compare(0, 3, "<0x") == 0 && p.text[5] == '>' && hex(p.text[3]) >= 0 &&
          hex(p.text[4]) >= 0)
        return std::string(1, static_cast<char>(hex(p.text[3]) * 16 + hex(p.text[4])));
      fail("%s: byte token %d has the piece '%s', not <0xXX>", source.c_str(), token, p.text.c_str());
    }
    std::string s = unescape_spaces(p.text);
    // The first piece after BOS carries the dummy-prefix space, which is not
    // part of the text (llama2.c's rule).
    if (prev_token == bos && !s.empty() && s[0] == ' ') s.erase(0, 1);
    return s;
  }

  std::string decode(const std::vector<int>& ids) const override {
    for (int id : ids) check_id(id);
    if (matches_user_defined) return sp_decode(ids);
    // User-defined pieces are control pieces in the proto, which sentencepiece
    // would drop: their text goes in between the decoded runs (as llama.cpp's
    // detokenize prints it). A run after the first keeps its leading space,
    // which sentencepiece strips only at the start of the text.
    std::string text;
    std::vector<int> run;
    bool first = true;
    auto flush = [&] {
      if (run.empty()) return;
      std::string s = sp_decode(run);
      if (!first && strips_dummy_prefix && pieces[static_cast<size_t>(run[0])].text.compare(0, 3, kSpaceMarker) == 0)
        s.insert(0, 1, ' ');
      text += s;
      first = false;
      run.clear();
    };
    for (int id : ids) {
      if (pieces[static_cast<size_t>(id)].type == kTypeUserDefined) {
        flush();
        text += pieces[static_cast<size_t>(id)].text;
        first = false;
      } else {
        run.push_back(id);
      }
    }
    flush();
    return text;
  }

  std::string sp_decode(const std::vector<int>& ids) const {
    std::string text;
    const auto status = sp.Decode(ids, &text);
    RUNLM_CHECK(status.ok(), "%s: sentencepiece decode failed: %s", source.c_str(), status.ToString().c_str());
    return text;
  }
};

}  // namespace

std::unique_ptr<TokenizerBackend> make_spm_backend_from_file(const std::string& path) {
  auto m = std::make_unique<SpmBackend>();
  m->source = path;
  m->model_kind = "llama";
  const auto status = m->sp.Load(path);
  RUNLM_CHECK(status.ok(), "cannot load sentencepiece model %s: %s", path.c_str(), status.ToString().c_str());
  m->init_tables();
  m->bos = m->sp.bos_id();
  m->eos = m->sp.eos_id();
  m->add_bos = true;
  return m;
}

std::unique_ptr<TokenizerBackend> make_spm_backend_from_gguf(const GgufFile& gguf) {
  const GgufVocab v = read_gguf_vocab(gguf);
  auto m = std::make_unique<SpmBackend>();
  m->source = gguf.path();
  m->model_kind = "llama";
  const auto status = m->sp.LoadFromSerializedProto(serialise_model_proto(v));
  RUNLM_CHECK(status.ok(), "%s: sentencepiece rejected the GGUF vocabulary: %s", gguf.path().c_str(),
              status.ToString().c_str());
  m->init_tables();
  for (size_t i = 0; i < m->pieces.size(); ++i) m->pieces[i].type = v.gguf_types[i];
  m->matches_user_defined = false;
  m->strips_dummy_prefix = v.add_space_prefix;
  m->bos = v.bos;
  m->eos = v.eos;
  m->add_bos = true;  // llama.cpp's default for SPM; tokenizer.cpp reads the GGUF key
  return m;
}

}  // namespace runlm
