// Byte-level BPE tokenizer (tokenizer.ggml.model = gpt2), as llama.cpp's
// llm_tokenizer_bpe_session: the pre-tokenizer splits the text into words,
// each word's bytes are spelled with the GPT-2 byte-to-unicode map, and the
// word's characters are merged pairwise by rank (tokenizer.ggml.merges, lowest
// rank first, leftmost first among equals) until no ranked pair is left. A
// final piece missing from the vocabulary falls back to its single bytes that
// are tokens (llama.cpp's rule). Decoding maps the characters back to bytes.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>

#include "bpe_pretokenizer.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer_backend.h"

namespace runlm {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the
// other 68 bytes take U+0100.. in byte order.
struct ByteMap {
  std::string byte_to_utf8[256];
  std::unordered_map<uint32_t, uint8_t> cpt_to_byte;
  ByteMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      const uint32_t cpt = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(cpt, &byte_to_utf8[b]);
      cpt_to_byte[cpt] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;  // immutable after construction (thread-safe static init)
  return m;
}

// Length of the UTF-8 sequence a lead byte starts (llama.cpp's
// unicode_len_utf8; the byte-encoded words are valid UTF-8).
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xe0) == 0xc0) return 2;
  if ((c & 0xf0) == 0xe0) return 3;
  if ((c & 0xf8) == 0xf0) return 4;
  return 1;
}

std::string merge_key(const char* a, size_t na, const char* b, size_t nb) {
  std::string k;
  k.reserve(na + nb + 4);
  const uint32_t n = static_cast<uint32_t>(na);
  k.append(reinterpret_cast<const char*>(&n), sizeof n);  // length prefix: no separator can collide
  k.append(a, na);
  k.append(b, nb);
  return k;
}

class BpeBackend : public TokenizerBackend {
 public:
  BpePreTokenizerSpec spec;
  std::unique_ptr<BpePreTokenizer> splitter;
  std::unordered_map<std::string, int> ranks;

  void encode_fragment(const std::string& text, std::vector<int>* out) const override {
    if (text.empty()) return;
    const ByteMap& bm = byte_map();
    for (const std::string& word : splitter->split(text)) {
      std::string enc;
      enc.reserve(word.size() * 2);
      for (unsigned char c : word) enc += bm.byte_to_utf8[c];
      if (spec.ignore_merges) {
        const auto it = piece_ids.find(enc);
        if (it != piece_ids.end()) {
          out->push_back(it->second);
          continue;
        }
      }
      encode_word(enc, out);
    }
  }

  bool encodes_user_defined_itself() const override { return false; }

  std::string token_to_piece(int /*prev_token*/, int token) const override {
    check_id(token);
    const VocabPiece& p = pieces[static_cast<size_t>(token)];
    switch (p.type) {
      case kTokenUserDefined: return p.text;
      case kTokenNormal: return decode_text(p.text);
      case kTokenByte: {
        unsigned int b = 0;
        char tail = 0;
        if (p.text.size() == 6 && std::sscanf(p.text.c_str(), "<0x%2X%c", &b, &tail) == 2 && tail == '>')
          return std::string(1, static_cast<char>(b));
        return decode_text(p.text);
      }
      default: return "";  // control, unknown, unused, undefined: nothing, as llama.cpp without special
    }
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string text;
    for (int id : ids) text += token_to_piece(-1, id);
    if (spec.clean_spaces) clean_up_spaces(&text);
    return text;
  }

 private:
  struct Symbol {
    size_t offset, n;  // bytes of the word
    int prev, next;
  };
  struct Bigram {
    int rank;
    int left, right;
    size_t n_left, n_right;  // the symbols' lengths when queued: a merge since makes the pair stale
    bool operator<(const Bigram& o) const {  // std::priority_queue pops the largest: lowest rank, then leftmost
      return rank > o.rank || (rank == o.rank && left > o.left);
    }
  };

  void encode_word(const std::string& w, std::vector<int>* out) const {
    std::vector<Symbol> sym;
    for (size_t off = 0; off < w.size();) {
      const size_t n = std::min(w.size() - off, utf8_len(static_cast<unsigned char>(w[off])));
      const int i = static_cast<int>(sym.size());
      sym.push_back({off, n, i - 1, off + n == w.size() ? -1 : i + 1});
      off += n;
    }
    std::priority_queue<Bigram> queue;
    auto add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const Symbol& a = sym[static_cast<size_t>(l)];
      const Symbol& b = sym[static_cast<size_t>(r)];
      const auto it = ranks.find(merge_key(w.data() + a.offset, a.n, w.data() + b.offset, b.n));
      if (it != ranks.end()) queue.push({it->second, l, r, a.n, b.n});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) add(i - 1, i);
    while (!queue.empty()) {
      const Bigram bg = queue.top();
      queue.pop();
      Symbol& l = sym[static_cast<size_t>(bg.left)];
      Symbol& r = sym[static_cast<size_t>(bg.right)];
      if (l.n == 0 || r.n == 0 || l.n != bg.n_left || r.n != bg.n_right) continue;
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
      add(l.prev, bg.left);
      add(bg.left, l.next);
    }
    for (const Symbol& s : sym) {
      if (s.n == 0) continue;
      const std::string piece = w.substr(s.offset, s.n);
      const auto it = piece_ids.find(piece);
      if (it != piece_ids.end()) {
        out->push_back(it->second);
        continue;
      }
      // llama.cpp looks each byte of the piece up as a one-byte token.
      for (char c : piece) {
        const auto b = piece_ids.find(std::string(1, c));
        if (b != piece_ids.end()) out->push_back(b->second);
      }
    }
  }

  // llama.cpp's llama_decode_text: each character back to its byte; a
  // character outside the map is spelled [UNK_BYTE_0x..].
  static std::string decode_text(const std::string& text) {
    const ByteMap& bm = byte_map();
    std::string out;
    for (uint32_t cpt : utf8_to_codepoints_lenient(text)) {
      const auto it = bm.cpt_to_byte.find(cpt);
      if (it != bm.cpt_to_byte.end()) {
        out.push_back(static_cast<char>(it->second));
        continue;
      }
      std::string utf8;
      append_utf8(cpt, &utf8);
      out += "[UNK_BYTE_0x";
      for (unsigned char c : utf8) out += strfmt("%02x", c);
      out += text + "]";
    }
    return out;
  }

  // llama.cpp's detokenize clean_spaces passes, in place as there (the
  // second pass marks the space it drops with a NUL that the next step then
  // sees): " ?" " !" " ." " ," lose the space, " ' " loses both, " 's" " 'm"
  // " 're" " 've" lose the space.
  static void clean_up_spaces(std::string* s) {
    std::string& t = *s;
    size_t total = t.size();
    size_t n = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) total--;
      t[total++] = x;
    }
    n = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
        total--;
        t[++i] = '\0';
      }
      t[total++] = x;
    }
    n = total;
    total = total ? 1 : 0;
    for (size_t i = 1; i < n; ++i) {
      const char x = t[i];
      if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
        const char x1 = t[i + 1];
        if (x1 == 's' || x1 == 'm') {
          total--;
        } else if (i + 2 < n) {
          const char x2 = t[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
        }
      }
      t[total++] = x;
    }
    t.resize(total);
  }
};

}  // namespace

