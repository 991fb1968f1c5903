// What each engine implements of the layer descriptions in models/arch.h.
// The CPU engine is the reference and runs every description. The CUDA
// engine runs the layers of every family (Llama, Mistral, Qwen2, Qwen3,
// Gemma 2/3, Phi-3) except what it still lacks, which it refuses with an
// Error naming the feature and the architecture, so no model runs on it with
// a part of its layer silently left out.
#pragma once

#include <string>
#include <vector>

#include "llama_arch.h"

namespace runlm {

// What of c's layer the CUDA engine does not implement: the experts'
// activations and counts its MoE kernels do not take, gpt-oss's clamped
// SwiGLU outside experts, and a head dimension past its RoPE and decode
// attention kernels' 256.
std::vector<std::string> cuda_engine_missing_features(const ModelConfig& c);

// "the CUDA engine does not implement FEATURES (architecture ARCH) yet; use
// --device cpu" when c uses anything it lacks, else "".
// --device auto takes the CPU with this reason.
std::string cuda_engine_unsupported_layer(const ModelConfig& c);
// The same as an Error (the CUDA engine's constructor).
void require_cuda_engine_support(const ModelConfig& c);

}  // namespace runlm
