// CUDA backend: the same forward pass as the CPU engine (src/cpu_engine.cpp),
// on the GPU, for every layer description of models/arch.h but what
// src/engine_support.h lists as missing (one layer loop, run_layers).
// Weights are uploaded once in their GGUF type (repacked for 16-byte loads,
// kernels/cuda/gpu_ops.h). Up to gemv_max_tokens_ tokens run
// through the quantized GEMV kernels with f32 activations (decode, short
// prompts); longer chunks through the tensor-core GEMM with f16 activations
// and the prefill attention backends (src/attention.h). The single-token
// decode step is captured once in a CUDA graph and replayed: every kernel
// reads the token and its position from device memory, so one graph serves
// every position.
// The parts live beside it: the weights and their upload (cuda_weights.h),
// the KV cache (cuda_kv_cache.h), the batch plan (cuda_batch_plan.h), the
// weight matmul dispatch (cuda_matmul.h), device buffers
// (cuda_device_buffer.h); the decode attention kernel comes from the
// selector of kernels/cuda/paged_attention.h.
#ifdef RUNLM_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <vector>

#include "attention.h"
#include "common.h"
#include "cuda/gpu_ops.h"
#include "cuda/moe_ops.h"
#include "cuda/paged_attention.h"
#include "cuda_batch_plan.h"
#include "cuda_device_buffer.h"
#include "cuda_kv_cache.h"
#include "cuda_matmul.h"
#include "cuda_weights.h"
#include "engine.h"
#include "kv_types.h"
#include "layer_rope.h"
#include "engine_support.h"
#include "model.h"
#include "ops.h"

