// Paged decode attention (flash-decoding over a paged KV cache). API and
// contract in paged_attention.h; measurements in docs/kernels.md ("paged decode").
//
// Memory bound: the design goal is to read each K/V byte once at close to
// copy bandwidth. Every kernel is GQA-aware (one CTA owns all query rows
// that share a KV head, so each K/V row is read once for the group) and
// split along the KV length (flash-decoding): the KV range is cut into
// page-aligned partitions of partition_size keys (0: no split, the CTA
// writes the normalised output; otherwise its (m, d, o) state goes to the
// workspace and paged_decode_combine below merges the partitions). The
// automatic split (make_plan) aims at about two waves of the device and
// prefers 1024-key partitions while they fill a quarter wave.
//
// The kernels (select_decode_kernel picks one per launch); each takes a
// sliding window, the attention logit soft-cap (softcap_log2 in
// paged_decode_common.cuh) and attention sinks (row_output there: joined
// once, at the no-split store or in the combine) at every head_dim and KV
// type it runs:
// - simt (paged_decode_simt.cuh): every K/V type pair and head_dim; kBdx =
//   head_dim / 8 threads cover a key row with one 16-byte load each, online
//   softmax per key lane, lanes merged by shuffles and shared memory.
// - mma_sm80 / mma_quant_sm80 (paged_decode_mma_sm80.cuh): mma.sync for QK
//   and PV, 8 rows a CTA, K/V bytes converted exactly to f16 fragments in
//   registers; the quantized-load kernel reads whole 16-byte chunks with the
//   block scales folded into the conversion (K and V both quantized at
//   head_dim 64 and 128), the generic one takes pairs with an f16 side and
//   head_dim 256.
// - mma_f16 (paged_decode_mma_f16.cuh): tensor cores for f16/f16 and
//   bf16/bf16 pools at head_dim 64 and 128.
// - tma_sm90 (paged_decode_tma_sm90.cuh, sm_90a): a CTA a group of 8 KV
//   heads, a producer warp filling a CTA-wide TMA ring with whole page rows,
//   8 consumer warps; K and V each q8_0, fp8 or q4_0 at head_dim 128.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include <string>
#include <vector>

#include "cuda/paged_attention.h"
#include "cuda/paged_decode_mma_f16.cuh"
#include "cuda/paged_decode_mma_sm80.cuh"
#include "cuda/paged_decode_simt.cuh"
#include "cuda/paged_decode_tma_sm90.cuh"
#include "cuda/tensor_map.h"

namespace runlm {

namespace {

using namespace paged;

// ------------------------------------------------------------ combine kernel

// grid: x = token-in-sequence * n_heads + head (over max_q_per_seq * n_heads),
// y = sequence. Warp w merges partitions w, w + 8, ...; lanes hold head
// elements 4 * lane + 128 * j as float4; the warps then merge through shared
// memory.
__global__ void __launch_bounds__(kCombineThreads)
    paged_decode_combine(const __grid_constant__ PagedDecodeParams p, int partition_size, const float* __restrict__ ws_o,
                         const float* __restrict__ ws_md, int ws_parts) {
  constexpr int kJ = kMaxHeadDim / 128;
  __shared__ float s_m[kCombineWarps], s_d[kCombineWarps];
  __shared__ float4 s_o[kCombineWarps][kMaxHeadDim / 4];
  const int s = blockIdx.y;
  const int i = blockIdx.x / p.n_heads, h = blockIdx.x % p.n_heads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hd = p.kv.head_dim;
  const SeqRange sr = seq_range(p, s, partition_size);
  if (!sr.ok) {
    if (blockIdx.x == 0) write_nan_rows(p, s);
    return;
  }
  if (i >= sr.n_q) return;
  const int64_t rid = int64_t(sr.q0 + i) * p.n_heads + h;

  float M = -INFINITY, D = 0.0f;
  float4 O[kJ];
#pragma unroll
  for (int j = 0; j < kJ; ++j) O[j] = make_float4(0, 0, 0, 0);
#pragma unroll 4
  for (int part = warp; part < sr.n_parts; part += kCombineWarps) {
    const int64_t at = rid * ws_parts + part;
    const float m_b = ws_md[at * 2], d_b = ws_md[at * 2 + 1];
    float sa, sb;
    attn_state_merge(M, D, m_b, d_b, sa, sb);
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int e = 4 * lane + 128 * j;
      if (e < hd) {
        const float4 ob = *reinterpret_cast<const float4*>(ws_o + at * hd + e);
        O[j] = make_float4(O[j].x * sa + ob.x * sb, O[j].y * sa + ob.y * sb, O[j].z * sa + ob.z * sb,
                           O[j].w * sa + ob.w * sb);
      }
    }
  }
  if (lane == 0) {
    s_m[warp] = M;
    s_d[warp] = D;
  }
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    const int e = 4 * lane + 128 * j;
    if (e < hd) s_o[warp][e / 4] = O[j];
  }
  __syncthreads();  // all warps' states are in shared memory
  for (int e = threadIdx.x; e < hd; e += kCombineThreads) {
    float Mt = -INFINITY, Dt = 0.0f, Ot = 0.0f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) {
      float sa, sb;
      attn_state_merge(Mt, Dt, s_m[w], s_d[w], sa, sb);
      Ot = Ot * sa + reinterpret_cast<const float*>(&s_o[w][0])[e] * sb;
    }
    p.out[rid * hd + e] = row_output(p, h, Mt, Dt, Ot);  // Dt = 0 (no key at all) cannot happen for a valid row
  }
}

