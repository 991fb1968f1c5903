// The inference engine interface: one model with its KV cache on one device.
// generate, chat and perplexity drive an Engine and never see the backend.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention.h"
#include "k_smoothing.h"
#include "kv_cache.h"
#include "kv_quant.h"

namespace runlm {

class Model;
struct ModelConfig;

enum class Device { Auto, Cpu, Cuda };
Device device_from_name(const std::string& name);  // "auto", "cpu", "cuda"
const char* device_name(Device d);

// How the KV cache is stored: one contiguous buffer for a single sequence,
// or pages with block tables (src/kv_cache.h) shared by many sequences.
enum class KvLayout { Contiguous, Paged };
KvLayout kv_layout_from_name(const std::string& name);  // "contiguous", "paged"
const char* kv_layout_name(KvLayout k);

struct EngineOptions {
  Device device = Device::Auto;
  int n_ctx = 0;          // KV cache capacity in tokens; 0 = the model's training context
  int n_threads = 0;      // CPU threads; 0 = all hardware threads
  int n_batch = 512;      // prefill chunk: tokens evaluated per pass
  // -1 = the model's own, 0 = full attention, N = a window of N on the
  // layers the model's pattern marks (every layer when it has none).
  int sliding_window = -1;
  AttnBackend attn = AttnBackend::Auto;  // prefill attention (GPU); the CPU has its own
  KvLayout kv = KvLayout::Contiguous;
  int block_size = 16;    // tokens per page (paged)
  int64_t kv_pages = 0;   // pages in the pool (paged); 0 = sized from kv_tokens and memory
  int64_t kv_tokens = 0;  // paged: wanted capacity in tokens (0 = n_ctx), capped by memory
  int64_t kv_bytes = 0;   // paged: memory for the pool (--kv-mem); 0 = the backend's default cap
  // KV element types; unset = the backend's default (f32 on the CPU, f16 on the GPU).
  std::optional<KvType> type_k, type_v;
  // make_engine calibrates K smoothing (src/k_smoothing.h) when K is
  // quantized (q8_0, q4_0, fp8); --k-smoothing off clears it.
  bool k_smoothing = true;
  // --verbose: the engine says once on stderr which decode attention kernel
  // it runs and why, and its prefill attention backend.
  bool verbose = false;
};

// One sequence's share of a batched step: its new tokens at positions
// [pos, pos + n_tokens). Their pages must have been reserved (BlockManager::grow).
struct BatchItem {
  int seq_id = 0;
  const int* tokens = nullptr;
  int n_tokens = 0;
  int pos = 0;
  bool want_logits = false;  // logits of the item's last token
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* backend_name() const = 0;
  // The decode attention kernel this engine runs (the GPU's selector's
  // choice, kernels/cuda/paged_attention.h; "cpu" on the CPU).
  virtual const char* decode_kernel() const = 0;
  virtual int n_ctx() const = 0;
  virtual int n_vocab() const = 0;  // the width of a logits row
  // Element types of the KV cache (-ctk, -ctv).
  virtual KvType type_k() const = 0;
  virtual KvType type_v() const = 0;
  // Copy bandwidth of the engine's memory in bytes/s, measured (a large
  // device-to-device copy, counting bytes read plus bytes written): the
  // ceiling decode is compared with.
  virtual double measure_copy_bandwidth() = 0;
  // Device memory in use on the engine's GPU, as its driver reports it
  // (total less free: the engine's weights, caches and workspaces, and the
  // context's own share); 0 for an engine on host memory.
  virtual uint64_t device_memory_in_use() const { return 0; }
  // Evaluates tokens[0..n) at positions pos..pos+n-1, replacing whatever the
  // cache held from pos on (so a chat turn re-uses positions [0, pos)). Writes
  // the logits of the last token ([n_vocab]), or of every token ([n, n_vocab])
  // when all_logits. Throws Error if pos + n exceeds n_ctx().
  virtual void forward(const int* tokens, int n, int pos, float* logits, bool all_logits) = 0;

