// libFuzzer target: Hugging Face config.json parsing (parse_hf_config) and
// the converter's check of the hyperparameters it takes from it
// (validate_llama_hparams). A runlm::Error is a correct rejection; anything
// else is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common.h"
#include "gguf_llama_writer.h"
#include "hf_config.h"

using namespace runlm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const HfConfig c = parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
    // What convert_hf copies into the GGUF hyperparameters.
    LlamaHParams hp;
    hp.context_length = c.max_position_embeddings;
    hp.dim = c.hidden_size;
    hp.hidden_dim = c.intermediate_size;
    hp.n_layers = c.num_hidden_layers;
    hp.n_heads = c.num_attention_heads;
    hp.n_kv_heads = c.num_key_value_heads;
    hp.head_dim = c.head_dim;
    hp.vocab_size = c.vocab_size;
    hp.rms_eps = static_cast<float>(c.rms_norm_eps);
    hp.rope_theta = static_cast<float>(c.rope_theta);
    hp.rope_scaling_type = c.rope_scaling_type;
    hp.rope_scaling_factor = static_cast<float>(c.rope_scaling_factor);
    hp.rope_scaling_original_context = c.rope_scaling_original_context;
    hp.sliding_window = c.sliding_window;
    hp.tied_embeddings = c.tie_word_embeddings;
    validate_llama_hparams(hp, "fuzz/config.json");
  } catch (const Error&) {
  }
  return 0;
}
