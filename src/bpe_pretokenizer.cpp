// BPE pre-tokenizer: llama.cpp's regex lists per tokenizer.ggml.pre, run on
// PCRE2. Three points make PCRE2 agree with llama.cpp's own splitter (its
// hand-written matchers for the GPT-2/Llama 3/Qwen regexes and std::regex
// over "collapsed" category bytes for the rest):
//  - the text is decoded as llama.cpp decodes it (invalid bytes become U+FFFD)
//    and matched as UTF-8 of those code points;
//  - every non-ASCII whitespace code point (Unicode White_Space, llama.cpp's
//    unicode_set_whitespace) is matched as U+000B: llama.cpp gives whitespace
//    no other category and std::regex sees it as \v, so e.g. U+3000 is a space
//    and not a member of an explicit range like [　-。];
//  - each regex runs over one word at a time with the word's end as the end
//    of the subject, so (?!\S) sees the word boundary as llama.cpp does.
// std::regex's $ (end of text) is written \z for PCRE2.
#include "bpe_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>

#include "common.h"

namespace runlm {
namespace {

// The regex lists of llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp),
// one per LLAMA_VOCAB_PRE_TYPE_*.
const char* const kDefault[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
};
const char* const kLlama3[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const char* const kDeepseekLlm[] = {
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+\\z",  // std::regex $ is the end of the text; PCRE2's $ also matches before a final \n
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
};
const char* const kDeepseek3Llm[] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
const char* const kDeepseekCoder[] = {
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
};
const char* const kFalcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
};
const char* const kStarcoder[] = {
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};
const char* const kGpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
};
const char* const kQwen2[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const char* const kQwen35[] = {
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const char* const kPoro[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
};
const char* const kViking[] = {
    " ?[^(\\s|.,!?…。，、।۔،)]+",
    "\\p{N}",
};
const char* const kTekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const char* const kGpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

struct PreEntry {
  const char* name;
  std::vector<std::string> regexes;
  bool ignore_merges;
  bool clean_spaces;
  bool add_bos;
};

template <size_t N>
std::vector<std::string> list(const char* const (&r)[N]) {
  return std::vector<std::string>(r, r + N);
}

// llama_vocab::impl::load's tokenizer.ggml.pre names and the flags it sets
// with each (clean_spaces defaults to true for BPE).
const std::vector<PreEntry>& pre_table() {
  static const std::vector<PreEntry> table = [] {
    std::vector<PreEntry> t;
    auto add = [&](std::initializer_list<const char*> names, std::vector<std::string> re, bool ignore_merges,
                   bool clean_spaces, bool add_bos) {
      for (const char* n : names) t.push_back({n, re, ignore_merges, clean_spaces, add_bos});
    };
    add({"default"}, list(kDefault), false, true, false);
    add({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}, list(kLlama3), true,
        true, true);
    add({"dbrx", "smaug-bpe"}, list(kLlama3), false, true, false);
    add({"deepseek-llm"}, list(kDeepseekLlm), false, false, false);
    add({"deepseek-coder"}, list(kDeepseekCoder), false, false, false);
    add({"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"}, list(kDeepseek3Llm), false, false, false);
    add({"falcon"}, list(kFalcon), false, true, false);
    add({"mpt", "gpt-2", "phi-2", "gigachat", "a.x-4.0", "mellum", "olmo", "jais", "exaone4"}, list(kGpt2), false, true,
        false);
    add({"trillion", "granite-docling"}, list(kGpt2), false, false, false);
    add({"starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"}, list(kStarcoder), false, true, false);
    add({"smollm", "command-r"}, list(kStarcoder), false, false, false);
    add({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"}, list(kQwen2), false, false, false);
    add({"megrez", "stablelm2"}, list(kQwen2), false, true, false);
    add({"qwen35"}, list(kQwen35), false, false, false);
    add({"poro-chat"}, list(kPoro), false, false, false);
    add({"bloom", "gpt3-finnish"}, list(kPoro), false, true, false);
    add({"viking"}, list(kViking), false, false, false);
    add({"tekken"}, list(kTekken), true, false, true);
    add({"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, list(kGpt4o), false, false, false);
    return t;
  }();
  return table;
}

// Unicode White_Space above ASCII (llama.cpp's unicode_set_whitespace).
bool is_non_ascii_whitespace(uint32_t c) {
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

BpePreTokenizerSpec bpe_pre_tokenizer_spec(const std::string& pre, const std::string& source) {
  for (const PreEntry& e : pre_table())
    if (pre == e.name) return {e.regexes, e.ignore_merges, e.clean_spaces, e.add_bos};
  fail("%s: tokenizer.ggml.pre '%s' is not supported; supported: %s", source.c_str(), pre.c_str(),
       bpe_supported_pre_names().c_str());
}

std::string bpe_supported_pre_names() {
  std::string s;
  for (const PreEntry& e : pre_table()) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

void append_utf8(uint32_t cpt, std::string* out) {
  if (cpt <= 0x7f) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7ff) {
    out->push_back(static_cast<char>(0xc0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  } else if (cpt <= 0xffff) {
    out->push_back(static_cast<char>(0xe0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  }
}

// llama.cpp's unicode_cpt_from_utf8: the lead byte gives the length, the
// continuation bytes are checked for 10xxxxxx and nothing else (overlong
// forms and surrogates pass); a sequence cut short by the end of the text is
// invalid too.
std::vector<uint32_t> utf8_to_codepoints_lenient(const std::string& text) {
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  auto cont = [&](size_t i) { return i < n && (s[i] & 0xc0) == 0x80; };
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      cpts.push_back(c);
      i += 1;
    } else if ((c & 0xe0) == 0xc0 && c >= 0xc0 && cont(i + 1)) {
      cpts.push_back(((c & 0x1fu) << 6) | (s[i + 1] & 0x3fu));
      i += 2;
    } else if ((c & 0xf0) == 0xe0 && cont(i + 1) && cont(i + 2)) {
      cpts.push_back(((c & 0x0fu) << 12) | ((s[i + 1] & 0x3fu) << 6) | (s[i + 2] & 0x3fu));
      i += 3;
    } else if ((c & 0xf8) == 0xf0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const uint32_t cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3fu) << 12) | ((s[i + 2] & 0x3fu) << 6) | (s[i + 3] & 0x3fu);
      cpts.push_back(cp <= 0x10ffff ? cp : 0xfffd);
      i += 4;
    } else {
      cpts.push_back(0xfffd);
      i += 1;
    }
  }
  return cpts;
}

struct BpePreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

BpePreTokenizer::BpePreTokenizer(const std::vector<std::string>& regexes, const std::string& source) : source_(source) {
  for (const std::string& re : regexes) {
    auto c = std::make_unique<Compiled>();
    int err = 0;
    PCRE2_SIZE err_off = 0;
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re.data()), re.size(), PCRE2_UTF | PCRE2_UCP, &err, &err_off,
                            nullptr);
    RUNLM_CHECK(c->code != nullptr, "%s: pre-tokenizer regex '%s' does not compile (PCRE2 at %zu: %s)", source.c_str(),
                re.c_str(), static_cast<size_t>(err_off), pcre2_message(err).c_str());
    // JIT is an optimisation only: without it (unsupported CPU) the
    // interpreter gives the same matches.
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);
    compiled_.push_back(std::move(c));
  }
}

BpePreTokenizer::~BpePreTokenizer() = default;

std::vector<std::string> BpePreTokenizer::split(const std::string& text) const {
  const std::vector<uint32_t> cpts = utf8_to_codepoints_lenient(text);
  // The subject PCRE2 sees and the byte offset where each code point starts
  // in it (one more entry for the end).
  std::string subject;
  subject.reserve(text.size());
  std::vector<size_t> byte_of(cpts.size() + 1);
  for (size_t i = 0; i < cpts.size(); ++i) {
    byte_of[i] = subject.size();
    uint32_t c = cpts[i];
    if (is_non_ascii_whitespace(c)) c = 0x0b;
    if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;  // PCRE2 takes no surrogates; U+FFFD is in the same classes here
    append_utf8(c, &subject);
  }
  byte_of[cpts.size()] = subject.size();
  auto cpt_at = [&](size_t byte) {  // byte is always a code point start
    return static_cast<size_t>(std::lower_bound(byte_of.begin(), byte_of.end(), byte) - byte_of.begin());
  };

  // Words as code point lengths, as llama.cpp's offsets.
  std::vector<size_t> words;
  if (!cpts.empty()) words.push_back(cpts.size());
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  RUNLM_CHECK(md != nullptr, "out of memory for a PCRE2 match");
  try {
    for (const auto& c : compiled_) {
      std::vector<size_t> next;
      next.reserve(words.size());
      size_t start = 0;  // code point index of the current word
      for (size_t len : words) {
        const size_t b0 = byte_of[start], b1 = byte_of[start + len];
        const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data() + b0);
        const size_t n = b1 - b0;
        size_t gap = 0;  // start (bytes, within the word) of text no match has taken
        size_t pos = 0;
        while (pos < n) {
          const int rc = pcre2_match(c->code, subj, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
          if (rc == PCRE2_ERROR_NOMATCH) break;
          RUNLM_CHECK(rc >= 0, "%s: pre-tokenizer regex failed on the text: %s", source_.c_str(),
                      pcre2_message(rc).c_str());
          const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
          const size_t ms = ov[0], me = ov[1];
          if (me == ms) {  // an empty match takes nothing: step one code point
            if (ms >= n) break;
            pos = byte_of[cpt_at(b0 + ms) + 1] - b0;
            continue;
          }
          if (ms > gap) next.push_back(cpt_at(b0 + ms) - cpt_at(b0 + gap));
          next.push_back(cpt_at(b0 + me) - cpt_at(b0 + ms));
          gap = pos = me;
        }
        if (gap < n) next.push_back(cpt_at(b1) - cpt_at(b0 + gap));
        start += len;
      }
      words.swap(next);
    }
  } catch (...) {
    pcre2_match_data_free(md);
    throw;
  }
  pcre2_match_data_free(md);

  std::vector<std::string> out;
  out.reserve(words.size());
  size_t start = 0;
  for (size_t len : words) {
    std::string w;
    for (size_t i = start; i < start + len; ++i) append_utf8(cpts[i], &w);
    out.push_back(std::move(w));
    start += len;
  }
  return out;
}

}  // namespace runlm
