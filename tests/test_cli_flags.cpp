// llama.cpp's flag spellings: the pre-pass (src/cli_flags.h) as a table of
// argument lists and what each becomes, then the same spellings through the
// runlm binary on stories260K, and the inputs that used to be reinterpreted
// silently (-fa as "-f a", a prompt without -p).
#include <gtest/gtest.h>

#include <fstream>

#include "cli_flags.h"
#include "common.h"
#include "test_support.h"

using namespace runlm;
using namespace runlm::test;

namespace {

CliOptionInfo opt(const std::string& s, const std::string& l, bool value = true) {
  return CliOptionInfo{s, {l}, value};
}

// The options the model-running subcommands share (cli_common.cpp).
std::vector<CliOptionInfo> model_options() {
  return {opt("m", "model"),        opt("", "tokenizer"),    opt("c", "ctx-size"),     opt("t", "threads"),
          opt("b", "batch-size"),   opt("", "device"),       opt("", "n-gpu-layers"),  opt("", "attn"), opt("", "flash-attn"),
          opt("", "kv"),            opt("", "block-size"),   opt("", "cache-type-k"),  opt("", "cache-type-v"),
          opt("", "k-smoothing"),   opt("", "swa"),          opt("h", "help", false),  opt("", "temp"),
          opt("", "top-k"),         opt("", "top-p"),        opt("", "min-p"),         opt("s", "seed")};
}

std::vector<CliOptionInfo> with(std::vector<CliOptionInfo> base, const std::vector<CliOptionInfo>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

std::vector<CliOptionInfo> generate_options() {
  return with(model_options(), {opt("p", "prompt"), opt("f", "file"), opt("n", "n-predict"),
                                opt("", "ignore-eos", false), opt("r", "reverse-prompt"), opt("", "stop"),
                                opt("e", "escape", false), opt("", "no-conversation", false)});
}
std::vector<CliOptionInfo> chat_options() {
  return with(model_options(), {opt("", "chat-template"), opt("", "system-prompt"), opt("n", "n-predict"),
                                opt("r", "reverse-prompt"), opt("", "stop"), opt("e", "escape", false),
                                opt("", "conversation", false)});
}
std::vector<CliOptionInfo> batch_options() {
  return with(model_options(), {opt("f", "file"), opt("o", "output"), opt("", "parallel"), opt("n", "n-predict")});
}
std::vector<CliOptionInfo> bench_options() {
  return with(model_options(), {opt("p", "n-prompt"), opt("n", "n-gen"), opt("", "npl"), opt("", "npp"),
                                opt("", "ntg")});
}
std::vector<CliOptionInfo> perplexity_options() {
  return with(model_options(), {opt("f", "file"), opt("", "kl-base"), opt("", "ppl-mode")});
}

using Args = std::vector<std::string>;

struct RewriteCase {
  const char* what;
  std::vector<CliOptionInfo> (*options)();
  Args in;
  Args out;            // expected rewrite, when error is empty
  std::string error;   // expected words of the Error
};

}  // namespace

TEST(CliFlags, LlamaSpellingsAreRewrittenOrRefused) {
  const std::vector<RewriteCase> cases = {
      // -ngl and its long forms carry the value to --n-gpu-layers.
      {"-ngl", generate_options, {"-m", "M", "-ngl", "99"}, {"-m", "M", "--n-gpu-layers", "99"}, ""},
      {"--n-gpu-layers", generate_options, {"--n-gpu-layers", "0"}, {"--n-gpu-layers", "0"}, ""},
      {"--gpu-layers=", generate_options, {"--gpu-layers=-1"}, {"--n-gpu-layers", "-1"}, ""},
      // -fa on|auto picks fa2/fa3 (--attn auto), off the naive kernel.
      {"-fa on", generate_options, {"-fa", "on"}, {"--flash-attn", "on"}, ""},
      {"-fa auto", generate_options, {"-fa", "auto"}, {"--flash-attn", "auto"}, ""},
      {"-fa off", generate_options, {"-fa", "off"}, {"--flash-attn", "off"}, ""},
      {"--flash-attn=off", chat_options, {"--flash-attn=off"}, {"--flash-attn", "off"}, ""},
      {"-fa yes", generate_options, {"-fa", "yes"}, {}, "-fa takes on, auto, off, got 'yes'"},
      {"-fa at the end", generate_options, {"-fa"}, {}, "-fa needs a value"},
      {"-dev", generate_options, {"-dev", "cpu"}, {"--device", "cpu"}, ""},
      // Conversation mode is the chat subcommand.
      {"-cnv on generate", generate_options, {"-cnv"}, {}, "use 'runlm chat'"},
      {"--conversation on generate", generate_options, {"--conversation"}, {}, "use 'runlm chat'"},
      {"-no-cnv on generate", generate_options, {"-no-cnv"}, {"--no-conversation"}, ""},
      {"-cnv on chat", chat_options, {"-cnv"}, {"--conversation"}, ""},
      {"-no-cnv on chat", chat_options, {"-no-cnv"}, {}, "use 'runlm generate'"},
      {"-sys on chat", chat_options, {"-sys", "Be brief."}, {"--system-prompt", "Be brief."}, ""},
      {"-sys on generate", generate_options, {"-sys", "x"}, {}, "a system prompt belongs to 'runlm chat'"},
      {"-np on batch", batch_options, {"-np", "4"}, {"--parallel", "4"}, ""},
      {"-np on generate", generate_options, {"-np", "4"}, {}, "are for 'runlm batch'"},
      {"-npl -npp -ntg on bench", bench_options, {"-npl", "1,2", "-npp", "8", "-ntg", "4"},
       {"--npl", "1,2", "--npp", "8", "--ntg", "4"}, ""},
      {"-npl on generate", generate_options, {"-npl", "2"}, {}, "runlm bench -npl"},
      {"-ctk -ctv", generate_options, {"-ctk", "q8_0", "-ctv", "f16"}, {"--cache-type-k", "q8_0", "--cache-type-v", "f16"}, ""},
      {"-ub", batch_options, {"-ub", "64"}, {"--batch-size", "64"}, ""},
      {"--ubatch-size", generate_options, {"--ubatch-size", "32"}, {"--batch-size", "32"}, ""},
      {"--kl-divergence-base", perplexity_options, {"--kl-divergence-base", "b.logits"}, {"--kl-base", "b.logits"}, ""},
      // --jinja is left to the template engine (cxxopts decides).
      {"--jinja", chat_options, {"--jinja", "-n", "4"}, {"--jinja", "-n", "4"}, ""},
      // One-letter flags and their values pass unchanged, even values that
      // look like flags.
      {"one-letter flags", generate_options, {"-m", "M", "-n", "8", "-t", "2", "-p", "hi"},
       {"-m", "M", "-n", "8", "-t", "2", "-p", "hi"}, ""},
      {"a prompt that looks like a flag", generate_options, {"-p", "-ngl", "-n", "-1"}, {"-p", "-ngl", "-n", "-1"}, ""},
      {"negative numbers", generate_options, {"--temp", "-0.5", "-s", "-1"}, {"--temp", "-0.5", "-s", "-1"}, ""},
      {"--long=value", generate_options, {"--temp=0", "--ignore-eos"}, {"--temp=0", "--ignore-eos"}, ""},
      {"-e -r --stop", generate_options, {"-e", "-r", "User:", "--stop", "\\n"}, {"-e", "-r", "User:", "--stop", "\\n"}, ""},
      // Unknown flags name the closest known one; nothing is split.
      {"-st", generate_options, {"-st"}, {}, "unknown option -st; the closest"},
      {"-xyz", generate_options, {"-xyz"}, {}, "unknown option -xyz"},
      {"--n-predit", generate_options, {"--n-predit", "4"}, {}, "the closest runlm generate knows is --n-predict"},
      {"-ngl typo", generate_options, {"-ngll", "9"}, {}, "the closest runlm generate knows is -ngl"},
      {"-n5 is not -n 5", generate_options, {"-n5"}, {}, "unknown option -n5"},
      // A positional argument is an error, never a silently ignored prompt.
      {"prompt without -p", generate_options, {"-m", "M", "Once upon a time"}, {}, "unexpected argument 'Once upon a time': the prompt goes after -p"},
      {"after --", generate_options, {"--", "x"}, {}, "unexpected argument 'x'"},
      {"positional on batch", batch_options, {"prompts.txt"}, {}, "unexpected argument 'prompts.txt'"},
      {"missing value", generate_options, {"-n"}, {}, "-n needs a value"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    if (c.error.empty()) {
      try {
        EXPECT_EQ(rewrite_cli_args(c.in, c.options(), "runlm generate", false).args, c.out);
      } catch (const Error& e) {
        ADD_FAILURE() << "unexpected error: " << e.what();
      }
    } else {
      const std::string msg = error_of([&] { rewrite_cli_args(c.in, c.options(), "runlm generate", false); });
      EXPECT_NE(msg.find(c.error), std::string::npos) << "expected '" << c.error << "' in: " << msg;
    }
  }
}

TEST(CliFlags, PositionalArgumentsWhereTheSubcommandTakesThem) {
  const std::vector<CliOptionInfo> quantize = {opt("", "in"), opt("", "out"), opt("", "type"), opt("t", "threads")};
  EXPECT_EQ(rewrite_cli_args({"a.gguf", "b.gguf", "q8_0", "-t", "2"}, quantize, "runlm quantize", true).args,
            (Args{"a.gguf", "b.gguf", "q8_0", "-t", "2"}));
}

TEST(CliFlags, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0);
  EXPECT_EQ(edit_distance("abc", ""), 3);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("-ngl", "-ngl"), 0);
  EXPECT_EQ(edit_distance("--n-predit", "--n-predict"), 1);
}