namespace runlm {

namespace {

constexpr int kMaxGemvTokens = 16;    // the GEMV kernels take up to 16 rows of x
constexpr int kMaxGemvTokensGemmOnce = 4;  // where F16, Q4_0, Q8_0 weights switch to the GEMM (see allocate_buffers)

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
  const char* decode_kernel() const override { return decode_kernel_name(decode_choice_.kernel); }
  int n_ctx() const override { return n_ctx_; }
  int n_vocab() const override { return cfg_.n_vocab; }
  KvType type_k() const override { return type_k_; }
  KvType type_v() const override { return type_v_; }
  int max_batch_tokens() const override { return n_batch_; }
  int sliding_window() const override { return common_window(windows_); }
  // K smoothing is applied where K is written and Q rotated
  // (rope_and_store_kv_slots), which is the paged path's store.
  void set_qk_stats(QkStats* stats) override {
    RUNLM_CHECK(!stats || kv_.blocks, "K smoothing on the GPU needs the paged KV cache (--kv paged)");
    // Statistics are of the unsmoothed Q, as the CPU engine's.
    RUNLM_CHECK(!stats || !k_smoothed_, "set_qk_stats: remove the K smoothing before collecting statistics");
    qk_stats_ = stats;
  }
  void set_k_smoothing(const KSmoothing& smoothing) override {
    if (smoothing.empty()) {
      k_smoothed_ = false;
      return;
    }
    RUNLM_CHECK(kv_.blocks, "K smoothing on the GPU needs the paged KV cache (--kv paged)");
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
  BlockManager* blocks() override { return kv_.blocks.get(); }

  // A step over several sequences of the paged cache. Tokens are reordered
  // so that items of at most kMaxDecodeQ tokens (decode steps, short tails)
  // come first and run through the paged decode kernel; longer items
  // (prefill chunks) follow and run through the prefill attention backends on
  // their K/V gathered out of the pages.
  // One batched step (forward_batch): the logits of the rows that want them
  // into `logits`, or only their argmax into `greedy_tokens`.
  void run_items(const std::vector<BatchItem>& items, float* logits, int* greedy_tokens) {
    RUNLM_CHECK(kv_.blocks, "forward_batch needs the paged KV cache (--kv paged)");
    const ModelConfig& c = cfg_;
    BatchPlan plan;
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < items.size(); ++i) {
        const BatchItem& it = items[i];
        const bool short_item = it.n_tokens <= kMaxDecodeQ;
        if ((pass == 0) != short_item) continue;
        RUNLM_CHECK(it.n_tokens > 0, "forward_batch: empty item for sequence %d", it.seq_id);
        RUNLM_CHECK(kv_.blocks->seq_len(it.seq_id) >= it.pos + it.n_tokens,
                    "forward_batch: pages for positions [%d, %d) of sequence %d were not reserved", it.pos,
                    it.pos + it.n_tokens, it.seq_id);
        RUNLM_CHECK(it.pos + it.n_tokens <= n_ctx_, "sequence %d: %d positions exceed the context size %d", it.seq_id,
                    it.pos + it.n_tokens, n_ctx_);
        plan.add(it, kv_.blocks->block_table(it.seq_id), kv_.block_size, short_item, static_cast<int>(i));
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

  uint64_t device_memory_in_use() const override {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return total_b - free_b;
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
    if (kv_.blocks) {
      // Paged: forward() is sequence 0, run as batches of one item.
      reserve_sequence0(*kv_.blocks, pos, n);
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
    rope_ = layer_rope_specs(model_, n_ctx_, &rope_factors_);  // the kernels read each spec on the host at launch
    upload_gpu_weights(model_, w_);
    allocate_buffers();
    mm_.build_groups(w_.layers, xh_.get(), q_.get(), k_.get(), v_.get(), gate_.get(), up_.get());
    kv_.allocate(cfg_, type_k_, type_v_, n_ctx_, opt);
    if (kv_.blocks) choose_prefill_kv();
    choose_decode_kernel(opt.verbose);
  }



  // The decode attention kernel (the selector, kernels/cuda/paged_attention.h)
  // for this engine's cache; with --verbose said once on stderr, with the
  // prefill attention backend.
  void choose_decode_kernel(bool verbose) {
    const ModelConfig& c = cfg_;
    PagedDecodeParams probe;
    probe.n_heads = c.n_heads;
    probe.kv.k_type = type_k_;
    probe.kv.v_type = type_v_;
    probe.kv.head_dim = c.head_dim;
    probe.kv.n_kv_heads = c.n_kv_heads;
    probe.kv.block_size = kv_.blocks ? kv_.block_size : 16;
    probe.kv.k_pool = kv_.blocks ? k_pool(0) : nullptr;
    probe.kv.v_pool = kv_.blocks ? v_pool(0) : nullptr;
    decode_choice_ = select_engine_decode_kernel(kv_.blocks != nullptr, probe);
    if (!verbose) return;
    std::fprintf(stderr, "decode attention: %s (%s)\n", decode_kernel_name(decode_choice_.kernel),
                 decode_choice_.reason);
    std::fprintf(stderr, "prefill attention: %s (--attn %s)\n",
                 attn_backend_name(attn_resolve(attn_, prefill_probe())), attn_backend_name(attn_));
  }

  // The prefill attention problem the backend choice is made for: f16,
  // causal, with the widest layer window (a window at all is what a backend
  // may lack).
  AttnParams prefill_probe() const {
    AttnParams probe;
    probe.head_dim = cfg_.head_dim;
    probe.dtype = DType::F16;
    probe.causal = true;
    const int widest = *std::max_element(windows_.begin(), windows_.end());
    probe.window_left = widest > 0 ? widest - 1 : -1;
    return probe;
  }

  // How prefill attention reads the paged K/V. f16/f16 pools: in
  // place through the block tables. Typed pools (bf16, q8_0, q4_0, fp8, K and
  // V independent): in place when the backend the engine runs (--attn, or
  // what auto picks for the contiguous f16 problem, by speed) dequantizes
  // them in the kernel (naive, fa2); otherwise (fa3: its TMA copies raw tiles)
  // gather_kv first decodes the chunk's K/V to contiguous f16. Auto keeps
  // fa3 on sm_90 (+ gather) rather than switching to the slower fa2.
  // Said once on stderr for typed pools (tests read it).
  void choose_prefill_kv() {
    const bool typed = type_k_ != KvType::F16 || type_v_ != KvType::F16;
    paged_prefill_ = true;
    if (!typed) return;
    AttnParams probe = prefill_probe();
    const AttnBackend chosen = attn_resolve(attn_, probe);
    const int32_t dummy_table = 0;  // attn_unsupported_reason tests block_tables for null only
    probe.block_tables = &dummy_table;
    probe.block_size = kv_.block_size;
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
    free_gpu_weights(w_, cfg_.tied_embeddings);
    if (host_io_) cudaFreeHost(host_io_);
    host_io_ = nullptr;
    if (plan_host_) cudaFreeHost(plan_host_);
    plan_host_ = nullptr;
    if (logits_host_) cudaFreeHost(logits_host_);
    logits_host_ = nullptr;
    if (moe_offsets_host_) cudaFreeHost(moe_offsets_host_);
    moe_offsets_host_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  void check_kv_types(const EngineOptions& opt) {
    type_k_ = opt.type_k.value_or(KvType::F16);
    type_v_ = opt.type_v.value_or(KvType::F16);
    runlm::check_kv_types(Device::Cuda, type_k_, type_v_, opt.kv, cfg_.head_dim);
  }

  void allocate_buffers() {
    const ModelConfig& c = cfg_;
    const size_t m = static_cast<size_t>(n_batch_);
    const size_t widest = std::max<size_t>({static_cast<size_t>(c.dim), static_cast<size_t>(c.q_dim()), static_cast<size_t>(w_.hidden)});
    x_.allocate(m * c.dim);
    xb_.allocate(m * widest);
    xh_.allocate(m * widest);
    q_.allocate(m * c.q_dim());
    qh_.allocate(m * c.q_dim());
    k_.allocate(m * c.kv_dim());
    v_.allocate(m * c.kv_dim());
    att_.allocate(m * c.q_dim());
    atth_.allocate(m * c.q_dim());
    gate_.allocate(m * w_.hidden);
    up_.allocate(m * w_.hidden);
    logits_.allocate(m * c.n_vocab);
    argmax_.allocate(m);
    rows_.allocate(m * c.dim);
    tokens_.allocate(m);
    positions_.allocate(m);
    cu_seqlens_.allocate(4);
    mm_.allocate(w_, kMaxGemvTokens, static_cast<int64_t>(widest));
    if (c.moe()) allocate_moe_buffers();
    // Layers whose GEMM reads the weights once (F16 through cuBLAS, Q4_0 and
    // Q8_0 through the fused kernel, gemm_q_fused.cu) beat the GEMV from a few
    // tokens on: a 16-sequence F16 step took 25.6 ms by GEMV, slower per
    // token than 64 by GEMM, and Q4_0 at 16 sequences decoded 1,406 tokens/s
    // by GEMV against 3,019 by the fused GEMM (H100, bench -npl 16). The
    // other types pay a dequantization pass in the GEMM path and keep the
    // GEMV up to 16.
    const GpuLayer& l0 = w_.layers.front();
    // MoE models keep the GEMV up to 16 tokens. The reason was the experts'
    // GEMMs, which waited for a host read of the counts (moe_ffn_gemm); int8-x
    // experts now take the grouped expert GEMV at any length, and whether
    // their models' dense projections should switch at 4 tokens is to be
    // measured.
    bool gemm_reads_once = !c.moe();
    for (const gpu::GpuMatrix* w : {&l0.wq, &l0.wk, &l0.wv, &l0.wo, &l0.w_gate, &l0.w_up, &l0.w_down})
      gemm_reads_once = gemm_reads_once && gemm_reads_weights_once(*w);
    gemv_max_tokens_ = gemm_reads_once ? kMaxGemvTokensGemmOnce : kMaxGemvTokens;
    // Pinned staging for tokens, positions and cu_seqlens (graph-capturable copies).
    check(cudaMallocHost(&host_io_, (2 * m + 4) * sizeof(int)), "cudaMallocHost");
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

  // One contiguous-cache chunk of at most n_batch_ tokens of the one
  // sequence; the logits of its last token (all of them: all_logits) into
  // out when out is non-null.
  void run_chunk(const int* tokens, int m, int pos, float* out, bool all_logits) {
    stage_inputs(tokens, m, pos);
    if (m == 1 && out && !all_logits) {
      // The decode step: one graph for every position.
      if (!graph_exec_) capture_decode_graph();
      check(cudaGraphLaunch(graph_exec_, stream_), "cudaGraphLaunch");
    } else {
      run_layers(contiguous_step(m, pos));
      if (out) {
        const int first = all_logits ? 0 : m - 1;
        output_logits(x_.get() + static_cast<size_t>(first) * cfg_.dim, m - first);
      }
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

  // ---- the forward pass -----------------------------------------------------
  //
  // One layer loop (run_layers) serves every step. A step is its tokens and
  // positions (device arrays) and how attention reads and writes K/V:
  //   ContiguousDecode: at most gemv_max_tokens_ tokens of the one sequence
  //     in the contiguous cache; decode_attention_rope rotates, stores and
  //     attends in one launch (and writes wo's int8 x). The single-token
  //     step is captured in a CUDA graph (capture_decode_graph).
  //   ContiguousPrefill: a longer chunk; rope_and_store_kv, then the prefill
  //     attention backend over the keys [0, pos + m).
  //   Paged: a BatchPlan over the paged pools; rope_and_store_kv_slots, the
  //     paged decode kernel for the short items, the prefill backend for the
  //     long ones (see run_items).
  // Each weight product picks the GEMV (f32 or int8 x, m <= gemv_max_tokens_)
  // or the GEMM (f16 x) from the step's token count.
  enum class KvMode { ContiguousDecode, ContiguousPrefill, Paged };
  struct Step {
    int m = 0;
    const int* tokens = nullptr;     // device [m]
    const int* positions = nullptr;  // device [m]
    KvMode kv = KvMode::ContiguousDecode;
    int pos = 0;                     // contiguous: the first position
    const BatchPlan* plan = nullptr; // Paged
  };

  // A contiguous chunk staged by stage_inputs. A prefill chunk's query and
  // key prefix sums go to the device here, before the layers.
  Step contiguous_step(int m, int pos) {
    Step s;
    s.m = m;
    s.tokens = tokens_.get();
    s.positions = positions_.get();
    s.pos = pos;
    s.kv = m <= gemv_max_tokens_ ? KvMode::ContiguousDecode : KvMode::ContiguousPrefill;
    if (s.kv == KvMode::ContiguousPrefill) {
      int* h_cu = host_io_ + 2 * n_batch_;
      h_cu[0] = 0;
      h_cu[1] = m;
      h_cu[2] = 0;
      h_cu[3] = pos + m;
      check(cudaMemcpyAsync(cu_seqlens_.get(), h_cu, 4 * sizeof(int), cudaMemcpyHostToDevice, stream_), "copy cu");
    }
    return s;
  }

  // The transformer over a planned batch (see run_items).
  void run_batch(const BatchPlan& plan) {
    const ModelConfig& c = cfg_;
    const int m = static_cast<int>(plan.tokens.size());
    int32_t* d = plan_dev_.get();
    const PlanOffsets& o = plan_at_;
    if (plan.n_dec() > 0) {
      const size_t ws =
          paged_decode_workspace_bytes(plan.n_dec(), plan.dec_tokens, c.n_heads, c.head_dim, plan.max_dec_len);
      decode_ws_.reserve(std::max<size_t>(ws, 1));
    }
    // The pools feed the prefill backend in place through the block tables
    // (AttnParams' paged mode, typed pools dequantized in the kernel) or, for
    // a backend that cannot read them (fa3 with typed pools), through
    // gather_kv's contiguous f16 copy: choose_prefill_kv.
    if (plan.n_pre() > 0 && !paged_prefill_) {
      const size_t total_k = static_cast<size_t>(plan.pre_cu_k.back());
      k_gather_.reserve(total_k * c.kv_dim());
      v_gather_.reserve(total_k * c.kv_dim());
    }
    Step s;
    s.m = m;
    s.tokens = d + o.tokens;
    s.positions = d + o.positions;
    s.kv = KvMode::Paged;
    s.plan = &plan;
    run_layers(s);

    const int rows = static_cast<int>(plan.logit_rows.size());
    if (rows == 0) return;
    gpu::gather_rows(x_.get(), d + o.logit_rows, rows, c.dim, rows_.get(), stream_);
    output_logits(rows_.get(), rows);
  }

  // The layers over one step: x_ holds the residual stream of its m tokens
  // after them. Per layer, as the CPU engine (src/cpu_engine.cpp):
  //   h = rmsnorm(x); q, k, v = Wq h [+ bq], Wk h [+ bk], Wv h [+ bv];
  //   [per-head rmsnorm of q and k]; rope + store K/V;
  //   x += [post_norm](Wo attention(q, K, V, [sinks]) [+ bo]);
  //   h = rmsnorm(x); x += [post_norm](Wdown (act(Wgate h) * Wup h)),
  // the bracketed parts where the model has them, act SiLU or GELU-tanh.
  // Each residual add is folded into the RMSNorm after it (rmsnorm_fused;
  // the last one into the final add), and on the GEMV path the norms and
  // the activation write the int8 x of the GEMVs that read it.
  void run_layers(const Step& s) {
    const ModelConfig& c = cfg_;
    const int m = s.m;
    const bool gemv = m <= gemv_max_tokens_;
    gpu::embed_rows(w_.tok_embd, s.tokens, m, x_.get(), stream_, c.embd_scale);
    const float* pending = nullptr;  // the previous layer's down projection, not yet added to x
    const bool gelu = c.ffn_act == FfnActivation::GeluTanh;
    for (int l = 0; l < c.n_layers; ++l) {
      GpuLayer& g = w_.layers[l];
      // Attention block.
      norm_into_x(g.attn_norm, pending, m, gemv, uses_x8(g.wq) || uses_x8(g.wk) || uses_x8(g.wv));
      if (gemv) project_gemv({{&g.wq, q_.get()}, {&g.wk, k_.get()}, {&g.wv, v_.get()}}, xb_.get(), m, true);
      else project_qkv_gemm(g, m);
      if (c.qkv_bias || c.qk_norm)
        gpu::qkv_bias_head_norm(q_.get(), k_.get(), v_.get(), g.bq.get(), g.bk.get(), g.bv.get(), g.q_norm.get(),
                                g.k_norm.get(), m, c.n_heads, c.n_kv_heads, c.head_dim, c.rms_eps, stream_);
      const bool att_x8 = attend(l, s, gemv);
      if (gemv) project_gemv({{&g.wo, xb_.get()}}, att_.get(), m, att_x8);
      else gpu::gemm(g.wo, atth_.get(), xb_.get(), m, mm_.scratch(), stream_);
      if (c.attn_out_bias) gpu::add_bias_rows(xb_.get(), g.bo.get(), m, c.dim, stream_);
      if (c.post_norms) post_norm(g.attn_post_norm, m);
      // Feed-forward block.
      if (c.moe()) {
        moe_ffn(g, m, gemv);
        if (c.post_norms) post_norm(g.ffn_post_norm, m);
        pending = xb_.get();
        continue;
      }
      norm_into_x(g.ffn_norm, xb_.get(), m, gemv, uses_x8(g.w_gate) || uses_x8(g.w_up));
      if (gemv) project_gemv({{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, xb_.get(), m, true);
      else project_gemm(g.gate_up, {{&g.w_gate, gate_.get()}, {&g.w_up, up_.get()}}, m);
      const int64_t n_act = static_cast<int64_t>(m) * w_.hidden;
      if (gemv && uses_x8(g.w_down)) {
        if (gelu) gpu::geglu_x8(gate_.get(), up_.get(), mm_.x8(), m, w_.hidden, stream_);
        else gpu::swiglu_x8(gate_.get(), up_.get(), mm_.x8(), m, w_.hidden, stream_);
        project_gemv({{&g.w_down, xb_.get()}}, gate_.get(), m, true);
      } else {
        // f32 in place for the GEMV, f16 into xh_ for the GEMM.
        uint16_t* act_f16 = gemv ? nullptr : xh_.get();
        if (gelu) gpu::geglu(gate_.get(), up_.get(), act_f16, n_act, stream_);
        else gpu::swiglu(gate_.get(), up_.get(), act_f16, n_act, stream_);
        if (gemv) project_gemv({{&g.w_down, xb_.get()}}, gate_.get(), m);
        else gpu::gemm(g.w_down, xh_.get(), xb_.get(), m, mm_.scratch(), stream_);
      }
      if (c.post_norms) post_norm(g.ffn_post_norm, m);
      pending = xb_.get();
    }
    if (pending) gpu::add_inplace(x_.get(), pending, static_cast<int64_t>(m) * c.dim, stream_);
  }

  // ---- mixture of experts ----------------------------------------------------
  //
  // The feed-forward block of an MoE layer, as the CPU engine's moe_ffn:
  // h = rmsnorm(x += xb_); the router's logits (+ bias) pick each token's k
  // experts and weights (gpu::moe_route, on the device); each chosen expert
  // runs its gated FFN (+ biases) on h; xb_ = the weighted sum of their
  // outputs in slot order. Three paths, by the step's token count m and
  // the experts' types (nothing waits on the host except the last):
  //   m == 1, or a GEMV-length step of experts not all of an int8-x type:
  //     the per-pair expert GEMV (moe_ffn_gemv), ids in device memory; the
  //     single-token step runs inside the CUDA graph;
  //   m > 1 with int8-x experts (experts_grouped): the grouped expert GEMV
  //     (moe_ffn_grouped), each chunk of up to 16 pairs reading its expert
  //     once;
  //   longer steps of the other experts (f32, f16, bf16): one GEMM per
  //     active expert (moe_ffn_gemm), sized by a host read of the counts.
  void moe_ffn(const GpuLayer& g, int m, bool gemv) {
    const ModelConfig& c = cfg_;
    const int k = c.n_expert_used, ne = c.n_expert, dim = c.dim;
    const bool grouped = m > 1 && experts_grouped(g);
    bool x8_ready = false;  // mm_.x8() holds h as int8
    if (grouped) {
      // f32 h for the router and for moe_gather_x8, which quantizes it in the
      // grouped order.
      norm_for_gemv(g.ffn_norm, xb_.get(), m, false);
    } else if (gemv) {
      x8_ready = (uses_x8(g.gate_exps.type) || uses_x8(g.up_exps.type)) && dim % 32 == 0;
      norm_for_gemv(g.ffn_norm, xb_.get(), m, x8_ready);
    } else {
      // f32 for the router (moe_router_logits), f16 for the experts' GEMMs.
      gpu::rmsnorm_fused(x_.get(), xb_.get(), g.ffn_norm.get(), xb_.get(), xh_.get(), nullptr, m, dim, c.rms_eps,
                         stream_);
    }
    moe_router_logits(g, m, x8_ready);
    gpu::MoeRoute r;
    r.n_expert = ne;
    r.n_used = k;
    r.softmax_first = c.moe_gating == MoeGating::SoftmaxThenTopK;
    r.normalize = c.moe_norm_weights;
    r.scale = c.moe_weights_scale;
    gpu::moe_route(moe_logits_.get(), g.router_b.get(), r, m, moe_ids_.get(), moe_w_.get(), stream_);
    if (grouped) moe_ffn_grouped(g, m);
    else if (gemv) moe_ffn_gemv(g, m);
    else moe_ffn_gemm(g, m);
  }

  // Whether a layer's experts take the grouped expert GEMV: all three of an
  // int8-x type, in blocks of 32 columns.
  bool experts_grouped(const GpuLayer& g) const {
    const ModelConfig& c = cfg_;
    return uses_x8(g.gate_exps.type) && uses_x8(g.up_exps.type) && uses_x8(g.down_exps.type) && c.dim % 32 == 0 &&
           c.expert_hidden_dim % 32 == 0;
  }

  // The router's logits of the m normed rows in xb_ (f32) into moe_logits_.
  // With f32 x where the type has that GEMV (the router stays f32 in GGUF
  // files; llama-quantize leaves ffn_gate_inp alone): int8 x would round the
  // logits that choose the experts. GEMV chunks of up to 16 rows on the
  // GEMM path too: the router is n_expert rows, a small read.
  // A router of another type reads int8 x: the one the norm wrote when
  // x8_ready (the experts read it next), else quantized here.
  void moe_router_logits(const GpuLayer& g, int m, bool x8_ready) {
    const ModelConfig& c = cfg_;
    for (int done = 0; done < m; done += kMaxGemvTokens) {
      const int n = std::min(kMaxGemvTokens, m - done);
      const float* x = xb_.get() + static_cast<size_t>(done) * c.dim;
      float* y = moe_logits_.get() + static_cast<size_t>(done) * c.n_expert;
      if (gpu::gemv_f32x_supports(g.router.type)) gpu::gemv(g.router, x, y, n, stream_);
      else project_gemv({{&g.router, y}}, x, n, x8_ready);
    }
  }

  gpu::MoeActivation moe_activation() const {
    gpu::MoeActivation a;
    a.oai = cfg_.ffn_act == FfnActivation::SwigluOai;  // alpha 1.702, limit 7 as kernels/cpu/ops.h swiglu_oai
    return a;
  }

  // Decode: pairs p = t * k + s in token order. gate/up read h as int8
  // (mm_.x8(), written by the norm) or f32 (xb_); the activation writes the
  // down GEMV's int8 x (moe_x8_) or f32 in place.
  void moe_ffn_gemv(const GpuLayer& g, int m) {
    const ModelConfig& c = cfg_;
    const int k = c.n_expert_used, pairs = m * k;
    const int32_t* ids = moe_ids_.get();
    const gpu::ExpertGemvOut gu[2] = {{&g.gate_exps, moe_gate_.get()}, {&g.up_exps, moe_up_.get()}};
    const bool one_launch = gate_up_one_launch(g);
    for (int i = 0; i < 2; i += one_launch ? 2 : 1)
      expert_gemv(gu + i, one_launch ? 2 : 1, mm_.x8(), xb_.get(), m, ids, pairs, k);
    const gpu::ExpertGemvOut down{&g.down_exps, moe_y_.get()};
    const int64_t eh = c.expert_hidden_dim;
    if (uses_x8(g.down_exps.type)) {
      gpu::moe_activation_x8(moe_gate_.get(), moe_up_.get(), g.gate_exps_b.get(), g.up_exps_b.get(), ids, pairs, eh,
                             moe_activation(), moe_x8_.get(), stream_);
      expert_gemv(&down, 1, moe_x8_.get(), nullptr, pairs, ids, pairs, 1);
    } else {
      gpu::moe_activation(moe_gate_.get(), moe_up_.get(), g.gate_exps_b.get(), g.up_exps_b.get(), ids, pairs, eh,
                          moe_activation(), nullptr, stream_);
      expert_gemv(&down, 1, nullptr, moe_gate_.get(), pairs, ids, pairs, 1);
    }
    gpu::moe_combine(moe_y_.get(), nullptr, ids, moe_w_.get(), g.down_exps_b.get(), m, k, c.dim, xb_.get(), stream_);
  }

  // The expert GEMV of `outs` by their type's path (int8 x8 or f32 x, x_rows rows).
  void expert_gemv(const gpu::ExpertGemvOut* outs, int n, const void* x8, const float* x, int x_rows,
                   const int32_t* ids, int pairs, int x_div) {
    if (uses_x8(outs[0].w->type)) gpu::expert_gemv_x8(outs, n, x8, x_rows, ids, pairs, x_div, stream_);
    else gpu::expert_gemv_f32(outs, n, x, ids, pairs, x_div, stream_);
  }

  // Gate and up share a launch when they have one type and shape.
  static bool gate_up_one_launch(const GpuLayer& g) {
    return g.gate_exps.type == g.up_exps.type && g.gate_exps.rows == g.up_exps.rows;
  }

  // Steps of several tokens with int8-x experts (experts_grouped): the pairs
  // grouped by expert and cut into chunks of at most 16 on the device
  // (gpu::moe_group), h quantized into the grouped order (moe_gather_x8),
  // then gate/up, the activation (over grouped rows, into the down GEMV's
  // int8 x) and down through the grouped expert GEMV, each chunk reading its
  // expert once; moe_combine reads y through row_of_pair. The launches are
  // sized by moe_chunk_bound, the real chunk count stays on the device:
  // nothing waits on the host.
  void moe_ffn_grouped(const GpuLayer& g, int m) {
    const ModelConfig& c = cfg_;
    const int k = c.n_expert_used, ne = c.n_expert, pairs = m * k;
    const int max_chunks = gpu::moe_chunk_bound(pairs, ne);
    gpu::moe_group(moe_ids_.get(), pairs, ne, moe_offsets_.get(), moe_perm_.get(), moe_row_expert_.get(),
                   moe_row_of_pair_.get(), moe_chunks_.get(), moe_n_chunks_.get(), stream_);
    gpu::moe_gather_x8(xb_.get(), moe_perm_.get(), k, pairs, c.dim, moe_x8_.get(), stream_);
    const gpu::ExpertGemvOut gu[2] = {{&g.gate_exps, moe_gate_.get()}, {&g.up_exps, moe_up_.get()}};
    const bool one_launch = gate_up_one_launch(g);
    for (int i = 0; i < 2; i += one_launch ? 2 : 1)
      gpu::grouped_expert_gemv_x8(gu + i, one_launch ? 2 : 1, moe_x8_.get(), pairs, moe_chunks_.get(),
                                  moe_n_chunks_.get(), max_chunks, stream_);
    gpu::moe_activation_x8(moe_gate_.get(), moe_up_.get(), g.gate_exps_b.get(), g.up_exps_b.get(),
                           moe_row_expert_.get(), pairs, c.expert_hidden_dim, moe_activation(), moe_x8_.get(),
                           stream_);
    const gpu::ExpertGemvOut down{&g.down_exps, moe_y_.get()};
    gpu::grouped_expert_gemv_x8(&down, 1, moe_x8_.get(), pairs, moe_chunks_.get(), moe_n_chunks_.get(), max_chunks,
                                stream_);
    gpu::moe_combine(moe_y_.get(), moe_row_of_pair_.get(), moe_ids_.get(), moe_w_.get(), g.down_exps_b.get(), m, k,
                     c.dim, xb_.get(), stream_);
  }

  // Longer steps of experts not all of an int8-x type (f32, f16, bf16): the
  // pairs grouped by expert on the device (gpu::moe_group), then per active
  // expert one GEMM over its rows. The GEMM sizes are the per-expert counts,
  // so they come to the host: one small copy and a stream sync per MoE
  // layer, which only this path (never graph-captured) keeps.
  void moe_ffn_gemm(const GpuLayer& g, int m) {
    const ModelConfig& c = cfg_;
    const int k = c.n_expert_used, ne = c.n_expert, pairs = m * k, dim = c.dim;
    const int64_t eh = c.expert_hidden_dim;
    gpu::moe_group(moe_ids_.get(), pairs, ne, moe_offsets_.get(), moe_perm_.get(), moe_row_expert_.get(),
                   moe_row_of_pair_.get(), nullptr, nullptr, stream_);
    check(cudaMemcpyAsync(moe_offsets_host_, moe_offsets_.get(), static_cast<size_t>(ne + 1) * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream_),
          "copy expert offsets");
    gpu::gather_rows_f16(xh_.get(), moe_perm_.get(), k, pairs, dim, moe_xh_.get(), stream_);
    check(cudaStreamSynchronize(stream_), "sync");
    const int32_t* off = moe_offsets_host_;
    for (int e = 0; e < ne; ++e) {
      const int n = off[e + 1] - off[e];
      if (n == 0) continue;
      const uint16_t* xe = moe_xh_.get() + static_cast<size_t>(off[e]) * dim;
      gpu::gemm(gpu::expert_matrix(g.gate_exps, e), xe, moe_gate_.get() + static_cast<size_t>(off[e]) * eh, n,
                mm_.scratch(), stream_);
      gpu::gemm(gpu::expert_matrix(g.up_exps, e), xe, moe_up_.get() + static_cast<size_t>(off[e]) * eh, n,
                mm_.scratch(), stream_);
    }
    gpu::moe_activation(moe_gate_.get(), moe_up_.get(), g.gate_exps_b.get(), g.up_exps_b.get(),
                        moe_row_expert_.get(), pairs, eh, moe_activation(), moe_acth_.get(), stream_);
    for (int e = 0; e < ne; ++e) {
      const int n = off[e + 1] - off[e];
      if (n == 0) continue;
      gpu::gemm(gpu::expert_matrix(g.down_exps, e), moe_acth_.get() + static_cast<size_t>(off[e]) * eh,
                moe_y_.get() + static_cast<size_t>(off[e]) * dim, n, mm_.scratch(), stream_);
    }
    gpu::moe_combine(moe_y_.get(), moe_row_of_pair_.get(), moe_ids_.get(), moe_w_.get(), g.down_exps_b.get(), m, k,
                     dim, xb_.get(), stream_);
  }

  // Every (token, slot) pair of a full batch: n_batch_ * k rows.
  void allocate_moe_buffers() {
    const ModelConfig& c = cfg_;
    const size_t m = static_cast<size_t>(n_batch_), k = static_cast<size_t>(c.n_expert_used);
    const size_t pairs = m * k, eh = static_cast<size_t>(c.expert_hidden_dim);
    moe_logits_.allocate(m * c.n_expert);
    moe_ids_.allocate(pairs);
    moe_w_.allocate(pairs);
    moe_gate_.allocate(pairs * eh);
    moe_up_.allocate(pairs * eh);
    moe_y_.allocate(pairs * c.dim);
    moe_xh_.allocate(pairs * c.dim);
    moe_acth_.allocate(pairs * eh);
    // Every pair's int8 x: h (dim) for the grouped gate/up, the activation
    // (expert_hidden) for down.
    if (eh % 32 == 0)
      moe_x8_.allocate(gpu::x8_bytes(static_cast<int>(pairs), static_cast<int64_t>(std::max<size_t>(c.dim, eh))));
    moe_offsets_.allocate(static_cast<size_t>(c.n_expert) + 1);
    moe_perm_.allocate(pairs);
    moe_row_expert_.allocate(pairs);
    moe_row_of_pair_.allocate(pairs);
    moe_chunks_.allocate(static_cast<size_t>(gpu::moe_chunk_bound(static_cast<int>(pairs), c.n_expert)));
    moe_n_chunks_.allocate(1);
    check(cudaMallocHost(&moe_offsets_host_, (static_cast<size_t>(c.n_expert) + 1) * sizeof(int32_t)),
          "cudaMallocHost");
  }

  // xb_ = rmsnorm(xb_) * w (Gemma's post-attention and post-FFN norms), in
  // place: the kernel reads a row whole before it writes it.
  void post_norm(const DeviceBuffer<float>& w, int m) {
    gpu::rmsnorm(xb_.get(), w.get(), xb_.get(), nullptr, m, cfg_.dim, cfg_.rms_eps, stream_);
  }

  // x += add (when add is non-null), then the normed x for the projections
  // that read it: f32 into xb_ (and int8 into mm_.x8() when want_x8) for the
  // GEMV, f16 into xh_ for the GEMM.
  void norm_into_x(const DeviceBuffer<float>& w, const float* add, int m, bool gemv, bool want_x8) {
    if (gemv) norm_for_gemv(w, add, m, want_x8);
    else gpu::rmsnorm_fused(x_.get(), add, w.get(), nullptr, xh_.get(), nullptr, m, cfg_.dim, cfg_.rms_eps, stream_);
  }

  // Layer l's attention for the step, from the projections in q_, k_, v_
  // (f32, before RoPE): K and V are rotated and stored into the cache, and
  // the output lands in att_ (f32, GEMV path) or atth_ (f16, GEMM path).
  // Returns whether wo's int8 x was written too (mm_.x8()).
  bool attend(int l, const Step& s, bool gemv) {
    const ModelConfig& c = cfg_;
    const int m = s.m;
    switch (s.kv) {
      case KvMode::ContiguousDecode: {
        // RoPE and the K/V store inside the attention launch; the int8 x of
        // a Q4_0/Q8_0 wo comes out of the attention kernel itself.
        const bool att_x8 = uses_x8(w_.layers[l].wo) && c.head_dim % 32 == 0;
        // This kernel is the engine's own and takes the attention soft-cap and sinks.
        gpu::decode_attention_rope(q_.get(), k_.get(), v_.get(), s.positions, m, c.n_heads, c.n_kv_heads,
                                   c.head_dim, rope_[size_t(l)], k_cache(l), v_cache(l), window(l), c.attn_scale(),
                                   n_ctx_, att_.get(), stream_, att_x8 ? mm_.x8() : nullptr, c.attn_softcap,
                                   sinks(l));
        return att_x8;
      }
      case KvMode::ContiguousPrefill: {
        gpu::rope_and_store_kv(q_.get(), k_.get(), v_.get(), s.positions, m, c.n_heads, c.n_kv_heads, c.head_dim,
                               rope_[size_t(l)], k_cache(l), v_cache(l), qh_.get(), stream_);
        AttnParams p = prefill_params(l);
        p.q = qh_.get();
        p.k = k_cache(l);
        p.v = v_cache(l);
        p.out = atth_.get();
        p.cu_seqlens_q = cu_seqlens_.get();
        p.cu_seqlens_k = cu_seqlens_.get() + 2;
        p.batch = 1;
        p.total_q = m;
        p.total_k = s.pos + m;
        p.max_seqlen_q = m;
        p.max_seqlen_k = s.pos + m;
        attention_dispatch(attn_, p);
        return false;
      }
      case KvMode::Paged:
        attend_paged(l, *s.plan, gemv);
        return false;
    }
    return false;
  }

  // attend() over the paged pools: the short items (first plan.dec_tokens
  // rows) through the paged decode kernel into att_, the long ones through
  // the prefill backend into atth_ (after the short items' rows, which the
  // GEMM path converts to f16 beside them).
  void attend_paged(int l, const BatchPlan& plan, bool gemv) {
    const ModelConfig& c = cfg_;
    const int m = static_cast<int>(plan.tokens.size());
    int32_t* d = plan_dev_.get();
    const PlanOffsets& o = plan_at_;
    gpu::rope_and_store_kv_slots(
        q_.get(), k_.get(), v_.get(), d + o.positions, d + o.slots, m, c.n_heads, c.n_kv_heads, c.head_dim,
        rope_[size_t(l)], k_pool(l), v_pool(l), type_k_, type_v_, kv_.block_size,
        gemv ? nullptr : qh_.get(), stream_,
        k_smoothed_ ? k_smoothing_.get() + static_cast<size_t>(l) * KSmoothing::kRows * c.kv_dim() : nullptr);
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
      p.scale = c.attn_scale();
      p.kv.k_pool = k_pool(l);
      p.kv.v_pool = v_pool(l);
      p.kv.k_type = type_k_;
      p.kv.v_type = type_v_;
      p.kv.block_tables = d + o.dec_tables;
      p.kv.max_blocks_per_seq = o.dec_max_blocks;
      p.kv.seq_lens = d + o.dec_seq_lens;
      p.kv.block_size = kv_.block_size;
      p.kv.n_kv_heads = c.n_kv_heads;
      p.kv.head_dim = c.head_dim;
      p.softcap = c.attn_softcap;
      p.sinks = sinks(l);
      paged_decode_attention(p, decode_ws_.get(), decode_ws_.size(), stream_);
      if (!gemv) gpu::to_f16(att_.get(), atth_.get(), static_cast<int64_t>(plan.dec_tokens) * c.q_dim(), stream_);
    }
    if (plan.n_pre() > 0) {
      const int total_k = plan.pre_cu_k.back();
      AttnParams p = prefill_params(l);
      if (paged_prefill_) {
        p.k = k_pool(l);
        p.v = v_pool(l);
        p.block_tables = d + o.pre_tables;
        p.max_blocks_per_seq = o.pre_max_blocks;
        p.block_size = kv_.block_size;
        p.num_pages = static_cast<int>(kv_.n_slots / kv_.block_size);
        p.k_type = type_k_;
        p.v_type = type_v_;
      } else {
        gpu::gather_kv(k_pool(l), v_pool(l), type_k_, type_v_, d + o.pre_tables, o.pre_max_blocks, d + o.pre_cu_k,
                       plan.n_pre(), total_k, kv_.block_size, c.kv_dim(), k_gather_.get(), v_gather_.get(), stream_);
        p.k = k_gather_.get();
        p.v = v_gather_.get();
      }
      p.q = qh_.get() + static_cast<size_t>(plan.dec_tokens) * c.q_dim();
      p.out = atth_.get() + static_cast<size_t>(plan.dec_tokens) * c.q_dim();
      p.cu_seqlens_q = d + o.pre_cu_q;
      p.cu_seqlens_k = d + o.pre_cu_k;
      p.batch = plan.n_pre();
      p.total_q = m - plan.dec_tokens;
      p.total_k = total_k;
      p.max_seqlen_q = plan.max_pre_q;
      p.max_seqlen_k = plan.max_pre_k;
      attention_dispatch(attn_, p);
    }
  }

  // The prefill attention problem of layer l, without its tensors and lengths.
  AttnParams prefill_params(int l) const {
    const ModelConfig& c = cfg_;
    AttnParams p;
    p.n_heads = c.n_heads;
    p.n_kv_heads = c.n_kv_heads;
    p.head_dim = c.head_dim;
    p.dtype = DType::F16;
    p.causal = true;
    p.window_left = window_left(l);
    p.scale = c.attn_scale();
    p.stream = stream_;
    p.softcap = c.attn_softcap;
    p.sinks = sinks(l);
    return p;
  }

  // The final norm and the output projection of `rows` rows of the residual
  // stream (x, device [rows, dim]) into logits_, soft-capped where the
  // model caps its logits.
  void output_logits(const float* x, int rows) {
    const ModelConfig& c = cfg_;
    const bool gemv = rows <= gemv_max_tokens_;  // one row: the GEMV reads the output matrix once either way
    gpu::rmsnorm(x, w_.output_norm.get(), gemv ? xb_.get() : nullptr, gemv ? nullptr : xh_.get(), rows, c.dim,
                 c.rms_eps, stream_);
    if (gemv) project_gemv({{&w_.output, logits_.get()}}, xb_.get(), rows);
    else gpu::gemm(w_.output, xh_.get(), logits_.get(), rows, mm_.scratch(), stream_);
    if (c.final_softcap > 0)
      gpu::softcap(logits_.get(), static_cast<int64_t>(rows) * c.n_vocab, c.final_softcap, stream_);
  }

  // Calibration only (set_qk_stats): layer l's Q (RoPE'd in place by
  // rope_and_store_kv_slots) and K (not: the store rotates its own copy) to
  // the host, K rotated there by the layer's RoPE as kernels/cpu/ops.h does.
  void add_qk_stats(int l, const std::vector<int>& positions) {
    const ModelConfig& c = cfg_;
    const int m = static_cast<int>(positions.size());
    std::vector<float> q(static_cast<size_t>(m) * c.q_dim()), k(static_cast<size_t>(m) * c.kv_dim());
    check(cudaMemcpyAsync(q.data(), q_.get(), q.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy q");
    check(cudaMemcpyAsync(k.data(), k_.get(), k.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_), "copy k");
    check(cudaStreamSynchronize(stream_), "sync");
    for (int t = 0; t < m; ++t)
      rope_ext(&k[static_cast<size_t>(t) * c.kv_dim()], c.n_kv_heads, c.head_dim, positions[static_cast<size_t>(t)],
               rope_[size_t(l)]);
    qk_stats_->add(l, q.data(), k.data(), m);
  }

  // The single-token decode step (contiguous cache) as one graph: every
  // kernel reads the token and its position from tokens_ / positions_.
  void capture_decode_graph() {
    Step s;
    s.m = 1;
    s.tokens = tokens_.get();
    s.positions = positions_.get();
    s.kv = KvMode::ContiguousDecode;
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    run_layers(s);
    output_logits(x_.get(), 1);
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    check(cudaGraphInstantiate(&graph_exec_, graph, 0), "graph instantiate");
    cudaGraphDestroy(graph);
  }

  void* k_pool(int l) const { return kv_.k_pool(l); }
  void* v_pool(int l) const { return kv_.v_pool(l); }
  uint16_t* k_cache(int l) const { return static_cast<uint16_t*>(k_pool(l)); }
  uint16_t* v_cache(int l) const { return static_cast<uint16_t*>(v_pool(l)); }
  bool uses_x8(const gpu::GpuMatrix& w) const { return uses_x8(w.type); }
  bool uses_x8(DType t) const { return weight_paths(t).gemv == GemvPath::X8; }

  // The weight products (src/cuda_matmul.h): short steps by GEMV from f32 x
  // (int8 x where the type's path says so), long ones by GEMM from xh_.
  void project_gemv(std::initializer_list<gpu::GemvOut> outs, const float* x, int m, bool x8_ready = false) {
    mm_.gemv(outs, x, m, x8_ready, stream_);
  }
  void project_gemm(const GemmGroup& g, std::initializer_list<gpu::GemmOut> outs, int m) {
    mm_.gemm(g, outs, xh_.get(), m, stream_);
  }
  void project_qkv_gemm(const GpuLayer& g, int m) {
    if (g.qkv.n > 0) return project_gemm(g.qkv, {}, m);
    if (g.kv.n > 0) {  // F16 with GQA: q alone, k/v batched
      gpu::gemm(g.wq, xh_.get(), q_.get(), m, mm_.scratch(), stream_);
      return project_gemm(g.kv, {}, m);
    }
    project_gemm(g.qkv, {{&g.wq, q_.get()}, {&g.wk, k_.get()}, {&g.wv, v_.get()}}, m);
  }

  // xb = rmsnorm(x += add) in f32, and into x8_ too when a reader wants int8.
  void norm_for_gemv(const DeviceBuffer<float>& w, const float* add, int m, bool want_x8) {
    want_x8 = want_x8 && cfg_.dim % 32 == 0;  // int8 x comes in blocks of 32
    gpu::rmsnorm_fused(x_.get(), add, w.get(), xb_.get(), nullptr, want_x8 ? mm_.x8() : nullptr, m, cfg_.dim,
                       cfg_.rms_eps, stream_);
  }

  const Model& model_;
  const ModelConfig& cfg_;
  AttnBackend attn_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  int n_ctx_ = 0, n_batch_ = 512;
  std::vector<int> windows_;  // per layer, 0 = full attention (layer_windows)
  std::vector<float> rope_factors_;  // the per-pair divisors in use (rope_freqs, longrope's long or short), or empty
  std::vector<RopeSpec> rope_;       // per layer (layer_rope_specs); factors point into rope_factors_
  int window(int layer) const { return windows_[size_t(layer)]; }
  // A layer's attention sinks on the device ([n_heads]), nullptr without them.
  const float* sinks(int layer) const { return cfg_.attn_sinks ? w_.layers[size_t(layer)].sinks.get() : nullptr; }
  // AttnParams::window_left of a layer: keys [q - window_left, q], -1 = all.
  int window_left(int layer) const { return window(layer) > 0 ? window(layer) - 1 : -1; }
  GpuWeights w_;  // upload_gpu_weights

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
  KvType type_k_ = KvType::F16, type_v_ = KvType::F16;
  GpuKvCache kv_;  // the pools, and the page bookkeeping when paged
  DeviceBuffer<int> tokens_, positions_;      // [n_batch]
  DeviceBuffer<int> cu_seqlens_;              // [0, m, 0, pos + m]
  WeightMatmul mm_;  // the weight products, their int8 x, split-K scratch and batched-GEMM tables
  int gemv_max_tokens_ = kMaxGemvTokens;  // longer chunks take the GEMM path
  bool paged_prefill_ = true;             // prefill attention reads the pages in place (choose_prefill_kv)
  int* host_io_ = nullptr;  // pinned: tokens [n_batch], positions [n_batch], cu_seqlens [4]
  // Batched steps.
  DeviceBuffer<int32_t> plan_dev_;        // a step's tokens, positions, slots, tables (see upload_plan)
  int32_t* plan_host_ = nullptr;          // pinned staging for plan_dev_
  size_t plan_host_n_ = 0;
  float* logits_host_ = nullptr;          // pinned, logits_buffer()
  size_t logits_host_n_ = 0;
  DeviceBuffer<float> rows_;              // [n_batch, dim] rows whose logits are wanted
  DecodeKernelChoice decode_choice_;     // choose_decode_kernel
  DeviceBuffer<uint8_t> decode_ws_;       // paged decode split-K partial states
  DeviceBuffer<uint16_t> k_gather_, v_gather_;  // [total_k, kv_dim] K/V of prefill items, contiguous
  QkStats* qk_stats_ = nullptr;          // set_qk_stats
  DeviceBuffer<float> k_smoothing_;      // [n_layers][KSmoothing::kRows][kv_dim] (KSmoothing::params)
  bool k_smoothed_ = false;
  // Mixture of experts (allocate_moe_buffers): router logits [n_batch,
  // n_expert]; per (token, slot) pair the expert id and weight; the experts'
  // gate / up [pairs, expert_hidden] f32, down outputs [pairs, dim] f32,
  // grouped inputs [pairs, dim] and activations [pairs, expert_hidden] f16
  // (GEMM path), the expert GEMVs' int8 x; the grouping and its chunks
  // (moe_group).
  DeviceBuffer<float> moe_logits_, moe_w_, moe_gate_, moe_up_, moe_y_;
  DeviceBuffer<int32_t> moe_ids_, moe_offsets_, moe_perm_, moe_row_expert_, moe_row_of_pair_, moe_n_chunks_;
  DeviceBuffer<gpu::MoeChunk> moe_chunks_;
  DeviceBuffer<uint16_t> moe_xh_, moe_acth_;
  DeviceBuffer<uint8_t> moe_x8_;
  int32_t* moe_offsets_host_ = nullptr;  // pinned [n_expert + 1]
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
  // The layers' matrices as they go up (fused ones split: layer_matrices).
  std::vector<LayerMatrices> layers;
  for (const auto& lw : w.layers) layers.push_back(layer_matrices(model.config(), lw));
  std::vector<const WeightView*> all = {&w.tok_embd};
  if (!model.config().tied_embeddings) all.push_back(&w.output);
  for (const auto& l : layers)
    for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo}) all.push_back(v);
  if (model.config().moe()) {
    for (const auto& lw : w.layers) {
      const std::string why = gpu::upload_unsupported_reason(qmatrix(lw.gate_inp));
      if (!why.empty()) return lw.gate_inp.name + ": " + why;
      for (const WeightView* v : {&lw.gate_exps, &lw.up_exps, &lw.down_exps}) {
        const std::string e = gpu::upload_unsupported_reason(expert_qmatrix(*v));
        if (!e.empty()) return v->name + ": " + e;
      }
    }
  }
  for (const WeightView* v : all) {
    const std::string why = gpu::upload_unsupported_reason(qmatrix(*v));
    if (!why.empty()) return v->name + ": " + why;
  }
  // The feed-forward matrices go up padded to padded_hidden().
  if (model.config().moe()) return "";
  const int64_t h = padded_hidden(model.config());
  for (const auto& l : layers) {
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
