// `runlm quantize IN.gguf OUT.gguf TYPE [--pure] [--allow-requantize]
// [--threads N]`: re-encodes the weights of a GGUF with one of llama.cpp's
// quantization mixes (named as llama-quantize names them) or a plain type.
#include <cstdio>
#include <cxxopts.hpp>
#include <iostream>

#include "commands.h"
#include "cli_common.h"
#include "common.h"
#include "quantize.h"

namespace runlm {

int cmd_quantize(int argc, char** argv) {
  cxxopts::Options opts("runlm quantize", "Re-encode the weights of a GGUF model");
  opts.positional_help("IN.gguf OUT.gguf TYPE");
  const std::string types = quant_target_names();
  opts.add_options()
      ("in", "input GGUF", cxxopts::value<std::string>())
      ("out", "output GGUF (a new file; never the input)", cxxopts::value<std::string>())
      ("type", types, cxxopts::value<std::string>())
      ("pure", "every weight matrix gets TYPE's base type (no per-tensor mix rules)")
      ("allow-requantize", "re-encode tensors that are already quantized (loses quality)")
      ("t,threads", "worker threads (default: all cores)", cxxopts::value<int>()->default_value("0"))
      ("h,help", "show this help");
  opts.parse_positional({"in", "out", "type"});
  auto args = parse_options(opts, argc, argv, /*allow_positional=*/true);
  if (args.count("help")) {
    std::cout << help_text(opts) << "\n";
    return 0;
  }
  RUNLM_CHECK(args.count("in") && args.count("out") && args.count("type"),
              "quantize: expected IN.gguf OUT.gguf TYPE\n%s", opts.help().c_str());
  const std::string in = args["in"].as<std::string>(), out = args["out"].as<std::string>();
  const std::string type = args["type"].as<std::string>();
  const QuantTarget& target = quant_target_from_name(type);  // fail before opening anything
  QuantizeOptions o;
  // -t above the hardware threads is capped, as for the model subcommands.
  o.n_threads = capped_thread_count(args["threads"].as<int>());
  o.pure = args.count("pure") > 0;
  o.allow_requantize = args.count("allow-requantize") > 0;
  const QuantizeReport r = quantize_gguf(in, out, target.name, o);
  std::printf("quantize: wrote %s as %s%s: %zu tensors, %.2f MB -> %.2f MB%s\n", out.c_str(), target.name,
              o.pure ? " (pure)" : "", r.n_tensors, static_cast<double>(r.bytes_in) / 1e6,
              static_cast<double>(r.bytes_out) / 1e6,
              r.fallbacks.empty() ? "" : strfmt(", %zu fell back (see above)", r.fallbacks.size()).c_str());
  return 0;
}

}  // namespace runlm
