#include "engine_support.h"

#include "common.h"

namespace runlm {

namespace {
// kernels/cuda/rope.cuh's kMaxRopePairs pairs and decode_attention.cu's
// kMaxHeadDim (this file builds without CUDA, so the number is repeated).
constexpr int kCudaMaxHeadDim = 256;
// kernels/cuda/moe_ops.h's kMaxMoeExperts.
constexpr int kCudaMaxExperts = 256;
}  // namespace

std::vector<std::string> cuda_engine_missing_features(const ModelConfig& c) {
  std::vector<std::string> f;
  // The experts' kernels (kernels/cuda/moe_ops.h) take SiLU and swiglu_oai,
  // at most kCudaMaxExperts experts of which at most 32 chosen per token.
  if (c.ffn_act == FfnActivation::SwigluOai && !c.moe()) f.push_back("clamped SwiGLU (swiglu_oai) outside experts");
  if (c.moe() && c.ffn_act == FfnActivation::GeluTanh) f.push_back("GELU experts");
  if (c.n_expert > kCudaMaxExperts) f.push_back(strfmt("%d experts (at most %d)", c.n_expert, kCudaMaxExperts));
  if (c.moe() && c.n_expert_used > 32) f.push_back(strfmt("%d experts per token (at most 32)", c.n_expert_used));
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
