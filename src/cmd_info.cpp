// runlm info: what a GGUF model holds, read from the file without running
// it: architecture, shapes, weight types and sizes, vocabulary and whether
// it carries a chat template. A vocabulary-only GGUF (llama.cpp's
// ggml-vocab-*.gguf: no tensors) gets its vocabulary and template.
#include <cstdio>
#include <map>

#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "dtype.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

namespace runlm {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return u == 0 ? strfmt("%.0f B", b) : strfmt("%.2f %s", b, units[u]);
}

std::string vocabulary_lines(const GgufFile& g, const Tokenizer& tok, const std::string& tmpl) {
  const std::string kind = g.get_string_opt("tokenizer.ggml.model").value_or("unknown");
  std::string out = strfmt("vocabulary:     %s, %d tokens, bos %d '%s', eos %d '%s'\n", kind.c_str(), tok.n_vocab(),
                           tok.bos(), tok.id_to_piece(tok.bos()).c_str(), tok.eos(), tok.id_to_piece(tok.eos()).c_str());
  out += tmpl.empty() ? std::string("chat template:  none in the file (runlm chat needs --chat-template)\n")
                      : strfmt("chat template:  in the file (tokenizer.chat_template, %zu bytes)\n", tmpl.size());
  return out;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  cxxopts::Options opts("runlm info", "Describe a GGUF model: architecture, shapes, tensor types, vocabulary");
  opts.add_options()
      ("m,model", "GGUF model file", cxxopts::value<std::string>())
      ("h,help", "show this help");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", help_text(opts).c_str());
    return 0;
  }
  RUNLM_CHECK(args.count("model"), "no model given: use -m MODEL.gguf");
  const std::string path = args["model"].as<std::string>();
  {
    auto g = GgufFile::open(path);
    if (g->tensors().empty()) {
      auto tok = Tokenizer::from_gguf(*g);
      std::string out = strfmt("file:           %s (GGUF v%u, %s)\n", path.c_str(), g->version(),
                               human_bytes(double(g->file_size())).c_str());
      out += strfmt("architecture:   %s (vocabulary only: no weights)\n",
                    g->get_string_opt("general.architecture").value_or("none").c_str());
      out += vocabulary_lines(*g, *tok, g->get_string_opt("tokenizer.chat_template").value_or(""));
      write_stdout(out);
      return 0;
    }
  }
  auto model = Model::load(path);
  const ModelConfig& c = model->config();
  const GgufFile& g = model->gguf();

  std::string out;
  out += strfmt("file:           %s (GGUF v%u, %s)\n", path.c_str(), g.version(), human_bytes(double(g.file_size())).c_str());
  out += strfmt("architecture:   %s%s\n", arch_name(c.arch), c.name.empty() ? "" : strfmt(" (%s)", c.name.c_str()).c_str());
  out += strfmt("parameters:     %lld\n", static_cast<long long>(model->n_params()));
  out += strfmt("layers:         %d\n", c.n_layers);
  out += strfmt("embedding dim:  %d\n", c.dim);
  out += strfmt("ffn dim:        %d\n", c.hidden_dim);
  out += strfmt("heads:          %d\n", c.n_heads);
  out += strfmt("kv heads:       %d\n", c.n_kv_heads);
  out += strfmt("head dim:       %d\n", c.head_dim);
  out += strfmt("context:        %d (training)\n", c.ctx_train);
  out += strfmt("rope theta:     %g\n", c.rope_theta);
  out += strfmt("sliding window: %s\n", c.sliding_window > 0 ? std::to_string(c.sliding_window).c_str() : "none");

  // Tensors by type: count and bytes, then the total.
  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t total = 0;
  for (const auto& t : g.tensors()) {
    auto& slot = by_type[dtype_name(t.type)];
    ++slot.first;
    slot.second += t.nbytes;
    total += t.nbytes;
  }
  out += strfmt("tensors:        %zu, %s\n", g.tensors().size(), human_bytes(double(total)).c_str());
  for (const auto& [name, cb] : by_type)
    out += strfmt("  %-6s %5d tensors %12llu bytes (%s)\n", name.c_str(), cb.first,
                  static_cast<unsigned long long>(cb.second), human_bytes(double(cb.second)).c_str());

  out += vocabulary_lines(g, model->tokenizer(), model->chat_template_source());
  write_stdout(out);
  return 0;
}

}  // namespace runlm
