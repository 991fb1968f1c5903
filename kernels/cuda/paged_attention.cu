// Paged decode attention (flash-decoding over a paged KV cache), issue 6.
// API and contract in paged_attention.h; notes and measurements in NOTES.md
// ("paged decode").
//
// Version 1: memory bound, so the design goal is to read each K/V byte once
// at close to copy bandwidth (measurements: NOTES.md, "paged decode").
// - GQA-aware: one CTA per (sequence, KV head, row chunk, partition) owns all
//   query rows (query tokens x query heads) that share the KV head, up to
//   kMaxRows of them, so each K/V row is read once for the whole group.
// - Thread layout: kBdx = head_dim / 8 threads cover one key's row with one
//   16-byte load each; the CTA's 128 threads are 128 / kBdx "key lanes", and
//   each lane takes kUnroll keys per iteration, so a thread has 2 * kUnroll
//   16-byte loads in flight before their first use. The page indices for the
//   next iteration are loaded while this one's K/V are in flight.
// - Scores: partial dot products over a thread's 8 elements, summed by an xor
//   butterfly across the kBdx lanes (every lane ends with the same sum); an
//   online softmax (base 2: log2(e) * scale is folded into q) per row per key
//   lane; the key lanes' states are merged by shuffles inside a warp and then
//   through shared memory across the 4 warps (attn_state_merge).
// - Split-K (flash-decoding): the KV range is cut into partitions of
//   partition_size keys, page-aligned; partition_size 0 means no split (one
//   device function serves both, as vLLM's v1/v2): the CTA then writes the
//   normalised output; otherwise it writes its (m, d, o) state to the
//   workspace and paged_decode_combine merges the partitions.
// - K/V element types are policy structs (kernels/cuda/kv_codec.cuh):
//   address + load + convert to fp32 in registers, K and V each their own.
// Version 2 (this): the kernels of <= 4 rows capped at 128 registers for 4
// CTAs (16 warps) per SM instead of 3 (+6% at B=64, L=8192, +7% at B=256),
// and the automatic split prefers 1024-key partitions while they fill a
// quarter wave (B=1, L=32k: 61 vs 73 us).
// Version 3 (issue 7): templated on (K type, V type) among f16, bf16, q8_0,
// q4_0, fp8 (kernel in paged_attention.cuh, instantiations in inst/). The
// quantized pools keep the thread layout (8 values of a key row per thread,
// so q and o stay 2 x 8 x rows registers) with narrower loads (8 bytes for
// q8_0 / fp8, 4 for q4_0) plus one 2-byte scale load per key; the values are
// converted right after the load and the scale is applied once per key and
// row (on the partial dot for K, on the probability for V). With <= 2 rows
// a thread takes 8 keys per iteration instead of 4 to keep the bytes in
// flight up.
// Version 4 (issue 7): pools with a quantized K or V (q8_0, q4_0, fp8; the
// partner f16 or quantized) at head_dim 64, 128, 256 run on tensor cores
// (paged_decode_mma.cuh: mma.sync for QK and PV, 8 rows a CTA, the K/V
// bytes converted exactly to f16 fragments in registers, the block scales
// on the f32 accumulators of K and on P for V); version 3 stays for
// f16/f16, every bf16 pair and head_dim 32. RUNLM_PAGED_DECODE=simt keeps
// version 3 for every pair (comparisons).
// Version 5 (issue 7): version 4 with a software-pipelined key loop at
// head_dim 64 and 128 (a warp issues the raw loads of 16-key tiles 1 and 2
// ahead, in a register ring, before converting and multiplying a tile;
// paged_decode_mma.cuh); head_dim 256 stays on version 4.
// Version 6 (issue 7): the tensor-core kernel with the K/V bytes streamed
// by 16-byte cp.async (whole rows, 512 contiguous bytes a warp copy)
// through a per-warp 2-4 stage ring in shared memory, the fragments read
// from there (ldmatrix for K), 16 warps an SM (paged_decode_mma_v6.cuh);
// head_dim 64 and 128, version 4 at 256 (make_plan says so).
// Version 7 (issue 7): version 4's loop with the K and V bytes loaded as
// whole 16-byte chunks straight into registers (each sector requested
// once), in a fragment order that converts in place, the block scales
// folded into the f16 conversion (paged_decode_mma_v7.cuh); head_dim 64
// and 128 with K and V both quantized, version 4 for the others.
// Version 8: version 7's loads and conversions with version 5's register
// ring of 16-key tiles (2-4 stages: tiles in flight while a tile computes).
// Version 9: version 7 at 3 CTAs an SM (168 registers) where that does not
// spill. RUNLM_PAGED_DECODE_MMA=v4..v9 picks the version, tests switch it
// with paged_decode_set_mma_version. Unset (before version 12): version 9, the fastest measured
// at B=64, L=8192 (H100, session 6: q8_0 443 us against v4's 496, fp8 461
// against 490, q4_0 321 against 376); pairs with an f16 side and head_dim
// 256 run version 4 (mma_version_at).
// Version 10 (issue 6): tensor cores for the plain pools, K and V both f16
// or both bf16, head_dim 64 and 128 (paged_decode_mma_f16.cuh: version 7's
// 16-byte loads in fragment order, no conversion, ~7 warp instructions a
// key against the SIMT kernel's ~88). The default since session 7's
// measurement (default_f16_mma_mode: mma4 on sm_90+, mma before);
// RUNLM_PAGED_DECODE_F16=mma (16 keys a warp step, 3 CTAs an SM at hd 128),
// mma2 (32 keys, 2 CTAs) or mma4 (16 keys, 4 CTAs) forces a mode, simt the
// SIMT kernel (version 3), which every other head_dim and the mixed
// f16/bf16 pairs run; tests and benches switch it with
// paged_decode_set_f16_mma. RUNLM_PAGED_DECODE=simt turns it off too.
// Version 11 (issue 7, opt-in: RUNLM_PAGED_DECODE_MMA=v11, sm_90a): version
// 7's math with each 16-key tile's K/V bytes brought by TMA into a per-warp
// shared-memory ring of 3-4 stages (paged_decode_mma_v11.cuh), for K and V
// both q8_0 or fp8 at head_dim 128, block_size >= 16, n_kv_heads even; the
// other cases run what version 9 runs (mma_version_at). The host encodes 4
// tensor maps a launch (make_v11_maps). RUNLM_PAGED_DECODE_V11=s4c3
// (default: 4 stages, 3 CTAs an SM) or s3c4 (3 stages, 4 CTAs) picks the
// configuration.
// Version 12 (issue 7, the default since session 11, sm_90a): one CTA
// per (sequence, group of 8 KV heads, row chunk, partition), a producer warp
// bringing each 16-key tile of the 8 heads (whole 1 KB quant rows and the
// scale rows of a page) into a CTA-wide TMA ring, 8 consumer warps (one a
// head) computing it with version 11's math (paged_decode_mma_v12.cuh); K and
// V each q8_0, fp8 or q4_0, head_dim 128, block_size >= 16, n_kv_heads a
// multiple of 8; elsewhere what version 9 runs. RUNLM_PAGED_DECODE_V12=c1
// or c2 forces its CTAs an SM (v12_ctas), RUNLM_PAGED_DECODE_V12_TILES=1 or
// 2 its tiles a consumer step (v12_tiles_per_step). Measured at B=64 L=8192
// against f16's version 10 in the same run: q8_0 1.83x, fp8 1.84x, q4_0
// 3.08x (session 11; version 9: 1.62x, 1.64x, 2.25x); session 13's
// defaults (1 CTA, two tiles) on a slower lease 1.82x, 1.82x, 2.81x against
// 1.81x, 1.80x, 2.71x with session 11's; session 14's (one LOP3 a q4_0
// nibble pair, two QK chains, the lazy softmax max) 1.84x, 1.84x, 3.17x;
// NOTES.md "Decode v12".
#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cstdint>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/paged_attention.h"
#include "cuda/paged_decode_mma.cuh"
#include "cuda/paged_decode_mma_f16.cuh"
#include "cuda/paged_decode_mma_v11.cuh"
#include "cuda/paged_decode_mma_v12.cuh"
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
    p.out[rid * hd + e] = Ot / Dt;  // Dt = 0 (no key at all) cannot happen for a valid row
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

