// The RoPE each layer applies (kernels/cpu/ops.h RopeSpec), as both engines
// take it from the model: the NeoX or adjacent-pair style and rotated width;
// the local base and scale on sliding-window layers where the model has
// them; YaRN's correction dimensions; and the per-pair divisors
// (rope_freqs, or longrope's long ones above the original context and its
// short ones within it, as llama.cpp chooses them).
#pragma once

#include <vector>

#include "model.h"
#include "ops.h"

namespace runlm {

// The specs of every layer for a context of n_ctx tokens. The divisors are
// decoded into *factors, which the specs point into: keep it alive (and
// unmoved) as long as the specs.
std::vector<RopeSpec> layer_rope_specs(const Model& model, int n_ctx, std::vector<float>* factors);

}  // namespace runlm
