// runlm: one binary, one subcommand per job. Errors from any subcommand end
// here as "error: ..." on stderr and exit code 1; never an abort.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "commands.h"
#include "common.h"
#include "version.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Subcommand kSubcommands[] = {
    {"generate", runlm::cmd_generate, "complete a prompt (-m MODEL -p TEXT | -f FILE -n N)"},
    {"chat", runlm::cmd_chat, "interactive chat with a chat template"},
    {"batch", runlm::cmd_batch, "generate for every prompt of a file (text or JSONL) with continuous batching"},
    {"bench", runlm::cmd_bench, "prefill and decode throughput, llama-bench style (-p 512 -n 128)"},
    {"bench-attn", runlm::cmd_bench_attn, "prefill attention backends: TFLOP/s sweep (GPU)"},
    {"bench-decode", runlm::cmd_bench_decode, "paged decode attention kernels: us, GB/s per KV type (GPU)"},
    {"bench-matmul", runlm::cmd_bench_matmul, "decode GEMV and prefill GEMM kernels on 7B shapes (GPU)"},
    {"perplexity", runlm::cmd_perplexity, "perplexity over a text in chunks; KLD against a saved run (-m MODEL -f FILE)"},
    {"convert", runlm::cmd_convert, "llama2.c .bin or Hugging Face directory -> GGUF"},
    {"quantize", runlm::cmd_quantize, "re-encode a GGUF's weights (q8_0, q4_0, q4_k, q6_k, q4_k_m, f16...)"},
    {"info", runlm::cmd_info, "describe a GGUF model: architecture, shapes, tensor types, vocabulary (-m MODEL)"},
    {"tokenize", runlm::cmd_tokenize, "print the tokens of a text, llama-tokenize style (-m MODEL -p TEXT [--ids])"},
    {"template", runlm::cmd_template, "print a conversation as the chat template renders it (-m MODEL --messages CONV.json)"},
};

void usage() {
  std::fprintf(stderr, "%s\n", runlm::version_line().c_str());
  std::fprintf(stderr, "usage: runlm SUBCOMMAND [options]   (runlm SUBCOMMAND --help for its options)\n\n");
  for (const auto& s : kSubcommands) std::fprintf(stderr, "  %-11s %s\n", s.name, s.help);
  std::fprintf(stderr, "\n  runlm --version   version, git commit and whether CUDA is built in\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  for (const auto& s : kSubcommands) {
    if (std::strcmp(argv[1], s.name) != 0) continue;
    const std::string prog = std::string("runlm ") + s.name;
    argv[1] = const_cast<char*>(prog.c_str());
    try {
      return s.run(argc - 1, argv + 1);
    } catch (const std::bad_alloc& e) {
      // Sizes from files and flags are checked before the big allocations;
      // this is the last line for whatever still runs out of host memory.
      std::fflush(stdout);
      std::fprintf(stderr, "error: out of host memory (%s); try a smaller -c or a smaller model\n", e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "-v")) {
    std::printf("%s\n", runlm::version_line().c_str());
    return 0;
  }
  std::fprintf(stderr, "error: unknown subcommand '%s'\n\n", argv[1]);
  usage();
  return 1;
}
