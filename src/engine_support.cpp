#include "engine_support.h"

#include "common.h"

namespace runlm {

void require_cuda_engine_support(const ModelConfig& c) {
  const std::vector<std::string> missing = c.features_beyond_llama();
  if (missing.empty()) return;
  std::string list;
  for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
  fail("the CUDA engine does not implement %s (architecture %s) yet; use --device cpu", list.c_str(),
       arch_name(c.arch));
}

}  // namespace runlm