  // Paged engines only: the page bookkeeping (nullptr when contiguous) and
  // one step over several sequences, writing one logits row [n_vocab] per
  // item with want_logits, in item order. Sequence id 0 is the one forward()
  // uses; batch callers use ids >= 1.
  virtual BlockManager* blocks() { return nullptr; }
  virtual void forward_batch(const std::vector<BatchItem>& items, float* logits) = 0;
  // forward_batch for a step whose every row is sampled greedily with no
  // logit edits: only each row's argmax (runlm::argmax), one token per item
  // with want_logits, in item order. The GPU engine reduces on the device and
  // copies back ints instead of n_vocab floats a row.
  virtual void forward_batch_greedy(const std::vector<BatchItem>& items, int* tokens);
  // Host memory for n floats of forward_batch logits that this engine fills
  // fastest (page-locked on the GPU: a 256-sequence step copies 33 MB).
  // Valid until the next call; the contents are not kept.
  virtual float* logits_buffer(size_t n);
  // Most tokens one forward_batch may carry (the prefill chunk size).
  virtual int max_batch_tokens() const = 0;
  // The attention window every layer keeps to, in tokens (0 = some layer
  // attends to everything): keys older than it are never read again, so a
  // paged cache may release their pages.
  virtual int sliding_window() const = 0;

  // K smoothing (src/k_smoothing.h). While stats is set, every forward adds
  // each layer's RoPE'd Q and K (before any smoothing) to it. set_k_smoothing
  // installs the shift and scales that every later K write and Q use applies
  // (an empty one removes them); K already in the cache is not rewritten, so
  // it is set before anything is cached. A backend that cannot apply them
  // says so with an Error.
  virtual void set_qk_stats(QkStats* stats) = 0;
  virtual void set_k_smoothing(const KSmoothing& smoothing) = 0;
  virtual bool k_smoothed() const = 0;

 private:
  std::vector<float> logits_buffer_;  // logits_buffer()'s default
};

// Each layer's attention window in tokens (0 = full attention): the model's
// window on the layers its pattern marks (ModelConfig::swa_layers; every
// layer without a pattern); `option` (EngineOptions::sliding_window) 0 makes
// every layer full, N > 0 resizes the window of the marked layers.
std::vector<int> layer_windows(const ModelConfig& config, int option);
// The window all layers keep to (0 when some layer has full attention).
int common_window(const std::vector<int>& windows);

// Bytes of the K and V caches together for n_ctx tokens of elem_bytes
// elements (2 x n_layers x n_ctx x n_kv_heads x head_dim x elem_bytes),
// computed in 64 bits: context sizes times model widths overflow 32. An
// overflow is an Error naming the request.
uint64_t kv_cache_bytes(const ModelConfig& config, int64_t n_ctx, uint64_t elem_bytes);
// "12.5 GiB"-style size for messages.
std::string format_bytes(uint64_t bytes);
// Physical memory of this machine in bytes (0 when unknown).
uint64_t host_memory_bytes();
// Checks, before allocating, that a host buffer of `bytes` can fit in this
// machine's memory; otherwise an Error "WHAT needs N bytes (...), more than
// this machine's M; use a smaller -c". Allocating first is no check: Linux
// overcommit lets a too-large buffer succeed and the OOM killer strike when
// its pages are touched, and under AddressSanitizer a failed new aborts.
void check_host_allocation(uint64_t bytes, const std::string& what);

// forward() of a paged engine runs sequence 0: keeps its first `pos`
// positions and reserves pages for `n` more (Error when the pool is full).
void reserve_sequence0(BlockManager& blocks, int pos, int n);

std::unique_ptr<Engine> make_cpu_engine(const Model& model, const EngineOptions& options);
// Only in CUDA builds (RUNLM_CUDA); make_engine reports a build without it.
std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options);
bool cuda_device_available();
// Why the CUDA engine cannot hold this model's weights ("" when it can).
std::string cuda_model_unsupported_reason(const Model& model);
// Picks the device (Auto: CUDA when a GPU is present and built in, else CPU).
std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options);

}  // namespace runlm