bool gpu_kv_type(KvType t) { return t == KvType::F16 || t == KvType::BF16 || kv_type_quantized(t); }

void check_params(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  for (KvType t : {kv.k_type, kv.v_type})
    RUNLM_CHECK(gpu_kv_type(t), "paged_decode_attention: kv type %s (K=%s V=%s) unsupported; supported: f16, bf16, "
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
  // version 6 computes offsets inside a page in 32 bits.
  RUNLM_CHECK(int64_t(kv.n_kv_heads) * hd * 2 * bs < (int64_t(1) << 31),
              "paged_decode_attention: n_kv_heads=%d x head_dim=%d x block_size=%d makes a page of 2 GiB or more",
              kv.n_kv_heads, hd, bs);
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

KernelFn pick_kernel(KvType k, KvType v, int hd, int r) {
  KernelFn fn = nullptr;
  switch (k) {
    case KvType::F16: fn = pick_kernel_kf16(v, hd, r); break;
    case KvType::BF16: fn = pick_kernel_kbf16(v, hd, r); break;
    case KvType::Q8_0: fn = pick_kernel_kq8_0(v, hd, r); break;
    case KvType::Q4_0: fn = pick_kernel_kq4_0(v, hd, r); break;
    case KvType::FP8: fn = pick_kernel_kfp8(v, hd, r); break;
    default: break;
  }
  RUNLM_CHECK(fn, "paged_decode_attention: no kernel for K=%s V=%s head_dim=%d", kv_type_name(k), kv_type_name(v),
              hd);
  return fn;
}

// The tensor-core kernel covers K and V in {f16, q8_0, q4_0, fp8} with at
// least one quantized, head_dim 64, 128, 256 (version 4 above).
bool mma_types(KvType k, KvType v, int hd) {
  auto in = [](KvType t) { return t == KvType::F16 || kv_type_quantized(t); };
  return in(k) && in(v) && (kv_type_quantized(k) || kv_type_quantized(v)) && (hd == 64 || hd == 128 || hd == 256);
}

// Version 10's pools: K and V both f16 or both bf16, head_dim 64 or 128
// (the SIMT kernel keeps 8, 16, 32, 256 and the mixed f16/bf16 pairs).
bool plain_mma_types(KvType k, KvType v, int hd) {
  return k == v && (k == KvType::F16 || k == KvType::BF16) && (hd == 64 || hd == 128);
}

// The index in names of environment variable `name`'s value, `unset` when
// it is unset or empty; any other value stops with an error listing names.
template <size_t N>
int env_choice(const char* name, const char* const (&names)[N], int unset) {
  const char* e = std::getenv(name);
  if (!e || !*e) return unset;
  std::string list;
  for (size_t i = 0; i < N; ++i) {
    if (std::strcmp(e, names[i]) == 0) return static_cast<int>(i);
    list += (i ? ", " : "") + std::string(names[i]);
  }
  fail("%s=%s unsupported; supported: %s", name, e, list.c_str());
}

bool mma_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("RUNLM_PAGED_DECODE");
    return !(e && std::strcmp(e, "simt") == 0);
  }();
  return on;
}

