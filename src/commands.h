// One entry point per subcommand; main() dispatches on argv[1]. Each takes
// the arguments after the subcommand name (argv[0] is "runlm SUBCOMMAND"),
// parses them with cxxopts, and returns the process exit code. Errors are
// thrown as runlm::Error and reported by main().
#pragma once

namespace runlm {

int cmd_generate(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_batch(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_bench_attn(int argc, char** argv);
int cmd_bench_decode(int argc, char** argv);
int cmd_bench_matmul(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_template(int argc, char** argv);

}  // namespace runlm
