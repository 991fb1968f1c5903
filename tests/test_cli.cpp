// Bad input through the command line: each case is a clear message on
// stderr and exit code 1, never a crash (no signal) and no partial output.
#include <gtest/gtest.h>

#include <signal.h>

#include <fstream>

#include "test_support.h"

using namespace runlm::test;

namespace {

std::string generate_cmd(const std::string& model, const std::string& extra) {
  return runlm_binary() + " generate -m " + model + " -t 2 " + extra;
}

// Writes the first `n` bytes of `src` (or all, with `patch` applied) to a temp file.
void write_variant(const std::string& dst, const std::string& bytes) {
  std::ofstream f(dst, std::ios::binary);
  f << bytes;
}

}  // namespace

TEST(Cli, MissingModelFile) {
  expect_clean_error(run_command(generate_cmd("/nonexistent/model.gguf", "-p hi")), "/nonexistent/model.gguf");
}

TEST(Cli, BadMagic) {
  TempPath p(".gguf");
  std::string bytes = read_file(shared_model("stories260K.gguf"));
  bytes[0] = 'X';
  write_variant(p.str(), bytes);
  expect_clean_error(run_command(generate_cmd(p.str(), "-p hi")), "magic");
}

TEST(Cli, TruncatedGguf) {
  const std::string bytes = read_file(shared_model("stories260K.gguf"));
  for (size_t cut : {size_t{3}, size_t{100}, size_t{14000}, bytes.size() / 2, bytes.size() - 1}) {
    TempPath p(".gguf");
    write_variant(p.str(), bytes.substr(0, cut));
    const CommandResult r = run_command(generate_cmd(p.str(), "-p hi -n 4"));
    expect_clean_error(r, p.str());
  }
}

TEST(Cli, NotAGgufAtAll) {
  expect_clean_error(run_command(generate_cmd(shared_model("stories260K.bin"), "-p hi")), "magic");
}

TEST(Cli, BadFlagValues) {
  const std::string m = shared_model("stories260K.gguf");
  expect_clean_error(run_command(generate_cmd(m, "-n abc")), "-n");
  expect_clean_error(run_command(generate_cmd(m, "-n -5")), "-n");
  expect_clean_error(run_command(generate_cmd(m, "--temp -1")), "--temp");
  expect_clean_error(run_command(generate_cmd(m, "--top-p 2")), "--top-p");
  expect_clean_error(run_command(generate_cmd(m, "-c -3")), "-c");
  expect_clean_error(run_command(generate_cmd(m, "--device tpu")), "tpu");
  expect_clean_error(run_command(generate_cmd(m, "--swa banana")), "--swa");
  expect_clean_error(run_command(generate_cmd(m, "--no-such-flag")), "no-such-flag");
  expect_clean_error(run_command(runlm_binary() + " generate -p hi"), "-m");
  expect_clean_error(run_command(generate_cmd(m, "-f /nonexistent/prompt.txt")), "/nonexistent/prompt.txt");
}

TEST(Cli, PromptLongerThanContext) {
  const CommandResult r = run_command(
      generate_cmd(shared_model("stories260K.gguf"), "-c 8 -p 'Once upon a time there was a little girl named Lily'"));
  expect_clean_error(r, "context");
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Cli, UnknownSubcommand) {
  const CommandResult r = run_command(runlm_binary() + " frobnicate");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos);
}

// --verbose: the engine says which decode attention kernel it runs, once.
TEST(Cli, VerboseNamesTheDecodeKernel) {
  const std::string m = shared_model("stories260K.gguf");
  const CommandResult r = run_command(generate_cmd(m, "--device cpu --verbose -n 2 --temp 0 -p hi"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find("decode attention: cpu");
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("decode attention:", at + 1), std::string::npos) << "said more than once: " << r.err;
  const CommandResult quiet = run_command(generate_cmd(m, "--device cpu -n 2 --temp 0 -p hi"));
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("decode attention:"), std::string::npos) << quiet.err;
}

TEST(Cli, HelpExitsZero) {
  const CommandResult r = run_command(runlm_binary() + " generate --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--top-p"), std::string::npos);
}

// ---------------------------------------------------------------- --version, info