TEST(CliFlags, HelpShowsTheSingleDashSpellings) {
  const std::string help = "  -n, --n-predict arg  tokens\n      --parallel arg   sequences\n      --npl arg        rows\n"
                           "      --system-prompt arg  system message\n";
  const std::vector<CliOptionInfo> o = {opt("n", "n-predict"), opt("", "parallel"), opt("", "npl"),
                                        opt("", "system-prompt")};
  const std::string shown = help_with_llama_spellings(help, o);
  EXPECT_NE(shown.find("  -np, --parallel arg"), std::string::npos) << shown;
  EXPECT_NE(shown.find("       -npl arg"), std::string::npos) << shown;
  EXPECT_NE(shown.find("  -sys, --system-prompt arg"), std::string::npos) << shown;
  EXPECT_NE(shown.find("  -n, --n-predict arg  tokens"), std::string::npos) << shown;
}

// ---------------------------------------------------------------- binary

namespace {

std::string model() { return shared_model("stories260K.gguf"); }

void expect_error(const CommandResult& r, const std::string& words) {
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(words), std::string::npos) << "expected '" << words << "' in: " << r.err;
}

CommandResult generate(const std::string& extra) {
  return run_command("timeout 120 " + runlm_binary() + " generate -m " + model() + " -t 2 --temp 0 -n 4 " + extra);
}

}  // namespace

