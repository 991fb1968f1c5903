// Tokenizer: picks the backend by tokenizer.ggml.model, then does what both
// vocabulary kinds share the way llama.cpp's llama_vocab does it: the
// special-token ids (BOS, EOS, EOT, EOM) and add_bos from the GGUF, the
// end-of-generation set (those ids plus the tokens llama.cpp recognises by
// their text), and the partition of a text at special-token texts
// (tokenizer_st_partition) before the plain fragments go to the backend.
#include "tokenizer.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "common.h"
#include "gguf.h"
#include "tokenizer_backend.h"

namespace runlm {

void TokenizerBackend::check_id(int id) const {
  RUNLM_CHECK(id >= 0 && static_cast<size_t>(id) < pieces.size(), "token id %d out of range (vocabulary of %zu, %s)", id,
              pieces.size(), source.c_str());
}

namespace {

// Token texts that end generation in llama.cpp (llama_vocab::impl::load's
// EOG list), whatever the vocabulary kind.
constexpr const char* kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~["};
// Texts llama.cpp takes as the EOT token when tokenizer.ggml.eot_token_id is absent.
constexpr const char* kEotTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<end_of_utterance>"};

// Fill-in-the-middle tokens that llama.cpp also counts as end of generation
// (pad, repository, file separator), by key or else by text.
struct FimEog {
  const char* key;
  std::vector<const char*> texts;
};
const FimEog kFimEog[] = {
    {"tokenizer.ggml.fim_pad_token_id", {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
    {"tokenizer.ggml.fim_rep_token_id", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {"tokenizer.ggml.fim_sep_token_id", {"<|file_sep|>"}},
};
// gpt-oss (o200k_harmony) message markers llama.cpp always renders.
constexpr const char* kRenderedMarkers[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};

// An optional token-id key: absent keeps def; an id outside the vocabulary
// is an error (llama.cpp warns and keeps the default; a bad id here would
// index out of the embedding).
int optional_id(const GgufFile& g, const char* key, int def, size_t n) {
  const std::optional<int64_t> x = g.get_int_opt(key);
  if (!x) return def;
  RUNLM_CHECK(*x >= 0 && *x < static_cast<int64_t>(n), "%s: %s = %lld is not a token id (vocabulary of %zu)",
              g.path().c_str(), key, static_cast<long long>(*x), n);
  return static_cast<int>(*x);
}

// EOT/EOM, add_bos and the end-of-generation set, as llama.cpp derives them.
// Like llama.cpp, a token found by its text (EOT, EOM, end of generation)
// that is not typed control becomes control: it prints nothing and is matched
// in text only with parse_special.
void finish_special_tokens(TokenizerBackend& b, const GgufFile* g) {
  const size_t n = b.pieces.size();
  auto make_control = [&](int id) {
    if (id >= 0) b.pieces[static_cast<size_t>(id)].type = kTokenControl;
  };
  std::vector<int> fim(std::size(kFimEog), -1);
  if (g) {
    for (size_t i = 0; i < fim.size(); ++i) fim[i] = optional_id(*g, kFimEog[i].key, -1, n);
    b.eot = optional_id(*g, "tokenizer.ggml.eot_token_id", -1, n);
    b.eom = optional_id(*g, "tokenizer.ggml.eom_token_id", -1, n);
    if (const GgufValue* v = g->find("tokenizer.ggml.add_bos_token")) b.add_bos = v->as_bool();
  }
  auto lookup = [&](const char* text) {
    const auto it = b.piece_ids.find(text);
    return it == b.piece_ids.end() ? -1 : it->second;
  };
  if (b.eot < 0) {
    // llama.cpp walks its hash map, so with several candidates its pick is
    // arbitrary; every candidate is in the EOG set below either way.
    for (const char* t : kEotTexts)
      if ((b.eot = lookup(t)) >= 0) {
        make_control(b.eot);
        break;
      }
  }
  if (b.eom < 0) make_control(b.eom = lookup("<|eom_id|>"));
  b.eog.assign(n, 0);
  for (size_t i = 0; i < fim.size(); ++i) {
    for (size_t k = 0; fim[i] < 0 && k < kFimEog[i].texts.size(); ++k) make_control(fim[i] = lookup(kFimEog[i].texts[k]));
    if (fim[i] >= 0) b.eog[static_cast<size_t>(fim[i])] = 1;
  }
  for (const char* t : kEogTexts) {
    const int id = lookup(t);
    if (id < 0) continue;
    b.eog[static_cast<size_t>(id)] = 1;
    make_control(id);
  }
  for (const char* t : kRenderedMarkers)
    if (const int id = lookup(t); id >= 0) b.pieces[static_cast<size_t>(id)].type = kTokenUserDefined;
  for (int id : {b.eos, b.eot, b.eom})
    if (id >= 0) b.eog[static_cast<size_t>(id)] = 1;
  // o200k_harmony (gpt-oss): <|end|> ends a message, not the generation,
  // when <|return|> and <|call|> exist.
  const int end = lookup("<|end|>"), ret = lookup("<|return|>"), call = lookup("<|call|>");
  const int calls = lookup("<|calls|>"), flush = lookup("<|flush|>");
  if (end >= 0 && end != b.eos && ((ret >= 0 && call >= 0) || (calls >= 0 && flush >= 0))) {
    b.eog[static_cast<size_t>(end)] = 0;
    b.pieces[static_cast<size_t>(end)].type = kTokenUserDefined;  // rendered, as there
  }

  // Phi-3 (llama.cpp picks it by general.name): every special token but
  // <unk>, <s> and <|endoftext|> swallows the whitespace after it, as its
  // Hugging Face tokenizer's rstrip does.
  std::string name = g ? g->get_string_opt("general.name").value_or("") : "";
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    b.rstrip.assign(n, 0);
    for (size_t id = 0; id < n; ++id) {
      const int t = b.pieces[id].type;
      if (t == kTokenControl || t == kTokenUserDefined || t == kTokenUnknown) b.rstrip[id] = 1;
    }
    if (const int s = lookup("</s>"); s >= 0) b.rstrip[static_cast<size_t>(s)] = 1;
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
      if (const int id = lookup(t); id >= 0) b.rstrip[static_cast<size_t>(id)] = 0;
  }
}

struct Fragment {
  int token;     // -1: raw text [offset, offset + length)
  size_t offset;
  size_t length;
};

bool overlaps_literal(size_t begin, size_t end, const std::vector<std::pair<size_t, size_t>>* literal) {
  if (!literal) return false;
  for (const auto& [a, z] : *literal)
    if (begin < z && a < end) return true;
  return false;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<TokenizerBackend> backend) : b_(std::move(backend)) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_model_file(const std::string& path) {
  auto b = make_spm_backend_from_file(path);
  finish_special_tokens(*b, nullptr);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(b)));
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
  const std::optional<std::string> model = gguf.get_string_opt("tokenizer.ggml.model");
  RUNLM_CHECK(model.has_value(), "key not found in model: tokenizer.ggml.model (%s)", gguf.path().c_str());
  std::unique_ptr<TokenizerBackend> b;
  if (*model == "llama") {
    b = make_spm_backend_from_gguf(gguf);
  } else if (*model == "gpt2") {
    b = make_bpe_backend_from_gguf(gguf);
  } else {
    fail("%s: tokenizer.ggml.model '%s' is not supported; supported: llama (SentencePiece), gpt2 (byte-level BPE)",
         gguf.path().c_str(), model->c_str());
  }
  finish_special_tokens(*b, &gguf);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(b)));
}

std::vector<int> Tokenizer::encode(const std::string& text, bool add_bos, bool parse_special) const {
  return encode_impl(text, add_bos, parse_special, nullptr);
}

std::vector<int> Tokenizer::encode(const std::string& text, bool add_bos, bool parse_special,
                                   const std::vector<std::pair<size_t, size_t>>& literal_ranges) const {
  return encode_impl(text, add_bos, parse_special, &literal_ranges);
}

// llama.cpp's tokenizer_st_partition: for each special token, longest text
// first, every raw fragment is split at each occurrence of its text. Control
// and unknown tokens take part only with parse_special; user-defined ones
// always, except where the backend matches them itself.
std::vector<int> Tokenizer::encode_impl(const std::string& text, bool add_bos, bool parse_special,
                                        const std::vector<std::pair<size_t, size_t>>* literal) const {
  const TokenizerBackend& b = *b_;
  std::vector<int> out;
  if (add_bos) {
    RUNLM_CHECK(b.bos >= 0, "%s: the vocabulary has no BOS token", b.source.c_str());
    out.push_back(b.bos);
  }
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});

  const bool user_defined = !b.encodes_user_defined_itself();
  if (parse_special || user_defined) {
    // The special tokens that occur in the text at all, longest first (a
    // stable sort keeps id order among equal lengths, as llama.cpp's cache).
    std::vector<int> present;
    for (size_t id = 0; id < b.pieces.size(); ++id) {
      const VocabPiece& p = b.pieces[id];
      const bool take = ((p.type == kTokenControl || p.type == kTokenUnknown) && parse_special) ||
                        (p.type == kTokenUserDefined && (parse_special || user_defined));
      if (take && !p.text.empty() && text.find(p.text) != std::string::npos) present.push_back(static_cast<int>(id));
    }
    std::stable_sort(present.begin(), present.end(), [&](int x, int y) {
      return b.pieces[static_cast<size_t>(x)].text.size() > b.pieces[static_cast<size_t>(y)].text.size();
    });
    for (int id : present) {
      const std::string& st = b.pieces[static_cast<size_t>(id)].text;
      std::vector<Fragment> next;
      next.reserve(frags.size());
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          next.push_back(f);
          continue;
        }
        const std::string_view window(text.data(), f.offset + f.length);
        size_t start = f.offset;  // start of the remaining raw text
        size_t search = f.offset;
        while (true) {
          const size_t match = window.find(st, search);
          if (match == std::string_view::npos) break;
          if (overlaps_literal(match, match + st.size(), literal)) {
            search = match + 1;
            continue;
          }
          if (match > start) next.push_back({-1, start, match - start});
          next.push_back({id, match, st.size()});
          start = search = match + st.size();
          if (!b.rstrip.empty() && b.rstrip[static_cast<size_t>(id)]) {
            const size_t end = f.offset + f.length;
            while (start < end && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
            search = start;
          }
        }
        if (start < f.offset + f.length) next.push_back({-1, start, f.offset + f.length - start});
      }
      frags.swap(next);
    }
  }
  if (!parse_special && !user_defined) {
    // SentencePiece without special tokens: the whole text in one go.
    b.encode_fragment(text, &out);
    return out;
  }
  for (const Fragment& f : frags) {
    if (f.token >= 0)
      out.push_back(f.token);
    else
      b.encode_fragment(text.substr(f.offset, f.length), &out);
  }
  return out;
}

