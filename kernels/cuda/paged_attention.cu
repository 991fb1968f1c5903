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
// - K/V element types are a policy struct (KvF16, KvBf16): address + 16-byte
//   load + convert to fp32 in registers; a quantized pool (issue 7) is one
//   more struct.
// Version 2 (this): the kernels of <= 4 rows capped at 128 registers for 4
// CTAs (16 warps) per SM instead of 3 (+6% at B=64, L=8192, +7% at B=256),
// and the automatic split prefers 1024-key partitions while they fill a
// quarter wave (B=1, L=32k: 61 vs 73 us).
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "cuda/attn_state.h"
#include "cuda/common.cuh"
#include "cuda/paged_attention.h"

namespace runlm {

namespace {

constexpr int kThreads = 128;       // 4 warps per partition CTA
constexpr int kWarps = kThreads / 32;
constexpr int kMaxRows = 8;         // query rows (tokens x heads of a group) per CTA
constexpr int kMinPartition = 256;   // smallest split: >= the largest page
constexpr int kLongPartition = 1024; // preferred split when it still fills the device (make_plan)
// The split never makes more than this many partitions per sequence over
// all (KV head, chunk) CTAs together; this bounds the workspace without
// knowing n_kv_heads (see parts_bound).
constexpr int kMaxSplitCtasPerBatch = 2048;
constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int kMaxHeadDim = 256;

// ------------------------------------------------------------ KV policies

// Read-only, streamed once: skip L1 (no reuse within an SM). (An L2::256B
// prefetch hint was measured: no change, see NOTES.md.)
__device__ __forceinline__ uint4 ldg_stream16(const void* ptr) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(ptr));
  return r;
}

// A KV policy: kVec elements per 16-byte load, the address of elements
// [elem, elem + kVec) of a slot's row (row_elems = n_kv_heads * head_dim),
// and the conversion to fp32.
struct KvF16 {
  static constexpr int kVec = 8;
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const void* pool, int64_t slot, int64_t row_elems, int elem) {
    return ldg_stream16(static_cast<const __half*>(pool) + slot * row_elems + elem);
  }
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[kVec]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