std::unique_ptr<TokenizerBackend> make_bpe_backend_from_gguf(const GgufFile& g) {
  auto b = std::make_unique<BpeBackend>();
  const char* path = g.path().c_str();
  b->source = g.path();
  b->model_kind = "gpt2";
  const std::optional<std::string> pre = g.get_string_opt("tokenizer.ggml.pre");
  RUNLM_CHECK(pre.has_value(),
              "%s: tokenizer.ggml.pre is missing; a gpt2 (byte-level BPE) vocabulary needs its pre-tokenizer name "
              "(supported: %s)",
              path, bpe_supported_pre_names().c_str());
  b->pre = *pre;
  b->spec = bpe_pre_tokenizer_spec(*pre, g.path());
  b->splitter = std::make_unique<BpePreTokenizer>(b->spec.regexes, g.path());

  const std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  RUNLM_CHECK(n > 0, "%s: tokenizer.ggml.tokens is empty", path);
  RUNLM_CHECK(n <= static_cast<size_t>(INT32_MAX), "%s: tokenizer.ggml.tokens has %zu tokens, more than int32 holds",
              path, n);
  std::vector<float> scores(n, 0.0f);
  if (g.find("tokenizer.ggml.scores")) {
    scores = g.get_float_array("tokenizer.ggml.scores");
    RUNLM_CHECK(scores.size() == n, "%s: tokenizer.ggml.scores has %zu entries but tokenizer.ggml.tokens has %zu",
                path, scores.size(), n);
  }
  std::vector<int64_t> types(n, kTokenNormal);
  if (g.find("tokenizer.ggml.token_type")) {
    types = g.get_int_array("tokenizer.ggml.token_type");
    RUNLM_CHECK(types.size() == n, "%s: tokenizer.ggml.token_type has %zu entries but tokenizer.ggml.tokens has %zu",
                path, types.size(), n);
  }
  b->pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    RUNLM_CHECK(types[i] >= 0 && types[i] <= kTokenByte,
                "%s: tokenizer.ggml.token_type[%zu] = %lld; supported: 0 undefined, 1 normal, 2 unknown, 3 control, "
                "4 user defined, 5 unused, 6 byte",
                path, i, static_cast<long long>(types[i]));
    VocabPiece& p = b->pieces[i];
    // llama.cpp names an empty token [EMPTY_i] (it can never match text).
    p.text = tokens[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : tokens[i];
    p.score = scores[i];
    p.type = static_cast<int>(types[i]);
    b->piece_ids.emplace(p.text, static_cast<int>(i));
  }

  RUNLM_CHECK(g.find("tokenizer.ggml.merges") != nullptr, "%s: tokenizer.ggml.merges is missing (a gpt2 vocabulary "
              "needs its BPE merges)", path);
  const std::vector<std::string> merges = g.get_string_array("tokenizer.ggml.merges");
  b->ranks.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    // llama.cpp splits at the first space after the first byte.
    const size_t pos = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    RUNLM_CHECK(pos != std::string::npos && pos + 1 < m.size(),
                "%s: tokenizer.ggml.merges[%zu] = '%s' is not two pieces separated by a space", path, i, m.c_str());
    RUNLM_CHECK(i <= static_cast<size_t>(INT32_MAX), "%s: tokenizer.ggml.merges has more than int32 entries", path);
    b->ranks.emplace(merge_key(m.data(), pos, m.data() + pos + 1, m.size() - pos - 1), static_cast<int>(i));
  }

  // llama.cpp's BPE defaults: BOS = EOS = 11 when in the vocabulary.
  auto id = [&](const char* key, int def) {
    const std::optional<int64_t> x = g.get_int_opt(key);
    if (!x) return def < static_cast<int>(n) ? def : -1;
    RUNLM_CHECK(*x >= 0 && *x < static_cast<int64_t>(n), "%s: %s = %lld is not a token id (vocabulary of %zu)", path,
                key, static_cast<long long>(*x), n);
    return static_cast<int>(*x);
  };
  b->bos = id("tokenizer.ggml.bos_token_id", 11);
  b->eos = id("tokenizer.ggml.eos_token_id", 11);
  b->add_bos = b->spec.add_bos;
  return b;
}

}  // namespace runlm
