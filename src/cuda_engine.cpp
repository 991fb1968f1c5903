// CUDA backend: the same forward pass as the CPU engine (src/cpu_engine.cpp),
// on the GPU. Weights are uploaded once in their GGUF type (repacked for
// 16-byte loads, kernels/cuda/gpu_ops.h). Up to gemv_max_tokens_ tokens run
// through the quantized GEMV kernels with f32 activations (decode, short
// prompts); longer chunks through the tensor-core GEMM with f16 activations
// and the prefill attention backends (src/attention.h). The single-token
// decode step is captured once in a CUDA graph and replayed: every kernel
// reads the token and its position from device memory, so one graph serves
// every position.
#ifdef RUNLM_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#include "attention.h"
#include "common.h"
#include "cuda/gpu_ops.h"
#include "cuda/paged_attention.h"
#include "engine.h"
#include "engine_support.h"
#include "model.h"
#include "ops.h"

namespace runlm {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in %s: %s", what, cudaGetErrorString(e));
}

constexpr int kMaxGemvTokens = 16;    // the GEMV kernels take up to 16 rows of x
constexpr int kMaxGemvTokensGemmOnce = 4;  // where F16, Q4_0, Q8_0 weights switch to the GEMM (see allocate_buffers)

QMatrix qmatrix(const WeightView& w) { return QMatrix{w.type, w.data, w.row_bytes, w.ne0, w.ne1}; }

