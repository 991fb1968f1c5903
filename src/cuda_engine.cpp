// CUDA backend: the same forward pass as the CPU engine (src/cpu_engine.cpp),
// on the GPU. Weights are uploaded once in their GGUF type (repacked for
// 16-byte loads, kernels/cuda/gpu_ops.h). Up to kMaxGemvTokens tokens run
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
#include <vector>

#include "attention.h"
#include "common.h"
#include "cuda/gpu_ops.h"
#include "engine.h"
#include "model.h"

namespace runlm {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in %s: %s", what, cudaGetErrorString(e));
}

constexpr int kMaxGemvTokens = 16;

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
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

struct GpuLayer {
  gpu::GpuMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  DeviceBuffer<float> attn_norm, ffn_norm;
};

class CudaEngine final : public Engine {
 public:
  CudaEngine(const Model& model, const EngineOptions& opt)
      : model_(model), cfg_(model.config()), attn_(opt.attn) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
      cudaGetLastError();
      fail("--device cuda: no CUDA device found");
    }
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    RUNLM_CHECK(opt.kv == KvLayout::Contiguous,
                "--device cuda: --kv paged is not available on the GPU yet; use --kv contiguous or --device cpu");
    n_ctx_ = opt.n_ctx > 0 ? opt.n_ctx : cfg_.ctx_train;
    n_batch_ = std::max(1, opt.n_batch);
    window_ = opt.sliding_window >= 0 ? opt.sliding_window : cfg_.sliding_window;
    upload_weights();
    allocate_buffers();
  }

  ~CudaEngine() override {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    for (auto& l : layers_)
      for (gpu::GpuMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) gpu::free_matrix(*m);
    gpu::free_matrix(tok_embd_);
    if (!cfg_.tied_embeddings) gpu::free_matrix(output_);
    if (host_io_) cudaFreeHost(host_io_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* backend_name() const override { return "cuda"; }
  int n_ctx() const override { return n_ctx_; }
  const char* kv_type_name() const override { return "f16"; }
  int max_batch_tokens() const override { return n_batch_; }
  void forward_batch(const std::vector<BatchItem>&, float*) override {
    fail("--device cuda: batched decoding over the paged KV cache is not available on the GPU yet; use --device cpu");
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
  void upload_weights() {
    const ModelWeights& w = model_.weights();
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
      g.w_gate = gpu::upload_matrix(qmatrix(lw.w_gate));
      g.w_up = gpu::upload_matrix(qmatrix(lw.w_up));
      g.w_down = gpu::upload_matrix(qmatrix(lw.w_down));
      upload_vector_into(lw.attn_norm, g.attn_norm);
      upload_vector_into(lw.ffn_norm, g.ffn_norm);
    }
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
    const size_t widest = std::max({c.dim, c.q_dim(), c.hidden_dim});
    x_.allocate(m * c.dim);
    xb_.allocate(m * widest);
    xh_.allocate(m * widest);
    q_.allocate(m * c.q_dim());
    qh_.allocate(m * c.q_dim());
    k_.allocate(m * c.kv_dim());
    v_.allocate(m * c.kv_dim());
    att_.allocate(m * c.q_dim());
    atth_.allocate(m * c.q_dim());
    gate_.allocate(m * c.hidden_dim);
    up_.allocate(m * c.hidden_dim);
    logits_.allocate(m * c.n_vocab);
    const size_t cache = static_cast<size_t>(c.n_layers) * n_ctx_ * c.kv_dim();
    k_cache_.allocate(cache);
    v_cache_.allocate(cache);
    tokens_.allocate(m);
    positions_.allocate(m);
    cu_seqlens_.allocate(4);
    size_t scratch = 0;
    for (const auto& l : layers_)
      for (const gpu::GpuMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        scratch = std::max(scratch, gpu::gemm_scratch_bytes(*w));
    scratch = std::max(scratch, gpu::gemm_scratch_bytes(output_));
    gemm_scratch_.allocate(scratch);
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

  void run_chunk(const int* tokens, int m, int pos, float* out, bool all_logits) {
    stage_inputs(tokens, m, pos);
    const bool gemv_path = m <= kMaxGemvTokens;
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

  void capture_decode_graph() {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    layers_gemv(1, -1);
    logits_gemv(1, false);
    check(cudaStreamEndCapture(stream_, &graph), "end capture");
    check(cudaGraphInstantiate(&graph_exec_, graph, 0), "graph instantiate");
    cudaGraphDestroy(graph);
  }

  uint16_t* k_cache(int l) const {
    return k_cache_.get() + static_cast<size_t>(l) * n_ctx_ * cfg_.kv_dim();
  }
  uint16_t* v_cache(int l) const {
    return v_cache_.get() + static_cast<size_t>(l) * n_ctx_ * cfg_.kv_dim();
  }

  // Transformer layers for m <= 16 tokens; `pos` is unused on the device
  // (positions come from positions_), kept for readability of callers.
  void layers_gemv(int m, int /*pos*/) {
    const ModelConfig& c = cfg_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    gpu::embed_rows(tok_embd_, tokens_.get(), m, x_.get(), stream_);
    for (int l = 0; l < c.n_layers; ++l) {
      GpuLayer& g = layers_[l];
      gpu::rmsnorm(x_.get(), g.attn_norm.get(), xb_.get(), nullptr, m, c.dim, c.rms_eps, stream_);
      gpu::gemv(g.wq, xb_.get(), q_.get(), m, stream_);
      gpu::gemv(g.wk, xb_.get(), k_.get(), m, stream_);
      gpu::gemv(g.wv, xb_.get(), v_.get(), m, stream_);
      gpu::rope_and_store_kv(q_.get(), k_.get(), v_.get(), positions_.get(), m, c.n_heads, c.n_kv_heads, c.head_dim,
                             c.rope_theta, c.rope_freq_scale, k_cache(l), v_cache(l), nullptr, stream_);
      gpu::decode_attention(q_.get(), k_cache(l), v_cache(l), m, positions_.get(), c.n_heads, c.n_kv_heads,
                            c.head_dim, window_, scale, n_ctx_, att_.get(), stream_);
      gpu::gemv(g.wo, att_.get(), xb_.get(), m, stream_);
      gpu::add_inplace(x_.get(), xb_.get(), static_cast<int64_t>(m) * c.dim, stream_);
      gpu::rmsnorm(x_.get(), g.ffn_norm.get(), xb_.get(), nullptr, m, c.dim, c.rms_eps, stream_);
      gpu::gemv(g.w_gate, xb_.get(), gate_.get(), m, stream_);
      gpu::gemv(g.w_up, xb_.get(), up_.get(), m, stream_);
      gpu::swiglu(gate_.get(), up_.get(), nullptr, static_cast<int64_t>(m) * c.hidden_dim, stream_);
      gpu::gemv(g.w_down, gate_.get(), xb_.get(), m, stream_);
      gpu::add_inplace(x_.get(), xb_.get(), static_cast<int64_t>(m) * c.dim, stream_);
    }
  }

  void logits_gemv(int m, bool all_logits) {
    const ModelConfig& c = cfg_;
    const int first = all_logits ? 0 : m - 1;
    const int rows = m - first;
    gpu::rmsnorm(x_.get() + static_cast<size_t>(first) * c.dim, output_norm_.get(), xb_.get(), nullptr, rows, c.dim,
                 c.rms_eps, stream_);
    gpu::gemv(output_, xb_.get(), logits_.get(), rows, stream_);
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
      gpu::gemm(g.wq, xh_.get(), q_.get(), m, scratch, stream_);
      gpu::gemm(g.wk, xh_.get(), k_.get(), m, scratch, stream_);
      gpu::gemm(g.wv, xh_.get(), v_.get(), m, scratch, stream_);
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
      p.window_left = window_ > 0 ? window_ - 1 : -1;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      p.stream = stream_;
      attention_dispatch(attn_, p);
      gpu::gemm(g.wo, atth_.get(), xb_.get(), m, scratch, stream_);
      gpu::add_inplace(x_.get(), xb_.get(), static_cast<int64_t>(m) * c.dim, stream_);
      gpu::rmsnorm(x_.get(), g.ffn_norm.get(), nullptr, xh_.get(), m, c.dim, c.rms_eps, stream_);
      gpu::gemm(g.w_gate, xh_.get(), gate_.get(), m, scratch, stream_);
      gpu::gemm(g.w_up, xh_.get(), up_.get(), m, scratch, stream_);
      gpu::swiglu(gate_.get(), up_.get(), xh_.get(), static_cast<int64_t>(m) * c.hidden_dim, stream_);
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
  int n_ctx_ = 0, n_batch_ = 512, window_ = 0;

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
  DeviceBuffer<uint16_t> k_cache_, v_cache_;  // [n_layers, n_ctx, n_kv_heads * head_dim] f16
  DeviceBuffer<int> tokens_, positions_;      // [n_batch]
  DeviceBuffer<int> cu_seqlens_;              // [0, m, 0, pos + m]
  DeviceBuffer<uint8_t> gemm_scratch_;
  int* host_io_ = nullptr;  // pinned: tokens [n_batch], positions [n_batch], cu_seqlens [4]
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

std::unique_ptr<Engine> make_cuda_engine(const Model& model, const EngineOptions& options) {
  return std::make_unique<CudaEngine>(model, options);
}

}  // namespace runlm

#endif  // RUNLM_CUDA
