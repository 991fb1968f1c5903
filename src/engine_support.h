// What each engine implements of the layer descriptions in models/arch.h.
// The CPU engine is the reference and runs every description; the CUDA
// engine runs the plain Llama layer (Llama, Mistral) and refuses the rest
// with an Error naming the feature and the architecture, so no model runs on
// it with a part of its layer silently left out.
#pragma once

#include "llama.h"

namespace runlm {

// Error ("the CUDA engine does not implement FEATURE (architecture ARCH)
// yet; use --device cpu") when c uses anything beyond the Llama layer.
void require_cuda_engine_support(const ModelConfig& c);

}  // namespace runlm
