#include "version.h"

#ifndef RUNLM_GIT_COMMIT
#define RUNLM_GIT_COMMIT "unknown"
#endif

namespace runlm {

const char* runlm_version() { return "0.1.0"; }

const char* runlm_git_commit() { return RUNLM_GIT_COMMIT; }

bool runlm_built_with_cuda() {
#ifdef RUNLM_CUDA
  return true;
#else
  return false;
#endif
}

std::string version_line() {
  return std::string("runlm ") + runlm_version() + " (commit " + runlm_git_commit() + ", " +
         (runlm_built_with_cuda() ? "CPU + CUDA" : "CPU only, built without CUDA") + ")";
}

}  // namespace runlm