// ------------------------------------------------------------ host side

int rows_per_cta(int rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : kMaxRows; }

int ilog2(int x) {
  int r = 0;
  while ((1 << r) < x) ++r;
  return r;
}

int next_pow2(int64_t x) {
  int64_t r = 1;
  while (r < x) r <<= 1;
  return static_cast<int>(r);
}

// Most partitions any launch with these bounds may use (workspace sizing).
int parts_bound(int n_seqs, int max_seq_len) {
  if (n_seqs <= 0 || max_seq_len <= 0) return 1;
  const int by_len = ceil_div(max_seq_len, kMinPartition);
  const int by_batch = std::max(1, kMaxSplitCtasPerBatch / n_seqs);
  return std::max(1, std::min(by_len, by_batch));
}


void check_params(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  for (KvType t : {kv.k_type, kv.v_type})
    RUNLM_CHECK(kv_type_on_gpu(t), "paged_decode_attention: kv type %s (K=%s V=%s) unsupported; supported: f16, bf16, "
                "q8_0, q4_0, fp8 for K and V independently",
                kv_type_name(t), kv_type_name(kv.k_type), kv_type_name(kv.v_type));
  const int hd = kv.head_dim;
  RUNLM_CHECK(hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256,
              "paged_decode_attention: head_dim=%d unsupported; supported: 8, 16, 32, 64, 128, 256", hd);
  const bool quant = kv_type_quantized(kv.k_type) || kv_type_quantized(kv.v_type);
  RUNLM_CHECK(!quant || hd % 32 == 0,
              "paged_decode_attention: head_dim=%d with kv K=%s V=%s unsupported; quantized KV types need head_dim "
              "32, 64, 128 or 256 (a scale per 32 values)",
              hd, kv_type_name(kv.k_type), kv_type_name(kv.v_type));
  const int bs = kv.block_size;
  RUNLM_CHECK(bs >= 8 && bs <= 256 && (bs & (bs - 1)) == 0,
              "paged_decode_attention: block_size=%d unsupported; supported: powers of two in 8..256", bs);
  RUNLM_CHECK(p.n_heads > 0 && kv.n_kv_heads > 0 && p.n_heads % kv.n_kv_heads == 0,
              "paged_decode_attention: n_heads=%d not a positive multiple of n_kv_heads=%d", p.n_heads,
              kv.n_kv_heads);
  // A page (K or V, f16 at most 2 bytes a value) stays below 2^31 bytes:
  // the kernels compute offsets inside a page in 32 bits.
  RUNLM_CHECK(int64_t(kv.n_kv_heads) * hd * 2 * bs < (int64_t(1) << 31),
              "paged_decode_attention: n_kv_heads=%d x head_dim=%d x block_size=%d makes a page of 2 GiB or more",
              kv.n_kv_heads, hd, bs);
  RUNLM_CHECK(p.softcap >= 0.0f && p.softcap <= FLT_MAX,
              "paged_decode_attention: softcap=%g unsupported; supported: 0 (none) or a finite value > 0", p.softcap);
  RUNLM_CHECK(p.max_q_per_seq >= 1 && p.max_q_per_seq <= 16,
              "paged_decode_attention: max_q_per_seq=%d unsupported; supported: 1..16", p.max_q_per_seq);
  RUNLM_CHECK(p.n_seqs >= 0 && p.n_seqs <= 65535, "paged_decode_attention: n_seqs=%d out of range 0..65535",
              p.n_seqs);
  RUNLM_CHECK(p.total_q >= 0 && p.max_seq_len >= 0 && p.window >= 0 && kv.max_blocks_per_seq >= 0,
              "paged_decode_attention: negative size (total_q=%d max_seq_len=%d window=%d max_blocks_per_seq=%d)",
              p.total_q, p.max_seq_len, p.window, kv.max_blocks_per_seq);
  RUNLM_CHECK(int64_t(kv.max_blocks_per_seq) * bs >= p.max_seq_len,
              "paged_decode_attention: max_seq_len=%d exceeds the block table (%d blocks of %d)", p.max_seq_len,
              kv.max_blocks_per_seq, bs);
  if (p.n_seqs > 0 && p.total_q > 0)
    RUNLM_CHECK(p.q && p.out && p.cu_q && kv.k_pool && kv.v_pool && kv.block_tables && kv.seq_lens,
                "paged_decode_attention: null device pointer in the params");
}