// A device buffer freed with the engine.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { allocate(n); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }
  void allocate(size_t n) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if (cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      cudaGetLastError();
      fail("out of GPU memory: needed %zu bytes, free %zu bytes", n * sizeof(T), free_b);
    }
    n_ = n;
  }
  // Grows (contents not kept) to at least n elements.
  void reserve(size_t n) {
    if (n <= n_ && ptr_) return;
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    allocate(n);
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Projections of one x that run as one batched GEMM (gpu::gemm_batched):
// where their n weight, n x and n y pointers start in the engine's pointer
// table; n = 0 when the matrices do not qualify (then one gemm each).
struct GemmGroup {
  size_t at = 0;
  int n = 0;
  int64_t rows = 0, cols = 0;
};

struct GpuLayer {
  gpu::GpuMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  DeviceBuffer<float> attn_norm, ffn_norm;
  GemmGroup qkv, kv, gate_up;  // kv: when q's shape differs (GQA)
};

// The feed-forward width the GPU uses: a multiple of 8 (see upload_padded).
int64_t padded_hidden(const ModelConfig& c) { return (c.hidden_dim + 7) / 8 * 8; }

// Items of at most this many tokens run through the paged decode kernel.
constexpr int kMaxDecodeQ = 16;

// A batched step laid out for the device: tokens in execution order (short
// items first), where each goes, and the per-sequence tables of each group.
struct BatchPlan {
  std::vector<int> tokens, positions, slots;
  // Short items (paged decode kernel): query prefix sums, key lengths, tables.
  std::vector<int> dec_cu_q{0}, dec_seq_lens;
  std::vector<std::vector<int32_t>> dec_tables;
  // Long items (prefill attention on gathered K/V): query and key prefix sums.
  std::vector<int> pre_cu_q{0}, pre_cu_k{0};
  std::vector<std::vector<int32_t>> pre_tables;
  int dec_tokens = 0, max_dec_q = 0, max_dec_len = 0, max_pre_q = 0, max_pre_k = 0;
  // Rows of the step whose logits are wanted, in the items' order.
  std::vector<std::pair<int, int>> wanted;  // (item index, token row)
  std::vector<int32_t> logit_rows;

  void add(const BatchItem& it, const std::vector<int32_t>& table, int block_size, bool short_item, int item_index) {
    for (int i = 0; i < it.n_tokens; ++i) {
      const int p = it.pos + i;
      tokens.push_back(it.tokens[i]);
      positions.push_back(p);
      slots.push_back(table[p / block_size] * block_size + p % block_size);
    }
    const int len = it.pos + it.n_tokens;
    if (short_item) {
      max_dec_len = std::max(max_dec_len, len);
      dec_cu_q.push_back(dec_cu_q.back() + it.n_tokens);
      dec_seq_lens.push_back(len);
      dec_tables.push_back(table);
      dec_tokens += it.n_tokens;
      max_dec_q = std::max(max_dec_q, it.n_tokens);
    } else {
      pre_cu_q.push_back(pre_cu_q.back() + it.n_tokens);
      pre_cu_k.push_back(pre_cu_k.back() + len);
      pre_tables.push_back(table);
      max_pre_q = std::max(max_pre_q, it.n_tokens);
      max_pre_k = std::max(max_pre_k, len);
    }
    if (it.want_logits) {
      wanted.push_back({item_index, static_cast<int>(tokens.size()) - 1});
      std::sort(wanted.begin(), wanted.end());
      logit_rows.clear();
      for (const auto& w : wanted) logit_rows.push_back(w.second);
    }
  }
  int n_dec() const { return static_cast<int>(dec_seq_lens.size()); }
  int n_pre() const { return static_cast<int>(pre_cu_k.size()) - 1; }
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(const Model& model, const EngineOptions& opt)
      : model_(model), cfg_(model.config()), attn_(opt.attn) {
    require_cuda_engine_support(cfg_);
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
      cudaGetLastError();
      fail("--device cuda: no CUDA device found");
    }
    // A constructor that throws (out of GPU memory half-way through the
    // weights) gets no destructor call: free what was made so far, or the
    // process keeps that GPU memory for the rest of its life.
    try {
      init(opt);
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaEngine() override { release(); }

  const char* backend_name() const override { return "cuda"; }
  int n_ctx() const override { return n_ctx_; }
  int n_vocab() const override { return cfg_.n_vocab; }
  KvType type_k() const override { return type_k_; }
  KvType type_v() const override { return type_v_; }
  int max_batch_tokens() const override { return n_batch_; }
  int sliding_window() const override { return common_window(windows_); }
  // K smoothing is applied where K is written and Q rotated
  // (rope_and_store_kv_slots), which is the paged path's store.
  void set_qk_stats(QkStats* stats) override {
    RUNLM_CHECK(!stats || blocks_, "K smoothing on the GPU needs the paged KV cache (--kv paged)");
    // Statistics are of the unsmoothed Q, as the CPU engine's.
    RUNLM_CHECK(!stats || !k_smoothed_, "set_qk_stats: remove the K smoothing before collecting statistics");
    qk_stats_ = stats;
  }
  void set_k_smoothing(const KSmoothing& smoothing) override {
    if (smoothing.empty()) {
      k_smoothed_ = false;
      return;
    }
    RUNLM_CHECK(blocks_, "K smoothing on the GPU needs the paged KV cache (--kv paged)");
    RUNLM_CHECK(smoothing.n_layers == cfg_.n_layers && smoothing.kv_dim == cfg_.kv_dim(),
                "K smoothing made for %d layers x %d channels; this model has %d x %d", smoothing.n_layers,
                smoothing.kv_dim, cfg_.n_layers, cfg_.kv_dim());
    k_smoothing_.allocate(smoothing.params.size());
    check(cudaMemcpy(k_smoothing_.get(), smoothing.params.data(), smoothing.params.size() * sizeof(float),
                     cudaMemcpyHostToDevice),
          "upload K smoothing");
    k_smoothed_ = true;
  }
  bool k_smoothed() const override { return k_smoothed_; }
  BlockManager* blocks() override { return blocks_.get(); }

  // A step over several sequences of the paged cache. Tokens are reordered
  // so that items of at most kMaxDecodeQ tokens (decode steps, short tails)
  // come first and run through the paged decode kernel; longer items
  // (prefill chunks) follow and run through the prefill attention backends on
  // their K/V gathered out of the pages.
  // One batched step (forward_batch): the logits of the rows that want them
  // into `logits`, or only their argmax into `greedy_tokens`.
  void run_items(const std::vector<BatchItem>& items, float* logits, int* greedy_tokens) {
    RUNLM_CHECK(blocks_, "forward_batch needs the paged KV cache (--kv paged)");
    const ModelConfig& c = cfg_;
    BatchPlan plan;
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < items.size(); ++i) {
        const BatchItem& it = items[i];
        const bool short_item = it.n_tokens <= kMaxDecodeQ;
        if ((pass == 0) != short_item) continue;
        RUNLM_CHECK(it.n_tokens > 0, "forward_batch: empty item for sequence %d", it.seq_id);
        RUNLM_CHECK(blocks_->seq_len(it.seq_id) >= it.pos + it.n_tokens,
                    "forward_batch: pages for positions [%d, %d) of sequence %d were not reserved", it.pos,
                    it.pos + it.n_tokens, it.seq_id);
        RUNLM_CHECK(it.pos + it.n_tokens <= n_ctx_, "sequence %d: %d positions exceed the context size %d", it.seq_id,
                    it.pos + it.n_tokens, n_ctx_);
        plan.add(it, blocks_->block_table(it.seq_id), block_size_, short_item, static_cast<int>(i));
      }
    const int m = static_cast<int>(plan.tokens.size());
    RUNLM_CHECK(m <= n_batch_, "forward_batch: %d tokens exceed the batch size %d (-b)", m, n_batch_);
    for (int t : plan.tokens)
      RUNLM_CHECK(t >= 0 && t < c.n_vocab, "token id %d out of range [0, %d)", t, c.n_vocab);
    upload_plan(plan);
    run_batch(plan);
    const int n_rows = static_cast<int>(plan.logit_rows.size());
    if (n_rows > 0 && greedy_tokens) {
      // Greedy rows: the argmax on the device, ints back (not n_vocab floats).
      gpu::argmax_rows(logits_.get(), n_rows, c.n_vocab, argmax_.get(), stream_);
      check(cudaMemcpyAsync(greedy_tokens, argmax_.get(), static_cast<size_t>(n_rows) * sizeof(int),
                            cudaMemcpyDeviceToHost, stream_),
            "copy tokens");
    } else if (n_rows > 0) {
      check(cudaMemcpyAsync(logits, logits_.get(), static_cast<size_t>(n_rows) * c.n_vocab * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_),
            "copy logits");
    }
    check(cudaStreamSynchronize(stream_), "sync");
  }

  void forward_batch(const std::vector<BatchItem>& items, float* logits) override {
    run_items(items, logits, nullptr);
  }

  void forward_batch_greedy(const std::vector<BatchItem>& items, int* tokens) override {
    run_items(items, nullptr, tokens);
  }

  float* logits_buffer(size_t n) override {
    if (logits_host_n_ < n) {
      if (logits_host_) cudaFreeHost(logits_host_);
      logits_host_ = nullptr;
      logits_host_n_ = 0;
      check(cudaMallocHost(&logits_host_, n * sizeof(float)), "cudaMallocHost (logits)");
      logits_host_n_ = n;
    }
    return logits_host_;
  }

  double measure_copy_bandwidth() override {
    // 1 GiB each way: far past the 50 MB L2, so this is HBM bandwidth.
    const size_t n = size_t{1} << 30;
    DeviceBuffer<uint8_t> a(n), b(n);
    check(cudaMemsetAsync(a.get(), 1, n, stream_), "memset");
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    float best_ms = 1e30f;
    for (int rep = 0; rep < 6; ++rep) {
      cudaEventRecord(start, stream_);
      check(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, stream_), "copy");
      cudaEventRecord(stop, stream_);
      check(cudaEventSynchronize(stop), "sync");
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (rep > 0) best_ms = std::min(best_ms, ms);  // the first copy warms up
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 2.0 * static_cast<double>(n) / (best_ms * 1e-3);
  }

  void forward(const int* tokens, int n, int pos, float* logits, bool all_logits) override {
    RUNLM_CHECK(n > 0, "forward: no tokens");
    RUNLM_CHECK(pos >= 0 && static_cast<int64_t>(pos) + n <= n_ctx_,
                "context full: %d tokens at position %d exceed the context size %d (-c)", n, pos, n_ctx_);
    if (blocks_) {
      // Paged: forward() is sequence 0, run as batches of one item.
      reserve_sequence0(*blocks_, pos, n);
      for (int done = 0; done < n; ) {
        const int chunk = all_logits ? 1 : std::min(n_batch_, n - done);
        BatchItem it;
        it.tokens = tokens + done;
        it.n_tokens = chunk;
        it.pos = pos + done;
        it.want_logits = all_logits || done + chunk == n;
        forward_batch({it}, all_logits ? logits + static_cast<size_t>(done) * cfg_.n_vocab : logits);
        done += chunk;
      }
      return;
    }
    for (int i = 0; i < n; ++i)
      RUNLM_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab, "token id %d out of range [0, %d)", tokens[i],
                  cfg_.n_vocab);
    for (int done = 0; done < n; done += n_batch_) {
      const int m = std::min(n_batch_, n - done);
      const bool want = all_logits || done + m == n;
      float* out = all_logits ? logits + static_cast<size_t>(done) * cfg_.n_vocab : logits;
      run_chunk(tokens + done, m, pos + done, want ? out : nullptr, all_logits);
    }
  }

 private:
  // The constructor's work; the constructor frees what it made if it throws.
  void init(const EngineOptions& opt) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_kv_types(opt);
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : cfg_.ctx_train;
    n_batch_ = std::max(1, opt.n_batch);
    windows_ = layer_windows(cfg_, opt.sliding_window);
    upload_weights();
    allocate_buffers();
    build_gemm_groups();
    allocate_kv_cache(opt);
    if (blocks_) choose_prefill_kv();
  }

  // How prefill attention reads the paged K/V (issue 7). f16/f16 pools: in
  // place through the block tables. Typed pools (bf16, q8_0, q4_0, fp8, K and
  // V independent): in place when the backend the engine runs (--attn, or
  // what auto picks for the contiguous f16 problem, by speed) dequantizes
  // them in the kernel (naive, fa2); otherwise (fa3: its TMA copies raw tiles)
  // gather_kv first decodes the chunk's K/V to contiguous f16. Auto keeps
  // fa3 on sm_90 (+ gather) rather than switching to the slower fa2.
  // RUNLM_PREFILL_KV=gather forces the gather, for measuring. Said once on
  // stderr for typed pools (tests read it).
  void choose_prefill_kv() {
    const bool typed = type_k_ != KvType::F16 || type_v_ != KvType::F16;
    paged_prefill_ = !gather_prefill_kv_;
    if (!typed || gather_prefill_kv_) return;
    AttnParams probe;
    probe.head_dim = cfg_.head_dim;
    probe.dtype = DType::F16;
    probe.causal = true;
    // The widest layer window: a window at all is what a backend may lack.
    const int widest = *std::max_element(windows_.begin(), windows_.end());
    probe.window_left = widest > 0 ? widest - 1 : -1;
    const AttnBackend chosen = attn_resolve(attn_, probe);
    const int32_t dummy_table = 0;  // attn_unsupported_reason tests block_tables for null only
    probe.block_tables = &dummy_table;
    probe.block_size = block_size_;
    probe.k_type = type_k_;
    probe.v_type = type_v_;
    int dev = 0, major = 0, minor = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "compute capability");
    check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "compute capability");
    const std::string why = attn_unsupported_reason(chosen, probe, major * 10 + minor);
    paged_prefill_ = why.empty();
    if (paged_prefill_)
      std::fprintf(stderr, "prefill attention: %s reads the K=%s V=%s pages in place\n", attn_backend_name(chosen),
                   kv_type_name(type_k_), kv_type_name(type_v_));
    else
      std::fprintf(stderr, "prefill attention: gather_kv decodes the K=%s V=%s pages to f16 for %s (%s)\n",
                   kv_type_name(type_k_), kv_type_name(type_v_), attn_backend_name(chosen), why.c_str());
  }

  // Frees what the raw handles hold (the DeviceBuffers free themselves).
  void release() {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    for (auto& l : layers_)
      for (gpu::GpuMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) gpu::free_matrix(*m);
    gpu::free_matrix(tok_embd_);
    if (!cfg_.tied_embeddings) gpu::free_matrix(output_);
    output_ = gpu::GpuMatrix{};  // tied: the same allocation as tok_embd_
    if (host_io_) cudaFreeHost(host_io_);
    host_io_ = nullptr;
    if (plan_host_) cudaFreeHost(plan_host_);
    plan_host_ = nullptr;
    if (logits_host_) cudaFreeHost(logits_host_);
    logits_host_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  // KV cache types (issue 7): the paged cache takes f16, bf16, q8_0, q4_0 and
  // fp8 for K and V independently (the store, paged decode, naive / fa2
  // prefill and gather_kv kernels read them); the contiguous cache's kernels (decode_attention and
  // the prefill backends reading the cache in place) read f16 only.
  void check_kv_types(const EngineOptions& opt) {
    type_k_ = opt.type_k.value_or(KvType::F16);
    type_v_ = opt.type_v.value_or(KvType::F16);
    auto on_gpu = [](KvType t) { return t == KvType::F16 || t == KvType::BF16 || kv_type_quantized(t); };
    for (KvType t : {type_k_, type_v_})
      RUNLM_CHECK(on_gpu(t),
                  "--device cuda: KV cache type %s (K=%s V=%s) unsupported on the GPU; supported: f16, bf16, q8_0, "
                  "q4_0, fp8 (K and V independently, with --kv paged); the CPU backend supports f32",
                  kv_type_name(t), kv_type_name(type_k_), kv_type_name(type_v_));
    const bool plain = type_k_ == KvType::F16 && type_v_ == KvType::F16;
    RUNLM_CHECK(plain || opt.kv == KvLayout::Paged,
                "--device cuda: KV cache types K=%s V=%s need the paged KV cache (--kv paged); the contiguous cache "
                "on the GPU supports f16/f16 only",
                kv_type_name(type_k_), kv_type_name(type_v_));
    for (KvType t : {type_k_, type_v_})
      RUNLM_CHECK(t == KvType::F16 || cfg_.head_dim % 32 == 0,
                  "--device cuda: KV cache type %s with head_dim=%d unsupported; types other than f16 need head_dim "
                  "a multiple of 32 (a scale per 32 values)",
                  kv_type_name(t), cfg_.head_dim);
  }

  void upload_weights() {
    const ModelWeights& w = model_.weights();
    hidden_ = padded_hidden(cfg_);
    tok_embd_ = gpu::upload_matrix(qmatrix(w.tok_embd));
    output_ = cfg_.tied_embeddings ? tok_embd_ : gpu::upload_matrix(qmatrix(w.output));
    upload_vector_into(w.output_norm, output_norm_);
    layers_.resize(cfg_.n_layers);
    for (int l = 0; l < cfg_.n_layers; ++l) {
      const LayerWeights& lw = w.layers[l];
      GpuLayer& g = layers_[l];
      g.wq = gpu::upload_matrix(qmatrix(lw.wq));
      g.wk = gpu::upload_matrix(qmatrix(lw.wk));
      g.wv = gpu::upload_matrix(qmatrix(lw.wv));
      g.wo = gpu::upload_matrix(qmatrix(lw.wo));
      g.w_gate = upload_padded(lw.w_gate, hidden_, lw.w_gate.ne0);
      g.w_up = upload_padded(lw.w_up, hidden_, lw.w_up.ne0);
      g.w_down = upload_padded(lw.w_down, lw.w_down.ne1, hidden_);
      upload_vector_into(lw.attn_norm, g.attn_norm);
      upload_vector_into(lw.ffn_norm, g.ffn_norm);
    }
  }

  // Uploads w as a rows x cols matrix, zero-padded where it is smaller. The
  // feed-forward width is padded to a multiple of 8 (the GPU layout of plain
  // float types needs it): the extra gate/up rows give silu(0) * 0 = 0 and the
  // extra down columns multiply those zeros, so the result is exact.
  gpu::GpuMatrix upload_padded(const WeightView& w, int64_t rows, int64_t cols) {
    if (rows == w.ne1 && cols == w.ne0) return gpu::upload_matrix(qmatrix(w));
    const size_t row_bytes = dtype_row_bytes(w.type, cols);
    std::vector<uint8_t> buf(row_bytes * static_cast<size_t>(rows), 0);  // zero bits are 0.0 in every plain type
    for (int64_t r = 0; r < w.ne1; ++r) std::memcpy(buf.data() + r * row_bytes, w.row(r), w.row_bytes);
    return gpu::upload_matrix(QMatrix{w.type, buf.data(), row_bytes, cols, rows});
  }

  void upload_vector_into(const WeightView& v, DeviceBuffer<float>& dst) {
    std::vector<float> host(static_cast<size_t>(v.ne0));
    get_row(qmatrix(v), 0, host.data());
    dst.allocate(host.size());
    check(cudaMemcpy(dst.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }

  void allocate_buffers() {
    const ModelConfig& c = cfg_;
    const size_t m = static_cast<size_t>(n_batch_);
    const size_t widest = std::max<size_t>({static_cast<size_t>(c.dim), static_cast<size_t>(c.q_dim()), static_cast<size_t>(hidden_)});
    x_.allocate(m * c.dim);
    xb_.allocate(m * widest);
    xh_.allocate(m * widest);
    q_.allocate(m * c.q_dim());
    qh_.allocate(m * c.q_dim());
    k_.allocate(m * c.kv_dim());
    v_.allocate(m * c.kv_dim());
    att_.allocate(m * c.q_dim());
    atth_.allocate(m * c.q_dim());
    gate_.allocate(m * hidden_);
    up_.allocate(m * hidden_);
    logits_.allocate(m * c.n_vocab);
    argmax_.allocate(m);
    rows_.allocate(m * c.dim);
    tokens_.allocate(m);
    positions_.allocate(m);
    cu_seqlens_.allocate(4);
    const char* f32x = std::getenv("RUNLM_GEMV_F32X");
    gemv_x8_ = !(f32x && std::strcmp(f32x, "1") == 0);
    const char* rope_sep = std::getenv("RUNLM_DECODE_ROPE_FUSED");  // =0: separate RoPE launch, for comparison
    rope_in_attention_ = !(rope_sep && std::strcmp(rope_sep, "0") == 0);
    x8_.allocate(gpu::x8_bytes(kMaxGemvTokens, static_cast<int64_t>(widest)));
    // The gate/up GEMV writes SwiGLU's int8 x itself (gpu::gemv_x8_swiglu),
    // into its own buffer: x8_ is still being read by that launch.
    // Off by default: measured slower on the H100 (Q4_0 tg128 479 t/s
    // against 525 with the separate swiglu_x8 launch, same run; NOTES.md).
    // RUNLM_GEMV_SWIGLU_FUSED=1 turns it on, for comparison.
    const char* swiglu_fused = std::getenv("RUNLM_GEMV_SWIGLU_FUSED");
    swiglu_in_gemv_ = swiglu_fused && std::strcmp(swiglu_fused, "1") == 0 && hidden_ % 32 == 0;
    if (swiglu_in_gemv_) {
      x8_ffn_.allocate(gpu::x8_bytes(gpu::kGemvSwigluMaxTokens, static_cast<int64_t>(hidden_)));
      swiglu_tickets_.allocate(gpu::gemv_x8_swiglu_tickets(hidden_));
      check(cudaMemset(swiglu_tickets_.get(), 0, gpu::gemv_x8_swiglu_tickets(hidden_) * sizeof(unsigned)),
            "cudaMemset (swiglu tickets)");  // each launch leaves them zero again
    }
    // Layers whose GEMM reads the weights once (F16 through cuBLAS, Q4_0 and
    // Q8_0 through the fused kernel, gemm_q_mma.cu) beat the GEMV from a few
    // tokens on: a 16-sequence F16 step took 25.6 ms by GEMV, slower per
    // token than 64 by GEMM, and Q4_0 at 16 sequences decoded 1,406 tokens/s
    // by GEMV against 3,019 by the fused GEMM (H100, bench -npl 16). The
    // other types pay a dequantization pass in the GEMM path and keep the
    // GEMV up to 16. RUNLM_GEMV_MAX_TOKENS (1-16) overrides, for measuring.
    const GpuLayer& l0 = layers_.front();
    bool gemm_reads_once = true;
    for (const gpu::GpuMatrix* w : {&l0.wq, &l0.wk, &l0.wv, &l0.wo, &l0.w_gate, &l0.w_up, &l0.w_down})
      gemm_reads_once = gemm_reads_once && (w->type == DType::F16 || (gpu::gemm_fused_supports(*w) &&
                                                                      gpu::gemm_fused_fits_device(*w) &&
                                                                      gpu::gemm_fused_max_tokens() >= kMaxGemvTokens));
    gemv_max_tokens_ = gemm_reads_once ? kMaxGemvTokensGemmOnce : kMaxGemvTokens;
    // RUNLM_PREFILL_KV=gather: prefill attention reads f16 K/V gathered out of
    // the pages (the path of the other KV types) instead of the pages
    // themselves, for measuring one against the other.
    if (const char* e = std::getenv("RUNLM_PREFILL_KV")) {
      RUNLM_CHECK(std::strcmp(e, "pages") == 0 || std::strcmp(e, "gather") == 0,
                  "RUNLM_PREFILL_KV must be pages or gather, got '%s'", e);
      gather_prefill_kv_ = std::strcmp(e, "gather") == 0;
    }
    if (const char* e = std::getenv("RUNLM_GEMV_MAX_TOKENS")) {
      const int v = std::atoi(e);
      RUNLM_CHECK(v >= 1 && v <= kMaxGemvTokens, "RUNLM_GEMV_MAX_TOKENS must be 1 to %d, got '%s'", kMaxGemvTokens, e);
      gemv_max_tokens_ = v;
    }
    size_t scratch = 0;
    for (const auto& l : layers_)
      for (const gpu::GpuMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        scratch = std::max(scratch, gpu::gemm_scratch_bytes(*w));
    scratch = std::max(scratch, gpu::gemm_scratch_bytes(output_));
    gemm_scratch_.allocate(scratch);
    // Pinned staging for tokens, positions and cu_seqlens (graph-capturable copies).
    check(cudaMallocHost(&host_io_, (2 * m + 4) * sizeof(int)), "cudaMallocHost");
  }

  // Contiguous: n_ctx rows. Paged: the pages asked for (kv_pages), else
  // enough for kv_tokens (or n_ctx), but at most what fits in 90% of the GPU
  // memory left after the weights and buffers, as vLLM sizes its pool.
  void allocate_kv_cache(const EngineOptions& opt) {
    const ModelConfig& c = cfg_;
    n_slots_ = n_ctx_;
    if (opt.kv == KvLayout::Paged) block_size_ = opt.block_size;
    // Per-token bytes of each type (quants + scales, src/paged_kv.h).
    layout_k_ = kv_pool_layout(type_k_, block_size_, c.n_kv_heads, c.head_dim);
    layout_v_ = kv_pool_layout(type_v_, block_size_, c.n_kv_heads, c.head_dim);
    const size_t row_bytes = static_cast<size_t>(c.n_layers) *
                             static_cast<size_t>(layout_k_.q_row + layout_k_.s_row + layout_v_.q_row + layout_v_.s_row);
    if (opt.kv == KvLayout::Paged) {
      int64_t pages = opt.kv_pages;
      if (pages <= 0) {
        const int64_t tokens = opt.kv_tokens > 0 ? opt.kv_tokens : n_ctx_;
        pages = (tokens + block_size_ - 1) / block_size_;
        size_t free_b = 0, total_b = 0;
        check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        const double budget = opt.kv_bytes > 0 ? static_cast<double>(opt.kv_bytes) : 0.9 * static_cast<double>(free_b);
        pages = std::min<int64_t>(pages, static_cast<int64_t>(budget / (static_cast<double>(row_bytes) * block_size_)));
        RUNLM_CHECK(pages > 0, "KV cache: no GPU memory left for a single page (%zu bytes free)", free_b);
      }
      RUNLM_CHECK(pages < (int64_t{1} << 31), "KV cache: %lld pages is too many", static_cast<long long>(pages));
      blocks_ = std::make_unique<BlockManager>(static_cast<int>(pages), block_size_);
      n_slots_ = pages * block_size_;
    }
    // n_slots_ is a whole number of pages (paged) or n_ctx rows of a plain type (contiguous: f16 only).
    layer_bytes_k_ = static_cast<size_t>(n_slots_) * static_cast<size_t>(layout_k_.q_row + layout_k_.s_row);
    layer_bytes_v_ = static_cast<size_t>(n_slots_) * static_cast<size_t>(layout_v_.q_row + layout_v_.s_row);
    const size_t need = static_cast<size_t>(c.n_layers) * (layer_bytes_k_ + layer_bytes_v_);
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    RUNLM_CHECK(need <= free_b,
                "out of GPU memory for the KV cache: needs %zu bytes (%d layers x %lld slots, K %s and V %s), %zu "
                "bytes free; lower -c",
                need, c.n_layers, static_cast<long long>(n_slots_), kv_type_name(type_k_), kv_type_name(type_v_),
                free_b);
    k_cache_.allocate(static_cast<size_t>(c.n_layers) * layer_bytes_k_);
    v_cache_.allocate(static_cast<size_t>(c.n_layers) * layer_bytes_v_);
  }

  // Copies the chunk's tokens and positions to the device.
  void stage_inputs(const int* tokens, int m, int pos) {
    int* h_tok = host_io_;
    int* h_pos = host_io_ + n_batch_;
    for (int i = 0; i < m; ++i) {
      h_tok[i] = tokens[i];
      h_pos[i] = pos + i;
    }
    // The stream may still read the staging buffer from the previous step.
    check(cudaStreamSynchronize(stream_), "sync");
    check(cudaMemcpyAsync(tokens_.get(), h_tok, m * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy tokens");
    check(cudaMemcpyAsync(positions_.get(), h_pos, m * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy pos");
  }

  void run_chunk(const int* tokens, int m, int pos, float* out, bool all_logits) {
    stage_inputs(tokens, m, pos);
    const bool gemv_path = m <= gemv_max_tokens_;
    if (m == 1 && out && !all_logits) {
      // The decode step: one graph for every position.
      if (!graph_exec_) capture_decode_graph();
      check(cudaGraphLaunch(graph_exec_, stream_), "cudaGraphLaunch");
    } else if (gemv_path) {
      layers_gemv(m, pos);
      logits_gemv(m, all_logits);
    } else {
      layers_gemm(m, pos);
      logits_gemm(m, all_logits);
    }
    if (!out) {
      check(cudaStreamSynchronize(stream_), "sync");
      return;
    }
    const int rows = all_logits ? m : 1;
    check(cudaMemcpyAsync(out, logits_.get(), static_cast<size_t>(rows) * cfg_.n_vocab * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          "copy logits");
    check(cudaStreamSynchronize(stream_), "sync");
  }

  // Copies the plan's integer arrays to the device in one transfer.
  struct PlanOffsets {
    size_t tokens, positions, slots, dec_cu_q, dec_seq_lens, dec_tables, pre_cu_q, pre_cu_k, pre_tables, logit_rows;
    int dec_max_blocks = 1, pre_max_blocks = 1;
  };
  PlanOffsets plan_at_;

  void upload_plan(const BatchPlan& p) {
    std::vector<int32_t> h;
    auto put = [&](const std::vector<int>& v) {
      const size_t at = h.size();
      h.insert(h.end(), v.begin(), v.end());
      return at;
    };
    auto put_tables = [&](const std::vector<std::vector<int32_t>>& tables, int* max_blocks) {
      *max_blocks = 1;
      for (const auto& t : tables) *max_blocks = std::max(*max_blocks, static_cast<int>(t.size()));
      const size_t at = h.size();
      for (const auto& t : tables) {
        h.insert(h.end(), t.begin(), t.end());
        h.insert(h.end(), static_cast<size_t>(*max_blocks) - t.size(), 0);
      }
      return at;
    };
    PlanOffsets& o = plan_at_;
    o.tokens = put(p.tokens);
    o.positions = put(p.positions);
    o.slots = put(p.slots);
    o.dec_cu_q = put(p.dec_cu_q);
    o.dec_seq_lens = put(p.dec_seq_lens);
    o.dec_tables = put_tables(p.dec_tables, &o.dec_max_blocks);
    o.pre_cu_q = put(p.pre_cu_q);
    o.pre_cu_k = put(p.pre_cu_k);
    o.pre_tables = put_tables(p.pre_tables, &o.pre_max_blocks);
    o.logit_rows = put(p.logit_rows);
    // The previous step may still read the pinned staging buffer.
    check(cudaStreamSynchronize(stream_), "sync");
    if (plan_host_n_ < h.size()) {
      if (plan_host_) cudaFreeHost(plan_host_);
      plan_host_n_ = h.size() * 2;
      check(cudaMallocHost(&plan_host_, plan_host_n_ * sizeof(int32_t)), "cudaMallocHost");
    }
    std::copy(h.begin(), h.end(), plan_host_);
    plan_dev_.reserve(h.size());
    check(cudaMemcpyAsync(plan_dev_.get(), plan_host_, h.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
          "copy plan");
  }

  // The transformer over a planned batch (see forward_batch).
  void run_batch(const BatchPlan& plan) {
    const ModelConfig& c = cfg_;
    const int m = static_cast<int>(plan.tokens.size());
    const bool gemv_path = m <= gemv_max_tokens_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    int32_t* d = plan_dev_.get();
    const PlanOffsets& o = plan_at_;
    const int pre_tokens = m - plan.dec_tokens;
    const int total_k = plan.pre_cu_k.back();
    if (plan.n_dec() > 0) {
      const size_t ws = paged_decode_workspace_bytes(plan.n_dec(), plan.dec_tokens, c.n_heads, c.head_dim, plan.max_dec_len);
      decode_ws_.reserve(std::max<size_t>(ws, 1));
    }
    // The pools feed the prefill backend in place through the block tables
    // (AttnParams' paged mode, typed pools dequantized in the kernel) or, for
    // a backend that cannot read them (fa3 with typed pools), through
    // gather_kv's contiguous f16 copy: choose_prefill_kv.
    const bool paged_prefill = paged_prefill_;
    if (plan.n_pre() > 0 && !paged_prefill) {
      k_gather_.reserve(static_cast<size_t>(total_k) * c.kv_dim());
      v_gather_.reserve(static_cast<size_t>(total_k) * c.kv_dim());
    }
    // x += add (the previous residual branch, folded into the norm), then
    // short steps: f32 (and int8 for gemv_x8) into project_gemv; long: f16.
    auto norm = [&](const DeviceBuffer<float>& w, const float* add) {
      if (gemv_path) norm_for_gemv(w, add, m, true);
      else gpu::rmsnorm_fused(x_.get(), add, w.get(), nullptr, xh_.get(), nullptr, m, c.dim, c.rms_eps, stream_);
    };

    gpu::embed_rows(tok_embd_, d + o.tokens, m, x_.get(), stream_);
    const float* pending = nullptr;  // the previous layer's down projection, not yet added to x
    for (int l = 0; l < c.n_layers; ++l) {
      GpuLayer& g = layers_[l];
      norm(g.attn_norm, pending);
      if (gemv_path) project_gemv({{&g.wq, q_.get()}, {&g.wk, k_.get()}, {&g.wv, v_.get()}}, xb_.get(), m, true);
      else project_qkv_gemm(g, m);
      gpu::rope_and_store_kv_slots(q_.get(), k_.get(), v_.get(), d + o.positions, d + o.slots, m, c.n_heads,
                                   c.n_kv_heads, c.head_dim, c.rope_theta, c.rope_freq_scale, k_pool(l), v_pool(l),
                                   type_k_, type_v_, block_size_, gemv_path ? nullptr : qh_.get(), stream_,
                                   k_smoothed_
                                       ? k_smoothing_.get() + static_cast<size_t>(l) * KSmoothing::kRows * c.kv_dim()
                                       : nullptr);
      if (qk_stats_) add_qk_stats(l, plan.positions);
      if (plan.n_dec() > 0) {
        PagedDecodeParams p;
        p.q = q_.get();
        p.out = att_.get();
        p.cu_q = d + o.dec_cu_q;
        p.n_seqs = plan.n_dec();
        p.total_q = plan.dec_tokens;
        p.max_q_per_seq = plan.max_dec_q;
        p.max_seq_len = plan.max_dec_len;
        p.n_heads = c.n_heads;
        p.window = window(l);
        p.scale = scale;
        p.kv.k_pool = k_pool(l);
        p.kv.v_pool = v_pool(l);
        p.kv.k_type = type_k_;
        p.kv.v_type = type_v_;
        p.kv.block_tables = d + o.dec_tables;
        p.kv.max_blocks_per_seq = o.dec_max_blocks;
        p.kv.seq_lens = d + o.dec_seq_lens;
        p.kv.block_size = block_size_;
        p.kv.n_kv_heads = c.n_kv_heads;
        p.kv.head_dim = c.head_dim;
        paged_decode_attention(p, decode_ws_.get(), decode_ws_.size(), stream_);
      }
      if (plan.n_pre() > 0) {
        AttnParams p;
        if (paged_prefill) {
          p.k = k_pool(l);
          p.v = v_pool(l);
          p.block_tables = d + o.pre_tables;
          p.max_blocks_per_seq = o.pre_max_blocks;
          p.block_size = block_size_;
          p.num_pages = static_cast<int>(n_slots_ / block_size_);
          p.k_type = type_k_;
          p.v_type = type_v_;
        } else {
          gpu::gather_kv(k_pool(l), v_pool(l), type_k_, type_v_, d + o.pre_tables, o.pre_max_blocks, d + o.pre_cu_k,
                         plan.n_pre(), total_k, block_size_, c.kv_dim(), k_gather_.get(), v_gather_.get(), stream_);
          p.k = k_gather_.get();
          p.v = v_gather_.get();
        }
        p.q = qh_.get() + static_cast<size_t>(plan.dec_tokens) * c.q_dim();
        p.out = atth_.get() + static_cast<size_t>(plan.dec_tokens) * c.q_dim();
        p.cu_seqlens_q = d + o.pre_cu_q;
        p.cu_seqlens_k = d + o.pre_cu_k;
        p.batch = plan.n_pre();
        p.total_q = pre_tokens;
        p.total_k = total_k;
        p.max_seqlen_q = plan.max_pre_q;
        p.max_seqlen_k = plan.max_pre_k;
        p.n_heads = c.n_heads;
        p.n_kv_heads = c.n_kv_heads;
        p.head_dim = c.head_dim;
        p.dtype = DType::F16;
        p.causal = true;
        p.window_left = window_left(l);
        p.scale = scale;
        p.stream = stream_;
        attention_dispatch(attn_, p);
      }
      if (gemv_path) {
        project_gemv({{&g.wo, xb_.get()}}, att_.get(), m);  // only short items: att_ holds every row
      } else {
        if (plan.dec_tokens > 0)
          gpu::to_f16(att_.get(), atth_.get(), static_cast<int64_t>(plan.dec_tokens) * c.q_dim(), stream_);
        gpu::gemm(g.wo, atth_.get(), xb_.get(), m, gemm_scratch_.get(), stream_);
      }
      norm(g.ffn_norm, xb_.get());
      if (gemv_path) project_gemv({{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, xb_.get(), m, true);
      else project_gemm(g.gate_up, {{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, m);
      gpu::swiglu(gate_.get(), up_.get(), gemv_path ? nullptr : xh_.get(), static_cast<int64_t>(m) * hidden_,
                  stream_);
      if (gemv_path) project_gemv({{&g.w_down, xb_.get()}}, gate_.get(), m);
      else gpu::gemm(g.w_down, xh_.get(), xb_.get(), m, gemm_scratch_.get(), stream_);
      pending = xb_.get();
    }
    if (pending) gpu::add_inplace(x_.get(), pending, static_cast<int64_t>(m) * c.dim, stream_);

    const int rows = static_cast<int>(plan.logit_rows.size());
    if (rows == 0) return;
    gpu::gather_rows(x_.get(), d + o.logit_rows, rows, c.dim, rows_.get(), stream_);
    const bool gemv_logits = rows <= gemv_max_tokens_;
    gpu::rmsnorm(rows_.get(), output_norm_.get(), gemv_logits ? xb_.get() : nullptr, gemv_logits ? nullptr : xh_.get(),
                 rows, c.dim, c.rms_eps, stream_);
    if (gemv_logits) project_gemv({{&output_, logits_.get()}}, xb_.get(), rows);
    else gpu::gemm(output_, xh_.get(), logits_.get(), rows, gemm_scratch_.get(), stream_);
  }

  // Calibration only (set_qk_stats): layer l's Q (RoPE'd in place by
  // rope_and_store_kv_slots) and K (not: the store rotates its own copy) to
  // the host, K rotated there as kernels/cpu/ops.h does.
  void add_qk_stats(int l, const std::vector<int>& positions) {
    const ModelConfig& c = cfg_;
    const int m = static_cast<int>(positions.size());
    std::vector<float> q(static_cast<size_t>(m) * c.q_dim()), k(static_cast<size_t>(m) * c.kv_dim());
    check(cudaMemcpyAsync(q.data(), q_.get(), q.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy q");
    check(cudaMemcpyAsync(k.data(), k_.get(), k.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy k");
    check(cudaStreamSynchronize(stream_), "sync");
    for (int t = 0; t < m; ++t)
      rope(&k[static_cast<size_t>(t) * c.kv_dim()], c.n_kv_heads, c.head_dim, positions[static_cast<size_t>(t)],
           c.rope_theta, c.rope_freq_scale);
    qk_stats_->add(l, q.data(), k.data(), m);
  }

  void capture_decode_graph() {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    layers_gemv(1, -1);
    logits_gemv(1, false);
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    check(cudaGraphInstantiate(&graph_exec_, graph, 0), "graph instantiate");
    cudaGraphDestroy(graph);
  }

  // Layer l's pools (any KV type, layout of src/paged_kv.h) and, for the
  // contiguous cache (f16 only), the same as f16 rows.
  void* k_pool(int l) const { return k_cache_.get() + static_cast<size_t>(l) * layer_bytes_k_; }
  void* v_pool(int l) const { return v_cache_.get() + static_cast<size_t>(l) * layer_bytes_v_; }
  uint16_t* k_cache(int l) const { return static_cast<uint16_t*>(k_pool(l)); }
  uint16_t* v_cache(int l) const { return static_cast<uint16_t*>(v_pool(l)); }

  // Transformer layers for m <= 16 tokens; `pos` is unused on the device
  // (positions come from positions_), kept for readability of callers.
  void layers_gemv(int m, int /*pos*/) {
    const ModelConfig& c = cfg_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    gpu::embed_rows(tok_embd_, tokens_.get(), m, x_.get(), stream_);
    // Each residual add is folded into the RMSNorm after it (rmsnorm_fused),
    // and the norms and SwiGLU write the int8 x of the GEMVs that read it.
    const float* pending = nullptr;  // the previous layer's down projection, not yet added to x
    for (int l = 0; l < c.n_layers; ++l) {
      GpuLayer& g = layers_[l];
      norm_for_gemv(g.attn_norm, pending, m, uses_x8(g.wq) || uses_x8(g.wk) || uses_x8(g.wv));
      project_gemv({{&g.wq, q_.get()}, {&g.wk, k_.get()}, {&g.wv, v_.get()}}, xb_.get(), m, true);
      // The int8 x of a Q4_0/Q8_0 wo comes out of the attention kernel itself.
      const bool att_x8 = uses_x8(g.wo) && c.head_dim % 32 == 0;
      void* att_out_x8 = att_x8 ? x8_.get() : nullptr;
      if (rope_in_attention_) {  // RoPE and the K/V store inside the attention launch
        gpu::decode_attention_rope(q_.get(), k_.get(), v_.get(), positions_.get(), m, c.n_heads, c.n_kv_heads,
                                   c.head_dim, c.rope_theta, c.rope_freq_scale, k_cache(l), v_cache(l), window(l),
                                   scale, n_ctx_, att_.get(), stream_, att_out_x8);
      } else {
        gpu::rope_and_store_kv(q_.get(), k_.get(), v_.get(), positions_.get(), m, c.n_heads, c.n_kv_heads,
                               c.head_dim, c.rope_theta, c.rope_freq_scale, k_cache(l), v_cache(l), nullptr, stream_);
        gpu::decode_attention(q_.get(), k_cache(l), v_cache(l), m, positions_.get(), c.n_heads, c.n_kv_heads,
                              c.head_dim, window(l), scale, n_ctx_, att_.get(), stream_, att_out_x8);
      }
      project_gemv({{&g.wo, xb_.get()}}, att_.get(), m, att_x8);
      norm_for_gemv(g.ffn_norm, xb_.get(), m, uses_x8(g.w_gate) || uses_x8(g.w_up));
      if (fuse_swiglu(g, m)) {  // SwiGLU's int8 x comes out of the gate/up launch
        const gpu::GemvOut gate_up[2] = {{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}};
        gpu::gemv_x8_swiglu(gate_up, x8_.get(), m, x8_ffn_.get(), swiglu_tickets_.get(), stream_);
        const gpu::GemvOut down{&g.w_down, xb_.get()};
        gpu::gemv_x8(&down, 1, x8_ffn_.get(), m, stream_);
      } else {
        project_gemv({{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, xb_.get(), m, true);
        if (uses_x8(g.w_down)) {
          gpu::swiglu_x8(gate_.get(), up_.get(), x8_.get(), m, hidden_, stream_);
          project_gemv({{&g.w_down, xb_.get()}}, gate_.get(), m, true);
        } else {
          gpu::swiglu(gate_.get(), up_.get(), nullptr, static_cast<int64_t>(m) * hidden_, stream_);
          project_gemv({{&g.w_down, xb_.get()}}, gate_.get(), m);
        }
      }
      pending = xb_.get();
    }
    if (pending) gpu::add_inplace(x_.get(), pending, static_cast<int64_t>(m) * cfg_.dim, stream_);
  }

  bool uses_x8(const gpu::GpuMatrix& w) const { return gemv_x8_ && gpu::gemv_x8_supports(w.type); }

  // Gate/up, SwiGLU and down as gemv_x8_swiglu + gemv_x8 (no swiglu_x8
  // launch): all three int8-x matrices, gate and up in one launch.
  bool fuse_swiglu(const GpuLayer& g, int m) const {
    return swiglu_in_gemv_ && m <= gpu::kGemvSwigluMaxTokens && uses_x8(g.w_gate) && uses_x8(g.w_down) &&
           g.w_up.type == g.w_gate.type && g.w_up.cols == g.w_gate.cols && g.w_gate.rows == hidden_ &&
           g.w_up.rows == hidden_ && cfg_.dim % 32 == 0;
  }

  // xb = rmsnorm(x += add) in f32, and into x8_ too when a reader wants int8.
  void norm_for_gemv(const DeviceBuffer<float>& w, const float* add, int m, bool want_x8) {
    want_x8 = want_x8 && gemv_x8_ && cfg_.dim % 32 == 0;  // int8 x comes in blocks of 32
    gpu::rmsnorm_fused(x_.get(), add, w.get(), xb_.get(), nullptr, want_x8 ? x8_.get() : nullptr, m, cfg_.dim,
                       cfg_.rms_eps, stream_);
  }

  void logits_gemv(int m, bool all_logits) {
    const ModelConfig& c = cfg_;
    const int first = all_logits ? 0 : m - 1;
    const int rows = m - first;
    gpu::rmsnorm(x_.get() + static_cast<size_t>(first) * c.dim, output_norm_.get(), xb_.get(), nullptr, rows, c.dim,
                 c.rms_eps, stream_);
    project_gemv({{&output_, logits_.get()}}, xb_.get(), rows);
  }

  // y_i = W_i x for up to gemv_max_tokens_ rows of x (f32, [m, cols]). Q4_0
  // and Q8_0 matrices read x quantized to int8 once (gpu::gemv_x8, ~4x fewer
  // instructions per weight; RUNLM_GEMV_F32X=1 keeps f32 x for comparison);
  // the others the f32 kernels. Consecutive matrices of one type share one
  // launch (q/k/v, gate/up). No allocation: safe inside graph capture.
  // x8_ready: x8_ already holds x quantized (written by the op before).
  void project_gemv(std::initializer_list<gpu::GemvOut> outs, const float* x, int m, bool x8_ready = false) {
    const gpu::GemvOut* p = outs.begin();
    const int n = static_cast<int>(outs.size());
    bool x_quantized = x8_ready;
    for (int i = 0; i < n;) {
      int j = i + 1;
      while (j < n && p[j].w->type == p[i].w->type && p[j].w->cols == p[i].w->cols) ++j;
      if (uses_x8(*p[i].w)) {
        if (!x_quantized) gpu::quantize_x8(x, m, p[i].w->cols, x8_.get(), stream_);  // every out reads this x
        x_quantized = true;
        gpu::gemv_x8(p + i, j - i, x8_.get(), m, stream_);
      } else {
        gpu::gemv_multi(p + i, j - i, x, m, stream_);
      }
      i = j;
    }
  }

  // Same-shape F16 projections of one x (q/k/v, else k/v; gate/up) become
  // batched GEMMs: at 256 decode tokens a 4096 x 4096 product is about one
  // wave of cuBLAS tiles (29 us under ncu, 1.2 TB/s of weights), several in
  // one call fill the GPU better. The pointer table is built once.
  void build_gemm_groups() {
    std::vector<void*> h;
    using Out = std::pair<const gpu::GpuMatrix*, float*>;
    auto group = [&](std::initializer_list<Out> outs) {
      GemmGroup g;
      std::vector<const gpu::GpuMatrix*> ws;
      for (const Out& o : outs) ws.push_back(o.first);
      const int n = static_cast<int>(ws.size());
      if (!gpu::gemm_batched_ok(ws.data(), n)) return g;
      g.at = h.size();
      g.n = n;
      g.rows = ws[0]->rows;
      g.cols = ws[0]->cols;
      for (const Out& o : outs) h.push_back(const_cast<void*>(gpu::gemm_f16_data(*o.first)));
      for (int i = 0; i < n; ++i) h.push_back(xh_.get());
      for (const Out& o : outs) h.push_back(o.second);
      return g;
    };
    for (GpuLayer& l : layers_) {
      l.qkv = group({{&l.wq, q_.get()}, {&l.wk, k_.get()}, {&l.wv, v_.get()}});
      if (l.qkv.n == 0) l.kv = group({{&l.wk, k_.get()}, {&l.wv, v_.get()}});
      l.gate_up = group({{&l.w_gate, gate_.get()}, {&l.w_up, up_.get()}});
    }
    if (h.empty()) return;
    gemm_ptrs_.allocate(h.size());
    check(cudaMemcpy(gemm_ptrs_.get(), h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice), "copy gemm groups");
  }

  // y = W x for each out, x = xh_ (f16, m rows): one batched call for an
  // F16 group; else gemm_multi, which makes Q4_0 / Q8_0 matrices of one
  // type and width one fused launch (their row tiles side by side: q/k/v at
  // 256 tokens give 96 tiles of 128 rows where one gives 32) and runs the
  // rest one gemm each.
  void project_gemm(const GemmGroup& g, std::initializer_list<gpu::GemmOut> outs, int m) {
    if (g.n > 0) {
      void** p = gemm_ptrs_.get() + g.at;
      gpu::gemm_batched(p, reinterpret_cast<const uint16_t* const*>(p + g.n), reinterpret_cast<float* const*>(p + 2 * g.n),
                        g.n, g.rows, g.cols, m, stream_);
      return;
    }
    gpu::gemm_multi(outs.begin(), static_cast<int>(outs.size()), xh_.get(), m, gemm_scratch_.get(), stream_);
  }

  void project_qkv_gemm(const GpuLayer& g, int m) {
    if (g.qkv.n > 0) return project_gemm(g.qkv, {}, m);
    if (g.kv.n > 0) {  // F16 with GQA: q alone, k/v batched
      gpu::gemm(g.wq, xh_.get(), q_.get(), m, gemm_scratch_.get(), stream_);
      return project_gemm(g.kv, {}, m);
    }
    project_gemm(g.qkv, {{&g.wq, q_.get()}, {&g.wk, k_.get()}, {&g.wv, v_.get()}}, m);
  }

  // Transformer layers for a long chunk: f16 activations into tensor-core
  // GEMMs, prefill attention over the cached keys [0, pos + m).
  void layers_gemm(int m, int pos) {
    const ModelConfig& c = cfg_;
    void* scratch = gemm_scratch_.get();
    int* h_cu = host_io_ + 2 * n_batch_;
    h_cu[0] = 0;
    h_cu[1] = m;
    h_cu[2] = 0;
    h_cu[3] = pos + m;
    check(cudaMemcpyAsync(cu_seqlens_.get(), h_cu, 4 * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy cu");

    gpu::embed_rows(tok_embd_, tokens_.get(), m, x_.get(), stream_);
    for (int l = 0; l < c.n_layers; ++l) {
      GpuLayer& g = layers_[l];
      gpu::rmsnorm(x_.get(), g.attn_norm.get(), nullptr, xh_.get(), m, c.dim, c.rms_eps, stream_);
      project_qkv_gemm(g, m);
      gpu::rope_and_store_kv(q_.get(), k_.get(), v_.get(), positions_.get(), m, c.n_heads, c.n_kv_heads, c.head_dim,
                             c.rope_theta, c.rope_freq_scale, k_cache(l), v_cache(l), qh_.get(), stream_);
      AttnParams p;
      p.q = qh_.get();
      p.k = k_cache(l);
      p.v = v_cache(l);
      p.out = atth_.get();
      p.cu_seqlens_q = cu_seqlens_.get();
      p.cu_seqlens_k = cu_seqlens_.get() + 2;
      p.batch = 1;
      p.total_q = m;
      p.total_k = pos + m;
      p.max_seqlen_q = m;
      p.max_seqlen_k = pos + m;
      p.n_heads = c.n_heads;
      p.n_kv_heads = c.n_kv_heads;
      p.head_dim = c.head_dim;
      p.dtype = DType::F16;
      p.causal = true;
      p.window_left = window_left(l);
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      p.stream = stream_;
      attention_dispatch(attn_, p);
      gpu::gemm(g.wo, atth_.get(), xb_.get(), m, scratch, stream_);
      gpu::add_inplace(x_.get(), xb_.get(), static_cast<int64_t>(m) * c.dim, stream_);
      gpu::rmsnorm(x_.get(), g.ffn_norm.get(), nullptr, xh_.get(), m, c.dim, c.rms_eps, stream_);
      project_gemm(g.gate_up, {{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, m);
      gpu::swiglu(gate_.get(), up_.get(), xh_.get(), static_cast<int64_t>(m) * hidden_, stream_);
      gpu::gemm(g.w_down, xh_.get(), xb_.get(), m, scratch, stream_);
      gpu::add_inplace(x_.get(), xb_.get(), static_cast<int64_t>(m) * c.dim, stream_);
    }
  }

  void logits_gemm(int m, bool all_logits) {
    const ModelConfig& c = cfg_;
    if (!all_logits) {
      logits_gemv(m, false);  // one row: the GEMV reads the output matrix once either way
      return;
    }
    gpu::rmsnorm(x_.get(), output_norm_.get(), nullptr, xh_.get(), m, c.dim, c.rms_eps, stream_);
    gpu::gemm(output_, xh_.get(), logits_.get(), m, gemm_scratch_.get(), stream_);
  }

  const Model& model_;
  const ModelConfig& cfg_;
  AttnBackend attn_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  int n_ctx_ = 0, n_batch_ = 512;
  std::vector<int> windows_;  // per layer, 0 = full attention (layer_windows)
  int window(int layer) const { return windows_[size_t(layer)]; }
  // AttnParams::window_left of a layer: keys [q - window_left, q], -1 = all.
  int window_left(int layer) const { return window(layer) > 0 ? window(layer) - 1 : -1; }
  int64_t hidden_ = 0;  // feed-forward width on the GPU (padded_hidden)

  gpu::GpuMatrix tok_embd_, output_;
  DeviceBuffer<float> output_norm_;
  std::vector<GpuLayer> layers_;

  DeviceBuffer<float> x_;       // [n_batch, dim] residual stream
  DeviceBuffer<float> xb_;      // [n_batch, max(dim, q_dim, hidden)] f32 scratch
  DeviceBuffer<uint16_t> xh_;   // [n_batch, max(dim, q_dim, hidden)] f16 GEMM input
  DeviceBuffer<float> q_;       // [n_batch, n_heads * head_dim]
  DeviceBuffer<uint16_t> qh_;   // [n_batch, n_heads * head_dim] f16 for prefill attention
  DeviceBuffer<float> k_, v_;   // [n_batch, n_kv_heads * head_dim]
  DeviceBuffer<float> att_;     // [n_batch, n_heads * head_dim]
  DeviceBuffer<uint16_t> atth_; // [n_batch, n_heads * head_dim] f16 prefill attention output
  DeviceBuffer<float> gate_, up_;  // [n_batch, hidden]
  DeviceBuffer<float> logits_;  // [n_batch, n_vocab]
  DeviceBuffer<int> argmax_;    // [n_batch] greedy tokens (forward_batch_greedy)
  // [n_layers][n_slots / block_size pages of kv_pool_layout] (contiguous: [n_layers, n_ctx, kv_dim] f16)
  DeviceBuffer<uint8_t> k_cache_, v_cache_;
  KvType type_k_ = KvType::F16, type_v_ = KvType::F16;
  KvPoolLayout layout_k_, layout_v_;
  size_t layer_bytes_k_ = 0, layer_bytes_v_ = 0;
  DeviceBuffer<int> tokens_, positions_;      // [n_batch]
  DeviceBuffer<int> cu_seqlens_;              // [0, m, 0, pos + m]
  DeviceBuffer<uint8_t> gemm_scratch_;
  DeviceBuffer<void*> gemm_ptrs_;  // the GemmGroups' pointer arrays (build_gemm_groups)
  DeviceBuffer<uint8_t> x8_;  // x quantized for gemv_x8 ([16, widest] int8 + scales)
  DeviceBuffer<uint8_t> x8_ffn_;  // SwiGLU's int8 x from gemv_x8_swiglu ([4, hidden] int8 + scales)
  DeviceBuffer<unsigned> swiglu_tickets_;  // gemv_x8_swiglu's counters, [hidden / 32], zero between launches
  bool swiglu_in_gemv_ = false;  // RUNLM_GEMV_SWIGLU_FUSED=1
  bool gemv_x8_ = true;
  bool rope_in_attention_ = true;  // decode_attention_rope in layers_gemv (RUNLM_DECODE_ROPE_FUSED)
  int gemv_max_tokens_ = kMaxGemvTokens;  // longer chunks take the GEMM path
  bool gather_prefill_kv_ = false;        // RUNLM_PREFILL_KV=gather
  bool paged_prefill_ = true;             // prefill attention reads the pages in place (choose_prefill_kv)
  int* host_io_ = nullptr;  // pinned: tokens [n_batch], positions [n_batch], cu_seqlens [4]
  // Paged cache and batched steps.
  int block_size_ = 16;
  int64_t n_slots_ = 0;                   // KV rows per layer: n_ctx, or pages * block_size
  std::unique_ptr<BlockManager> blocks_;  // paged only
  DeviceBuffer<int32_t> plan_dev_;        // a step's tokens, positions, slots, tables (see upload_plan)
  int32_t* plan_host_ = nullptr;          // pinned staging for plan_dev_
  size_t plan_host_n_ = 0;
  float* logits_host_ = nullptr;          // pinned, logits_buffer()
  size_t logits_host_n_ = 0;
  DeviceBuffer<float> rows_;              // [n_batch, dim] rows whose logits are wanted
  DeviceBuffer<uint8_t> decode_ws_;       // paged decode split-K partial states
  DeviceBuffer<uint16_t> k_gather_, v_gather_;  // [total_k, kv_dim] K/V of prefill items, contiguous
  QkStats* qk_stats_ = nullptr;          // set_qk_stats
  DeviceBuffer<float> k_smoothing_;      // [n_layers][KSmoothing::kRows][kv_dim] (KSmoothing::params)
  bool k_smoothed_ = false;
};

}  // namespace

bool cuda_device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

std::string cuda_model_unsupported_reason(const Model& model) {
  if (std::string layer = cuda_engine_unsupported_layer(model.config()); !layer.empty()) return layer;
  const ModelWeights& w = model.weights();
  std::vector<const WeightView*> all = {&w.tok_embd, &w.output};
  for (const auto& l : w.layers)
    for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo}) all.push_back(v);
  for (const WeightView* v : all) {
    const std::string why = gpu::upload_unsupported_reason(qmatrix(*v));
    if (!why.empty()) return v->name + ": " + why;
  }
  // The feed-forward matrices go up padded to padded_hidden().
  const int64_t h = padded_hidden(model.config());
  for (const auto& l : w.layers) {
    for (const WeightView* v : {&l.w_gate, &l.w_up}) {
      const std::string why = gpu::upload_unsupported_reason(QMatrix{v->type, v->data, v->row_bytes, v->ne0, h});
      if (!why.empty()) return v->name + ": " + why;
    }
    // Quantized widths are whole blocks of 32 or more, so only plain types get padded.
    const bool pad = l.w_down.ne0 != h && dtype_info(l.w_down.type).block_size == 1;
    const std::string why = gpu::upload_unsupported_reason(
        pad ? QMatrix{l.w_down.type, l.w_down.data, dtype_row_bytes(l.w_down.type, h), h, l.w_down.ne1}
            : qmatrix(l.w_down));
    if (!why.empty()) return l.w_down.name + ": " + why;
  }
  return "";
}

std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<CudaEngine>(model, options);
}

}  // namespace runlm

#endif  // RUNLM_CUDA
