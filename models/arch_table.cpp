// The architectures runlm runs, one row each (see models/arch.h). Every
// value is read off llama.cpp: rope styles from llama_model_rope_type
// (llama: NORM; qwen2, qwen3, phi3, gemma2, gemma3: NEOX), tensors from each
// load_arch_tensors, soft-caps, windows and swa patterns from each
// load_arch_hparams, the activations and norms from src/models/*.cpp.
#include "arch.h"

#include "common.h"

namespace runlm {

namespace {

constexpr SoftcapRule kNoCap{};

// clang-format off
const ArchDesc kArchs[] = {
    // Llama 1/2/3.x, TinyLlama, Mistral 7B and Mistral Nemo (written as "llama"
    // by llama.cpp); with expert_count > 0, Mixtral (softmax, top k, renormalised).
    {Arch::Llama, "llama", "LlamaForCausalLM", RopeStyle::Adjacent, FfnActivation::SiLU,
     /*qkv_bias*/ false, /*qk_norm*/ false, /*post_norms*/ false, /*fused_qkv*/ false, /*fused_gate_up*/ false,
     /*output_tensor*/ true, /*embd_scale*/ false, /*rope_freqs*/ true, /*longrope*/ false, /*rope_dims_full*/ true,
     kNoCap, kNoCap, /*default_window*/ 0, /*swa_pattern*/ 0, LocalRope::Global, 0},
    {Arch::Mistral, "mistral", "MistralForCausalLM", RopeStyle::Adjacent, FfnActivation::SiLU,
     false, false, false, false, false, true, false, true, false, true,
     kNoCap, kNoCap, 0, 0, LocalRope::Global, 0},
    // Qwen2 / Qwen2.5: q, k, v biases.
    {Arch::Qwen2, "qwen2", "Qwen2ForCausalLM", RopeStyle::NeoX, FfnActivation::SiLU,
     true, false, false, false, false, true, false, false, false, false,
     kNoCap, kNoCap, 0, 0, LocalRope::Global, 0},
    // Qwen3: per-head RMSNorm of q and k before RoPE, no biases.
    {Arch::Qwen3, "qwen3", "Qwen3ForCausalLM", RopeStyle::NeoX, FfnActivation::SiLU,
     false, true, false, false, false, true, false, false, false, false,
     kNoCap, kNoCap, 0, 0, LocalRope::Global, 0},
    // Gemma 2: sqrt(dim) embedding scale, post norms, GELU, attention soft-cap
    // 50 and final 30, every other layer local with a 4096 window (layer 0 local).
    {Arch::Gemma2, "gemma2", "Gemma2ForCausalLM", RopeStyle::NeoX, FfnActivation::GeluTanh,
     false, false, true, false, false, /*output_tensor*/ false, true, false, false, false,
     {true, 50.0f}, {true, 30.0f}, 4096, 2, LocalRope::SwaKey, 46},
    // Gemma 3 (text): as Gemma 2 without the attention soft-cap, plus q/k
    // norms; 5 local layers to 1 global, local RoPE base 10000 unscaled.
    {Arch::Gemma3, "gemma3", "Gemma3ForCausalLM", RopeStyle::NeoX, FfnActivation::GeluTanh,
     false, true, true, false, false, true, true, false, false, false,
     kNoCap, {true, 0.0f}, 0, 6, LocalRope::SwaKeyUnscaled, 62},
    // Phi-3 / Phi-3.5 / Phi-4-mini: fused qkv and gate+up, longrope.
    {Arch::Phi3, "phi3", "Phi3ForCausalLM", RopeStyle::NeoX, FfnActivation::SiLU,
     false, false, false, true, true, true, false, false, true, false,
     kNoCap, kNoCap, 0, 0, LocalRope::Global, 0},
    // Qwen3-MoE: the Qwen3 layer with a mixture of experts (softmax, top k,
    // renormalised) in place of the FFN; expert size from expert_feed_forward_length.
    {Arch::Qwen3Moe, "qwen3moe", "Qwen3MoeForCausalLM", RopeStyle::NeoX, FfnActivation::SiLU,
     false, true, false, false, false, true, false, false, false, false,
     kNoCap, kNoCap, 0, 0, LocalRope::Global, 0,
     /*moe*/ true, MoeGating::SoftmaxThenTopK, /*moe_norm_weights*/ true, ExpertFfnKey::ExpertFeedForward},
    // gpt-oss: q/k/v/output biases, attention sinks, every other layer a
    // 128-token window (layer 0 sliding: llama.cpp's swa pattern 2), YaRN
    // RoPE, experts with biases and the clamped SwiGLU, top k then softmax.
    {Arch::GptOss, "gpt-oss", "GptOssForCausalLM", RopeStyle::NeoX, FfnActivation::SwigluOai,
     /*qkv_bias*/ true, false, false, false, false, true, false, false, false, false,
     kNoCap, kNoCap, /*default_window*/ 0, /*swa_pattern*/ 2, LocalRope::Global, 0,
     /*moe*/ true, MoeGating::TopKThenSoftmax, /*moe_norm_weights*/ false, ExpertFfnKey::ExpertFeedForward,
     /*moe_biases*/ true, /*attn_sinks*/ true, /*attn_out_bias*/ true, /*ffn_norm_post_attention*/ true},
};
// clang-format on

}  // namespace

const ArchDesc* find_arch(const std::string& gguf_name) {
  for (const auto& a : kArchs)
    if (gguf_name == a.gguf_name) return &a;
  return nullptr;
}

const ArchDesc& arch_desc(Arch arch) {
  for (const auto& a : kArchs)
    if (a.arch == arch) return a;
  fail("unknown architecture id %d", static_cast<int>(arch));
}

std::string supported_arch_names() {
  std::string s;
  for (const auto& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.gguf_name);
  return s;
}

const ArchDesc* find_arch_by_hf_class(const std::string& hf_class) {
  for (const auto& a : kArchs)
    if (hf_class == a.hf_class) return &a;
  return nullptr;
}

std::string supported_hf_classes() {
  std::string s;
  for (const auto& a : kArchs) {
    s += (s.empty() ? "" : ", ") + std::string(a.hf_class);
    if (a.arch == Arch::Llama) s += ", MixtralForCausalLM";  // the llama layer with experts
  }
  return s;
}

}  // namespace runlm