KernelFn pick_simt_kernel(KvType k, KvType v, int hd, int r) {
  KernelFn fn = nullptr;
  switch (k) {
    case KvType::F16: fn = pick_simt_kernel_kf16(v, hd, r); break;
    case KvType::BF16: fn = pick_simt_kernel_kbf16(v, hd, r); break;
    case KvType::Q8_0: fn = pick_simt_kernel_kq8_0(v, hd, r); break;
    case KvType::Q4_0: fn = pick_simt_kernel_kq4_0(v, hd, r); break;
    case KvType::FP8: fn = pick_simt_kernel_kfp8(v, hd, r); break;
    default: break;
  }
  RUNLM_CHECK(fn, "paged_decode_attention: no kernel for K=%s V=%s head_dim=%d", kv_type_name(k), kv_type_name(v),
              hd);
  return fn;
}

bool quantized(KvType t) { return kv_type_quantized(t); }

// The sm_80 tensor-core kernels cover K and V in {f16, q8_0, q4_0, fp8} with
// at least one quantized, head_dim 64, 128, 256.
bool mma_types(KvType k, KvType v, int hd) {
  auto in = [](KvType t) { return t == KvType::F16 || quantized(t); };
  return in(k) && in(v) && (quantized(k) || quantized(v)) && (hd == 64 || hd == 128 || hd == 256);
}

// Of those, the quantized-load kernel: K and V both quantized at head_dim 64 or 128.
bool mma_quant_types(KvType k, KvType v, int hd) {
  return quantized(k) && quantized(v) && (hd == 64 || hd == 128);
}

// The f16 tensor-core kernel: K and V both f16 or both bf16, head_dim 64 or
// 128 (the SIMT kernel keeps 8, 16, 32, 256 and the mixed f16/bf16 pairs).
bool mma_f16_types(KvType k, KvType v, int hd) {
  return k == v && (k == KvType::F16 || k == KvType::BF16) && (hd == 64 || hd == 128);
}

// The current device's compute capability, cached per device; present is
// false without a device (the SIMT kernel's launch then reports it).
struct DeviceArch {
  bool present = false;
  int major = 0, minor = 0;
  // The build's Hopper code is sm_90a only (TMA, mbarriers).
  bool sm90() const { return present && major == 9 && minor == 0; }
};

