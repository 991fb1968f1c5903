// runlm tokenize: print the tokens of a text as llama.cpp's llama-tokenize
// does ("ID -> 'piece'" lines, or the ids as a list with --ids). Only the
// vocabulary is read (the GGUF's metadata), so vocabulary-only GGUF files
// work as well as whole models.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

namespace runlm {

int cmd_tokenize(int argc, char** argv) {
  cxxopts::Options opts("runlm tokenize", "Print the tokens of a text (the model's vocabulary only)");
  opts.add_options()
      ("h,help", "show this help")
      ("m,model", "GGUF model or vocabulary-only GGUF", cxxopts::value<std::string>())
      ("p,prompt", "text to tokenize", cxxopts::value<std::string>())
      ("f,file", "read the text from a file", cxxopts::value<std::string>())
      ("ids", "print only the ids, as a list [1, 2, 3]")
      ("no-bos", "do not add BOS even where the vocabulary asks for it")
      ("no-parse-special", "encode special-token texts (<|im_start|>, </s>...) as plain text")
      ("show-count", "print the number of tokens");
  auto args = parse_options(opts, argc, argv);
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  RUNLM_CHECK(args.count("model"), "no model: use -m MODEL.gguf");
  RUNLM_CHECK(args.count("prompt") + args.count("file") == 1, "give the text with either -p TEXT or -f FILE");
  std::string text;
  if (args.count("file")) {
    const std::string path = args["file"].as<std::string>();
    std::ifstream in(path, std::ios::binary);
    RUNLM_CHECK(in, "cannot open %s", path.c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    RUNLM_CHECK(!in.bad(), "cannot read %s", path.c_str());
    text = ss.str();
  } else {
    text = args["prompt"].as<std::string>();
  }

  const auto gguf = GgufFile::open(args["model"].as<std::string>());
  const auto tok = Tokenizer::from_gguf(*gguf);
  const bool add_bos = tok->add_bos() && args.count("no-bos") == 0;
  const std::vector<int> ids = tok->encode(text, add_bos, args.count("no-parse-special") == 0);

  std::string out;
  if (args.count("ids")) {
    out += "[";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "]\n";
  } else {
    // Special tokens show their text here, as llama-tokenize shows them.
    for (int id : ids) out += strfmt("%6d -> '", id) + tok->token_text(id) + "'\n";
  }
  if (args.count("show-count")) out += strfmt("Total number of tokens: %zu\n", ids.size());
  write_stdout(out);
  return 0;
}

}  // namespace runlm
