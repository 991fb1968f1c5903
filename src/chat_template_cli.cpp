#include "chat_template_cli.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common.h"

namespace runlm {

void add_chat_template_options(cxxopts::Options& opts, const std::string& group) {
  std::string names;
  for (const auto& n : chat_template_names()) names += (names.empty() ? "" : ", ") + n;
  opts.add_options(group)
      ("chat-template", "built-in chat template: " + names + " (default: the model's tokenizer.chat_template)",
       cxxopts::value<std::string>())
      ("chat-template-file", "Jinja chat template file (default: the model's tokenizer.chat_template)",
       cxxopts::value<std::string>())
      ("jinja", "use the Jinja chat template (always on; accepted for llama.cpp compatibility)")
      ("verbose-prompt", "print the rendered prompt and its token count on stderr");
}

std::string no_chat_template_message() {
  return "the model has no chat template (tokenizer.chat_template); choose one with --chat-template NAME or "
         "--chat-template-file FILE";
}

std::optional<ChatTemplate> chat_template_from_options(const cxxopts::ParseResult& args,
                                                       const std::string& gguf_source, const std::string& model_path,
                                                       const std::string& bos_text, const std::string& eos_text) {
  const bool has_name = args.count("chat-template") > 0, has_file = args.count("chat-template-file") > 0;
  RUNLM_CHECK(!(has_name && has_file), "--chat-template and --chat-template-file both given; choose one");
  if (has_file) {
    const std::string path = args["chat-template-file"].as<std::string>();
    std::ifstream f(path, std::ios::binary);
    RUNLM_CHECK(f.good(), "cannot open chat template file %s (--chat-template-file)", path.c_str());
    std::stringstream ss;
    ss << f.rdbuf();
    RUNLM_CHECK(!f.bad(), "cannot read chat template file %s", path.c_str());
    return ChatTemplate(ss.str(), "chat template file " + path, bos_text, eos_text);
  }
  if (has_name) {
    const std::string name = args["chat-template"].as<std::string>();
    return ChatTemplate(builtin_chat_template(name), "built-in chat template " + name, bos_text, eos_text);
  }
  if (gguf_source.empty()) return std::nullopt;
  return ChatTemplate(gguf_source, "tokenizer.chat_template of " + model_path, bos_text, eos_text);
}

void print_verbose_prompt(const std::string& text, size_t n_tokens) {
  std::fprintf(stderr, "prompt (%zu tokens):\n%s\n", n_tokens, text.c_str());
}

}  // namespace runlm