// The tensor-core kernel's version: 0 until RUNLM_PAGED_DECODE_MMA is read.
std::atomic<int> g_mma_version{0};

int mma_version() {
  int v = g_mma_version.load(std::memory_order_relaxed);
  if (v == 0) {
    const char* const names[] = {"v4", "v5", "v6", "v7", "v8", "v9", "v11", "v12"};
    const int i = env_choice("RUNLM_PAGED_DECODE_MMA", names, -1);
    v = i < 0 ? 12 : std::atoi(names[i] + 1);  // 12 where it applies; elsewhere version 9's choice (mma_version_at)
    g_mma_version.store(v, std::memory_order_relaxed);
  }
  return v;
}

// Version 10's mode: -1 until RUNLM_PAGED_DECODE_F16 is read; 0 off (the
// SIMT kernel), 1 mma, 2 mma2, 3 mma4 (pick_mma_plain_kernel).
std::atomic<int> g_f16_mode{-1};

// Unset: mma4 on sm_90 and newer, the fastest mode measured there or within
// 1% of it (H100, session 7, GB/s against the SIMT kernel: B=1 L=32768 2460
// vs 2111, B=8 L=32768 2934 vs 2885, B=64 L=8192 2942 vs 2915, B=256 L=8192
// 3020 vs 2979; mma 2482 at B=1 but 2686 at B=8). Older GPUs take mma (mma4
// spills 8-16 bytes for sm_80; neither is measured there).
int default_f16_mma_mode() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();  // no device: the SIMT kernel's launch reports it
    return 0;
  }
  return major >= 9 ? 3 : 1;
}

