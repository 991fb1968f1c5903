// A Hugging Face byte-level BPE tokenizer (tokenizer.json plus
// tokenizer_config.json) written as GGUF vocabulary metadata the way
// llama.cpp's converter writes it (_set_vocab_gpt2): tokenizer.ggml.model
// "gpt2", tokenizer.ggml.pre, tokens, token_type, merges, special token ids
// and add_bos/add_eos, plus tokenizer.chat_template.
//
// llama.cpp names the pre-tokenizer by hashing the tokenizer's output on a
// fixed text, which needs the tokenizer itself; runlm names it by the model
// family instead (bpe_pre_tokenizer_for): Llama 3 "llama-bpe", Qwen2/Qwen3
// and Qwen3-MoE "qwen2", Mistral Nemo (MistralForCausalLM with
// tokenizer.json) "tekken", gpt-oss "gpt-4o".
#pragma once

#include <cstdint>
#include <string>

#include "hf_config.h"

namespace runlm {

class GgufWriter;

// llama.cpp's tokenizer.ggml.pre for the family's BPE tokenizer; Error for
// a family with no known one.
std::string bpe_pre_tokenizer_for(const HfConfig& cfg);

// Writes the vocabulary of DIR/tokenizer.json, padded to n_vocab with
// "[PAD<id>]" unused tokens as llama.cpp does; Error on a tokenizer that is
// not BPE, has more tokens than n_vocab, or is malformed.
void write_bpe_vocab(GgufWriter& w, const std::string& dir, const HfConfig& cfg, int64_t n_vocab,
                     const std::string& chat_template);

}  // namespace runlm
