#include "engine_support.h"

#include "common.h"

namespace runlm {

std::string cuda_engine_unsupported_layer(const ModelConfig& c) {
  const std::vector<std::string> missing = c.features_beyond_llama();
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
