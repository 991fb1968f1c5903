// The CUDA engine's KV cache: one K and one V pool a layer in the layout of
// src/paged_kv.h (any GPU KV type, paged), or n_ctx f16 rows a layer
// (contiguous), and for the paged cache the page bookkeeping (BlockManager).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda_device_buffer.h"
#include "engine.h"
#include "kv_cache.h"
#include "model.h"
#include "paged_kv.h"

namespace runlm {

struct GpuKvCache {
  // [n_layers][n_slots / block_size pages of kv_pool_layout] (contiguous: [n_layers, n_ctx, kv_dim] f16)
  DeviceBuffer<uint8_t> k_cache, v_cache;
  KvPoolLayout layout_k, layout_v;
  size_t layer_bytes_k = 0, layer_bytes_v = 0;
  int block_size = 16;
  int64_t n_slots = 0;                   // KV rows per layer: n_ctx, or pages * block_size
  std::unique_ptr<BlockManager> blocks;  // paged only

  // Contiguous: n_ctx rows. Paged: the pages asked for (opt.kv_pages), else
  // enough for opt.kv_tokens (or n_ctx), but at most what fits in 90% of the
  // GPU memory left after the weights and buffers, as vLLM sizes its pool.
  void allocate(const ModelConfig& c, KvType type_k, KvType type_v, int n_ctx, const EngineOptions& opt);
  // Layer l's pools (any KV type, layout of src/paged_kv.h); for the
  // contiguous cache (f16 only) its f16 rows.
  void* k_pool(int l) const { return k_cache.get() + static_cast<size_t>(l) * layer_bytes_k; }
  void* v_pool(int l) const { return v_cache.get() + static_cast<size_t>(l) * layer_bytes_v; }
};

}  // namespace runlm
