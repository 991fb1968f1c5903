// Converters to GGUF: llama.c .bin checkpoints and Hugging Face directories
// (config.json + safetensors + tokenizer.model or tokenizer.json) of the
// classes hf_config.h lists, mixtures of experts included (their router and
// experts: hf_moe_tensors.h). Weights are written as f32, f16 or bf16 (norms always
// f32); `runlm quantize` takes it from there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dtype.h"
#include "gguf_llama_writer.h"

namespace runlm {

struct ConvertResult {
  LlamaHParams hparams;
  DType type = DType::F32;  // type of the 2-D weights
  size_t n_tensors = 0;
  int64_t n_params = 0;
};

// llama2.c legacy checkpoint: 7 int32 header (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size (negative: untied classifier at the end),
// seq_len), then fp32 weights. The file size must match the header exactly.
// Weights already use the adjacent-pair RoPE layout: no permutation.
// type: f32, f16 or bf16 (nullopt: f32, the checkpoint's own precision).
ConvertResult convert_llama2c(const std::string& bin_path, const std::string& tokenizer_model,
                              const std::string& out_path, std::optional<DType> type = std::nullopt);

// Hugging Face directory. q_proj/k_proj rows are un-permuted from
// rotate_half order to adjacent pairs (llama.cpp convert_hf_to_gguf's
// permute). tokenizer_model "" means DIR/tokenizer.model. type nullopt keeps
// the checkpoint's precision (that of model.embed_tokens).
ConvertResult convert_hf(const std::string& dir, const std::string& out_path, std::optional<DType> type = std::nullopt,
                         const std::string& tokenizer_model = "");

// Source row of destination row `row` after the rotate_half -> adjacent-pair
// permutation of a q or k projection with n_head heads of rows/n_head rows:
// within a head, destination 2*j + s takes source s*(head_dim/2) + j.
int64_t rope_unpermute_source_row(int64_t row, int64_t n_rows, int64_t n_head);

}  // namespace runlm
