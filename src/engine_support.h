// What each engine implements of the layer descriptions in models/arch.h.
// The CPU engine is the reference and runs every description; the CUDA
// engine runs the plain Llama layer (Llama, Mistral) and refuses the rest
// with an Error naming the feature and the architecture, so no model runs on
// it with a part of its layer silently left out.
#pragma once

#include <string>

#include "llama_arch.h"

namespace runlm {

// "the CUDA engine does not implement FEATURES (architecture ARCH) yet; use
// --device cpu" when c uses anything beyond the Llama layer, else "".
// --device auto takes the CPU with this reason.
std::string cuda_engine_unsupported_layer(const ModelConfig& c);
// The same as an Error (the CUDA engine's constructor).
void require_cuda_engine_support(const ModelConfig& c);

}  // namespace runlm