TEST(Cli, VersionNamesTheBuild) {
  const CommandResult r = run_command(runlm_binary() + " --version");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("runlm ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("(commit "), std::string::npos) << r.out;
#ifdef RUNLM_CUDA
  EXPECT_NE(r.out.find("CUDA"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("built without CUDA"), std::string::npos) << r.out;
#endif
  // The commit is the checkout's when the build was configured from git.
  const CommandResult git = run_command("git -C " + std::string(RUNLM_SOURCE_DIR) + " rev-parse --short HEAD");
  if (git.exit_code == 0 && !git.out.empty()) {
    const std::string commit = r.out.substr(r.out.find("(commit ") + 8, r.out.find(',') - r.out.find("(commit ") - 8);
    EXPECT_TRUE(commit.size() >= 7 && commit != "unknown") << r.out;
  }
}

TEST(Cli, InfoDescribesTheModel) {
  const std::string m = shared_model("stories260K.gguf");
  const CommandResult r = run_command(runlm_binary() + " info -m " + m);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"architecture:   llama", "layers:         5", "embedding dim:  64", "heads:          8",
                           "kv heads:       4", "head dim:       8", "context:        2048", "tensors:        ",
                           "  f32 ", "vocabulary:     llama, 512 tokens, bos 1 '<s>', eos 2 '</s>'",
                           "chat template:  none in the file"})
    EXPECT_NE(r.out.find(line), std::string::npos) << "expected '" << line << "' in:\n" << r.out;
  expect_clean_error(run_command(runlm_binary() + " info"), "-m");
  expect_clean_error(run_command(runlm_binary() + " info -m /nonexistent/x.gguf"), "/nonexistent/x.gguf");
}

// llama.cpp's vocabulary-only GGUFs have no tensors: info describes the
// vocabulary and template instead of failing on the missing weights.
TEST(Cli, InfoDescribesAVocabularyOnlyFile) {
  const std::string v = test_asset("vocab/ggml-vocab-qwen2.gguf");
  RUNLM_REQUIRE_ASSET(v);
  const CommandResult r = run_command(runlm_binary() + " info -m " + v);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* line : {"architecture:   qwen2 (vocabulary only: no weights)",
                           "vocabulary:     gpt2, 151936 tokens, bos 151643 '<|endoftext|>'",
                           "chat template:  in the file (tokenizer.chat_template, 327 bytes)"})
    EXPECT_NE(r.out.find(line), std::string::npos) << "expected '" << line << "' in:\n" << r.out;
  EXPECT_EQ(r.out.find("layers:"), std::string::npos) << r.out;
}

// ---------------------------------------------------------------- generate: -r, --stop, -e, Ctrl-C

namespace {
CommandResult greedy(const std::string& extra) {
  return run_command(runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                     " -t 2 --temp 0 --no-display-prompt -p 'Once upon a time' " + extra);
}
}  // namespace

TEST(Cli, StopAndReversePromptEndTheOutput) {
  const CommandResult base = greedy("-n 60");
  ASSERT_EQ(base.exit_code, 0) << base.err;
  // A word from the middle of the greedy continuation.
  const size_t from = base.out.size() / 3;
  const size_t word = base.out.find(' ', from) + 1;
  const size_t word_end = base.out.find_first_of(" .,\n", word);
  ASSERT_GT(word_end, word) << base.out;
  const std::string w = base.out.substr(word, word_end - word);
  const size_t first = base.out.find(w);

  const CommandResult stop = greedy("-n 60 --stop '" + w + "'");
  ASSERT_EQ(stop.exit_code, 0) << stop.err;
  EXPECT_EQ(stop.out, base.out.substr(0, first) + "\n");
  EXPECT_NE(stop.err.find("stop: stop"), std::string::npos) << stop.err;

  const CommandResult rp = greedy("-n 60 -r '" + w + "'");
  ASSERT_EQ(rp.exit_code, 0) << rp.err;
  EXPECT_EQ(rp.out, base.out.substr(0, first + w.size()) + "\n");
  const CommandResult both = greedy("-n 60 --reverse-prompt zzzz --reverse-prompt '" + w + "'");
  EXPECT_EQ(both.out, rp.out);
}

TEST(Cli, EscapesInThePromptWithE) {
  const std::string m = shared_model("stories260K.gguf");
  const CommandResult raw = run_command(runlm_binary() + " generate -m " + m + " -t 2 -n 0 -p 'a\\tb\\x41'");
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_EQ(raw.out, "a\\tb\\x41\n");
  const CommandResult e = run_command(runlm_binary() + " generate -m " + m + " -t 2 -n 0 -e -p 'a\\tb\\x41'");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, "a\tbA\n");
}

TEST(Cli, CtrlCStopsGenerateWithItsTimings) {
  TempPath out(".out"), err(".err");
  const std::string cmd = runlm_binary() + " generate -m " + shared_model("stories260K.gguf") +
                          " -t 1 --temp 0 -c 32768 -n -1 --ignore-eos -p 'Once upon a time' >" + out.str() + " 2>" +
                          err.str();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until generation is under way (more than the prompt is out).
  for (int i = 0; i < 6000 && read_file(out.str()).size() < 40; ++i) usleep(20000);
  kill(pid, SIGINT);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 3000 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) usleep(20000);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "generate did not stop after SIGINT";
  }
  const std::string e = read_file(err.str());
  ASSERT_TRUE(WIFEXITED(status)) << e;
  EXPECT_EQ(WEXITSTATUS(status), 130) << e;
  EXPECT_NE(e.find("generation:"), std::string::npos) << e;
  EXPECT_NE(e.find("stop: interrupted"), std::string::npos) << e;
  EXPECT_EQ(read_file(out.str()).back(), '\n');
}
