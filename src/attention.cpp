// The attention backend table and the one dispatch point. Compiles without
// CUDA too: there every GPU backend is an Error saying so.
#include "attention.h"

#include <cfloat>
#include <cstdio>
#include <mutex>

#include "common.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/attn_kernels.h"
#endif

namespace runlm {

namespace {

#ifdef RUNLM_CUDA
constexpr AttnLaunchFn kNaiveLaunch = attn_naive_launch;
constexpr AttnLaunchFn kFa2Launch = attn_fa2_launch;
constexpr AttnLaunchFn kFa3Launch = attn_fa3_launch;
#else
constexpr AttnLaunchFn kNaiveLaunch = nullptr;
constexpr AttnLaunchFn kFa2Launch = nullptr;
constexpr AttnLaunchFn kFa3Launch = nullptr;
#endif

std::string join_ints(const std::vector<int>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += '}';
  return s;
}

int current_device_sm() {
#ifdef RUNLM_CUDA
  int dev = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) fail("attention: no usable CUDA device (%s)", cudaGetErrorString(e));
  return major * 10 + minor;
#else
  return 0;
#endif
}

// Parameter checks that hold for every backend: pointers, sizes, GQA.
void validate(const AttnParams& p) {
  RUNLM_CHECK(p.q && p.k && p.v && p.out, "attention: q, k, v and out must be set");
  RUNLM_CHECK(p.cu_seqlens_q && p.cu_seqlens_k, "attention: cu_seqlens_q and cu_seqlens_k must be set");
  RUNLM_CHECK(p.batch >= 1, "attention: batch=%d must be >= 1", p.batch);
  RUNLM_CHECK(p.total_q >= 0 && p.total_k >= 0, "attention: total_q=%d total_k=%d must be >= 0", p.total_q,
              p.total_k);
  RUNLM_CHECK(p.max_seqlen_q >= 0 && p.max_seqlen_k >= 0, "attention: max_seqlen_q=%d max_seqlen_k=%d must be >= 0",
              p.max_seqlen_q, p.max_seqlen_k);
  RUNLM_CHECK(p.n_heads >= 1 && p.n_kv_heads >= 1 && p.n_heads % p.n_kv_heads == 0,
              "attention: n_heads=%d must be a positive multiple of n_kv_heads=%d", p.n_heads, p.n_kv_heads);
  RUNLM_CHECK(p.head_dim >= 1, "attention: head_dim=%d must be >= 1", p.head_dim);
  RUNLM_CHECK(p.dtype == DType::BF16 || p.dtype == DType::F16, "attention: dtype %s unsupported; supported: bf16, f16",
              dtype_name(p.dtype));
  RUNLM_CHECK(p.window_left >= -1, "attention: window_left=%d must be -1 (none) or >= 0", p.window_left);
  RUNLM_CHECK(p.scale == p.scale && p.scale > 0.0f, "attention: scale=%g must be > 0", p.scale);
  RUNLM_CHECK(p.softcap >= 0.0f && p.softcap <= FLT_MAX, "attention: softcap=%g must be 0 (none) or finite and > 0",
              p.softcap);
  // Offsets into the tensors are computed in 64 bits by the kernels, but
  // row indices are int32 (cu_seqlens), as in FlashAttention.
  RUNLM_CHECK(static_cast<int64_t>(p.total_q) * p.n_heads < (int64_t(1) << 31),
              "attention: total_q*n_heads=%lld too large for int32 lse indexing",
              static_cast<long long>(p.total_q) * p.n_heads);
  if (p.block_tables) {
    RUNLM_CHECK(p.block_size >= 1 && p.max_blocks_per_seq >= 1 && p.num_pages >= 1,
                "attention: paged K/V needs block_size=%d, max_blocks_per_seq=%d and num_pages=%d >= 1", p.block_size,
                p.max_blocks_per_seq, p.num_pages);
    // Slots are int32 in the kernels (and TMA row coordinates).
    RUNLM_CHECK(static_cast<int64_t>(p.num_pages) * p.block_size < (int64_t(1) << 31),
                "attention: paged K/V of %d pages x %d slots too large; supported: < 2^31 slots", p.num_pages,
                p.block_size);
    RUNLM_CHECK(p.max_seqlen_k <= static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size,
                "attention: max_seqlen_k=%d exceeds what a block table of %d pages of %d keys holds", p.max_seqlen_k,
                p.max_blocks_per_seq, p.block_size);
  }
  if (attn_kv_typed(p)) {
    const KvType kt = attn_kv_type(p, false), vt = attn_kv_type(p, true);
    RUNLM_CHECK(p.block_tables, "attention: K=%s V=%s with dtype %s need paged K/V; contiguous K/V are in the dtype",
                kv_type_name(kt), kv_type_name(vt), dtype_name(p.dtype));
    for (KvType t : {kt, vt}) {
      RUNLM_CHECK(t == KvType::F16 || t == KvType::BF16 || t == KvType::Q8_0 || t == KvType::Q4_0 || t == KvType::FP8,
                  "attention: KV type %s (K=%s V=%s) unsupported; supported: f16, bf16, q8_0, q4_0, fp8",
                  kv_type_name(t), kv_type_name(kt), kv_type_name(vt));
      RUNLM_CHECK(t == KvType::F16 || t == KvType::BF16 || p.head_dim % 32 == 0,
                  "attention: KV type %s with head_dim=%d unsupported; supported: head_dim a multiple of 32",
                  kv_type_name(t), p.head_dim);
    }
  }
}

}  // namespace

