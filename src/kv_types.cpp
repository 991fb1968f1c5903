#include "kv_types.h"

#include "common.h"
#include "kv_quant.h"

namespace runlm {

void check_kv_types(Device device, KvType k, KvType v, KvLayout layout, int head_dim) {
  if (device != Device::Cuda) {
    for (KvType t : {k, v}) kv_row_bytes(t, head_dim, head_dim);  // throws when the blocks cannot follow head_dim
    return;
  }
  for (KvType t : {k, v})
    RUNLM_CHECK(kv_type_on_gpu(t),
                "--device cuda: KV cache type %s (K=%s V=%s) unsupported on the GPU; supported: f16, bf16, q8_0, "
                "q4_0, fp8 (K and V independently, with --kv paged); the CPU backend supports f32",
                kv_type_name(t), kv_type_name(k), kv_type_name(v));
  const bool plain = k == KvType::F16 && v == KvType::F16;
  RUNLM_CHECK(plain || layout == KvLayout::Paged,
              "--device cuda: KV cache types K=%s V=%s need the paged KV cache (--kv paged); the contiguous cache "
              "on the GPU supports f16/f16 only",
              kv_type_name(k), kv_type_name(v));
  for (KvType t : {k, v})
    RUNLM_CHECK(t == KvType::F16 || head_dim % 32 == 0,
                "--device cuda: KV cache type %s with head_dim=%d unsupported; types other than f16 need head_dim "
                "a multiple of 32 (a scale per 32 values)",
                kv_type_name(t), head_dim);
}

}  // namespace runlm
