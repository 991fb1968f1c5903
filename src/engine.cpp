#include "engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common.h"
#include "model.h"
#include "paged_kv.h"
#include "sampler.h"
#include "tokenizer.h"
#include "llama_arch.h"

namespace runlm {

Device device_from_name(const std::string& name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail("unknown device '%s'; expected auto, cpu or cuda", name.c_str());
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

void Engine::forward_batch_greedy(const std::vector<BatchItem>& items, int* tokens) {
  const size_t rows = static_cast<size_t>(std::count_if(items.begin(), items.end(), [](const BatchItem& it) {
    return it.want_logits;
  }));
  const int n_vocab = this->n_vocab();
  float* logits = logits_buffer(rows * n_vocab);
  forward_batch(items, logits);
  for (size_t r = 0; r < rows; ++r) tokens[r] = argmax(logits + r * n_vocab, n_vocab);
}

float* Engine::logits_buffer(size_t n) {
  if (logits_buffer_.size() < n) logits_buffer_.resize(n);
  return logits_buffer_.data();
}

uint64_t kv_cache_bytes(const ModelConfig& c, int64_t n_ctx, uint64_t elem_bytes) {
  RUNLM_CHECK(n_ctx > 0, "context size %lld must be positive", static_cast<long long>(n_ctx));
  uint64_t bytes = 2;  // K and V
  const uint64_t factors[] = {static_cast<uint64_t>(c.n_layers), static_cast<uint64_t>(n_ctx),
                              static_cast<uint64_t>(c.n_kv_heads), static_cast<uint64_t>(c.head_dim), elem_bytes};
  for (uint64_t f : factors)
    RUNLM_CHECK(!mul_overflows(bytes, f, &bytes),
                "KV cache for %lld tokens overflows 64 bits (%d layers x %d kv heads x head dim %d); use a smaller -c",
                static_cast<long long>(n_ctx), c.n_layers, c.n_kv_heads, c.head_dim);
  return bytes;
}

uint64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  uint64_t bytes = 0;
  return mul_overflows(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size), &bytes) ? 0 : bytes;
}

void check_host_allocation(uint64_t bytes, const std::string& what) {
  const uint64_t ram = host_memory_bytes();
  RUNLM_CHECK(ram == 0 || bytes <= ram, "%s needs %s (%llu bytes), more than this machine's %s of memory; use a smaller -c",
              what.c_str(), format_bytes(bytes).c_str(), static_cast<unsigned long long>(bytes),
              format_bytes(ram).c_str());
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  return u == 0 ? strfmt("%llu bytes", static_cast<unsigned long long>(bytes)) : strfmt("%.1f %s", v, units[u]);
}

KvLayout kv_layout_from_name(const std::string& name) {
  if (name == "contiguous") return KvLayout::Contiguous;
  if (name == "paged") return KvLayout::Paged;
  fail("unknown KV layout '%s'; expected paged or contiguous", name.c_str());
}

const char* kv_layout_name(KvLayout k) { return k == KvLayout::Paged ? "paged" : "contiguous"; }

std::vector<int> layer_windows(const ModelConfig& config, int option) {
  const int window = option >= 0 ? option : config.sliding_window;
  std::vector<int> out(size_t(config.n_layers), 0);
  for (int l = 0; l < config.n_layers; ++l)
    if (config.layer_uses_window(l)) out[size_t(l)] = window;
  return out;
}

int common_window(const std::vector<int>& windows) {
  int w = windows.empty() ? 0 : windows[0];
  for (int x : windows)
    if (x != w) return 0;
  return w;
}

void reserve_sequence0(BlockManager& blocks, int pos, int n) {
  if (!blocks.has_sequence(0)) blocks.add_sequence(0, {});
  blocks.truncate(0, pos);
  RUNLM_CHECK(blocks.seq_len(0) == pos, "KV cache: position %d of sequence 0 is not cached", pos);
  RUNLM_CHECK(blocks.grow(0, pos + n), "KV cache full: no free page for %d more tokens (-c / --kv-mem)", n);
}

#ifndef RUNLM_CUDA
bool cuda_device_available() { return false; }
std::string cuda_model_unsupported_reason(const Model&) { return "runlm was built without CUDA"; }
std::unique_ptr<Engine> make_cuda_engine(const Model&, const EngineOptions&) {
  fail("--device cuda: runlm was built without CUDA (no nvcc at configure time); use --device cpu");
}
#endif

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  Device device = options.device;
  if (device == Device::Auto) {
    // Auto takes the GPU when there is one that can hold the model, and says
    // why when it cannot; --device cuda turns the same reason into an error.
    device = Device::Cpu;
    if (cuda_device_available()) {
      const std::string why = cuda_model_unsupported_reason(model);
      if (why.empty()) device = Device::Cuda;
      else std::fprintf(stderr, "device auto: using the CPU, the GPU cannot run this model: %s\n", why.c_str());
    }
  }
  std::unique_ptr<Engine> engine;
  if (device == Device::Cuda) {
    engine = make_cuda_engine(model, options);
  } else {
    // The CPU engine has one attention implementation; asking it for a GPU
    // backend is an error, never a silent substitute.
    RUNLM_CHECK(options.attn == AttnBackend::Auto,
                "--attn %s runs on the GPU only; the CPU backend has its own attention (use --attn auto or --device "
                "cuda)",
                attn_backend_name(options.attn));
    engine = make_cpu_engine(model, options);
  }
  if (options.k_smoothing && kv_type_quantized(engine->type_k()))
    calibrate_k_smoothing(*engine, model.config(), model.tokenizer().bos());
  return engine;
}

}  // namespace runlm
