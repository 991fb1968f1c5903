// Mixture-of-experts routing on the CPU: which experts a token runs and with
// what weights, from the router's logits, as llama.cpp's build_moe_ffn
// (src/llama-graph.cpp) computes them.
#pragma once

#include <cstdint>

namespace runlm {

struct MoeRouting {
  int n_expert = 0;
  int n_used = 0;             // k
  // true: softmax over all experts, then the top k of the probabilities
  // (Mixtral, Qwen3-MoE); false: the top k logits, then a softmax over those
  // k (gpt-oss).
  bool softmax_first = true;
  bool normalize = false;     // the k weights divided by their sum (clamped below at 2^-14)
  float scale = 1.0f;         // then multiplied by this
};

// logits: [n_expert]. Writes the chosen experts in descending order of their
// score (ties: the lower index first) to experts[n_used] and their weights to
// weights[n_used]. scratch holds n_expert floats.
void moe_route(const float* logits, const MoeRouting& r, int32_t* experts, float* weights, float* scratch);

}  // namespace runlm