struct KvBf16 {
  static constexpr int kVec = 8;
  using Raw = uint4;
  __device__ __forceinline__ static Raw load(const void* pool, int64_t slot, int64_t row_elems, int elem) {
    return ldg_stream16(static_cast<const __nv_bfloat16*>(pool) + slot * row_elems + elem);
  }
  // bf16 is the top half of an fp32: a shift and a mask.
  __device__ __forceinline__ static void to_float(const Raw& r, float (&f)[kVec]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

// ------------------------------------------------------------ shared geometry

// What both kernels derive from a sequence's device-side lengths: the same
// function, so the partition kernel writes exactly the states the combine
// kernel reads.
struct SeqRange {
  int q0 = 0, n_q = 0, len = 0;
  int first = 0;    // first key any query of the sequence attends to
  int start = 0;    // first page-aligned position of the split grid
  int n_parts = 1;  // partitions with keys (1 when not split)
  bool ok = false;  // lengths within the host bounds
};

__device__ __forceinline__ SeqRange seq_range(const PagedDecodeParams& p, int s, int partition_size) {
  SeqRange r;
  r.q0 = p.cu_q[s];
  r.n_q = p.cu_q[s + 1] - r.q0;
  r.len = p.kv.seq_lens[s];
  r.ok = r.n_q >= 1 && r.n_q <= p.max_q_per_seq && r.q0 >= 0 && r.q0 + r.n_q <= p.total_q && r.len >= r.n_q &&
         r.len <= p.max_seq_len;
  if (!r.ok) return r;
  r.first = p.window > 0 ? max(0, r.len - r.n_q - p.window + 1) : 0;
  r.start = r.first & ~(p.kv.block_size - 1);  // whole pages before the window are skipped
  r.n_parts = partition_size > 0 ? (r.len - r.start + partition_size - 1) / partition_size : 1;
  return r;
}

// Writes NaN to every output row of a sequence whose lengths break the
// bounds, within [0, total_q) (the rows that exist). Done by one CTA.
__device__ void write_nan_rows(const PagedDecodeParams& p, int s) {
  const int q0 = p.cu_q[s], q1 = p.cu_q[s + 1];
  const int lo = max(q0, 0), hi = min(q1, p.total_q);
  const int64_t hd = p.kv.head_dim;
  for (int64_t i = int64_t(lo) * p.n_heads * hd + threadIdx.x; i < int64_t(hi) * p.n_heads * hd; i += blockDim.x)
    p.out[i] = NAN;
}

// ------------------------------------------------------------ partition kernel

// grid: x = partition * n_chunks + chunk, y = KV head, z = sequence.
// Workspace (split only): ws_o [total_q * n_heads][ws_parts][head_dim] and
// ws_md [total_q * n_heads][ws_parts][2] (m, d).
// Up to 4 query rows: at least 4 CTAs per SM (registers capped at 128, no
// spills): 16 warps instead of 12 measured +6% at B=64, L=8192 (NOTES.md).
template <typename KV, int HD, int R>
__global__ void __launch_bounds__(kThreads, R <= 4 ? 4 : 1)
    paged_decode_kernel(const __grid_constant__ PagedDecodeParams p, int partition_size, int n_chunks, int bs_shift,
                        float* __restrict__ ws_o, float* __restrict__ ws_md, int ws_parts) {
  static_assert(HD % KV::kVec == 0, "head_dim must be a multiple of the policy's vector");
  constexpr int kVec = KV::kVec;
  constexpr int kBdx = HD / kVec;                 // threads per key row
  static_assert(kBdx >= 1 && kBdx <= 32 && (kBdx & (kBdx - 1)) == 0, "kBdx must be a power of two <= 32");
  constexpr int kLanes = kThreads / kBdx;         // key lanes per CTA
  constexpr int kUnroll = R >= 8 ? 2 : 4;         // keys per lane per iteration (registers bound it at R = 8)
  constexpr int kKeysPerIter = kLanes * kUnroll;

  __shared__ float s_m[kWarps][R], s_d[kWarps][R];
  __shared__ float s_o[kWarps][R][HD];

  const int chunk = blockIdx.x % n_chunks, part = blockIdx.x / n_chunks;
  const int kvh = blockIdx.y, s = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tx = threadIdx.x % kBdx, g = threadIdx.x / kBdx;
  const PagedKvView& kv = p.kv;
  const int group = p.n_heads / kv.n_kv_heads;

  const SeqRange sr = seq_range(p, s, partition_size);
  if (!sr.ok) {
    if (partition_size == 0 && chunk == 0 && kvh == 0) write_nan_rows(p, s);  // split: the combine writes them
    return;
  }
  const int rows = sr.n_q * group;
  if (chunk * R >= rows || part >= sr.n_parts) return;

  // This CTA's keys: its partition, clipped to what its rows attend to.
  int k_begin = sr.first, k_end = sr.len;
  if (partition_size > 0) {
    k_begin = max(k_begin, sr.start + part * partition_size);
    k_end = min(k_end, sr.start + (part + 1) * partition_size);
  }

  // Rows: rho = chunk * R + r -> token i = rho / group, head kvh * group + rho % group.
  float q[R][kVec];
  int pos[R], lo[R];
  const float qscale = p.scale * kLog2e;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int rho = chunk * R + r;
    const bool valid = rho < rows;
    const int i = valid ? rho / group : 0;
    const int h = kvh * group + (valid ? rho % group : 0);
    pos[r] = valid ? sr.len - sr.n_q + i : -1;  // -1: every key masked
    lo[r] = p.window > 0 ? max(0, pos[r] - p.window + 1) : 0;
    const float* qp = p.q + (int64_t(sr.q0 + i) * p.n_heads + h) * HD + tx * kVec;
#pragma unroll
    for (int v = 0; v < kVec; v += 4) {
      const float4 x = valid ? *reinterpret_cast<const float4*>(qp + v) : make_float4(0, 0, 0, 0);
      q[r][v] = x.x * qscale;
      q[r][v + 1] = x.y * qscale;
      q[r][v + 2] = x.z * qscale;
      q[r][v + 3] = x.w * qscale;
    }
  }

  // Keys every valid row of the CTA attends to: [lo_max, hi_min), clipped to
  // the CTA's range; iterations inside it need no mask.
  int lo_max = k_begin, hi_min = k_end;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (pos[r] >= 0) {
      lo_max = max(lo_max, lo[r]);
      hi_min = min(hi_min, pos[r] + 1);
    }

  float m[R], d[R], o[R][kVec];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    d[r] = 0.0f;
#pragma unroll
    for (int v = 0; v < kVec; ++v) o[r][v] = 0.0f;
  }