KvType attn_kv_type(const AttnParams& p, bool v) {
  const std::optional<KvType>& t = v ? p.v_type : p.k_type;
  return t.value_or(p.dtype == DType::BF16 ? KvType::BF16 : KvType::F16);
}

bool attn_kv_typed(const AttnParams& p) {
  const KvType own = p.dtype == DType::BF16 ? KvType::BF16 : KvType::F16;
  return attn_kv_type(p, false) != own || attn_kv_type(p, true) != own;
}

const std::vector<AttnBackendInfo>& attn_backends() {
  static const std::vector<AttnBackendInfo> kTable = {
      // naive materialises one row of S in shared memory: any head_dim up to 256.
      // Paged K/V: naive reads any page size; fa2 and fa3 the engine's
      // (--block-size, powers of two 8..256): fa2 finds a key's page with a
      // shift, fa3 loads a tile as TMA boxes of whole 8-row swizzle atoms.
      // Typed pools (kv_types): naive decodes per element, fa2 converts each
      // staged tile to f16 in shared memory; fa3's TMA copies raw tiles
      // straight into the wgmma layout, so it reads f16/bf16 pools in the
      // dtype only (the engine gathers typed pools to f16 for it).
      // Soft-cap: naive caps the row it materialises; fa2 and fa3 have an
      // instantiation that caps each score tile in registers (kSoftcap).
      // Sinks: naive joins the sink to the row it materialises; fa2 and fa3
      // have an instantiation (kSinks) that joins it to each row's final
      // online-softmax state.
      {AttnBackend::Naive, "naive", {}, 256, true, true, true, true, true, 80, 1000, kNaiveLaunch, {}, true, true},
      {AttnBackend::Fa2, "fa2", {64, 128, 256}, 256, true, true, true, true, true, 80, 1000, kFa2Launch,
       {8, 16, 32, 64, 128, 256}, true, true},
      // fa3 is built for sm_90a only (wgmma, setmaxnreg): that code runs on 9.0 alone.
      {AttnBackend::Fa3, "fa3", {64, 128, 256}, 256, true, true, true, true, true, 90, 90, kFa3Launch,
       {8, 16, 32, 64, 128, 256}, false, true},
  };
  return kTable;
}

const AttnBackendInfo& attn_backend_info(AttnBackend b) {
  for (const AttnBackendInfo& row : attn_backends())
    if (row.backend == b) return row;
  fail("attention: backend %d has no table row (auto resolves first)", static_cast<int>(b));
}

AttnBackend attn_backend_from_name(const std::string& name) {
  if (name == "auto") return AttnBackend::Auto;
  std::string names;
  for (const AttnBackendInfo& row : attn_backends()) {
    if (name == row.name) return row.backend;
    names += std::string(row.name) + "|";
  }
  fail("--attn %s unknown; supported: %sauto", name.c_str(), names.c_str());
}

const char* attn_backend_name(AttnBackend b) {
  if (b == AttnBackend::Auto) return "auto";
  return attn_backend_info(b).name;
}

