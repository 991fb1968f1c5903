// Weight-type selection and parallel row encoding, shared by `runlm
// quantize`, `runlm convert` and make_random_model, plus quantize_gguf()
// itself: GGUF in, GGUF out with every 2-D weight re-encoded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtype.h"

namespace runlm {

// A target as users name it. Most are one type for every 2-D weight;
// q4_k_m is llama.cpp's Q4_K_M mix.
struct QuantTarget {
  const char* name;   // "q4_k_m"
  DType base;         // type of most 2-D weights
  uint32_t ftype;     // general.file_type
  bool k_mix;         // Q6_K for output (or tied token_embd) and some attn_v / ffn_down
};
// Accepts f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m (any case); Error
// listing them otherwise.
const QuantTarget& quant_target_from_name(const std::string& name);

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third one in between get more bits in the *_M mixes.
bool llama_use_more_bits(int layer, int n_layers);

struct TensorTypeChoice {
  DType type;          // what the tensor is written as
  DType wanted;        // what the target asked for
  std::string note;    // non-empty when type != wanted: why (names the tensor)
};
// 1-D tensors stay F32. A row length that is not a multiple of the wanted
// type's block size falls back: k-quant -> q8_0 when ne[0] % 32 == 0, else
// f16. `has_output` is false for tied models, where token_embd plays the
// output's part in the q4_k_m mix (as in llama.cpp).
TensorTypeChoice choose_tensor_type(const QuantTarget& target, const std::string& name,
                                    const std::vector<int64_t>& ne, int n_layers, bool has_output);

// Writes n_rows rows of n_cols elements of type t to dst, row r being
// encoded from the floats that src_row(r, buf) puts in buf[0..n_cols).
// Rows are split over n_threads threads (0: hardware_concurrency); src_row
// must therefore be safe to call concurrently. An exception in any thread
// is rethrown here.
using RowSource = std::function<void(int64_t row, float* buf)>;
void encode_rows_parallel(DType t, int64_t n_cols, int64_t n_rows, const RowSource& src_row, uint8_t* dst,
                          int n_threads = 0);

struct QuantizeReport {
  size_t n_tensors = 0;
  std::vector<std::string> fallbacks;  // one note per tensor that fell back
  uint64_t bytes_in = 0;               // tensor data only
  uint64_t bytes_out = 0;
};
// Re-encodes every tensor of the GGUF at `in` for `target` and writes `out`
// (metadata copied, general.file_type updated). Fallbacks are printed on
// stderr and returned. A tensor already of its chosen type is copied as is.
QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const std::string& target,
                             int n_threads = 0);

}  // namespace runlm
