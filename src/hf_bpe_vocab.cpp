// tokenizer.json to GGUF vocabulary metadata (see hf_bpe_vocab.h).
#include "hf_bpe_vocab.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "common.h"
#include "gguf.h"
#include "json_brief.h"

namespace runlm {

namespace {

using nlohmann::json;

// llama.cpp's token types (llama_token_type / gguf TokenType).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

json read_json(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    RUNLM_CHECK(!required, "%s: cannot open", path.c_str());
    return json();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("%s: bad JSON: %s", path.c_str(), e.what());
  }
}

// llama.cpp's does_token_look_special: added tokens not marked special
// that still name a control token.
bool looks_special(const std::string& t) {
  auto wraps = [&](const char* a, const char* b) {
    const std::string sa(a), sb(b);
    return t.size() >= sa.size() + sb.size() && t.compare(0, sa.size(), sa) == 0 &&
           t.compare(t.size() - sb.size(), sb.size(), sb) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xef\xbd\x9c", "\xef\xbd\x9c>") || wraps("<start_of_", ">") || wraps("<end_of_", ">");
}

// A special token named in tokenizer_config.json: a string or {"content": ...}.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

std::string bpe_pre_tokenizer_for(const HfConfig& cfg) {
  switch (cfg.arch) {
    case Arch::Llama:  // Llama 3.x (Mixtral ships a sentencepiece tokenizer.model)
      if (cfg.n_expert == 0) return "llama-bpe";
      break;
    case Arch::Mistral: return "tekken";    // Mistral Nemo's tekken tokenizer
    case Arch::Qwen2:
    case Arch::Qwen3:
    case Arch::Qwen3Moe: return "qwen2";
    case Arch::GptOss: return "gpt-4o";     // o200k_harmony, as llama.cpp's hash names it
    default: break;
  }
  fail("%s with a tokenizer.json (byte-level BPE): no known llama.cpp pre-tokenizer for this family; supported: "
       "LlamaForCausalLM (llama-bpe), MistralForCausalLM (tekken), Qwen2ForCausalLM, Qwen3ForCausalLM and "
       "Qwen3MoeForCausalLM (qwen2), GptOssForCausalLM (gpt-4o)",
       cfg.architecture.c_str());
}

void write_bpe_vocab(GgufWriter& w, const std::string& dir, const HfConfig& cfg, int64_t n_vocab,
                     const std::string& chat_template) {
  const std::string tok_path = dir + "/tokenizer.json";
  const json tj = read_json(tok_path, true);
  RUNLM_CHECK(tj.is_object() && tj.contains("model") && tj["model"].is_object(), "%s: no \"model\" object",
              tok_path.c_str());
  const json& model = tj["model"];
  const std::string type = model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>() : "";
  RUNLM_CHECK(type == "BPE", "%s: tokenizer model type '%s' is not supported (supported: BPE)", tok_path.c_str(),
              type.c_str());
  const std::string pre = bpe_pre_tokenizer_for(cfg);

  // id -> (text, type): the BPE vocabulary, then the added tokens over it.
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;
  RUNLM_CHECK(model.contains("vocab") && model["vocab"].is_object(), "%s: model.vocab must be an object",
              tok_path.c_str());
  for (const auto& [text, id] : model["vocab"].items()) {
    RUNLM_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0, "%s: vocab entry '%s' has id %s", tok_path.c_str(),
                text.c_str(), json_brief(id).c_str());
    by_id[id.get<int64_t>()] = {text, kNormal};
  }
  std::map<std::string, int64_t> added_id;
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const json& t : tj["added_tokens"]) {
      RUNLM_CHECK(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                      t["content"].is_string(),
                  "%s: malformed added_tokens entry %s", tok_path.c_str(), json_brief(t).c_str());
      const int64_t id = t["id"].get<int64_t>();
      std::string text = t["content"].get<std::string>();
      const bool special = t.value("special", false) || looks_special(text);
      if (!special) {
        // As llama.cpp: a user-defined token's sentencepiece spaces become plain ones.
        for (size_t p; (p = text.find("\xe2\x96\x81")) != std::string::npos;) text.replace(p, 3, " ");
      }
      by_id[id] = {text, special ? kControl : kUserDefined};
      added_id[t["content"].get<std::string>()] = id;
    }
  }
  RUNLM_CHECK(!by_id.empty() && by_id.rbegin()->first < n_vocab,
              "%s: token id %lld does not fit the model's vocabulary of %lld", tok_path.c_str(),
              static_cast<long long>(by_id.empty() ? -1 : by_id.rbegin()->first), static_cast<long long>(n_vocab));
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int64_t i = 0; i < n_vocab; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens.push_back(strfmt("[PAD%lld]", static_cast<long long>(i)));
      types.push_back(kUnused);
    } else {
      tokens.push_back(it->second.first);
      types.push_back(it->second.second);
    }
  }
  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    for (const json& m : model["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else {
        RUNLM_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                    "%s: malformed merge %s", tok_path.c_str(), json_brief(m).c_str());
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      }
    }
  }
  RUNLM_CHECK(!merges.empty(), "%s: a BPE tokenizer without merges", tok_path.c_str());

  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set("tokenizer.ggml.tokens", GgufValue::make_string_array(tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
  w.set("tokenizer.ggml.merges", GgufValue::make_string_array(merges));

  // Special tokens as gguf-py's SpecialVocab finds them: tokenizer_config.json
  // names the token, the added tokens give its id; else config.json's id.
  const json tc = read_json(dir + "/tokenizer_config.json", false);
  const json cj = read_json(dir + "/config.json", false);
  int64_t bos = -1;
  const std::pair<const char*, const char*> kinds[] = {
      {"bos", "tokenizer.ggml.bos_token_id"}, {"eos", "tokenizer.ggml.eos_token_id"},
      {"unk", "tokenizer.ggml.unknown_token_id"}, {"pad", "tokenizer.ggml.padding_token_id"}};
  for (const auto& [kind, key] : kinds) {
    int64_t id = -1;
    const std::string tk = std::string(kind) + "_token";
    if (tc.is_object() && tc.contains(tk)) {
      auto it = added_id.find(token_content(tc[tk]));
      if (it != added_id.end()) id = it->second;
    }
    const std::string ck = std::string(kind) + "_token_id";
    if (id < 0 && cj.is_object() && cj.contains(ck) && cj[ck].is_number_integer()) id = cj[ck].get<int64_t>();
    if (id < 0) continue;
    RUNLM_CHECK(id < n_vocab, "%s: %s id %lld is outside the vocabulary", dir.c_str(), tk.c_str(),
                static_cast<long long>(id));
    w.set_u32(key, static_cast<uint32_t>(id));
    if (std::string(kind) == "bos") bos = id;
  }
  // add_bos_token: tokenizer_config.json's flag, else whether the
  // post-processor's single-sequence template starts with the BOS token.
  std::optional<bool> add_bos;
  if (tc.is_object() && tc.contains("add_bos_token") && tc["add_bos_token"].is_boolean())
    add_bos = tc["add_bos_token"].get<bool>();
  if (!add_bos && tj.contains("post_processor") && tj["post_processor"].is_object()) {
    const json& pp = tj["post_processor"];
    const json* tp = &pp;
    if (pp.value("type", "") == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
      for (const json& p : pp["processors"])
        if (p.is_object() && p.value("type", "") == "TemplateProcessing") tp = &p;
    if (tp->value("type", "") == "TemplateProcessing" && tp->contains("single") && (*tp)["single"].is_array() &&
        !(*tp)["single"].empty()) {
      const json& first = (*tp)["single"][0];
      const bool starts_special = first.is_object() && first.contains("SpecialToken");
      add_bos = starts_special && bos >= 0 &&
                added_id.count(first["SpecialToken"].value("id", "")) &&
                added_id[first["SpecialToken"].value("id", "")] == bos;
    }
  }
  if (add_bos) w.set_bool("tokenizer.ggml.add_bos_token", *add_bos);
  if (tc.is_object() && tc.contains("add_eos_token") && tc["add_eos_token"].is_boolean())
    w.set_bool("tokenizer.ggml.add_eos_token", tc["add_eos_token"].get<bool>());
  if (!chat_template.empty()) w.set_string("tokenizer.chat_template", chat_template);
}

}  // namespace runlm
