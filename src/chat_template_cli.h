// The chat-template flags shared by chat, batch and template:
// --chat-template NAME (a built-in), --chat-template-file FILE (a .jinja
// file), --jinja (llama.cpp's flag for using the model's own template; it is
// always used here) and --verbose-prompt; and the choice between them and
// the GGUF's tokenizer.chat_template.
#pragma once

#include <cxxopts.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_template.h"

namespace runlm {

void add_chat_template_options(cxxopts::Options& opts, const std::string& group);

// --chat-template-file, else --chat-template, else the model's own template
// (gguf_source, read from model_path); nullopt when there is none of them.
// Throws Error for both flags at once, an unknown name, an unreadable file or
// a template that does not parse.
std::optional<ChatTemplate> chat_template_from_options(const cxxopts::ParseResult& args,
                                                       const std::string& gguf_source, const std::string& model_path,
                                                       const std::string& bos_text, const std::string& eos_text);

// The message for a model without a template and no flag choosing one.
std::string no_chat_template_message();

// --verbose-prompt: the rendered prompt and its token count on stderr.
void print_verbose_prompt(const std::string& text, size_t n_tokens);

}  // namespace runlm
