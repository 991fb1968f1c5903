// The mixture-of-experts tensors of a Hugging Face checkpoint as the rows of
// llama.cpp's GGUF tensors: the router (ffn_gate_inp, gpt-oss's bias) and the
// experts stacked 3-D (ffn_{gate,up,down}_exps, expert e's rows after expert
// e-1's), as llama.cpp's convert_hf_to_gguf.py writes them. Three source
// layouts:
//  - one 2-D tensor per expert, as [out, in] (Mixtral's
//    block_sparse_moe.experts.E.w1/w3/w2, Qwen3-MoE's
//    mlp.experts.E.gate_proj/up_proj/down_proj);
//  - transformers' fused experts: mlp.experts.gate_up_proj [E, 2*inter,
//    hidden] (the gate rows, then the up rows) and mlp.experts.down_proj
//    [E, hidden, inter];
//  - gpt-oss: mlp.experts.gate_up_proj [E, hidden, 2*inter] applied as x @ W
//    (transposed here) with gate and up interleaved on the last dimension
//    (gate = [..., ::2], up = [..., 1::2]), likewise its bias [E, 2*inter];
//    down_proj [E, inter, hidden] and its bias [E, hidden]. gpt-oss as
//    released keeps its experts in MXFP4 instead (hf_mxfp4_expert_rows).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gguf_llama_writer.h"
#include "hf_config.h"
#include "quantize.h"

namespace runlm {

class SafetensorsModel;

// Whether hf_moe_rows reads the tensor of this role.
bool is_moe_role(TensorRole role);

// The rows of `spec` (a role is_moe_role accepts), read from `st` on demand.
// The Hugging Face tensors it reads are appended to `used`; a missing one or
// one of another shape than config.json implies is an Error naming it.
RowSource hf_moe_rows(const SafetensorsModel& st, const HfConfig& cfg, const LlamaTensorSpec& spec,
                      std::vector<std::string>& used);

// Writes one row of a tensor in its packed type to dst.
using ByteRowSource = std::function<void(int64_t row, uint8_t* dst)>;

// Whether this tensor comes from MXFP4 expert blocks (HfConfig::mxfp4_experts:
// ffn_gate_exps, ffn_up_exps and ffn_down_exps; their biases are unquantized).
bool is_mxfp4_expert_role(const HfConfig& cfg, TensorRole role);

// The rows of an MXFP4 expert tensor as GGUF MXFP4 blocks, copied without
// decoding. The checkpoint has mlp.experts.gate_up_proj_blocks [E, 2*inter,
// hidden/32, 16] and _scales [E, 2*inter, hidden/32] (U8), rows by output,
// gate and up interleaved (gate = rows 2o, up = rows 2o + 1), and
// down_proj_blocks [E, hidden, inter/32, 16] with its scales. A block of 32
// values: its E8M0 scale byte, as it is, then 16 bytes; the checkpoint packs
// values 2k and 2k + 1 in byte k's low and high nibble, GGUF values k and
// k + 16 (the layout of llama.cpp's converter).
ByteRowSource hf_mxfp4_expert_rows(const SafetensorsModel& st, const HfConfig& cfg, const LlamaTensorSpec& spec,
                                   std::vector<std::string>& used);

}  // namespace runlm