int f16_mma_mode() {
  int m = g_f16_mode.load(std::memory_order_relaxed);
  if (m < 0) {
    const char* const names[] = {"simt", "mma", "mma2", "mma4"};
    m = env_choice("RUNLM_PAGED_DECODE_F16", names, -1);
    if (m < 0) m = default_f16_mma_mode();
    g_f16_mode.store(m, std::memory_order_relaxed);
  }
  return m;
}

bool use_plain_mma(const PagedDecodeParams& p) {
  return mma_enabled() && f16_mma_mode() > 0 && plain_mma_types(p.kv.k_type, p.kv.v_type, p.kv.head_dim);
}

bool use_mma(const PagedDecodeParams& p) {
  return (mma_enabled() && mma_types(p.kv.k_type, p.kv.v_type, p.kv.head_dim)) || use_plain_mma(p);
}

// The version that runs for these types at this head_dim: 5 to 9 exist at
// 64 and 128 only, 7 to 9 only with K and V both quantized; elsewhere the
// chosen version runs as version 4 (same results contract; the tests and
// the bench report the version asked for).
// Version 11's configuration (MmaV11Config): RUNLM_PAGED_DECODE_V11=s4c3
// (0, the default) or s3c4 (1), read once.
int v11_config() {
  static const int c = [] {
    const char* const names[] = {"s4c3", "s3c4"};
    return env_choice("RUNLM_PAGED_DECODE_V11", names, 0);
  }();
  return c;
}

// Whether the current device runs sm_90a code (compute capability 9.0: the
// build's Hopper code is sm_90a only, version 11's TMA and mbarriers need
// it), cached per device; false without a device.
bool device_is_sm90() {
  struct Entry {
    int dev;
    bool yes;
  };
  static thread_local Entry cache[16];
  static thread_local int n_cache = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  for (int i = 0; i < n_cache; ++i)
    if (cache[i].dev == dev) return cache[i].yes;
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  if (!ok) cudaGetLastError();
  const bool yes = ok && major == 9 && minor == 0;
  if (n_cache < 16) cache[n_cache++] = {dev, yes};
  return yes;
}

// Version 11's cases (paged_decode_mma_v11.cuh): K and V both q8_0 or fp8,
// head_dim 128, pages of >= 16 slots (a 16-key tile is one TMA box of one
// page), an even n_kv_heads (scale rows of n_kv x 8 bytes: TMA wants the
// 16-byte multiples), 16-byte aligned pools, an sm_90 device.
bool v11_applies(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  auto is8 = [](KvType t) { return t == KvType::Q8_0 || t == KvType::FP8; };
  return is8(kv.k_type) && is8(kv.v_type) && kv.head_dim == 128 && kv.block_size >= 16 && kv.n_kv_heads % 2 == 0 &&
         reinterpret_cast<uintptr_t>(kv.k_pool) % 16 == 0 && reinterpret_cast<uintptr_t>(kv.v_pool) % 16 == 0 &&
         device_is_sm90();
}

// The CTAs an SM version 12's kernel is sized for: 1 (168 registers, the
// whole ring budget; 9 warps put 3 in a quarter of the register file, 3 x
// 168 x 32 <= 16384) or 2 (112 registers, half the ring). The 2-CTA kernel
// still runs 1 an SM: 18 warps put 5 in a quarter, 5 x 112 x 32 > 16384. In
// practice 2 means a shorter ring and a register cap: with one tile a step
// one lease measured it faster (B=64 L=8192: q4_0 233.7 us against 247.8),
// another within 1%; with two tiles a step (session 13) 2 spills 12-136
// bytes and 1 none, and 1 is the faster (same run: q4_0 254.9 us against
// 265.0, q8_0 394.2 / 403.7; NOTES "Decode v12"). Unset: 1;
// RUNLM_PAGED_DECODE_V12=c1 or c2 forces one (read once).
int v12_ctas() {
  static const int ctas = [] {
    const char* const names[] = {"c1", "c2"};
    return 1 + env_choice("RUNLM_PAGED_DECODE_V12", names, 0);
  }();
  return ctas;
}