TEST(CliFlags, HelpOfEachSubcommandShowsTheLlamaSpellings) {
  const CommandResult chat = run_command(runlm_binary() + " chat --help");
  EXPECT_EQ(chat.exit_code, 0);
  EXPECT_NE(chat.out.find("-sys, --system-prompt"), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("-ngl, --n-gpu-layers"), std::string::npos) << chat.out;
  EXPECT_NE(chat.out.find("-ctk, --cache-type-k"), std::string::npos) << chat.out;
  const CommandResult batch = run_command(runlm_binary() + " batch --help");
  EXPECT_NE(batch.out.find("-np, --parallel"), std::string::npos) << batch.out;
  EXPECT_EQ(batch.out.find("--np,"), std::string::npos) << batch.out;
  const CommandResult bench = run_command(runlm_binary() + " bench --help");
  EXPECT_NE(bench.out.find(" -npl "), std::string::npos) << bench.out;
}

TEST(CliFlags, FaIsNeverReadAsAFileFlag) {
  RUNLM_REQUIRE_ASSET(model());
  // With a file ./a present, "-fa on" once ran generate on that file.
  TempPath dir(".d");
  ASSERT_EQ(run_command("mkdir -p " + dir.str()).exit_code, 0);
  {
    std::ofstream a(dir.str() + "/a");
    a << "The file a, which must not be the prompt.";
  }
  struct Cleanup {
    std::string d;
    ~Cleanup() { run_command("rm -rf " + d); }
  } cleanup{dir.str()};
  const CommandResult r = run_command("cd " + dir.str() + " && timeout 120 " + runlm_binary() + " generate -m " +
                                      model() + " -t 2 --temp 0 -n 4 -fa on -p 'Once upon a time'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find("must not be"), std::string::npos) << r.out;
  // Off on the CPU is its own (not flash) attention; on the GPU the naive kernel.
  const CommandResult off = generate("-fa off -p hi");
  EXPECT_EQ(off.exit_code, 0) << off.err;
  EXPECT_EQ(generate("-fa auto -p hi").exit_code, 0);
  expect_error(generate("-fa maybe -p hi"), "-fa takes on, auto, off");
  expect_error(generate("-fa on --attn naive -p hi"), "either -fa or --attn");
}

TEST(CliFlags, NglOnTheCpu) {
  RUNLM_REQUIRE_ASSET(model());
  const CommandResult zero = generate("-ngl 0 -p hi");
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_NE(zero.err.find("cpu"), std::string::npos) << zero.err;
  // All layers (or -1): the GPU when there is one, else the CPU, as a
  // llama.cpp build without a GPU runs.
  EXPECT_EQ(generate("-ngl 99 -p hi").exit_code, 0);
  EXPECT_EQ(generate("-ngl -1 -p hi").exit_code, 0);
  EXPECT_EQ(generate("--n-gpu-layers 99 -p hi").exit_code, 0);
  // stories260K has 5 layers: a split is refused, naming the choices.
  expect_error(generate("-ngl 2 -p hi"), "runlm runs a whole model on one device");
  expect_error(generate("-ngl 2 -p hi"), "-ngl 5 or more");
  expect_error(generate("-ngl 0 --device cuda -p hi"), "contradicts --device cuda");
  expect_error(generate("-ngl 99 --device cpu -p hi"), "contradicts --device cpu");
  expect_error(generate("-ngl -2 -p hi"), "-ngl must be >= -1");
}

TEST(CliFlags, OldMisreadingsAreNowClearErrors) {
  RUNLM_REQUIRE_ASSET(model());
  expect_error(generate("-cnv -p hi"), "use 'runlm chat'");
  expect_error(generate("-st -p hi"), "unknown option -st");
  expect_error(generate("'Once upon a time'"), "unexpected argument 'Once upon a time'");
  expect_error(generate("-np 4 -p hi"), "runlm batch");
  expect_error(generate("-sys hi -p hi"), "runlm chat");
  EXPECT_EQ(generate("-no-cnv -p hi").exit_code, 0);
  const CommandResult ctk = generate("-ctk f16 -ctv f16 -ub 16 -p hi");
  EXPECT_EQ(ctk.exit_code, 0) << ctk.err;
  expect_error(generate("-ctk q9 -p hi"), "q9");
}

TEST(CliFlags, ThreadsAboveTheHardwareAreCapped) {
  RUNLM_REQUIRE_ASSET(model());
  // -t 100000 once tried to start 100000 threads; now it is capped at once.
  const CommandResult r = generate("-t 100000 -p hi");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: -t 100000 is more than the"), std::string::npos) << r.err;
  TempPath q(".gguf");
  const CommandResult quantize =
      run_command("timeout 120 " + runlm_binary() + " quantize " + model() + " " + q.str() + " q8_0 -t 100000");
  EXPECT_EQ(quantize.exit_code, 0) << quantize.err;
  EXPECT_NE(quantize.err.find("warning: -t 100000 is more than the"), std::string::npos) << quantize.err;
  // Under a memory limit the capped pool still starts (-t 1000 used to hang).
#if defined(__SANITIZE_ADDRESS__)
  return;  // AddressSanitizer cannot run under an address-space limit
#endif
  const CommandResult limited =
      run_command("ulimit -v 6000000 && timeout 120 " + runlm_binary() + " generate -m " + model() +
                  " -t 1000 --temp 0 -n 4 -p hi");
  EXPECT_EQ(limited.signal, 0) << limited.err;
  EXPECT_EQ(limited.exit_code, 0) << limited.err;
}
