// `runlm quantize IN.gguf OUT.gguf TYPE [--threads N]`: re-encodes the
// weights of a GGUF (TYPE: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m).
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
  opts.add_options()
      ("in", "input GGUF", cxxopts::value<std::string>())
      ("out", "output GGUF", cxxopts::value<std::string>())
      ("type", "f32, f16, bf16, q8_0, q4_0, q4_k, q6_k or q4_k_m", cxxopts::value<std::string>())
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
  // -t above the hardware threads is capped, as for the model subcommands.
  const QuantizeReport r = quantize_gguf(in, out, target.name, capped_thread_count(args["threads"].as<int>()));
  std::printf("quantize: wrote %s as %s: %zu tensors, %.2f MB -> %.2f MB%s\n", out.c_str(), target.name,
              r.n_tensors, static_cast<double>(r.bytes_in) / 1e6, static_cast<double>(r.bytes_out) / 1e6,
              r.fallbacks.empty() ? "" : strfmt(", %zu fell back (see above)", r.fallbacks.size()).c_str());
  return 0;
}

}  // namespace runlm