// Version 12's ring depth: RUNLM_PAGED_DECODE_V12_STAGES=2..8 forces one
// (read once; measurements), 0 when unset (the kernel's default,
// MmaV12Stage::S).
int v12_stages_forced() {
  static const int n = [] {
    const char* e = std::getenv("RUNLM_PAGED_DECODE_V12_STAGES");
    if (!e || !*e) return 0;
    const int v = std::atoi(e);
    RUNLM_CHECK(v >= 2 && v <= 8, "RUNLM_PAGED_DECODE_V12_STAGES=%s unsupported; supported: 2..8", e);
    return v;
  }();
  return n;
}

// Version 12's tiles a consumer step (paged_decode_mma_v12.cuh):
// RUNLM_PAGED_DECODE_V12_TILES=1 or 2 forces one (read once; measurements);
// unset: 2 (both tiles' reads and QK products before either softmax).
int v12_tiles_per_step() {
  static const int n = [] {
    const char* const names[] = {"1", "2"};
    return 1 + env_choice("RUNLM_PAGED_DECODE_V12_TILES", names, 1);
  }();
  return n;
}

// Version 12's cases (paged_decode_mma_v12.cuh): K and V each q8_0, fp8 or
// q4_0, head_dim 128, pages of >= 16 slots, n_kv_heads a multiple of 8 (a
// CTA takes 8 heads), 16-byte aligned pools, an sm_90 device.
bool v12_applies(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  auto in = [](KvType t) { return t == KvType::Q8_0 || t == KvType::FP8 || t == KvType::Q4_0; };
  return in(kv.k_type) && in(kv.v_type) && kv.head_dim == 128 && kv.block_size >= 16 &&
         kv.n_kv_heads % kV12Heads == 0 && reinterpret_cast<uintptr_t>(kv.k_pool) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(kv.v_pool) % 16 == 0 && device_is_sm90();
}

// The version that runs for these params: 5 to 9 exist at head_dim 64 and
// 128 only, 7 to 9 only with K and V both quantized; elsewhere the chosen
// version runs as version 4 (same results contract; the tests and the bench
// report the version asked for). Version 11 runs where v11_applies, and
// everywhere else exactly what version 9 would run.
int mma_version_at(int version, const PagedDecodeParams& p) {
  const KvType k = p.kv.k_type, v = p.kv.v_type;
  if (version == 11) return v11_applies(p) ? 11 : mma_version_at(9, p);
  if (version == 12) return v12_applies(p) ? 12 : mma_version_at(9, p);
  if (p.kv.head_dim == 256) return 4;
  if (version >= 7 && (k == KvType::F16 || v == KvType::F16)) return 4;
  return version;
}

