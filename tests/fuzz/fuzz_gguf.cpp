// libFuzzer target: the GGUF reader and everything that reads a GGUF before
// inference runs: GgufFile::from_memory, every typed metadata getter, the
// model config (models/llama_arch.cpp), the tokenizer built from tokenizer.ggml.*,
// the weight views (Model::from_gguf), and one short forward pass of the CPU
// engine on whatever model survives all of that. A runlm::Error is a correct
// rejection; anything else (a sanitizer report, another exception, a huge
// allocation, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common.h"
#include "engine.h"
#include "gguf.h"
#include "model.h"
#include "tokenizer.h"

using namespace runlm;

namespace {

// Every getter on every key: each one either returns or throws Error.
void read_all_metadata(const GgufFile& g) {
  for (const GgufKV& kv : g.metadata()) {
    const std::string& k = kv.key;
    try { (void)g.get_int(k); } catch (const Error&) {}
    try { (void)g.get_float(k); } catch (const Error&) {}
    try { (void)g.get_bool(k); } catch (const Error&) {}
    try { (void)g.get_string(k); } catch (const Error&) {}
    try { (void)g.get_string_array(k); } catch (const Error&) {}
    try { (void)g.get_float_array(k); } catch (const Error&) {}
    try { (void)g.get_int_array(k); } catch (const Error&) {}
  }
}

// Touches the first and last byte of every tensor, so ASan sees any view
// that escapes the image.
uint32_t touch_tensors(const GgufFile& g) {
  uint32_t sum = 0;
  for (const GgufTensorInfo& t : g.tensors()) {
    const uint8_t* p = g.tensor_data(t);
    if (t.nbytes > 0) sum += p[0] + p[t.nbytes - 1];
  }
  return sum;
}

// A few tokens through the CPU engine with a small context, so a model whose
// shapes passed the loader but not the engine shows up here.
void run_model(const Model& model) {
  EngineOptions eo;
  eo.device = Device::Cpu;
  eo.n_ctx = 8;
  eo.n_threads = 1;
  eo.n_batch = 2;
  auto engine = make_cpu_engine(model, eo);
  const int n_vocab = model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_vocab) * 3);
  const int tokens[3] = {model.tokenizer().bos() >= 0 ? model.tokenizer().bos() : 0, n_vocab - 1, 0};
  engine->forward(tokens, 3, 0, logits.data(), /*all_logits=*/true);
  engine->forward(tokens, 1, 3, logits.data(), /*all_logits=*/false);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> g;
  try {
    g = GgufFile::from_memory(data, size, "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }
  read_all_metadata(*g);
  volatile uint32_t sink = touch_tensors(*g);
  (void)sink;
  try {
    (void)read_model_config(*g);
  } catch (const Error&) {
  }
  try {
    auto tok = Tokenizer::from_gguf(*g);
    const std::vector<int> ids = tok->encode("Once upon a time <s> \xe2\x96\x81x\xff", true, true);
    (void)tok->decode(ids);
  } catch (const Error&) {
  }
  try {
    auto model = Model::from_gguf(std::move(g));
    run_model(*model);
  } catch (const Error&) {
  }
  return 0;
}
