// runlm template: renders a conversation (a JSON array of {"role",
// "content"}) with a model's chat template and prints exactly the text the
// model would be given. It reads only the GGUF's metadata (the template and
// the BOS/EOS token texts), so vocabulary-only files work too.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chat_template_cli.h"
#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "gguf.h"

namespace runlm {
namespace {

// The text of token `key`'s id in tokenizer.ggml.tokens, or "" when the
// file names no such token.
std::string token_text(const GgufFile& g, const std::vector<std::string>& tokens, const char* key) {
  const std::optional<int64_t> id = g.get_int_opt(key);
  if (!id) return "";
  RUNLM_CHECK(*id >= 0 && static_cast<size_t>(*id) < tokens.size(), "%s is %lld, outside the vocabulary of %zu tokens",
              key, static_cast<long long>(*id), tokens.size());
  return tokens[static_cast<size_t>(*id)];
}

std::vector<ChatMessage> read_conversation(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RUNLM_CHECK(f.good(), "cannot open %s (--messages)", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON: %s", path.c_str(), e.what());
  }
  RUNLM_CHECK(j.is_array(), "%s: expected a JSON array of {\"role\", \"content\"} messages", path.c_str());
  std::vector<ChatMessage> messages;
  for (size_t k = 0; k < j.size(); ++k) {
    const auto& m = j[k];
    RUNLM_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                    m["content"].is_string(),
                "%s: message %zu needs string \"role\" and \"content\"", path.c_str(), k);
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

}  // namespace

int cmd_template(int argc, char** argv) {
  cxxopts::Options opts("runlm template", "Print a conversation as the chat template renders it");
  opts.add_options()
      ("h,help", "show this help")
      ("m,model", "GGUF model or vocabulary file", cxxopts::value<std::string>())
      ("messages", "conversation: a JSON array of {\"role\", \"content\"}", cxxopts::value<std::string>())
      ("no-add-generation-prompt", "leave out the assistant turn's opening");
  add_chat_template_options(opts, "template");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  RUNLM_CHECK(args.count("model"), "no model given: use -m MODEL.gguf");
  RUNLM_CHECK(args.count("messages"), "no conversation given: use --messages CONV.json");
  const std::string path = args["model"].as<std::string>();
  const std::vector<ChatMessage> messages = read_conversation(args["messages"].as<std::string>());
  auto g = GgufFile::open(path);
  std::vector<std::string> tokens;
  if (g->get_string_opt("tokenizer.chat_template") || args.count("chat-template") || args.count("chat-template-file"))
    tokens = g->get_string_array("tokenizer.ggml.tokens");
  const std::string bos = tokens.empty() ? "" : token_text(*g, tokens, "tokenizer.ggml.bos_token_id");
  const std::string eos = tokens.empty() ? "" : token_text(*g, tokens, "tokenizer.ggml.eos_token_id");
  const std::optional<ChatTemplate> tmpl =
      chat_template_from_options(args, g->get_string_opt("tokenizer.chat_template").value_or(""), path, bos, eos);
  RUNLM_CHECK(tmpl.has_value(), "%s", no_chat_template_message().c_str());
  const RenderedPrompt prompt = tmpl->apply(messages, args.count("no-add-generation-prompt") == 0);
  if (args.count("verbose-prompt")) std::fprintf(stderr, "%zu bytes\n", prompt.text.size());
  write_stdout(prompt.text);
  return 0;
}

}  // namespace runlm
