// dump_logits: the logits of a fixed token-id sequence and the greedy
// continuation, as JSON, for comparisons against other implementations
// (tools/check_hf_families.sh compares them with transformers').
//
//   dump_logits -m MODEL.gguf --ids 1,5,9,... [--greedy N] [--device cpu|cuda] [-t THREADS] -o OUT.json
//
// OUT.json: {"logits": [[n_vocab floats] per id], "greedy": [N ids]}; the
// greedy ids continue the sequence one token at a time through the KV cache.
#include <cxxopts.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common.h"
#include "engine.h"
#include "model.h"

using namespace runlm;

namespace {

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    RUNLM_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos, "--ids: bad id '%s'",
                item.c_str());
    ids.push_back(std::stoi(item));
  }
  RUNLM_CHECK(!ids.empty(), "--ids: no ids");
  return ids;
}

int run(int argc, char** argv) {
  cxxopts::Options opts("dump_logits", "Logits of a token-id sequence and its greedy continuation, as JSON");
  opts.add_options()
      ("m,model", "GGUF model", cxxopts::value<std::string>())
      ("ids", "comma-separated token ids", cxxopts::value<std::string>())
      ("greedy", "greedy tokens to generate after the ids", cxxopts::value<int>()->default_value("0"))
      ("device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))
      ("t,threads", "CPU threads", cxxopts::value<int>()->default_value("2"))
      ("o,output", "output JSON path", cxxopts::value<std::string>())
      ("h,help", "show this help");
  cxxopts::ParseResult args;
  try {
    args = opts.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    fail("%s", e.what());
  }
  if (args.count("help")) {
    std::cout << opts.help() << "\n";
    return 0;
  }
  RUNLM_CHECK(args.count("model") && args.count("ids") && args.count("output"), "-m, --ids and -o are required");
  const auto model = Model::load(args["model"].as<std::string>());
  const std::vector<int> ids = parse_ids(args["ids"].as<std::string>());
  const int n_greedy = args["greedy"].as<int>();
  const std::string device = args["device"].as<std::string>();
  RUNLM_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda");
  EngineOptions eo;
  eo.device = device == "cpu" ? Device::Cpu : Device::Cuda;
  eo.n_threads = args["threads"].as<int>();
  eo.n_ctx = static_cast<int>(ids.size()) + n_greedy + 1;
  auto engine = make_engine(*model, eo);
  const int n_vocab = model->config().n_vocab;

  std::vector<float> logits(ids.size() * size_t(n_vocab));
  engine->forward(ids.data(), static_cast<int>(ids.size()), 0, logits.data(), true);
  nlohmann::json out;
  out["logits"] = nlohmann::json::array();
  for (size_t t = 0; t < ids.size(); ++t)
    out["logits"].push_back(std::vector<float>(logits.begin() + t * n_vocab, logits.begin() + (t + 1) * n_vocab));
  std::vector<float> last(logits.end() - n_vocab, logits.end());
  std::vector<int> greedy;
  for (int i = 0; i < n_greedy; ++i) {
    const int next = static_cast<int>(std::max_element(last.begin(), last.end()) - last.begin());
    greedy.push_back(next);
    if (i + 1 < n_greedy) engine->forward(&next, 1, static_cast<int>(ids.size()) + i, last.data(), false);
  }
  out["greedy"] = greedy;
  std::ofstream f(args["output"].as<std::string>());
  RUNLM_CHECK(f, "cannot write %s", args["output"].as<std::string>().c_str());
  f << out.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
