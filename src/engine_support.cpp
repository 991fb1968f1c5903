#include "engine_support.h"

#include "common.h"

namespace runlm {

namespace {
// kernels/cuda/rope.cuh's kMaxRopePairs pairs and decode_attention.cu's
// kMaxHeadDim (this file builds without CUDA, so the number is repeated).
constexpr int kCudaMaxHeadDim = 256;
}  // namespace

std::vector<std::string> cuda_engine_missing_features(const ModelConfig& c) {
  std::vector<std::string> f;
  if (c.rope_yarn) f.push_back("YaRN RoPE");
  if (c.moe()) f.push_back("mixture of experts");
  if (c.attn_sinks) f.push_back("attention sinks");
  if (c.attn_out_bias) f.push_back("attention output bias");
  if (c.ffn_act == FfnActivation::SwigluOai) f.push_back("clamped SwiGLU (swiglu_oai)");
  if (c.head_dim > kCudaMaxHeadDim) f.push_back(strfmt("head dimension %d (at most %d)", c.head_dim, kCudaMaxHeadDim));
  return f;
}

std::string cuda_engine_unsupported_layer(const ModelConfig& c) {
  const std::vector<std::string> missing = cuda_engine_missing_features(c);
  if (missing.empty()) return "";
  std::string list;
  for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
  return strfmt("the CUDA engine does not implement %s (architecture %s) yet; use --device cpu", list.c_str(),
                arch_name(c.arch));
}

void require_cuda_engine_support(const ModelConfig& c) {
  const std::string why = cuda_engine_unsupported_layer(c);
  RUNLM_CHECK(why.empty(), "%s", why.c_str());
}

}  // namespace runlm
