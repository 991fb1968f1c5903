#ifdef RUNLM_CUDA

#include "cuda_kv_cache.h"

#include <algorithm>

namespace runlm {

void GpuKvCache::allocate(const ModelConfig& c, KvType type_k, KvType type_v, int n_ctx, const EngineOptions& opt) {
  n_slots = n_ctx;
  if (opt.kv == KvLayout::Paged) block_size = opt.block_size;
  // Per-token bytes of each type (quants + scales, src/paged_kv.h).
  layout_k = kv_pool_layout(type_k, block_size, c.n_kv_heads, c.head_dim);
  layout_v = kv_pool_layout(type_v, block_size, c.n_kv_heads, c.head_dim);
  const size_t row_bytes = static_cast<size_t>(c.n_layers) *
                           static_cast<size_t>(layout_k.q_row + layout_k.s_row + layout_v.q_row + layout_v.s_row);
  if (opt.kv == KvLayout::Paged) {
    int64_t pages = opt.kv_pages;
    if (pages <= 0) {
      const int64_t tokens = opt.kv_tokens > 0 ? opt.kv_tokens : n_ctx;
      pages = (tokens + block_size - 1) / block_size;
      size_t free_b = 0, total_b = 0;
      check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
      const double budget = opt.kv_bytes > 0 ? static_cast<double>(opt.kv_bytes) : 0.9 * static_cast<double>(free_b);
      pages = std::min<int64_t>(pages, static_cast<int64_t>(budget / (static_cast<double>(row_bytes) * block_size)));
      RUNLM_CHECK(pages > 0, "KV cache: no GPU memory left for a single page (%zu bytes free)", free_b);
    }
    RUNLM_CHECK(pages < (int64_t{1} << 31), "KV cache: %lld pages is too many", static_cast<long long>(pages));
    blocks = std::make_unique<BlockManager>(static_cast<int>(pages), block_size);
    n_slots = pages * block_size;
  }
  // n_slots is a whole number of pages (paged) or n_ctx rows of a plain type (contiguous: f16 only).
  layer_bytes_k = static_cast<size_t>(n_slots) * static_cast<size_t>(layout_k.q_row + layout_k.s_row);
  layer_bytes_v = static_cast<size_t>(n_slots) * static_cast<size_t>(layout_v.q_row + layout_v.s_row);
  const size_t need = static_cast<size_t>(c.n_layers) * (layer_bytes_k + layer_bytes_v);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  RUNLM_CHECK(need <= free_b,
              "out of GPU memory for the KV cache: needs %zu bytes (%d layers x %lld slots, K %s and V %s), %zu "
              "bytes free; lower -c",
              need, c.n_layers, static_cast<long long>(n_slots), kv_type_name(type_k), kv_type_name(type_v),
              free_b);
  k_cache.allocate(static_cast<size_t>(c.n_layers) * layer_bytes_k);
  v_cache.allocate(static_cast<size_t>(c.n_layers) * layer_bytes_v);
}

}  // namespace runlm

#endif  // RUNLM_CUDA
