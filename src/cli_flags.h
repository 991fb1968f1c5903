// The command line as llama.cpp users type it. llama.cpp spells many flags
// with several letters after one dash (-ngl, -fa, -np, -sys, -ctk); cxxopts
// reads "-fa" as "-f a", so a table-driven pre-pass rewrites every such
// spelling to runlm's long option BEFORE cxxopts sees the arguments, and
// refuses what it cannot place: an unknown flag (naming the closest known
// one), a llama.cpp flag whose feature this subcommand lacks, a stray
// positional argument. Nothing is ever silently reinterpreted.
#pragma once

#include <string>
#include <vector>

namespace runlm {

// One option a subcommand declares, as the pre-pass needs to know it.
struct CliOptionInfo {
  std::string short_name;               // "n", or "" when there is none
  std::vector<std::string> long_names;  // "n-predict"
  bool takes_value = true;              // false for a switch (--ignore-eos)
};

// A llama.cpp spelling and what runlm makes of it.
struct LlamaFlagAlias {
  const char* spellings;  // space-separated: "-ngl --n-gpu-layers --gpu-layers"
  const char* target;     // runlm's long option, without the dashes
  // For switch-like llama.cpp flags that take a value (-fa on|off|auto):
  // "on=auto off=naive auto=auto" maps the value; empty: passed unchanged.
  const char* value_map;
  // Said when the subcommand has no `target`: why, and what to use instead.
  const char* missing_note;
};

// The table (one row per llama.cpp flag runlm knows of).
const std::vector<LlamaFlagAlias>& llama_flag_aliases();

struct CliRewrite {
  std::vector<std::string> args;  // argv[1..] for cxxopts
};

// Rewrites args (argv without argv[0]) for a subcommand whose options are
// `options`; `program` ("runlm generate") names it in errors. With
// allow_positional false, a positional argument is an Error. Throws Error
// for an unknown option, an alias the subcommand cannot honour, or a bad
// value of a mapped flag.
CliRewrite rewrite_cli_args(const std::vector<std::string>& args, const std::vector<CliOptionInfo>& options,
                            const std::string& program, bool allow_positional);

// Levenshtein distance (for "did you mean").
int edit_distance(const std::string& a, const std::string& b);

// cxxopts' help text with the llama.cpp single-dash spellings (-np, -sys,
// -ctk...) shown beside the long options they stand for.
std::string help_with_llama_spellings(const std::string& help, const std::vector<CliOptionInfo>& options);

}  // namespace runlm