  const int32_t* table = kv.block_tables + int64_t(s) * kv.max_blocks_per_seq;
  const int bs_mask = kv.block_size - 1;
  const int64_t row_elems = int64_t(kv.n_kv_heads) * HD;
  const int elem = kvh * HD + tx * kVec;
  // Keys past k_end load the last valid key (a real row) and are masked.
  auto slot_of = [&](int key) -> int64_t {
    const int kc = min(key, k_end - 1);
    return int64_t(__ldg(table + (kc >> bs_shift))) << bs_shift | (kc & bs_mask);
  };

  int64_t slot[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) slot[u] = slot_of(k_begin + u * kLanes + g);

  for (int base = k_begin; base < k_end; base += kKeysPerIter) {
    typename KV::Raw kr[kUnroll], vr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      kr[u] = KV::load(kv.k_pool, slot[u], row_elems, elem);
      vr[u] = KV::load(kv.v_pool, slot[u], row_elems, elem);
    }
    // Next iteration's page indices, in flight together with this one's K/V.
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) slot[u] = slot_of(base + kKeysPerIter + u * kLanes + g);

    float sc[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[kVec];
      KV::to_float(kr[u], kf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int v = 0; v < kVec; ++v) acc = fmaf(q[r][v], kf[v], acc);
        sc[u][r] = acc;
      }
    }
    // Sum over the kBdx lanes of a key: the xor butterfly leaves the same
    // sum in each of them (a + b == b + a exactly at every step).
#pragma unroll
    for (int off = kBdx / 2; off > 0; off >>= 1)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) sc[u][r] += __shfl_xor_sync(0xffffffffu, sc[u][r], off);

    // Masks only where some key of the iteration is outside a row's range
    // (a CTA-uniform branch: the edges of the range, windows, causal tails).
    if (base < lo_max || base + kKeysPerIter > hi_min) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int key = base + u * kLanes + g;
          if (!(key < k_end && key >= lo[r] && key <= pos[r])) sc[u][r] = -INFINITY;
        }
    }
    // Online softmax: one max update per row per iteration.
    float corr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mx = m[r];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, sc[u][r]);
      const float ms = mx == -INFINITY ? 0.0f : mx;  // nothing live yet: keep exp2 away from -inf - -inf
      corr[r] = fast_exp2(m[r] - ms);                // m = -inf: 0 (d and o are 0 then anyway)
      m[r] = mx;
      d[r] *= corr[r];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        sc[u][r] = fast_exp2(sc[u][r] - ms);  // masked: 2^-inf = 0
        d[r] += sc[u][r];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int v = 0; v < kVec; ++v) o[r][v] *= corr[r];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float vf[kVec];
      KV::to_float(vr[u], vf);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int v = 0; v < kVec; ++v) o[r][v] = fmaf(sc[u][r], vf[v], o[r][v]);
    }
  }

  // Merge the key lanes of a warp (lanes kBdx apart hold the same elements).
#pragma unroll
  for (int off = kBdx; off < 32; off <<= 1) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float m_b = __shfl_xor_sync(0xffffffffu, m[r], off);
      const float d_b = __shfl_xor_sync(0xffffffffu, d[r], off);
      float sa, sb;
      attn_state_merge(m[r], d[r], m_b, d_b, sa, sb);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float o_b = __shfl_xor_sync(0xffffffffu, o[r][v], off);
        o[r][v] = o[r][v] * sa + o_b * sb;
      }
    }
  }
  if (lane < kBdx) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) s_o[warp][r][tx * kVec + v] = o[r][v];
      if (tx == 0) {
        s_m[warp][r] = m[r];
        s_d[warp][r] = d[r];
      }
    }
  }
  __syncthreads();  // every warp's state is in shared memory before the cross-warp merge

  const int n_rows = min(R, rows - chunk * R);
  for (int idx = threadIdx.x; idx < n_rows * HD; idx += kThreads) {
    const int r = idx / HD, e = idx % HD;
    float M = -INFINITY, D = 0.0f, O = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      float sa, sb;
      attn_state_merge(M, D, s_m[w][r], s_d[w][r], sa, sb);
      O = O * sa + s_o[w][r][e] * sb;
    }
    // Row r's global index, recomputed (the register array needs a constant index).
    const int rho = chunk * R + r;
    const int64_t rid = int64_t(sr.q0 + rho / group) * p.n_heads + kvh * group + rho % group;
    if (partition_size == 0) {
      p.out[rid * HD + e] = O / D;  // D > 0: a valid row attends at least to its own position
    } else {
      const int64_t at = rid * ws_parts + part;
      ws_o[at * HD + e] = O;
      if (e == 0) {
        ws_md[at * 2] = M;
        ws_md[at * 2 + 1] = D;
      }
    }
  }
}

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

