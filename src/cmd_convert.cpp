// `runlm convert SRC -o OUT.gguf [--type f32|f16|bf16] [--tokenizer tokenizer.model]`:
// SRC a llama2.c .bin file or a Hugging Face model directory.
#include <sys/stat.h>

#include <cstdio>
#include <cxxopts.hpp>
#include <iostream>

#include "commands.h"
#include "cli_common.h"
#include "common.h"
#include "convert.h"

namespace runlm {

int cmd_convert(int argc, char** argv) {
  cxxopts::Options opts("runlm convert", "Convert a llama2.c .bin checkpoint or a Hugging Face directory "
                                         "(Llama, Mistral, Qwen2, Qwen3, Gemma2, Gemma3, Phi3) to GGUF");
  opts.positional_help("SRC");
  opts.add_options()
      ("src", "llama2.c .bin file or Hugging Face model directory", cxxopts::value<std::string>())
      ("o,output", "output GGUF path", cxxopts::value<std::string>())
      ("type", "weight type: f32, f16 or bf16 (default: the checkpoint's own)", cxxopts::value<std::string>())
      ("tokenizer", "sentencepiece tokenizer.model (required for .bin; default SRC/tokenizer.model for a directory)",
       cxxopts::value<std::string>())
      ("h,help", "show this help");
  opts.parse_positional({"src"});
  auto args = parse_options(opts, argc, argv, /*allow_positional=*/true);
  if (args.count("help")) {
    std::cout << help_text(opts) << "\n";
    return 0;
  }
  RUNLM_CHECK(args.count("src"), "convert: missing SRC (a .bin file or a model directory)\n%s", opts.help().c_str());
  RUNLM_CHECK(args.count("output"), "convert: missing -o OUT.gguf");
  const std::string src = args["src"].as<std::string>();
  const std::string out = args["output"].as<std::string>();
  std::optional<DType> type;
  if (args.count("type")) type = dtype_from_name(args["type"].as<std::string>());
  const std::string tokenizer = args.count("tokenizer") ? args["tokenizer"].as<std::string>() : "";

  struct stat st {};
  RUNLM_CHECK(::stat(src.c_str(), &st) == 0, "convert: %s: no such file or directory", src.c_str());
  ConvertResult r;
  if (S_ISDIR(st.st_mode)) {
    r = convert_hf(src, out, type, tokenizer);
  } else {
    RUNLM_CHECK(!tokenizer.empty(),
                "convert: %s is a llama2.c checkpoint, which has no vocabulary: pass --tokenizer tokenizer.model",
                src.c_str());
    r = convert_llama2c(src, tokenizer, out, type);
  }
  const LlamaHParams& hp = r.hparams;
  std::printf("convert: wrote %s: %s, %zu tensors, %.2fM params, %s, dim %lld, %lld layers, %lld/%lld heads, vocab %lld%s\n",
              out.c_str(), hp.arch == Arch::Mistral ? "llama" : arch_name(hp.arch), r.n_tensors,
              static_cast<double>(r.n_params) / 1e6, dtype_name(r.type),
              static_cast<long long>(hp.dim), static_cast<long long>(hp.n_layers), static_cast<long long>(hp.n_heads),
              static_cast<long long>(hp.n_kv_heads), static_cast<long long>(hp.vocab_size),
              hp.tied_embeddings ? ", tied embeddings" : "");
  return 0;
}

}  // namespace runlm
