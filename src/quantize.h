// Weight-type selection and parallel row encoding, shared by `runlm
// quantize`, `runlm convert` and make_random_model, plus quantize_gguf()
// itself: GGUF in, GGUF out with every weight matrix re-encoded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dtype.h"

namespace runlm {

// How a mix changes a tensor class's type away from the base type; the
// values name llama.cpp's rules (llama_tensor_get_type_impl in
// src/llama-quant.cpp) and are documented in quantize.cpp.
enum class AttnVRule : uint8_t { Keep, Q2K, Q3KM, Q5K, Iq4, MoreBitsQ6K, First4Q5K };
enum class FfnDownRule : uint8_t { Keep, Q3K, Q3KM, Q5K, MoreBitsQ6K, FirstEighthQ5K };

// A target as users name it: one of llama.cpp's file types ("mixes", named
// as llama-quantize names them) or a plain type. A mix is a base type plus
// per-tensor rules; `runlm quantize --pure` and convert use the base type
// for every weight matrix.
struct QuantTarget {
  const char* name;     // "q4_k_m"
  DType base;           // type of most weight matrices
  uint32_t ftype;       // general.file_type (llama_ftype)
  AttnVRule attn_v;     // attn_v / attn_qkv
  FfnDownRule ffn_down;
  DType attn_output;    // its type in the mix (base when the mix leaves it)
  bool mxfp4_moe;       // MXFP4 for expert tensors, Q8_0 for the rest
};
// Accepts the names listed by quant_target_names() (any case); Error
// listing them otherwise. q3_k, q4_k and q5_k are llama-quantize's aliases
// for q3_k_m, q4_k_m and q5_k_m.
const QuantTarget& quant_target_from_name(const std::string& name);
std::string quant_target_names();
// The target that writes `t` for every weight matrix (convert's --type).
const QuantTarget& quant_target_for_type(DType t);

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third one in between get more bits in the *_M mixes.
bool llama_use_more_bits(int layer, int n_layers);

// What the rules look at besides the tensor itself (llama.cpp reads the same
// from the model's hyperparameters).
struct QuantModelInfo {
  int n_layers = 0;       // block_count
  int n_head = 1, n_head_kv = 1;  // n_gqa = n_head / n_head_kv
  int n_expert = 0;       // expert_count (0: dense)
  bool has_output = true; // false: tied embeddings, token_embd plays the output's part
  bool is_70b = false;    // llama.cpp's LLM_TYPE_70B (80 layers with GQA): attn_v gets Q5_K
  bool falcon = false;    // general.architecture == "falcon" (its own ffn_down rules)
  int n_gqa() const { return n_head_kv > 0 ? n_head / n_head_kv : 1; }
};
// From the GGUF metadata of a model (architecture hparams, output.weight).
class GgufFile;
QuantModelInfo quant_model_info(const GgufFile& g);

struct TensorTypeChoice {
  DType type;          // what the tensor is written as
  DType wanted;        // what the target asked for
  std::string note;    // non-empty when type != wanted: why (names the tensor)
  bool quantized = true;  // false: llama.cpp leaves this tensor's type alone (norms, vectors)
};
// Tensors llama.cpp does not quantize (1-D, names not ending in "weight",
// *_norm.weight, the MoE router ffn_gate_inp) report quantized = false with
// type F32. A row length that is not a multiple of the wanted type's block
// falls back as llama.cpp's tensor_type_fallback does (Q2_K/Q3_K -> Q4_0,
// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, then F16).
// `pure` skips the mix rules (llama-quantize --pure). The i-th attn_v is
// taken to be layer i's (one per layer, as in every llama-family model).
TensorTypeChoice choose_tensor_type(const QuantTarget& target, const std::string& name,
                                    const std::vector<int64_t>& ne, const QuantModelInfo& model,
                                    bool pure = false);

// Writes n_rows rows of n_cols elements of type t to dst, row r being
// encoded from the floats that src_row(r, buf) puts in buf[0..n_cols).
// Rows are split over n_threads threads (0: hardware_concurrency); src_row
// must therefore be safe to call concurrently. An exception in any thread
// is rethrown here.
using RowSource = std::function<void(int64_t row, float* buf)>;
void encode_rows_parallel(DType t, int64_t n_cols, int64_t n_rows, const RowSource& src_row, uint8_t* dst,
                          int n_threads = 0);

struct QuantizeOptions {
  int n_threads = 0;
  bool pure = false;              // every weight matrix gets the base type
  bool allow_requantize = false;  // re-encode tensors that are already quantized
};

struct QuantizeReport {
  size_t n_tensors = 0;
  std::vector<std::string> fallbacks;  // one note per tensor that fell back
  uint64_t bytes_in = 0;               // tensor data only
  uint64_t bytes_out = 0;
};
// Re-encodes the GGUF at `in` for `target` and writes `out` (metadata
// copied, general.file_type updated; written to a temporary file and renamed
// when complete). Fallbacks are printed on stderr and returned. A tensor
// already of its chosen type is copied as is. Errors, before anything is
// written: `out` is `in` (same path or the same file through a link), or a
// tensor would be re-encoded from a quantized type without
// allow_requantize.
QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const std::string& target,
                             const QuantizeOptions& options = {});

}  // namespace runlm
