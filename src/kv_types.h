// Which KV cache element types (-ctk / -ctv) an engine takes: one check for
// the CPU and the CUDA engines, so both refuse the same way.
#pragma once

#include "engine.h"
#include "paged_kv.h"

namespace runlm {

// Throws runlm::Error naming the combination and what is supported.
// CPU (device Cpu): every type, either layout, as long as a quantized
// type's 32-value blocks follow head_dim. CUDA (device Cuda): f16, bf16,
// q8_0, q4_0, fp8 for K and V independently with the paged cache, f16/f16
// with the contiguous one, and head_dim a multiple of 32 for any type but f16.
void check_kv_types(Device device, KvType k, KvType v, KvLayout layout, int head_dim);

}  // namespace runlm