DeviceArch device_arch() {
  struct Entry {
    int dev;
    DeviceArch arch;
  };
  static thread_local Entry cache[16];
  static thread_local int n_cache = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  for (int i = 0; i < n_cache; ++i)
    if (cache[i].dev == dev) return cache[i].arch;
  DeviceArch a;
  a.present = cudaDeviceGetAttribute(&a.major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
              cudaDeviceGetAttribute(&a.minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!a.present) {
    cudaGetLastError();
    a = {};
  }
  if (n_cache < 16) cache[n_cache++] = {dev, a};
  return a;
}

// The TMA kernel's cases (paged_decode_tma_sm90.cuh): K and V each q8_0, fp8
// or q4_0, head_dim 128, pages of >= 16 slots (a 16-key tile is one TMA box
// of one page), n_kv_heads a multiple of 8 (a CTA takes 8 heads), 16-byte
// aligned pools, an sm_90 device.
bool tma_applies(const PagedDecodeParams& p, const DeviceArch& arch) {
  const PagedKvView& kv = p.kv;
  auto in = [](KvType t) { return t == KvType::Q8_0 || t == KvType::FP8 || t == KvType::Q4_0; };
  return in(kv.k_type) && in(kv.v_type) && kv.head_dim == 128 && kv.block_size >= 16 &&
         kv.n_kv_heads % kTmaHeads == 0 && reinterpret_cast<uintptr_t>(kv.k_pool) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(kv.v_pool) % 16 == 0 && arch.sm90();
}

// Whether `kernel` has an instance for these params on this device.
bool kernel_runs(DecodeKernel kernel, const PagedDecodeParams& p, const DeviceArch& arch) {
  const KvType k = p.kv.k_type, v = p.kv.v_type;
  const int hd = p.kv.head_dim;
  switch (kernel) {
    case DecodeKernel::Simt: return true;
    case DecodeKernel::MmaSm80: return arch.present && mma_types(k, v, hd) && !mma_quant_types(k, v, hd);
    case DecodeKernel::MmaQuantSm80: return arch.present && mma_types(k, v, hd) && mma_quant_types(k, v, hd);
    case DecodeKernel::MmaF16: return arch.present && mma_f16_types(k, v, hd);
    case DecodeKernel::TmaSm90: return tma_applies(p, arch);
    case DecodeKernel::ContiguousRope: return false;
    case DecodeKernel::Auto: return true;
  }
  return false;
}

// Every kernel takes any window and soft-cap (PagedDecodeParams::window,
// softcap), so the choice is by KV types, head_dim and device only. Where a
// faster kernel's head_dim rules it out, the reason names it and the kernel
// chosen instead.
DecodeKernelChoice select(const PagedDecodeParams& p, const DeviceArch& arch) {
  const KvType k = p.kv.k_type, v = p.kv.v_type;
  const int hd = p.kv.head_dim;
  if (!arch.present) return {DecodeKernel::Simt, "no CUDA device"};
  if (mma_f16_types(k, v, hd)) return {DecodeKernel::MmaF16, "f16/f16 or bf16/bf16 pool at head_dim 64 or 128"};
  if (mma_types(k, v, hd)) {
    if (tma_applies(p, arch))
      return {DecodeKernel::TmaSm90,
              "K and V each q8_0, fp8 or q4_0 at head_dim 128, pages >= 16, n_kv_heads a multiple of 8, sm_90"};
    if (mma_quant_types(k, v, hd))
      return {DecodeKernel::MmaQuantSm80, "K and V both quantized at head_dim 64 or 128"};
    if (hd == 256 && quantized(k) && quantized(v))
      return {DecodeKernel::MmaSm80,
              "tma_sm90 (head_dim 128 only) and mma_quant_sm80 (64, 128): head_dim 256 unsupported -> mma_sm80"};
    return {DecodeKernel::MmaSm80, "a quantized K or V with an f16 partner, or head_dim 256"};
  }
  const bool same_plain = k == v && (k == KvType::F16 || k == KvType::BF16);
  if (same_plain && hd == 256) return {DecodeKernel::Simt, "mma_f16 (head_dim 64, 128): head_dim 256 unsupported -> simt"};
  return {DecodeKernel::Simt, "types or head_dim no tensor-core kernel covers"};
}

// The TMA kernel's tensor maps over one pool (K or V): quants [pages]
// [block_size][n_kv x 128] u8 as 4-D {a head's row bytes, slot, head, page}
// with the head dimension inside the slot one in memory (strides need not
// grow), so one box = 8 heads x 16 rows lands head-major in shared memory;
// 8-bit rows in 128-byte swizzled boxes, q4_0's 64-byte rows plain. Scales
// [pages][block_size][n_kv x 4] f16 in boxes of 8 heads' 32 scales x 16
// slots. The pool's page count is not in the params: the page dimension is
// the largest that keeps the mapped range under 2^48 bytes (coordinates
// come from valid table entries only; TMA wants dims <= 2^32).
void make_tma_maps(const void* pool, KvType type, int n_kv, int bs, const char* what, CUtensorMap* quants,
                   CUtensorMap* scales) {
  const int head_row = type == KvType::Q4_0 ? 64 : 128;  // a head's quant bytes of a slot (head_dim 128)
  const int64_t q_row = int64_t(n_kv) * head_row, s_row = int64_t(n_kv) * 8;
  const int64_t page = bs * (q_row + s_row);
  const int64_t pages = std::max<int64_t>(1, std::min<int64_t>(INT32_MAX, (int64_t(1) << 48) / page));
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  {
    const cuuint64_t dims[4] = {cuuint64_t(head_row), cuuint64_t(bs), cuuint64_t(n_kv), cuuint64_t(pages)};
    const cuuint64_t strides[3] = {cuuint64_t(q_row), cuuint64_t(head_row), cuuint64_t(page)};
    const cuuint32_t box[4] = {cuuint32_t(head_row), 16, cuuint32_t(kTmaHeads), 1};
    const CUtensorMapSwizzle swz = head_row == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
    const CUresult e = encode_tiled_fn()(quants, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(pool), dims,
                                         strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RUNLM_CHECK(e == CUDA_SUCCESS,
                "paged_decode_attention (tma_sm90): cuTensorMapEncodeTiled(%s quants, n_kv_heads=%d block_size=%d) "
                "failed: CUresult %d",
                what, n_kv, bs, int(e));
  }
  {
    const cuuint64_t dims[3] = {cuuint64_t(n_kv) * 4, cuuint64_t(bs), cuuint64_t(pages)};
    const cuuint64_t strides[2] = {cuuint64_t(s_row), cuuint64_t(page)};
    const cuuint32_t box[3] = {cuuint32_t(kTmaHeads) * 4, 16, 1};
    void* base = static_cast<uint8_t*>(const_cast<void*>(pool)) + bs * q_row;
    const CUresult e = encode_tiled_fn()(scales, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dims, strides, box, estr,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RUNLM_CHECK(e == CUDA_SUCCESS,
                "paged_decode_attention (tma_sm90): cuTensorMapEncodeTiled(%s scales, n_kv_heads=%d block_size=%d) "
                "failed: CUresult %d",
                what, n_kv, bs, int(e));
  }
}

// The launch's 4 maps, kept per (pools, types, geometry) in a per-thread
// cache (a pool a layer; cleared past kMapCache entries, room for every
// layer of the models runlm runs): a batched step launches the decode once
// a layer outside any CUDA graph, and an engine's pools do not move, so each
// layer's maps are encoded once instead of 4 driver calls a launch. A map
// depends on nothing else (the page dimension comes from the geometry).
DecodeTmaMaps make_tma_maps(const PagedKvView& kv) {
  struct Entry {
    const void* k_pool;
    const void* v_pool;
    KvType k_type, v_type;
    int n_kv, bs;
    DecodeTmaMaps maps;
  };
  constexpr size_t kMapCache = 160;
  static thread_local std::vector<Entry> cache;  // heap: only threads that launch pay for it
  for (const Entry& e : cache)
    if (e.k_pool == kv.k_pool && e.v_pool == kv.v_pool && e.k_type == kv.k_type && e.v_type == kv.v_type &&
        e.n_kv == kv.n_kv_heads && e.bs == kv.block_size)
      return e.maps;
  Entry e{kv.k_pool, kv.v_pool, kv.k_type, kv.v_type, kv.n_kv_heads, kv.block_size, {}};
  make_tma_maps(kv.k_pool, kv.k_type, kv.n_kv_heads, kv.block_size, "K", &e.maps.kq, &e.maps.ks);
  make_tma_maps(kv.v_pool, kv.v_type, kv.n_kv_heads, kv.block_size, "V", &e.maps.vq, &e.maps.vs);
  if (cache.size() >= kMapCache) cache.clear();  // pools of many engines over a thread's life: start over
  cache.push_back(e);
  return e.maps;
}

// Sets the dynamic shared memory limit of the TMA kernel once per (device,
// kernel), with the whole unified L1 / shared memory as shared: not a
// stream operation, so legal during graph capture (as the occupancy query
// below).
void ensure_smem_attr(KernelFn fn, int smem_bytes) {
  if (smem_bytes <= 48 * 1024) return;
  struct Entry {
    int dev;
    KernelFn fn;
  };
  static thread_local Entry done[64];
  static thread_local int n_done = 0;
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  for (int i = 0; i < n_done; ++i)
    if (done[i].dev == dev && done[i].fn == fn) return;
  cudaCheck(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
  cudaCheck(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  if (n_done < 64) done[n_done++] = {dev, fn};
}

// softcap: the quantized-load kernel's soft-capped instance (its kSoftcap).
KernelFn pick_mma_sm80_kernel(KvType k, KvType v, int hd, bool softcap) {
  KernelFn fn = nullptr;
  switch (k) {
    case KvType::F16: fn = pick_mma_sm80_kernel_kf16(v, hd, softcap); break;
    case KvType::Q8_0: fn = pick_mma_sm80_kernel_kq8_0(v, hd, softcap); break;
    case KvType::Q4_0: fn = pick_mma_sm80_kernel_kq4_0(v, hd, softcap); break;
    case KvType::FP8: fn = pick_mma_sm80_kernel_kfp8(v, hd, softcap); break;
    default: break;
  }
  RUNLM_CHECK(fn, "paged_decode_attention: no tensor-core kernel for K=%s V=%s head_dim=%d", kv_type_name(k),
              kv_type_name(v), hd);
  return fn;
}

// Resident CTAs the device can hold of this kernel (SMs x occupancy), cached
// per (device, kernel): the queries enqueue nothing, so they are legal while
// a stream is being captured, but they are not free.
int device_concurrency(KernelFn fn, int smem_bytes, int threads) {
  struct Entry {
    int dev;
    KernelFn fn;
    int ctas;
  };
  static thread_local Entry cache[16];
  static thread_local int n_cache = 0;
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  for (int i = 0; i < n_cache; ++i)
    if (cache[i].dev == dev && cache[i].fn == fn) return cache[i].ctas;
  int sms = 0, per_sm = 0;
  cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, smem_bytes));
  const int ctas = std::max(1, sms * std::max(1, per_sm));
  if (n_cache < 16) cache[n_cache++] = {dev, fn, ctas};
  return ctas;
}

struct Plan {
  DecodeKernel kernel = DecodeKernel::Simt;
  KernelFn fn = nullptr;      // the kernel (for tma_sm90: its address, for the attribute and occupancy queries)
  KernelTmaFn tma = nullptr;  // tma_sm90's kernel (its own parameter list: the tensor maps and the ring's depth)
  int tma_stages = 0;
  int threads = kThreads;     // a CTA's
  int heads_per_cta = 1;      // KV heads a CTA (tma_sm90: kTmaHeads; grid y = n_kv_heads / this)
  int rows_per_cta = 1;
  int n_chunks = 1;
  int smem_bytes = 0;      // dynamic shared memory (tma_sm90)
  int partition_size = 0;  // 0 = no split
  int n_parts = 1;         // grid partitions (and workspace stride)
  size_t ws_bytes = 0;
};

// Keys a CTA set of one (sequence, KV head) may have to cover: with a
// window, only the window (+ query tokens and page alignment), else the
// longest sequence.
int key_span(const PagedDecodeParams& p) {
  if (p.window <= 0) return p.max_seq_len;
  const int64_t w = int64_t(p.window) + p.max_q_per_seq + p.kv.block_size;
  return static_cast<int>(std::min<int64_t>(p.max_seq_len, w));
}

// The kernel that runs: `forced` (tests) when given, else the selector's.
DecodeKernel resolve_kernel(const PagedDecodeParams& p, DecodeKernel forced) {
  const DeviceArch arch = device_arch();
  if (forced == DecodeKernel::Auto) return select(p, arch).kernel;
  RUNLM_CHECK(kernel_runs(forced, p, arch),
              "paged_decode_attention: kernel %s does not run K=%s V=%s head_dim=%d block_size=%d n_kv_heads=%d on "
              "this device",
              decode_kernel_name(forced), kv_type_name(p.kv.k_type), kv_type_name(p.kv.v_type), p.kv.head_dim,
              p.kv.block_size, p.kv.n_kv_heads);
  return forced;
}

Plan make_plan(const PagedDecodeParams& p, int forced_partition, DecodeKernel forced) {
  Plan pl;
  pl.kernel = resolve_kernel(p, forced);
  const int group = p.n_heads / p.kv.n_kv_heads;
  const int rows = p.max_q_per_seq * group;
  switch (pl.kernel) {
    case DecodeKernel::MmaF16:
      pl.rows_per_cta = kMmaRows;
      pl.n_chunks = ceil_div(rows, kMmaRows);
      pl.fn = pick_mma_f16_kernel(p.kv.k_type, p.kv.head_dim, device_arch().major >= 9);
      RUNLM_CHECK(pl.fn, "paged_decode_attention: no mma_f16 kernel for K=%s V=%s head_dim=%d",
                  kv_type_name(p.kv.k_type), kv_type_name(p.kv.v_type), p.kv.head_dim);
      break;
    case DecodeKernel::TmaSm90: {
      pl.rows_per_cta = kMmaRows;
      pl.n_chunks = ceil_div(rows, kMmaRows);
      int stage_bytes = 0;
      pl.tma = pick_tma_sm90_kernel(p.kv.k_type, p.kv.v_type, &pl.tma_stages, &stage_bytes);
      RUNLM_CHECK(pl.tma, "paged_decode_attention: no tma_sm90 kernel for K=%s V=%s", kv_type_name(p.kv.k_type),
                  kv_type_name(p.kv.v_type));
      pl.smem_bytes = pl.tma_stages * stage_bytes + 16 * pl.tma_stages + 1024;  // TmaStage::smem
      pl.threads = kTmaThreads;
      pl.heads_per_cta = kTmaHeads;
      // Its address, for the attribute and occupancy queries only (never
      // launched through this type; void (*)() converts to any function type).
      pl.fn = reinterpret_cast<KernelFn>(reinterpret_cast<void (*)()>(pl.tma));
      ensure_smem_attr(pl.fn, pl.smem_bytes);
      break;
    }
    case DecodeKernel::MmaSm80:
    case DecodeKernel::MmaQuantSm80:
      pl.rows_per_cta = kMmaRows;
      pl.n_chunks = ceil_div(rows, kMmaRows);
      pl.fn = pick_mma_sm80_kernel(p.kv.k_type, p.kv.v_type, p.kv.head_dim, p.softcap > 0.0f);
      break;
    default:
      pl.rows_per_cta = rows_per_cta(rows);
      pl.n_chunks = ceil_div(rows, pl.rows_per_cta);
      pl.fn = pick_simt_kernel(p.kv.k_type, p.kv.v_type, p.kv.head_dim, pl.rows_per_cta);
  }
  const int span = std::max(1, key_span(p));
  const int bound = parts_bound(p.n_seqs, p.max_seq_len);
  if (forced_partition > 0) {
    RUNLM_CHECK(forced_partition >= kMinPartition && (forced_partition & (forced_partition - 1)) == 0,
                "paged_decode_attention: partition_size=%d unsupported; supported: 0 (no split), -1 (auto), "
                "powers of two >= %d",
                forced_partition, kMinPartition);
    pl.partition_size = forced_partition;
  } else if (forced_partition < 0) {
    // Enough CTAs for about two waves of the device (one wave and a bit
    // leaves a tail: measured -15% at 1.3 waves). But each CTA has fixed
    // costs (q load, merge, partial state, combine), so prefer partitions of
    // kLongPartition keys while they still give a quarter wave: at B=1,
    // L=32k, 256 CTAs of 1024 keys beat 1024 CTAs of 256 (61 vs 69 us).
    const int64_t base = int64_t(p.n_seqs) * (p.kv.n_kv_heads / pl.heads_per_cta) * pl.n_chunks;
    const int64_t conc = device_concurrency(pl.fn, pl.smem_bytes, pl.threads);
    const int64_t want = base > 0 ? (2 * conc + base - 1) / base : 1;
    // Unless whole (sequence, KV head) CTAs already fill their last wave to
    // >= 90%: then a split adds the partial states and the combine and
    // balances nothing (measured at B=64 L=8192: f16 on mma_f16 +1%, fp8 on
    // mma_quant_sm80 at 2 CTAs an SM (1.94 waves) +3.5% unsplit, while q8_0 /
    // q4_0 at 3 CTAs (1.29 waves) lose 7-10% unsplit). Lengths are
    // not known here; with very uneven ones a split would balance them, but
    // that is the same blind spot as the wave count above.
    const int64_t waves = base > 0 ? (base + conc - 1) / conc : 1;
    const bool fills_waves = base * 10 >= waves * conc * 9;
    if (pl.heads_per_cta > 1) {
      // tma_sm90 (a ring that fills once a CTA): the longest partitions
      // that still fit one wave (B=64 L=8192: 4096 keys, 128 CTAs: q8_0
      // 392.2 us, q4_0 233.7; 2048 keys, 256 CTAs: 397.2, 239.9).
      const int64_t fit = base > 0 ? conc / base : 1;
      if (fit > 1) {
        int size = std::max(kMinPartition, next_pow2((span + fit - 1) / fit));
        while (ceil_div(span, size) > bound) size *= 2;
        pl.partition_size = size;
      }
    } else if (want > 1 && !fills_waves) {
      int size = std::max(kMinPartition, next_pow2((span + want - 1) / want));
      if (size < kLongPartition) {
        const int64_t long_parts = ceil_div(span, kLongPartition);
        if (long_parts >= 2 && base * long_parts * 4 >= conc) size = kLongPartition;
      }
      while (ceil_div(span, size) > bound) size *= 2;
      pl.partition_size = size;
    }
  }
  if (pl.partition_size > 0) {
    pl.n_parts = ceil_div(span, pl.partition_size);
    if (pl.n_parts <= 1 && forced_partition < 0) {
      pl.partition_size = 0;  // one partition: no split, no combine
      pl.n_parts = 1;
    }
  }
  if (pl.partition_size > 0)
    pl.ws_bytes = size_t(p.total_q) * p.n_heads * pl.n_parts * (size_t(p.kv.head_dim) + 2) * sizeof(float);
  return pl;
}

}  // namespace

size_t paged_decode_workspace_bytes(int n_seqs, int total_q, int n_heads, int head_dim, int max_seq_len) {
  const int bound = parts_bound(n_seqs, max_seq_len);
  // A forced split may use up to ceil(max_seq_len / kMinPartition) partitions
  // even past the automatic bound; the bound is what auto uses, and forced
  // choices are checked against the workspace at launch.
  if (bound <= 1 || total_q <= 0) return 0;
  return size_t(total_q) * n_heads * bound * (size_t(head_dim) + 2) * sizeof(float);
}

const char* decode_kernel_name(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::Auto: return "auto";
    case DecodeKernel::Simt: return "simt";
    case DecodeKernel::MmaSm80: return "mma_sm80";
    case DecodeKernel::MmaQuantSm80: return "mma_quant_sm80";
    case DecodeKernel::MmaF16: return "mma_f16";
    case DecodeKernel::TmaSm90: return "tma_sm90";
    case DecodeKernel::ContiguousRope: return "contiguous_rope";
  }
  return "?";
}

bool decode_kernel_uses_tensor_cores(DecodeKernel k) {
  return k != DecodeKernel::Simt && k != DecodeKernel::Auto && k != DecodeKernel::ContiguousRope;
}

DecodeKernelChoice select_decode_kernel(const PagedDecodeParams& p) {
  check_params(p);
  return select(p, device_arch());
}

DecodeKernelChoice select_engine_decode_kernel(bool paged, const PagedDecodeParams& p) {
  if (!paged)
    return {DecodeKernel::ContiguousRope, "contiguous f16 cache: RoPE, K/V store and attention in one launch"};
  return select_decode_kernel(p);
}

std::vector<DecodeKernel> decode_kernels_for(const PagedDecodeParams& p) {
  check_params(p);
  const DeviceArch arch = device_arch();
  std::vector<DecodeKernel> out;
  for (DecodeKernel k : {DecodeKernel::Simt, DecodeKernel::MmaSm80, DecodeKernel::MmaQuantSm80, DecodeKernel::MmaF16,
                         DecodeKernel::TmaSm90})
    if (kernel_runs(k, p, arch)) out.push_back(k);
  return out;
}

bool paged_decode_uses_tensor_cores(const PagedDecodeParams& p) {
  return decode_kernel_uses_tensor_cores(select_decode_kernel(p).kernel);
}

int paged_decode_auto_partition(const PagedDecodeParams& p, DecodeKernel kernel) {
  check_params(p);
  return make_plan(p, -1, kernel).partition_size;
}

void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream) {
  paged_decode_attention(p, workspace, workspace_bytes, stream, -1);
}