std::string attn_unsupported_reason(AttnBackend b, const AttnParams& p, int sm) {
  const AttnBackendInfo& r = attn_backend_info(b);
  if (!r.launch) return strfmt("%s: runlm was built without CUDA; supported: none (rebuild with -DRUNLM_CUDA=ON)", r.name);
  if (!r.head_dims.empty()) {
    bool ok = false;
    for (int d : r.head_dims) ok |= d == p.head_dim;
    if (!ok)
      return strfmt("%s: head_dim=%d unsupported; supported: head_dim %s", r.name, p.head_dim,
                    join_ints(r.head_dims).c_str());
  } else if (p.head_dim > r.max_head_dim) {
    return strfmt("%s: head_dim=%d unsupported; supported: head_dim 1..%d", r.name, p.head_dim, r.max_head_dim);
  }
  if ((p.dtype == DType::BF16 && !r.bf16) || (p.dtype == DType::F16 && !r.fp16))
    return strfmt("%s: dtype=%s unsupported", r.name, dtype_name(p.dtype));
  if (p.causal && !r.causal) return strfmt("%s: causal unsupported", r.name);
  if (p.window_left >= 0 && !r.window) return strfmt("%s: window unsupported", r.name);
  if (p.softcap > 0.0f && !r.softcap) return strfmt("%s: softcap=%g unsupported", r.name, p.softcap);
  if (p.sinks && !r.sinks) return strfmt("%s: attention sinks unsupported", r.name);
  if (p.block_tables && !r.block_sizes.empty()) {
    bool ok = false;
    for (int bs : r.block_sizes) ok |= bs == p.block_size;
    if (!ok)
      return strfmt("%s: paged K/V block_size=%d unsupported; supported: block_size %s", r.name, p.block_size,
                    join_ints(r.block_sizes).c_str());
  }
  if (p.block_tables && attn_kv_typed(p)) {
    const char* kt = kv_type_name(attn_kv_type(p, false));
    const char* vt = kv_type_name(attn_kv_type(p, true));
    if (!r.kv_types)
      return strfmt("%s: paged K/V types K=%s V=%s unsupported; supported: K and V in the dtype (%s)", r.name, kt, vt,
                    dtype_name(p.dtype));
    if (p.dtype != DType::F16)
      return strfmt("%s: paged K/V types K=%s V=%s with dtype %s unsupported; supported: dtype f16", r.name, kt, vt,
                    dtype_name(p.dtype));
  }
  if (sm < r.min_sm || sm > r.max_sm) {
    if (r.min_sm == r.max_sm)
      return strfmt("%s: sm_%d unsupported; supported: sm_%d", r.name, sm, r.min_sm);
    return strfmt("%s: sm_%d unsupported; supported: sm_%d and newer", r.name, sm, r.min_sm);
  }
  return {};
}

AttnBackend attn_resolve(AttnBackend b, const AttnParams& p) {
#ifndef RUNLM_CUDA
  if (b == AttnBackend::Auto) fail("attention: auto: runlm was built without CUDA; no GPU backend available");
#endif
  const int sm = current_device_sm();
  if (b != AttnBackend::Auto) {
    std::string why = attn_unsupported_reason(b, p, sm);
    if (!why.empty()) throw Error(why);
    return b;
  }
  // Auto: the fastest backend that supports the request; the table lists the
  // fastest last.
  std::string whys;
  const auto& table = attn_backends();
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    std::string why = attn_unsupported_reason(it->backend, p, sm);
    if (why.empty()) return it->backend;
    if (!whys.empty()) whys += "; ";
    whys += why;
  }
  fail("attention: auto: no backend supports this request (%s)", whys.c_str());
}

void attention_dispatch(AttnBackend b, const AttnParams& p) {
  validate(p);
  const AttnBackend chosen = attn_resolve(b, p);
  if (b == AttnBackend::Auto) {
    // Log once per process; the forward pass calls this for every layer.
    static std::once_flag logged;
    std::call_once(logged, [&] {
      std::fprintf(stderr, "attention: auto selected %s (head_dim=%d, %s)\n", attn_backend_name(chosen), p.head_dim,
                   dtype_name(p.dtype));
    });
  }
  if (p.total_q == 0) return;  // nothing to write
  attn_backend_info(chosen).launch(p);
}

}  // namespace runlm
