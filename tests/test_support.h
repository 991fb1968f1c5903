// Helpers shared by the tests: paths to the shared models, temporary files,
// running the runlm binary as a user would, and error messages.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "common.h"
#include "gguf.h"
#include "k_smoothing.h"
#include "model.h"

namespace runlm::test {

// Test data. The embedded default model (stories260K, with its tokenizer and
// golden output) lives in the repository under models/stories260K/; every
// larger asset (sotu29m, the vocabularies, the chat templates, the Llama-2
// tokenizer) is found under one root: $RUNLM_TEST_DATA, by default ../shared
// beside the source tree. A test that needs such an asset names it with
// RUNLM_REQUIRE_ASSET first: when the asset is missing the test is skipped
// with a message naming it, or fails when CI=true (CI must never pass by
// skipping).
inline std::string test_data_root() {
  const char* env = std::getenv("RUNLM_TEST_DATA");
  if (env != nullptr && *env != '\0') return env;
  return std::string(RUNLM_SOURCE_DIR) + "/../shared";
}

// Path of an asset under the test-data root, e.g. test_asset("vocab/ggml-vocab-qwen2.gguf").
inline std::string test_asset(const std::string& relative) { return test_data_root() + "/" + relative; }

inline std::string embedded_model_dir() { return std::string(RUNLM_SOURCE_DIR) + "/models/stories260K"; }

// A file of the shared models folder by name: the stories260K files come
// from the repository, the rest from the test-data root's models/.
inline std::string shared_model(const std::string& name) {
  if (name.rfind("stories260K", 0) == 0) return embedded_model_dir() + "/" + name;
  return test_asset("models/" + name);
}

inline bool ci_run() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1");
}

// "" when path exists, else why the test cannot run and how to provide it.
inline std::string missing_asset(const std::string& path) {
  if (access(path.c_str(), R_OK) == 0) return "";
  return "missing test asset " + path + " (set RUNLM_TEST_DATA to the folder holding models/, vocab/ and " +
         "templates/; default ../shared beside the source tree)";
}

}  // namespace runlm::test

// Skips the calling test when `path` (a full path, e.g. from test_asset or
// shared_model) is missing; fails it instead when CI=true. Use at the top of
// a TEST body or a fixture's SetUp.
#define RUNLM_REQUIRE_ASSET(path)                                      \
  do {                                                                 \
    const std::string runlm_missing_ = ::runlm::test::missing_asset(path); \
    if (!runlm_missing_.empty()) {                                     \
      if (::runlm::test::ci_run()) GTEST_FAIL() << runlm_missing_;     \
      GTEST_SKIP() << runlm_missing_;                                  \
    }                                                                  \
  } while (0)

namespace runlm::test {

// The message Model::load gives for path, or "" when it loads.
inline std::string load_error(const std::string& path) {
  try {
    Model::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<int> read_ids(const std::string& path) {
  std::ifstream in(path);
  std::vector<int> ids;
  int x;
  while (in >> x) ids.push_back(x);
  return ids;
}

// A unique path under the system temp dir, removed when the object dies.
class TempPath {
 public:
  explicit TempPath(const std::string& suffix) {
    static int counter = 0;
    path_ = std::string(P_tmpdir) + "/runlm_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++) + suffix;
  }
  ~TempPath() {
    std::remove(path_.c_str());
    std::remove((path_ + ".tmp").c_str());
  }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

// Rewrites stories260K.gguf into `out` with `edit_meta` applied to its
// metadata, leaving out `skip_tensor` and swapping the two dimensions of
// `reshape_tensor` (model-loading and metadata tests). Returns out's path.
inline std::string rewritten_stories260k(const TempPath& out, const std::function<void(GgufWriter&)>& edit_meta,
                                         const std::string& skip_tensor = "", const std::string& reshape_tensor = "") {
  auto src = GgufFile::open(shared_model("stories260K.gguf"));
  GgufWriter w;
  w.copy_metadata(*src);
  edit_meta(w);
  for (const auto& t : src->tensors()) {
    if (t.name == skip_tensor) continue;
    auto ne = t.ne;
    if (t.name == reshape_tensor) std::swap(ne[0], ne[1]);
    w.add_tensor(t.name, t.type, ne, src->tensor_data(t));
  }
  w.write(out.str());
  return out.str();
}

struct CommandResult {
  int exit_code = -1;    // -1 when the process died from a signal
  int signal = 0;
  std::string out, err;
};

// Runs a shell command line, capturing stdout and stderr separately.
inline CommandResult run_command(const std::string& cmdline, const std::string& stdin_text = "") {
  TempPath out(".out"), err(".err"), in(".in");
  {
    std::ofstream f(in.str(), std::ios::binary);
    f << stdin_text;
  }
  const std::string full = cmdline + " <" + in.str() + " >" + out.str() + " 2>" + err.str();
  const int status = std::system(full.c_str());
  CommandResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.out = read_file(out.str());
  r.err = read_file(err.str());
  return r;
}

// A command that must fail cleanly: exit code 1 with "error: " and `words`
// on stderr, never a crash (no signal).
inline void expect_clean_error(const CommandResult& r, const std::string& words) {
  EXPECT_EQ(r.signal, 0) << "crashed with signal " << r.signal << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(words), std::string::npos) << "expected '" << words << "' in: " << r.err;
}
// The same, and nothing printed on stdout.
inline void expect_clean_error_no_output(const CommandResult& r, const std::string& words) {
  expect_clean_error(r, words);
  EXPECT_TRUE(r.out.empty()) << r.out;
}

inline std::string runlm_binary() { return RUNLM_BINARY; }

// The runlm::Error message of f(), or "<no error>" when f returns normally.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// Every word appears in msg (an error message names what it must).
inline void expect_words(const std::string& msg, const std::vector<std::string>& words) {
  for (const auto& w : words)
    EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg.substr(0, 400);
}

// A K smoothing (src/k_smoothing.h) with random, not calibrated, values for
// exactness tests: shift uniform in [-max_shift, max_shift], scale e^U(-1, 1),
// k_mul = 1 / scale; q_mul = scale, or 1 (K rewritten alone: a wrong rewrite
// whose effect must show) when k_only; k_weight e^U(-1, 1).
inline KSmoothing random_k_smoothing(const ModelConfig& c, uint32_t seed, float max_shift, bool k_only = false) {
  KSmoothing s;
  s.n_layers = c.n_layers;
  s.kv_dim = c.kv_dim();
  s.params.resize(size_t(c.n_layers) * KSmoothing::kRows * c.kv_dim());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> shift(-max_shift, max_shift), log_scale(-1, 1);
  for (int l = 0; l < c.n_layers; ++l) {
    float* p = s.params.data() + size_t(l) * KSmoothing::kRows * c.kv_dim();
    for (int ch = 0; ch < c.kv_dim(); ++ch) {
      const float scale = std::exp(log_scale(rng));
      p[ch] = shift(rng);
      p[c.kv_dim() + ch] = 1 / scale;
      p[2 * c.kv_dim() + ch] = k_only ? 1.0f : scale;
      p[3 * c.kv_dim() + ch] = std::exp(log_scale(rng));
    }
  }
  return s;
}

}  // namespace runlm::test