// A version 11 or 12 launch's tensor maps (MmaV11Maps) over one pool (K or
// V), heads_a_box 1 (version 11) or 8 (version 12): quants [pages]
// [block_size][n_kv x 128] u8 in 128-byte swizzled boxes of heads_a_box
// heads' rows x 16 slots (q4_0, version 12 only: 64-byte rows, no swizzle),
// scales [pages][block_size][n_kv x 4] f16 in boxes of 4 scales x 16 slots
// of 2 heads (version 11: the head pair kvh & ~1, kvh | 1, so boxes start
// 16-byte aligned) or 8 (version 12). The pool's page count is not in the
// params: the page dimension is the largest that keeps the mapped range
// under 2^48 bytes (coordinates come from valid table entries only; TMA
// wants dims <= 2^32).
void make_v11_maps(const void* pool, KvType type, int n_kv, int bs, int heads_a_box, const char* what,
                   CUtensorMap* quants, CUtensorMap* scales) {
  const int head_row = type == KvType::Q4_0 ? 64 : 128;  // a head's quant bytes of a slot (head_dim 128)
  const int64_t q_row = int64_t(n_kv) * head_row, s_row = int64_t(n_kv) * 8;
  const int64_t page = bs * (q_row + s_row);
  const int64_t pages = std::max<int64_t>(1, std::min<int64_t>(INT32_MAX, (int64_t(1) << 48) / page));
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  {
    // Version 11: 3-D {row bytes, slot, page}, a box = one head's 16 rows.
    // Version 12: 4-D {a head's row bytes, slot, head, page} with the head
    // dimension inside the slot one in memory (strides need not grow), so
    // one box = 8 heads x 16 rows, landing head-major in shared memory.
    const bool v12 = heads_a_box > 1;
    const int rank = v12 ? 4 : 3;
    const cuuint64_t dims3[3] = {cuuint64_t(q_row), cuuint64_t(bs), cuuint64_t(pages)};
    const cuuint64_t strides3[2] = {cuuint64_t(q_row), cuuint64_t(page)};
    const cuuint32_t box3[3] = {cuuint32_t(head_row), 16, 1};
    const cuuint64_t dims4[4] = {cuuint64_t(head_row), cuuint64_t(bs), cuuint64_t(n_kv), cuuint64_t(pages)};
    const cuuint64_t strides4[3] = {cuuint64_t(q_row), cuuint64_t(head_row), cuuint64_t(page)};
    const cuuint32_t box4[4] = {cuuint32_t(head_row), 16, cuuint32_t(heads_a_box), 1};
    // 8-bit rows in the 128-byte swizzle (versions 11, 12 read them so); q4_0's 64-byte rows (version 12) plain.
    const CUtensorMapSwizzle swz = head_row == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE;
    const CUresult e = encode_tiled_fn()(quants, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(pool),
                                         v12 ? dims4 : dims3, v12 ? strides4 : strides3, v12 ? box4 : box3, estr,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RUNLM_CHECK(e == CUDA_SUCCESS,
                "paged_decode_attention (versions 11, 12): cuTensorMapEncodeTiled(%s quants, n_kv_heads=%d block_size=%d) "
                "failed: CUresult %d",
                what, n_kv, bs, int(e));
  }
  {
    const cuuint64_t dims[3] = {cuuint64_t(n_kv) * 4, cuuint64_t(bs), cuuint64_t(pages)};
    const cuuint64_t strides[2] = {cuuint64_t(s_row), cuuint64_t(page)};
    const cuuint32_t box[3] = {cuuint32_t(heads_a_box == 1 ? 2 : heads_a_box) * 4, 16, 1};
    void* base = static_cast<uint8_t*>(const_cast<void*>(pool)) + bs * q_row;
    const CUresult e = encode_tiled_fn()(scales, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, base, dims, strides, box, estr,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    RUNLM_CHECK(e == CUDA_SUCCESS,
                "paged_decode_attention (versions 11, 12): cuTensorMapEncodeTiled(%s scales, n_kv_heads=%d block_size=%d) "
                "failed: CUresult %d",
                what, n_kv, bs, int(e));
  }
}

// The launch's 4 maps, kept per (pools, types, geometry) in a per-thread
// cache (a pool a layer; cleared past kMapCache entries, room for every
// layer of the models runlm runs): a batched step launches the decode once a layer
// outside any CUDA graph, and an engine's pools do not move, so each
// layer's maps are encoded once instead of 4 driver calls a launch. A map
// depends on nothing else (the page dimension comes from the geometry).
MmaV11Maps make_v11_maps(const PagedKvView& kv, int heads_a_box) {
  struct Entry {
    const void* k_pool;
    const void* v_pool;
    KvType k_type, v_type;
    int n_kv, bs, heads_a_box;
    MmaV11Maps maps;
  };
  constexpr size_t kMapCache = 160;
  static thread_local std::vector<Entry> cache;  // heap: only threads that launch pay for it
  for (const Entry& e : cache)
    if (e.k_pool == kv.k_pool && e.v_pool == kv.v_pool && e.k_type == kv.k_type && e.v_type == kv.v_type &&
        e.n_kv == kv.n_kv_heads && e.bs == kv.block_size && e.heads_a_box == heads_a_box)
      return e.maps;
  Entry e{kv.k_pool, kv.v_pool, kv.k_type, kv.v_type, kv.n_kv_heads, kv.block_size, heads_a_box, {}};
  make_v11_maps(kv.k_pool, kv.k_type, kv.n_kv_heads, kv.block_size, heads_a_box, "K", &e.maps.kq, &e.maps.ks);
  make_v11_maps(kv.v_pool, kv.v_type, kv.n_kv_heads, kv.block_size, heads_a_box, "V", &e.maps.vq, &e.maps.vs);
  if (cache.size() >= kMapCache) cache.clear();  // pools of many engines over a thread's life: start over
  cache.push_back(e);
  return e.maps;
}

// Sets the dynamic shared memory limit of a version 6, 11 or 12 kernel once per
// (device, kernel): not a stream operation, so legal during graph capture
// (as the occupancy query below). max_carveout (version 11, whose 3-4 CTAs
// an SM need 228-230 KB): the whole unified L1 / shared memory as shared.
void ensure_smem_attr(KernelFn fn, int smem_bytes, bool max_carveout = false) {
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
  if (max_carveout)
    cudaCheck(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  if (n_done < 64) done[n_done++] = {dev, fn};
}

KernelFn pick_mma_kernel(KvType k, KvType v, int hd, int version, int* smem_bytes) {
  KernelFn fn = nullptr;
  switch (k) {
    case KvType::F16: fn = pick_mma_kernel_kf16(v, hd, version, smem_bytes); break;
    case KvType::Q8_0: fn = pick_mma_kernel_kq8_0(v, hd, version, smem_bytes); break;
    case KvType::Q4_0: fn = pick_mma_kernel_kq4_0(v, hd, version, smem_bytes); break;
    case KvType::FP8: fn = pick_mma_kernel_kfp8(v, hd, version, smem_bytes); break;
    default: break;
  }
  RUNLM_CHECK(fn, "paged_decode_attention: no tensor-core kernel for K=%s V=%s head_dim=%d version=%d",
              kv_type_name(k), kv_type_name(v), hd, version);
  ensure_smem_attr(fn, *smem_bytes);
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
  KernelFn fn = nullptr;   // the kernel (for version 11: v11's address, for the attribute and occupancy queries)
  KernelV11Fn v11 = nullptr;  // version 11's kernel (its own parameter list: the tensor maps)
  KernelV12Fn v12 = nullptr;  // version 12's (the tensor maps and the ring's depth)
  int v12_stages = 0;
  int threads = kThreads;     // a CTA's
  int heads_per_cta = 1;      // KV heads a CTA (version 12: kV12Heads; grid y = n_kv_heads / this)
  int rows_per_cta = 1;
  int n_chunks = 1;
  int smem_bytes = 0;      // dynamic shared memory (version 6)
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

Plan make_plan(const PagedDecodeParams& p, int forced_partition) {
  Plan pl;
  const int group = p.n_heads / p.kv.n_kv_heads;
  const int rows = p.max_q_per_seq * group;
  if (use_plain_mma(p)) {
    pl.rows_per_cta = kMmaRows;
    pl.n_chunks = ceil_div(rows, kMmaRows);
    pl.fn = pick_mma_plain_kernel(p.kv.k_type, p.kv.head_dim, f16_mma_mode());
    RUNLM_CHECK(pl.fn, "paged_decode_attention: no version 10 kernel for K=%s V=%s head_dim=%d mode=%d",
                kv_type_name(p.kv.k_type), kv_type_name(p.kv.v_type), p.kv.head_dim, f16_mma_mode());
  } else if (use_mma(p)) {
    pl.rows_per_cta = kMmaRows;
    pl.n_chunks = ceil_div(rows, kMmaRows);
    const int version = mma_version_at(mma_version(), p);
    if (version == 11) {
      pl.v11 = pick_mma_v11_kernel(p.kv.k_type, p.kv.v_type, v11_config(), &pl.smem_bytes);
      RUNLM_CHECK(pl.v11, "paged_decode_attention: no version 11 kernel for K=%s V=%s", kv_type_name(p.kv.k_type),
                  kv_type_name(p.kv.v_type));
      pl.fn = reinterpret_cast<KernelFn>(pl.v11);  // never launched through this type
      ensure_smem_attr(pl.fn, pl.smem_bytes, true);
    } else if (version == 12) {
      int stage_bytes = 0;
      pl.v12 = pick_mma_v12_kernel(p.kv.k_type, p.kv.v_type, v12_ctas(), &pl.v12_stages, &stage_bytes);
      RUNLM_CHECK(pl.v12, "paged_decode_attention: no version 12 kernel for K=%s V=%s", kv_type_name(p.kv.k_type),
                  kv_type_name(p.kv.v_type));
      if (v12_stages_forced()) pl.v12_stages = v12_stages_forced();
      pl.smem_bytes = pl.v12_stages * stage_bytes + 16 * pl.v12_stages + 1024;  // MmaV12Stage::smem
      RUNLM_CHECK(pl.smem_bytes <= 227 * 1024,
                  "paged_decode_attention (version 12): %d stages of %d bytes do not fit a CTA's shared memory",
                  pl.v12_stages, stage_bytes);
      pl.threads = kV12Threads;
      pl.heads_per_cta = kV12Heads;
      pl.fn = reinterpret_cast<KernelFn>(pl.v12);  // never launched through this type
      ensure_smem_attr(pl.fn, pl.smem_bytes, true);
    } else {
      pl.fn = pick_mma_kernel(p.kv.k_type, p.kv.v_type, p.kv.head_dim, version, &pl.smem_bytes);
    }
  } else {
    pl.rows_per_cta = rows_per_cta(rows);
    pl.n_chunks = ceil_div(rows, pl.rows_per_cta);
    pl.fn = pick_kernel(p.kv.k_type, p.kv.v_type, p.kv.head_dim, pl.rows_per_cta);
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
    // balances nothing (measured at B=64 L=8192: f16 version 10 +1%, fp8 on
    // version 7 (2 CTAs an SM, 1.94 waves) +3.5% unsplit, while q8_0 / q4_0
    // on version 9 (3 CTAs, 1.29 waves) lose 7-10% unsplit). Lengths are
    // not known here; with very uneven ones a split would balance them, but
    // that is the same blind spot as the wave count above.
    const int64_t waves = base > 0 ? (base + conc - 1) / conc : 1;
    const bool fills_waves = base * 10 >= waves * conc * 9;
    if (pl.heads_per_cta > 1) {
      // Version 12 (a ring that fills once a CTA): the longest partitions
      // that still fit one wave (B=64 L=8192, sized for 2 CTAs an SM, which
      // run 1 an SM: 4096 keys, 128 CTAs: q8_0 392.2 us, q4_0
      // 233.7; 2048 keys, 256 CTAs: 397.2, 239.9).
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

int paged_decode_mma_version() { return mma_version(); }

void paged_decode_set_mma_version(int version) {
  RUNLM_CHECK((version >= 4 && version <= 9) || version == 11 || version == 12,
              "paged_decode_set_mma_version: version=%d unsupported; supported: 4, 5, 6, 7, 8, 9, 11, 12", version);
  g_mma_version.store(version, std::memory_order_relaxed);
}

int paged_decode_mma_version_for(const PagedDecodeParams& p) {
  check_params(p);
  if (use_plain_mma(p) || !use_mma(p)) return 0;
  return mma_version_at(mma_version(), p);
}

int paged_decode_f16_mma() { return f16_mma_mode(); }

void paged_decode_set_f16_mma(int mode) {
  RUNLM_CHECK(mode >= 0 && mode <= 3,
              "paged_decode_set_f16_mma: mode=%d unsupported; supported: 0 (simt), 1 (mma), 2 (mma2), 3 (mma4)", mode);
  g_f16_mode.store(mode, std::memory_order_relaxed);
}

bool paged_decode_uses_tensor_cores(const PagedDecodeParams& p) {
  check_params(p);
  return use_mma(p);
}

int paged_decode_auto_partition(const PagedDecodeParams& p) {
  check_params(p);
  return make_plan(p, -1).partition_size;
}

void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream) {
  paged_decode_attention(p, workspace, workspace_bytes, stream, -1);
}

void paged_decode_attention(const PagedDecodeParams& p, void* workspace, size_t workspace_bytes, void* stream,
                            int partition_size) {
  check_params(p);
  if (p.n_seqs == 0 || p.total_q == 0) return;
  const Plan pl = make_plan(p, partition_size);
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
  if (pl.v11) {
    const MmaV11Maps maps = make_v11_maps(p.kv, 1);
    pl.v11<<<grid, pl.threads, pl.smem_bytes, st>>>(p, maps, pl.partition_size, pl.n_chunks, ilog2(p.kv.block_size),
                                                 ws_o, ws_md, pl.n_parts);
  } else if (pl.v12) {
    const MmaV11Maps maps = make_v11_maps(p.kv, kV12Heads);
    pl.v12<<<grid, pl.threads, pl.smem_bytes, st>>>(p, maps, pl.partition_size, pl.n_chunks, ilog2(p.kv.block_size),
                                                 pl.v12_stages, pl.v12_stages >= 3 ? v12_tiles_per_step() : 1, ws_o,
                                                 ws_md, pl.n_parts);
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
