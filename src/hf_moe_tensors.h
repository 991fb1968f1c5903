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
//    down_proj [E, inter, hidden] and its bias [E, hidden].
#pragma once

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

}  // namespace runlm