void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream,
                            int partition_size, DecodeKernel kernel) {
  check_params(p);
  if (p.n_seqs == 0 || p.total_q == 0) return;
  const Plan pl = make_plan(p, partition_size, kernel);
  RUNLM_CHECK(pl.ws_bytes <= workspace_bytes && (pl.ws_bytes == 0 || workspace != nullptr),
              "paged_decode_attention: workspace of %zu bytes too small; this launch (partition_size=%d, %d "
              "partitions) needs %zu",
              workspace_bytes, pl.partition_size, pl.n_parts, pl.ws_bytes);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  float* ws_o = static_cast<float*>(workspace);
  const size_t rows_total = size_t(p.total_q) * p.n_heads;
  float* ws_md = pl.partition_size > 0 ? ws_o + rows_total * pl.n_parts * p.kv.head_dim : nullptr;
  const dim3 grid(static_cast<unsigned>(pl.n_parts * pl.n_chunks),
                  static_cast<unsigned>(p.kv.n_kv_heads / pl.heads_per_cta), static_cast<unsigned>(p.n_seqs));
  if (pl.tma) {
    const DecodeTmaMaps maps = make_tma_maps(p.kv);
    pl.tma<<<grid, pl.threads, pl.smem_bytes, st>>>(p, maps, pl.partition_size, pl.n_chunks, ilog2(p.kv.block_size),
                                                   pl.tma_stages, pl.tma_stages >= 3 ? 2 : 1, ws_o, ws_md,
                                                   pl.n_parts);
  } else {
    pl.fn<<<grid, kThreads, pl.smem_bytes, st>>>(p, pl.partition_size, pl.n_chunks, ilog2(p.kv.block_size), ws_o,
                                                 ws_md, pl.n_parts);
  }
  cudaCheckLaunch();
  if (pl.partition_size > 0) {
    const dim3 cgrid(static_cast<unsigned>(p.max_q_per_seq * p.n_heads), static_cast<unsigned>(p.n_seqs));
    paged_decode_combine<<<cgrid, kCombineThreads, 0, st>>>(p, pl.partition_size, ws_o, ws_md, pl.n_parts);
    cudaCheckLaunch();
  }
}

}  // namespace runlm
