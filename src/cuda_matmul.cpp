#ifdef RUNLM_CUDA

#include "cuda_matmul.h"

#include <algorithm>

#include "common.h"

namespace runlm {

namespace {

// Every quantized type reads x quantized to int8 once (gpu::gemv_x8: dp4a
// on the weights' integer levels, ~4x fewer instructions per weight than
// decoding each weight to f32); the plain types read f32 x.
constexpr WeightPaths kWeightPaths[] = {
    {DType::F32, GemvPath::F32, GemmPath::DequantCublas},   {DType::F16, GemvPath::F32, GemmPath::CublasF16},
    {DType::BF16, GemvPath::F32, GemmPath::DequantCublas},  {DType::Q8_0, GemvPath::X8, GemmPath::Fused},
    {DType::Q4_0, GemvPath::X8, GemmPath::Fused},           {DType::Q4_1, GemvPath::X8, GemmPath::DequantCublas},
    {DType::Q5_0, GemvPath::X8, GemmPath::DequantCublas},   {DType::Q5_1, GemvPath::X8, GemmPath::DequantCublas},
    {DType::Q2_K, GemvPath::X8, GemmPath::DequantCublas},   {DType::Q3_K, GemvPath::X8, GemmPath::DequantCublas},
    {DType::Q4_K, GemvPath::X8, GemmPath::DequantCublas},   {DType::Q5_K, GemvPath::X8, GemmPath::DequantCublas},
    {DType::Q6_K, GemvPath::X8, GemmPath::DequantCublas},   {DType::IQ4_NL, GemvPath::X8, GemmPath::DequantCublas},
    {DType::IQ4_XS, GemvPath::X8, GemmPath::DequantCublas}, {DType::MXFP4, GemvPath::X8, GemmPath::DequantCublas},
};

}  // namespace

const WeightPaths& weight_paths(DType t) {
  for (const WeightPaths& p : kWeightPaths)
    if (p.type == t) return p;
  fail("weight type %s unsupported on the GPU; supported: %s", dtype_name(t), gpu::kGpuWeightTypes);
}

std::vector<DType> gpu_weight_types() {
  std::vector<DType> v;
  for (const WeightPaths& p : kWeightPaths) v.push_back(p.type);
  return v;
}

bool gemm_reads_weights_once(const gpu::GpuMatrix& w) {
  switch (weight_paths(w.type).gemm) {
    case GemmPath::CublasF16: return true;
    case GemmPath::Fused: return gpu::gemm_fused_supports(w) && gpu::gemm_fused_fits_device(w);
    case GemmPath::DequantCublas: return false;
  }
  return false;
}

void WeightMatmul::allocate(const GpuWeights& w, int gemv_tokens, int64_t widest) {
  x8_.allocate(gpu::x8_bytes(gemv_tokens, widest));
  size_t scratch = 0;
  for (const auto& l : w.layers) {
    for (const gpu::GpuMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (m->data) scratch = std::max(scratch, gpu::gemm_scratch_bytes(*m));
    // The prefill path multiplies one expert at a time (gpu::expert_matrix).
    for (const gpu::GpuExperts* x : {&l.gate_exps, &l.up_exps, &l.down_exps})
      if (x->data) scratch = std::max(scratch, gpu::gemm_scratch_bytes(gpu::expert_matrix(*x, 0)));
  }
  scratch = std::max(scratch, gpu::gemm_scratch_bytes(w.output));
  scratch_.allocate(scratch);
}

// At 256 decode tokens a 4096 x 4096 product is about one wave of cuBLAS
// tiles (29 us under ncu, 1.2 TB/s of weights); several in one call fill
// the GPU better.
void WeightMatmul::build_groups(std::vector<GpuLayer>& layers, uint16_t* xh, float* q, float* k, float* v,
                                float* gate, float* up) {
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
    for (int i = 0; i < n; ++i) h.push_back(xh);
    for (const Out& o : outs) h.push_back(o.second);
    return g;
  };
  for (GpuLayer& l : layers) {
    l.qkv = group({{&l.wq, q}, {&l.wk, k}, {&l.wv, v}});
    if (l.qkv.n == 0) l.kv = group({{&l.wk, k}, {&l.wv, v}});
    l.gate_up = group({{&l.w_gate, gate}, {&l.w_up, up}});
  }
  if (h.empty()) return;
  ptrs_.allocate(h.size());
  check(cudaMemcpy(ptrs_.get(), h.data(), h.size() * sizeof(void*), cudaMemcpyHostToDevice), "copy gemm groups");
}

void WeightMatmul::gemv(std::initializer_list<gpu::GemvOut> outs, const float* x, int m, bool x8_ready,
                        cudaStream_t stream) {
  const gpu::GemvOut* p = outs.begin();
  const int n = static_cast<int>(outs.size());
  bool x_quantized = x8_ready;
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && p[j].w->type == p[i].w->type && p[j].w->cols == p[i].w->cols) ++j;
    if (weight_paths(p[i].w->type).gemv == GemvPath::X8) {
      if (!x_quantized) gpu::quantize_x8(x, m, p[i].w->cols, x8_.get(), stream);  // every out reads this x
      x_quantized = true;
      gpu::gemv_x8(p + i, j - i, x8_.get(), m, stream);
    } else {
      gpu::gemv_multi(p + i, j - i, x, m, stream);
    }
    i = j;
  }
}

void WeightMatmul::gemm(const GemmGroup& g, std::initializer_list<gpu::GemmOut> outs, const uint16_t* xh, int m,
                        cudaStream_t stream) {
  if (g.n > 0) {
    void** p = ptrs_.get() + g.at;
    gpu::gemm_batched(p, reinterpret_cast<const uint16_t* const*>(p + g.n), reinterpret_cast<float* const*>(p + 2 * g.n),
                      g.n, g.rows, g.cols, m, stream);
    return;
  }
  gpu::gemm_multi(outs.begin(), static_cast<int>(outs.size()), xh, m, scratch_.get(), stream);
}

}  // namespace runlm

#endif  // RUNLM_CUDA
