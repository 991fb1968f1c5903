// gpt-oss's replies in the harmony format: after the generation prompt
// "<|start|>assistant" the model writes one or more messages, each
// "<|channel|>NAME[ header]<|message|>TEXT" closed by "<|end|>" and the next
// opened by "<|start|>assistant": its reasoning on the analysis channel, tool
// calls on commentary, the answer on final (ended by <|return|>, which ends
// generation). The chat template takes back only the answer as an assistant
// message's content, as llama.cpp's chat parser gives it.
#pragma once

#include <string>

namespace runlm {

// The text of the reply's last final-channel message; "" when a harmony
// reply has none (cut short in its analysis); the reply itself when it is
// not in the harmony format (it does not open with "<|channel|>").
std::string harmony_final_text(const std::string& reply);
// Whether the reply is in the harmony format (it opens with "<|channel|>").
bool is_harmony_reply(const std::string& reply);

}  // namespace runlm
