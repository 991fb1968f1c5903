// What `runlm --version` prints: the version, the git commit the build was
// configured from (CMake passes it in; "unknown" outside a git checkout) and
// whether the CUDA backend is compiled in.
#pragma once

#include <string>

namespace runlm {

const char* runlm_version();
const char* runlm_git_commit();
bool runlm_built_with_cuda();
// "runlm 0.1.0 (commit abc1234, CPU + CUDA)"
std::string version_line();

}  // namespace runlm