std::string Tokenizer::token_to_piece(int prev_token, int token) const { return b_->token_to_piece(prev_token, token); }
std::string Tokenizer::token_text(int id) const {
  b_->check_id(id);
  const int type = b_->pieces[static_cast<size_t>(id)].type;
  if (type == kTokenControl || type == kTokenUnknown || type == kTokenUserDefined)
    return b_->pieces[static_cast<size_t>(id)].text;
  return b_->token_to_piece(-1, id);
}

std::string Tokenizer::decode(const std::vector<int>& ids) const { return b_->decode(ids); }

int Tokenizer::n_vocab() const { return static_cast<int>(b_->pieces.size()); }
int Tokenizer::bos() const { return b_->bos; }
int Tokenizer::eos() const { return b_->eos; }
int Tokenizer::eot() const { return b_->eot; }
bool Tokenizer::is_eog(int id) const {
  return id >= 0 && static_cast<size_t>(id) < b_->eog.size() && b_->eog[static_cast<size_t>(id)] != 0;
}
bool Tokenizer::add_bos() const { return b_->add_bos; }
const std::string& Tokenizer::model_kind() const { return b_->model_kind; }
const std::string& Tokenizer::pre() const { return b_->pre; }

int Tokenizer::piece_to_id(const std::string& piece) const {
  const auto it = b_->piece_ids.find(piece);
  return it == b_->piece_ids.end() ? -1 : it->second;
}

const std::string& Tokenizer::id_to_piece(int id) const {
  b_->check_id(id);
  return b_->pieces[static_cast<size_t>(id)].text;
}

float Tokenizer::score(int id) const {
  b_->check_id(id);
  return b_->pieces[static_cast<size_t>(id)].score;
}

int Tokenizer::token_type(int id) const {
  b_->check_id(id);
  return b_->pieces[static_cast<size_t>(id)].type;
}

}  // namespace runlm
