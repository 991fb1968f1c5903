// The inference engine interface: one model with its KV cache on one device.
// generate, chat and perplexity drive an Engine and never see the backend.
#pragma once

#include <memory>
#include <string>

#include "attention.h"

namespace runlm {

class Model;

enum class Device { Auto, Cpu, Cuda };
Device device_from_name(const std::string& name);  // "auto", "cpu", "cuda"
const char* device_name(Device d);

struct EngineOptions {
  Device device = Device::Auto;
  int n_ctx = 0;          // KV cache capacity in tokens; 0 = the model's training context
  int n_threads = 0;      // CPU threads; 0 = all hardware threads
  int n_batch = 512;      // prefill chunk: tokens evaluated per pass
  int sliding_window = -1;  // -1 = the model's own, 0 = full attention, N = window of N
  AttnBackend attn = AttnBackend::Auto;  // prefill attention (GPU); the CPU has its own
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* backend_name() const = 0;
  virtual int n_ctx() const = 0;
  // Element type of the KV cache ("f32" on the CPU, "f16" on the GPU).
  virtual const char* kv_type_name() const = 0;
  // Copy bandwidth of the engine's memory in bytes/s, measured (a large
  // device-to-device copy, counting bytes read plus bytes written): the
  // ceiling decode is compared with.
  virtual double measure_copy_bandwidth() = 0;
  // Evaluates tokens[0..n) at positions pos..pos+n-1, replacing whatever the
  // cache held from pos on (so a chat turn re-uses positions [0, pos)). Writes
  // the logits of the last token ([n_vocab]), or of every token ([n, n_vocab])
  // when all_logits. Throws Error if pos + n exceeds n_ctx().
  virtual void forward(const int* tokens, int n, int pos, float* logits, bool all_logits) = 0;
};

std::unique_ptr<Engine> make_cpu_engine(const Model& model, const EngineOptions& options);
// Only in CUDA builds (RUNLM_CUDA); make_engine reports a build without it.
std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options);
bool cuda_device_available();
// Picks the device (Auto: CUDA when a GPU is present and built in, else CPU).
std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options);

}  // namespace runlm
