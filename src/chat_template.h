// Chat templates: renders a conversation into the prompt text a model was
// trained on, byte for byte as transformers' apply_chat_template renders the
// model's own Jinja template. The known templates are named; a GGUF's
// tokenizer.chat_template (Jinja source) is recognised by its markers.
#pragma once

#include <string>
#include <vector>

namespace runlm {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Names accepted by --chat-template.
const std::vector<std::string>& chat_template_names();

// Recognises a Jinja chat template from its markers; throws Error saying the
// template is unknown and naming --chat-template and the known names.
std::string chat_template_detect(const std::string& jinja_source);

// Throws Error for an unknown name (listing the known ones), for a role the
// template lacks (Gemma has no system role), or a conversation it forbids.
// bos/eos are the token texts the template writes ("<s>", "</s>").
std::string chat_template_apply(const std::string& name, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, const std::string& bos = "<s>",
                                const std::string& eos = "</s>");

// The text that ends an assistant turn in this template ("</s>",
// "<|im_end|>", "<end_of_turn>"): generation stops there.
std::string chat_template_end_marker(const std::string& name);

}  // namespace runlm