void check_params(const PagedDecodeParams& p) {
  const PagedKvView& kv = p.kv;
  RUNLM_CHECK(kv.kv_type == DType::F16 || kv.kv_type == DType::BF16,
              "paged_decode_attention: kv type %s unsupported; supported: f16, bf16", dtype_name(kv.kv_type));
  const int hd = kv.head_dim;
  RUNLM_CHECK(hd == 8 || hd == 16 || hd == 32 || hd == 64 || hd == 128 || hd == 256,
              "paged_decode_attention: head_dim=%d unsupported; supported: 8, 16, 32, 64, 128, 256", hd);
  const int bs = kv.block_size;
  RUNLM_CHECK(bs >= 8 && bs <= 256 && (bs & (bs - 1)) == 0,
              "paged_decode_attention: block_size=%d unsupported; supported: powers of two in 8..256", bs);
  RUNLM_CHECK(p.n_heads > 0 && kv.n_kv_heads > 0 && p.n_heads % kv.n_kv_heads == 0,
              "paged_decode_attention: n_heads=%d not a positive multiple of n_kv_heads=%d", p.n_heads,
              kv.n_kv_heads);
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

using KernelFn = void (*)(const PagedDecodeParams, int, int, int, float*, float*, int);

template <typename KV, int HD>
KernelFn pick_rows(int r) {
  switch (r) {
    case 1: return paged_decode_kernel<KV, HD, 1>;
    case 2: return paged_decode_kernel<KV, HD, 2>;
    case 4: return paged_decode_kernel<KV, HD, 4>;
    default: return paged_decode_kernel<KV, HD, 8>;
  }
}

template <typename KV>
KernelFn pick_hd(int hd, int r) {
  switch (hd) {
    case 8: return pick_rows<KV, 8>(r);
    case 16: return pick_rows<KV, 16>(r);
    case 32: return pick_rows<KV, 32>(r);
    case 64: return pick_rows<KV, 64>(r);
    case 128: return pick_rows<KV, 128>(r);
    default: return pick_rows<KV, 256>(r);
  }
}

KernelFn pick_kernel(DType t, int hd, int r) {
  return t == DType::BF16 ? pick_hd<KvBf16>(hd, r) : pick_hd<KvF16>(hd, r);
}

// Resident CTAs the device can hold of this kernel (SMs x occupancy), cached
// per (device, kernel): the queries enqueue nothing, so they are legal while
// a stream is being captured, but they are not free.
int device_concurrency(KernelFn fn) {
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
  cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, 0));
  const int ctas = std::max(1, sms * std::max(1, per_sm));
  if (n_cache < 16) cache[n_cache++] = {dev, fn, ctas};
  return ctas;
}

struct Plan {
  KernelFn fn = nullptr;
  int rows_per_cta = 1;
  int n_chunks = 1;
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
  pl.rows_per_cta = rows_per_cta(rows);
  pl.n_chunks = ceil_div(rows, pl.rows_per_cta);
  pl.fn = pick_kernel(p.kv.kv_type, p.kv.head_dim, pl.rows_per_cta);
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
    const int64_t base = int64_t(p.n_seqs) * p.kv.n_kv_heads * pl.n_chunks;
    const int64_t conc = device_concurrency(pl.fn);
    const int64_t want = base > 0 ? (2 * conc + base - 1) / base : 1;
    if (want > 1) {
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
  const dim3 grid(static_cast<unsigned>(pl.n_parts * pl.n_chunks), static_cast<unsigned>(p.kv.n_kv_heads),
                  static_cast<unsigned>(p.n_seqs));
  pl.fn<<<grid, kThreads, 0, st>>>(p, pl.partition_size, pl.n_chunks, ilog2(p.kv.block_size), ws_o, ws_md,
                                   pl.n_parts);
  cudaCheckLaunch();
  if (pl.partition_size > 0) {
    const dim3 cgrid(static_cast<unsigned>(p.max_q_per_seq * p.n_heads), static_cast<unsigned>(p.n_seqs));
    paged_decode_combine<<<cgrid, kCombineThreads, 0, st>>>(p, pl.partition_size, ws_o, ws_md, pl.n_parts);
    cudaCheckLaunch();
  }
}

}  // namespace runlm
