// attn_fa2: FlashAttention-2 forward on mma.sync tensor cores (sm_80+).
// One CTA per (query tile of BM rows, head, sequence); its warps split the
// rows (16 * kMT each). K/V tiles of BN keys stream through a 2-stage
// cp.async ring; scores stay in registers, the softmax is online (running max
// and sum per row, base 2), normalisation is deferred to the end, and the
// log-sum-exp is written for each row.
// Q is re-read from shared memory by ldmatrix each k-step (keeps registers
// for O and S); output goes out by direct 4-byte stores.
// 32 rows a warp (d64/d128) as FA2, ex2.approx with one scale per row max,
// ldmatrix addresses from per-thread XOR offsets and P packed per k16 step
// (which keep d128 within the register limit), and a lazy rescale of O.
// Paged K/V (attention.h; Fa2Mode::kPaged, a separate instantiation so the
// contiguous kernel is unchanged): the cp.async tile loads find each key
// row's pool slot through the sequence's block table; nothing else differs.
// Typed pools (Fa2Mode::kTyped, dtype f16 only): K and V each of
// f16, bf16, q8_0, fp8 or q4_0, chosen at run time (one instantiation per
// head dim, a uniform switch in the conversion step instead of
// 25 type pairs of templates). The ring stages hold a tile's raw page bytes
// (quants, then the rows' f16 scales), cp.async'd through the table as in
// kPaged; after the stage lands, every thread decodes its chunks (kv_codec's
// register decoders, value * scale in fp32, rounded once to f16: bit for bit
// what gather_kv writes) into one f16 tile per operand in the swizzled
// layout ldmatrix reads, and one more barrier publishes it. bf16 converts in
// place (same size); f16 is read from the stage as in kPaged. fa3 keeps
// reading typed pools through gather_kv: its TMA copies raw tiles.
// Soft-cap (AttnParams::softcap > 0): a separate instantiation (kSoftcap)
// caps each tile's raw scores (softcap_tanh) before the mask; every mode,
// head dim, window and KV type the kernel runs takes it.
// Sinks (AttnParams::sinks): likewise an instantiation of their own
// (kSinks), which joins the head's sink to each row's final state in the
// epilogue (attn_state_add_sink); the main loop is unchanged.
#include <cfloat>
#include <cstdlib>
#include <type_traits>

#include "cuda/attn_kernels.h"
#include "cuda/attn_softcap.cuh"
#include "cuda/attn_state.h"
#include "cuda/common.cuh"
#include "cuda/kv_codec.cuh"
#include "cuda/mma_sm80.cuh"
#include "paged_kv.h"

namespace runlm {

namespace {

struct Fa2Args {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const int32_t* cu_q;
  const int32_t* cu_k;
  int total_q, n_heads, n_kv_heads, window_left;
  bool causal;
  float scale_log2;  // softmax scale * log2(e); 1 under soft-cap (the capped scores are already in base 2)
  float cap_in, cap_out;  // soft-cap only: s -> cap_out * tanh(s * cap_in), scale / cap and cap * log2(e)
  const int32_t* block_tables;  // paged only: [batch, max_blocks_per_seq]
  int max_blocks_per_seq;
  int log2_bs;                  // paged only: log2(block_size)
  int n_m_blocks, n_hb;         // query blocks of the longest sequence; (head, sequence) pairs
  int order;                    // Fa2Order: which query block(s), head and sequence a CTA takes
  const float* sinks;           // kSinks only: [n_heads] sink logits
};

// CTA -> (query block(s), head, sequence). Under causal masking a query
// block's cost grows with its index (block m sees m + 1 key tiles of BM), so
// the order decides how even the last wave is (docs/kernels.md).
//   kHead: (head, sequence) slowest, heaviest block first inside it.
//     Keeps one head's K/V hot in L2, but every head's heavy blocks queue
//     behind the previous head's light ones: the last head's heaviest block
//     starts near the end and runs alone (~11% tail at 8k causal, d128).
//   kLpt: query block slowest, heaviest first over all heads (longest
//     processing time first: greedy dispatch of a sorted list). Best
//     balance; the resident CTAs then span every head, K/V beyond L2.
//   kPair: one CTA runs block nm-1-i, then block i, of one head: every CTA
//     costs nm + 1 tiles, head-major order kept for L2.
enum Fa2Order : int { kFa2OrderHead = 0, kFa2OrderLpt = 1, kFa2OrderPair = 2 };

// Typed pools only (Fa2Mode::kTyped): the pools' types and layouts, and
// where each operand's ring stages and f16 tile sit in shared memory (byte
// offsets from the start; fa2_typed_smem). A struct of its own so that the
// other kernels' parameters (and machine code) stay as they were.
struct Fa2TypedArgs : Fa2Args {
  KvType k_type, v_type;
  KvPoolLayout lk, lv;
  uint32_t k_ring, k_stage, k_tile, v_ring, v_stage, v_tile;
};

// Contiguous K/V, paged pools in the dtype, typed paged pools (see the top).
enum class Fa2Mode { kContig, kPaged, kTyped };
template <Fa2Mode M>
using Fa2ArgsOf = std::conditional_t<M == Fa2Mode::kTyped, Fa2TypedArgs, Fa2Args>;

// Tile shape per head dim: kWarps warps of 16*kMT rows each, BN keys a
// tile. d64/d128: 32 rows a warp, half the shared-memory reads of K/V per
// FLOP of 16 rows, at the register limit (measured on H100, d128 16k: 291
// vs 247 TFLOP/s for 16 rows a warp).
template <int D>
struct Fa2Traits;
template <>
struct Fa2Traits<64> {
  static constexpr int kWarps = 4, kMT = 2, kBN = 64, kMinBlocks = 2;
};
template <>
struct Fa2Traits<128> {
  static constexpr int kWarps = 4, kMT = 2, kBN = 64, kMinBlocks = 2;
};
template <>
struct Fa2Traits<256> {
  static constexpr int kWarps = 8, kMT = 1, kBN = 64, kMinBlocks = 1;
};

// Lazy rescale: the running max m of a row moves only when a tile's max
// exceeds it by more than kFa2RescaleLog2 (base 2), as FlashAttention-4
// does. Otherwise P = 2^(s - m) may reach 2^8 (fine in bf16/f16 and in the
// fp32 O and l, which share the stale m, so O / l and the LSE m + log2 l are
// unchanged), and the warp skips the 4 * kMT * kDT multiplies of O and the
// exp2 of the correction: one vote a tile (rescaling every tile costs 128
// FMUL a thread at d128, on the path from the softmax to the first P V mma).
constexpr float kFa2RescaleLog2 = 8.0f;

template <int D>
constexpr int fa2_bm() {
  return Fa2Traits<D>::kWarps * 16 * Fa2Traits<D>::kMT;
}
template <int D>
constexpr size_t fa2_smem_bytes() {
  return size_t(fa2_bm<D>() + 4 * Fa2Traits<D>::kBN) * D * 2;  // Q + 2 stages of K and V
}

// Copies rows [0, rows) of a [R][D] tile from global (row stride in elements)
// into swizzled shared memory; rows >= valid are zero-filled.
template <int D, int R, int kThreads, typename T>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* src, int64_t stride, int valid) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int row = idx / kChunks, ch = idx % kChunks;
    const bool ok = row < valid;
    const T* s = ok ? src + row * stride + ch * 8 : src;
    cp_async_16(dst + swz_offset<D>(row, ch), s, ok ? 16 : 0);
  }
}

// load_tile for paged K/V: row r of the tile is the sequence's key n0 + r, at
// pool slot table[(n0 + r) >> log2_bs] * block_size + ((n0 + r) & (block_size - 1)),
// src is the pool's slot 0 (this kv head), stride its row length. Rows >=
// valid (past the sequence's last key) are zero-filled and their table
// entries never read: the tail of the last page may hold anything, and P = 0
// times a NaN there would still be NaN. Rows whose page is -1 (released by
// the sliding window: no query sees them) are zero-filled too. Every thread
// copies the same chunk column ch of rows r0, r0 + kRowStep, ...; called once
// for K and once for V (the second reads the same table entries from L1).
// Interleaving K and V per row, one table read a thread per tile plus
// shuffles, or 32-bit offsets all spilled as much or more at d128 (ptxas,
// docs/kernels.md).
template <int D, int R, int kThreads, typename T>
__device__ __forceinline__ void load_tile_paged(uint32_t dst, const T* src, int stride, const int32_t* table,
                                                int log2_bs, int n0, int valid) {
  constexpr int kChunks = D / 8;
  constexpr int kIters = R * kChunks / kThreads, kRowStep = kThreads / kChunks;
  static_assert(R * kChunks % kThreads == 0 && kThreads % kChunks == 0, "chunks split evenly over the threads");
  const int ch = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int row = r0 + i * kRowStep;
    const T* s = src;
    int bytes = 0;
    if (row < valid) {
      const int j = n0 + row;
      const int page = __ldg(table + (j >> log2_bs));
      if (page >= 0) {
        s = src + (int64_t((page << log2_bs) | (j & ((1 << log2_bs) - 1))) * stride + ch * 8);
        bytes = 16;
      }
    }
    cp_async_16(dst + swz_offset<D>(row, ch), s, bytes);
  }
}

// 4/8/16-byte global -> shared copy (scale rows: head_dim / 16 bytes);
// src_bytes = 0 writes zeros.
template <int N>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src, int src_bytes) {
  if constexpr (N == 16)
    cp_async_16(dst, src, src_bytes);
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(src_bytes));
}

// Raw bytes of an R-row tile of a typed pool (type t, layout l) into a ring
// stage at dst. f16 / bf16: the swizzled [R][D] tile of load_tile_paged.
// q8_0 / fp8 / q4_0: quants [R][D * bits / 8] row after row, then scales
// [R][D / 32] f16. Rows past the last key and rows of released pages (-1)
// are zero-filled, quants and scales: they decode to +-0, never NaN.
template <int D, int R, int kThreads>
__device__ __forceinline__ void load_tile_typed(uint32_t dst, const uint8_t* pool, KvType t, const KvPoolLayout& l,
                                                int kvh, const int32_t* table, int log2_bs, int n0, int valid) {
  if (!kv_type_quantized(t)) {
    load_tile_paged<D, R, kThreads>(dst, reinterpret_cast<const __half*>(pool) + kvh * D, int(l.q_row / 2), table,
                                    log2_bs, n0, valid);
    return;
  }
  const int bs_mask = (1 << log2_bs) - 1;
  // Chunks of 16 quant bytes a row: D / 16 (q8_0, fp8) or D / 32 (q4_0).
  const int log2_qch = t == KvType::Q4_0 ? __ffs(D / 32) - 1 : __ffs(D / 16) - 1;
  const int qbytes = 16 << log2_qch;
  const uint8_t* quants = pool + int64_t(kvh) * qbytes;
  const uint8_t* scales = pool + int64_t(l.block_size) * l.q_row + kvh * (D / 16);
  for (int idx = threadIdx.x; idx < (R << log2_qch); idx += kThreads) {
    const int row = idx >> log2_qch, c = idx & ((1 << log2_qch) - 1);
    const void* s = pool;
    int bytes = 0;
    if (row < valid) {
      const int j = n0 + row;
      const int page = __ldg(table + (j >> log2_bs));
      if (page >= 0) {
        s = quants + page * l.page + (j & bs_mask) * l.q_row + c * 16;
        bytes = 16;
      }
    }
    cp_async_16(dst + row * qbytes + c * 16, s, bytes);
  }
  for (int row = threadIdx.x; row < R; row += kThreads) {
    const void* s = pool;
    int bytes = 0;
    if (row < valid) {
      const int j = n0 + row;
      const int page = __ldg(table + (j >> log2_bs));
      if (page >= 0) {
        s = scales + page * l.page + (j & bs_mask) * l.s_row;
        bytes = D / 16;
      }
    }
    cp_async_small<D / 16>(dst + R * qbytes + row * (D / 16), s, bytes);
  }
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 8 values, a scale, into one 16-byte chunk of f16: value * d in fp32 (exact:
// a small integer or an e4m3 value times an f16), rounded once to f16, as
// gather_kv does (kv_decode_elem then __float2half_rn).
__device__ __forceinline__ uint4 pack_chunk(const float (&f)[8], float d) {
  return make_uint4(pack_half2(f[0] * d, f[1] * d), pack_half2(f[2] * d, f[3] * d), pack_half2(f[4] * d, f[5] * d),
                    pack_half2(f[6] * d, f[7] * d));
}

// Decodes the ring stage at raw (load_tile_typed's layout for type t) into
// the swizzled f16 [R][D] tile at tile; bf16 in place (tile == raw). A
// thread takes 16-byte output chunks (row, ch): elements 8ch..8ch+7 of a
// row, all in block ch / 4. t is uniform over the CTA: one branch, then a
// loop without any. smem: the generic pointer of the dynamic shared memory.
template <int D, int R, int kThreads>
__device__ __forceinline__ void convert_tile(uint8_t* smem, uint32_t raw, uint32_t tile, KvType t) {
  constexpr int kChunks = D / 8, kIters = R * kChunks / kThreads;
  static_assert(R * kChunks % kThreads == 0, "chunks split evenly over the threads");
  const uint16_t* sc = reinterpret_cast<const uint16_t*>(smem + raw + R * (t == KvType::Q4_0 ? D / 2 : D));
  auto scale = [&](int row, int ch) { return __half2float(__ushort_as_half(sc[row * (D / 32) + ch / 4])); };
  if (t == KvType::BF16) {
#pragma unroll 4
    for (int i = 0; i < kIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / kChunks, ch = idx % kChunks;
      uint4* p = reinterpret_cast<uint4*>(smem + raw + swz_offset<D>(row, ch));
      float f[8];
      KvBf16::to_float(*p, f);
      *p = pack_chunk(f, 1.0f);
    }
  } else if (t == KvType::Q4_0) {
#pragma unroll 4
    for (int i = 0; i < kIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / kChunks, ch = idx % kChunks;
      // Block ch / 4, elements e0..e0+7 (e0 = 8 (ch % 4)): the low nibbles
      // of bytes e0..e0+7 for e0 < 16, else the high ones of bytes e0-16...
      const uint2 w = *reinterpret_cast<const uint2*>(smem + raw + row * (D / 2) + (ch / 4) * 16 + (ch & 1) * 8);
      const int sh = (ch & 2) * 2;
      constexpr float kMagic = 8388608.0f + 8.0f;
      const uint32_t nib[2] = {(w.x >> sh) & 0x0F0F0F0Fu, (w.y >> sh) & 0x0F0F0F0Fu};
      float f[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = __uint_as_float(__byte_perm(nib[e / 4], 0x4B00u, 0x5440u | (e % 4))) - kMagic;
      *reinterpret_cast<uint4*>(smem + tile + swz_offset<D>(row, ch)) = pack_chunk(f, scale(row, ch));
    }
  } else {
#pragma unroll 4
    for (int i = 0; i < kIters; ++i) {
      const int idx = threadIdx.x + i * kThreads, row = idx / kChunks, ch = idx % kChunks;
      const uint2 w = *reinterpret_cast<const uint2*>(smem + raw + row * D + ch * 8);
      float f[8];
      if (t == KvType::Q8_0)
        KvQ8::to_float(w, f);
      else
        KvFp8::to_float(w, f);
      *reinterpret_cast<uint4*>(smem + tile + swz_offset<D>(row, ch)) = pack_chunk(f, scale(row, ch));
    }
  }
}

// The (head, sequence) pair of this CTA: n_heads * sequence + head.
__device__ __forceinline__ int fa2_hb(const Fa2Args& a) {
  const int unit = blockIdx.x;
  if (a.order == kFa2OrderLpt) return unit % a.n_hb;
  if (a.order == kFa2OrderPair) return unit / ((a.n_m_blocks + 1) / 2);
  return unit / a.n_m_blocks;
}

// The query block of this CTA's pass (0, or 1 under kPair), -1 for none.
// kPair: CTA i of a pair takes blocks nm - 1 - i and i of its sequence (nm
// of its own length: a shorter sequence's CTAs with 2i >= nm have none).
template <int BM, bool kAllowPair>
__device__ __forceinline__ int fa2_m_block(const Fa2Args& a, int pass, int sq) {
  const int unit = blockIdx.x;
  if (a.order == kFa2OrderLpt) return pass == 0 ? a.n_m_blocks - 1 - unit / a.n_hb : -1;
  if (kAllowPair && a.order == kFa2OrderPair) {
    const int i = unit % ((a.n_m_blocks + 1) / 2), nm = ceil_div(sq, BM);
    if (2 * i >= nm) return -1;
    return pass == 0 ? nm - 1 - i : (2 * i + 1 < nm ? i : -1);
  }
  return pass == 0 ? a.n_m_blocks - 1 - unit % a.n_m_blocks : -1;
}

// Softmax pieces (per half row hr of an m-tile: this lane's scores s[nt][2 hr], s[nt][2 hr + 1]).
// The row's raw maximum over the tile: the lane's, then its 4-lane quad's.
template <int kNT>
__device__ __forceinline__ float tile_row_max(const float (&s)[kNT][4], int hr) {
  float mx = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][hr * 2], s[nt][hr * 2 + 1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}

// p = 2^(s * scale_log2 - m_use) in place; returns the lane's part of the row sum.
template <int kNT>
__device__ __forceinline__ float exp_row(float (&s)[kNT][4], int hr, float scale_log2, float m_use) {
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const float p0 = fast_exp2(fmaf(s[nt][hr * 2], scale_log2, -m_use));
    const float p1 = fast_exp2(fmaf(s[nt][hr * 2 + 1], scale_log2, -m_use));
    s[nt][hr * 2] = p0;
    s[nt][hr * 2 + 1] = p1;
    sum += p0 + p1;
  }
  return sum;
}

// kSoftcap: the attention logit soft-cap (attention.h) is a template switch
// so that the kernels without it compile as before: d128 runs at the
// register limit, where any change to the loop moves ptxas's spills. kSinks
// (attention sinks) is one for the same reason.
template <typename T, int D, Fa2Mode kMode, bool kSoftcap, bool kSinks>
__global__ void __launch_bounds__(Fa2Traits<D>::kWarps * 32, Fa2Traits<D>::kMinBlocks)
    attn_fa2_fwd(Fa2ArgsOf<kMode> a) {
  constexpr bool kPaged = kMode != Fa2Mode::kContig, kTyped = kMode == Fa2Mode::kTyped;
  using Tr = ElemTraits<T>;
  constexpr int kWarps = Fa2Traits<D>::kWarps, kMT = Fa2Traits<D>::kMT, BN = Fa2Traits<D>::kBN;
  constexpr int BM = fa2_bm<D>(), kThreads = kWarps * 32;
  constexpr int kNT = BN / 8;  // n8 tiles of S per m-tile
  constexpr int kDT = D / 8;   // n8 tiles of O per m-tile
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_u32(smem);
  // [2][BN][D] each; typed: [2] ring stages of a.k_stage / a.v_stage bytes.
  uint32_t sK = sQ + BM * D * 2, sV = sK + 2 * BN * D * 2;
  if constexpr (kTyped) sK = sQ + a.k_ring, sV = sQ + a.v_ring;

  // This CTA's head and sequence; its query block(s) come from
  // fa2_m_block per pass (Fa2Order). Heaviest blocks first in every order.
  const int hb = fa2_hb(a);
  const int h = hb % a.n_heads, b = hb / a.n_heads;
  const int q_start = a.cu_q[b], sq = a.cu_q[b + 1] - q_start;
  const int k_start = a.cu_k[b], sk = a.cu_k[b + 1] - k_start;
  const int offset = sk - sq;  // query i sits at key position i + offset
  const int kvh = h / (a.n_heads / a.n_kv_heads);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  // ldmatrix addresses, split into a per-thread row base and a few XOR
  // offsets: every 16-row group starts at a multiple of 8 rows, so a row's
  // swizzle key is lane & 7, and chunk 8*blk + c (c < 8) swizzles to
  // 8*blk + (c ^ (lane & 7)). Four offsets per operand then cover every
  // k-step; computing each address from scratch cost registers (spills).
  const uint32_t r7 = lane & 7;
  uint32_t xhi[4], xmid[4];  // chunk low bit from lane >> 4 (Q, V) or (lane >> 3) & 1 (K)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    xhi[j] = ((2 * j + (lane >> 4)) ^ r7) << 4;
    xmid[j] = ((2 * j + ((lane >> 3) & 1)) ^ r7) << 4;
  }
  const uint32_t q_row = sQ + (warp * kMT * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * D * 2;
  const uint32_t k_row = ((lane & 7) + (lane >> 4) * 8) * D * 2;           // + stage base
  const uint32_t v_row = ((lane & 7) + ((lane >> 3) & 1) * 8) * D * 2;     // + stage base
  const int64_t q_stride = int64_t(a.n_heads) * D, kv_stride = int64_t(a.n_kv_heads) * D;
  // Contiguous: the sequence's first key row; paged: the pool's slot 0.
  const T* kg = static_cast<const T*>(a.k) + (int64_t(kPaged ? 0 : k_start) * a.n_kv_heads + kvh) * D;
  const T* vg = static_cast<const T*>(a.v) + (int64_t(kPaged ? 0 : k_start) * a.n_kv_heads + kvh) * D;
  const int32_t* table = kPaged ? a.block_tables + int64_t(b) * a.max_blocks_per_seq : nullptr;
  // Typed: the pools' bytes (the kv head is applied inside load_tile_typed).
  const uint8_t* kpool = static_cast<const uint8_t*>(a.k);
  const uint8_t* vpool = static_cast<const uint8_t*>(a.v);

  // One pass per query block. A second pass (kPair) reuses Q's buffer and
  // the ring (a barrier first; the first pass waited for all its copies). Only the
  // contiguous sm_90 kernels have it (fa2_two_pass: fa2_order gives the
  // others no kPair). At 255 registers ptxas's spills swing with any change:
  // d128 contiguous spills 36/64 bytes on sm_80 with the pass loop and 36/72
  // on sm_90a without it, none the other way round; paged and typed spilled
  // 44-120 bytes more with it.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr int kPasses = 1;
#else
  constexpr int kPasses = kPaged ? 1 : 2;
#endif
  // One barrier a K/V tile (at its top).
#pragma unroll 1
  for (int pass = 0; pass < kPasses; ++pass) {
    // Without an end-of-tile barrier a warp may still read the last tile
    // (and Q) of the first pass: wait before the second overwrites them.
    if (pass > 0) __syncthreads();
    // Recomputed from blockIdx and the parameters each pass rather than kept
    // live across the first (registers: ptxas spilled with m_second held).
    const int m_block = fa2_m_block<BM, kPasses == 2>(a, pass, sq);
    const int m0 = m_block * BM;
    if (m_block < 0 || m0 >= sq) break;  // none, or past a shorter sequence's end
    const T* qg = static_cast<const T*>(a.q) + (int64_t(q_start + m0) * a.n_heads + h) * D;

    // Keys any row of this tile can see: [n_lo, n_hi).
    int n_hi = sk, n_lo = 0;
    if (a.causal) n_hi = min(sk, m0 + BM - 1 + offset + 1);
    if (a.window_left >= 0) n_lo = max(0, m0 + offset - a.window_left);
    const int t_lo = n_lo / BN;
    const int t_hi = n_hi > n_lo ? ceil_div(n_hi, BN) : t_lo;  // empty when nothing is visible

    float o[kMT][kDT][4];
    float m_run[kMT][2], l_run[kMT][2];  // running max (base-2, scaled) and partial row sums
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
      m_run[mt][0] = m_run[mt][1] = -INFINITY;
      l_run[mt][0] = l_run[mt][1] = 0.0f;
    }

    if (t_lo < t_hi) {
      load_tile<D, BM, kThreads>(sQ, qg, q_stride, sq - m0);
      if constexpr (kTyped) {
        load_tile_typed<D, BN, kThreads>(sK, kpool, a.k_type, a.lk, kvh, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
        load_tile_typed<D, BN, kThreads>(sV, vpool, a.v_type, a.lv, kvh, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
      } else if constexpr (kPaged) {
        load_tile_paged<D, BN, kThreads>(sK, kg, a.n_kv_heads * D, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
        load_tile_paged<D, BN, kThreads>(sV, vg, a.n_kv_heads * D, table, a.log2_bs, t_lo * BN, sk - t_lo * BN);
      } else {
        load_tile<D, BN, kThreads>(sK, kg + int64_t(t_lo * BN) * kv_stride, kv_stride, sk - t_lo * BN);
        load_tile<D, BN, kThreads>(sV, vg + int64_t(t_lo * BN) * kv_stride, kv_stride, sk - t_lo * BN);
      }
      cp_async_commit();
    }

    for (int t = t_lo; t < t_hi; ++t) {
      const int stage = (t - t_lo) & 1;
      cp_async_wait<0>();  // tile t: the only group in flight
      // Tile t's copies (and Q) are visible to all warps, and every warp is
      // done with tile t-1, so its stage can take tile t+1 (issued below,
      // after the barrier; issuing it before would need a second barrier at
      // the end of each tile).
      __syncthreads();
      if (t + 1 < t_hi) {
        // The other stage was last read in iteration t-1: the barrier above
        // says every warp is done.
        const int n1 = (t + 1) * BN;
        if constexpr (kTyped) {
          load_tile_typed<D, BN, kThreads>(sK + (stage ^ 1) * a.k_stage, kpool, a.k_type, a.lk, kvh, table,
                                           a.log2_bs, n1, sk - n1);
          load_tile_typed<D, BN, kThreads>(sV + (stage ^ 1) * a.v_stage, vpool, a.v_type, a.lv, kvh, table,
                                           a.log2_bs, n1, sk - n1);
        } else if constexpr (kPaged) {
          load_tile_paged<D, BN, kThreads>(sK + (stage ^ 1) * BN * D * 2, kg, a.n_kv_heads * D, table, a.log2_bs, n1,
                                           sk - n1);
          load_tile_paged<D, BN, kThreads>(sV + (stage ^ 1) * BN * D * 2, vg, a.n_kv_heads * D, table, a.log2_bs, n1,
                                           sk - n1);
        } else {
          load_tile<D, BN, kThreads>(sK + (stage ^ 1) * BN * D * 2, kg + int64_t(n1) * kv_stride, kv_stride, sk - n1);
          load_tile<D, BN, kThreads>(sV + (stage ^ 1) * BN * D * 2, vg + int64_t(n1) * kv_stride, kv_stride, sk - n1);
        }
        cp_async_commit();
      }
      uint32_t sKs = sK + stage * BN * D * 2, sVs = sV + stage * BN * D * 2;
      if constexpr (kTyped) {
        sKs = sK + stage * a.k_stage;
        sVs = sV + stage * a.v_stage;
        // Decode the stage's raw bytes into the f16 tiles (quantized: a.k_tile /
        // a.v_tile; bf16: in place). The tiles were last read in iteration t-1,
        // which every warp has finished (the barrier at this tile's top);
        // the barrier below publishes them to every warp.
        if (a.k_type != KvType::F16) {
          const uint32_t dst = kv_type_quantized(a.k_type) ? a.k_tile : sKs - sQ;
          convert_tile<D, BN, kThreads>(smem, sKs - sQ, dst, a.k_type);
          sKs = sQ + dst;
        }
        if (a.v_type != KvType::F16) {
          const uint32_t dst = kv_type_quantized(a.v_type) ? a.v_tile : sVs - sQ;
          convert_tile<D, BN, kThreads>(smem, sVs - sQ, dst, a.v_type);
          sVs = sQ + dst;
        }
        __syncthreads();
      }

      // S = Q K^T for this warp's rows.
      float s[kMT][kNT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t qa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          ldmatrix_x4(q_row + mt * 16 * D * 2 + (kk / 4) * 128 + xhi[kk % 4], qa[mt][0], qa[mt][1], qa[mt][2],
                      qa[mt][3]);
#pragma unroll
        for (int n2 = 0; n2 < kNT / 2; ++n2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(sKs + k_row + n2 * 16 * D * 2 + (kk / 4) * 128 + xmid[kk % 4], b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<Tr::kIsBf16>(s[mt][2 * n2], qa[mt], b0, b1);
            mma_16816<Tr::kIsBf16>(s[mt][2 * n2 + 1], qa[mt], b2, b3);
          }
        }
      }

      // Soft-cap before the mask (tanh(-inf) would unmask a key): s * scale ->
      // cap * tanh(. / cap) -> * log2(e), folded into two multiplies around
      // the tanh (softcap_tanh); a.scale_log2 is then 1.
      if constexpr (kSoftcap) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[mt][nt][e] = a.cap_out * softcap_tanh(s[mt][nt][e] * a.cap_in);
      }

      // Mask only tiles that straddle a boundary (sequence end, diagonal, window edge).
      const int n0 = t * BN;
      const bool need_mask = n0 + BN > sk || (a.causal && n0 + BN - 1 > m0 + offset) ||
                             (a.window_left >= 0 && n0 < m0 + BM - 1 + offset - a.window_left);
      if (need_mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            const int pos = m0 + (warp * kMT + mt) * 16 + g + hr * 8 + offset;
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                const int j = n0 + nt * 8 + t4 * 2 + c;
                const bool vis = j < sk && (!a.causal || j <= pos) && (a.window_left < 0 || j >= pos - a.window_left);
                if (!vis) s[mt][nt][hr * 2 + c] = -INFINITY;
              }
          }
      }

      // Online softmax, base 2: p = 2^(s*scale_log2 - m), O and l rescaled by 2^(m_old - m).
      // Row maxima of the tile (raw scores, scaled once: scale > 0 keeps the order).
      float mx_new[kMT][2];
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          mx_new[mt][hr] = tile_row_max(s[mt], hr) * a.scale_log2;
          // -inf + 8 = -inf: a row's first visible key always moves m; a row
          // with nothing visible yet (-inf) never does.
          grow |= mx_new[mt][hr] > m_run[mt][hr] + kFa2RescaleLog2;
        }
      // Warp-uniform: most tiles move no row's m by 2^8 and skip the O multiply.
      if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int hr = 0; hr < 2; ++hr) {
            float corr = 1.0f;
            if (mx_new[mt][hr] > m_run[mt][hr] + kFa2RescaleLog2) {
              corr = fast_exp2(m_run[mt][hr] - mx_new[mt][hr]);  // 0 when m was -inf (O and l are 0 then)
              m_run[mt][hr] = mx_new[mt][hr];
            }
            l_run[mt][hr] *= corr;
#pragma unroll
            for (int dt = 0; dt < kDT; ++dt) {
              o[mt][dt][hr * 2] *= corr;
              o[mt][dt][hr * 2 + 1] *= corr;
            }
          }
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          // A row with nothing visible yet keeps m = -inf: subtract 0 instead (its p are 0).
          const float m_use = m_run[mt][hr] == -INFINITY ? 0.0f : m_run[mt][hr];
          l_run[mt][hr] += exp_row(s[mt], hr, a.scale_log2, m_use);
        }

      // O += P V. P is packed one k16 step at a time, so S's registers die as
      // the loop advances (packing all of P first spilled at d128). The C
      // layout of two adjacent n8 tiles is the A layout of one k16 step.
#pragma unroll
      for (int k2 = 0; k2 < kNT / 2; ++k2) {
        uint32_t pa[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          pa[mt][0] = Tr::pack2(s[mt][2 * k2][0], s[mt][2 * k2][1]);
          pa[mt][1] = Tr::pack2(s[mt][2 * k2][2], s[mt][2 * k2][3]);
          pa[mt][2] = Tr::pack2(s[mt][2 * k2 + 1][0], s[mt][2 * k2 + 1][1]);
          pa[mt][3] = Tr::pack2(s[mt][2 * k2 + 1][2], s[mt][2 * k2 + 1][3]);
        }
#pragma unroll
        for (int d2 = 0; d2 < kDT / 2; ++d2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4_trans(sVs + v_row + k2 * 16 * D * 2 + (d2 / 4) * 128 + xhi[d2 % 4], b0, b1, b2, b3);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<Tr::kIsBf16>(o[mt][2 * d2], pa[mt], b0, b1);
            mma_16816<Tr::kIsBf16>(o[mt][2 * d2 + 1], pa[mt], b2, b3);
          }
        }
      }
    }

    // Epilogue: finish the row sums across the quad, join the sink, normalise, store.
    T* og = static_cast<T*>(a.out) + (int64_t(q_start) * a.n_heads + h) * D;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float l = l_run[mt][hr];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        float m = m_run[mt][hr];
        float inv;
        if constexpr (kSinks) {
          inv = attn_state_add_sink(m, l, a.sinks[h] * kLog2e) / l;  // l >= 1 after the join
        } else {
          inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: out = 0
        }
        const int i = m0 + (warp * kMT + mt) * 16 + g + hr * 8;
        if (i < sq) {
          T* orow = og + int64_t(i) * q_stride;
#pragma unroll
          for (int dt = 0; dt < kDT; ++dt)
            *reinterpret_cast<uint32_t*>(orow + dt * 8 + t4 * 2) =
                Tr::pack2(o[mt][dt][hr * 2] * inv, o[mt][dt][hr * 2 + 1] * inv);
          if (a.lse && t4 == 0)
            a.lse[int64_t(h) * a.total_q + q_start + i] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
        }
      }
    }
  }  // pass
}

// Bytes of one ring stage of a typed operand: the swizzled f16 tile for f16
// and bf16, else quants + scales rounded up to 128 (every stage and tile
// starts on a 128-byte boundary, as the swizzle assumes).
template <int D>
uint32_t fa2_typed_stage_bytes(KvType t) {
  constexpr int BN = Fa2Traits<D>::kBN;
  if (!kv_type_quantized(t)) return BN * D * 2;
  const uint32_t q = (t == KvType::Q4_0 ? D / 2 : D) + D / 16;  // quants + scales of a row
  return (BN * q + 127) / 128 * 128;
}

// Shared memory of a typed launch: Q, K's ring, V's ring, then an f16 tile
// for each quantized operand. Fills a's offsets; returns the total.
template <int D>
size_t fa2_typed_smem(Fa2TypedArgs& a) {
  constexpr int BN = Fa2Traits<D>::kBN;
  uint32_t at = fa2_bm<D>() * D * 2;
  a.k_stage = fa2_typed_stage_bytes<D>(a.k_type);
  a.v_stage = fa2_typed_stage_bytes<D>(a.v_type);
  a.k_ring = at, at += 2 * a.k_stage;
  a.v_ring = at, at += 2 * a.v_stage;
  a.k_tile = at, at += kv_type_quantized(a.k_type) ? BN * D * 2 : 0;
  a.v_tile = at, at += kv_type_quantized(a.v_type) ? BN * D * 2 : 0;
  return at;
}

// Whether this launch's kernel has the second pass kPair needs: contiguous
// K/V on sm_90+ (the kernel's kPasses).
bool fa2_two_pass(const AttnParams& p) {
  static const int major = [] {
    int dev = 0, m = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev));
    return m;
  }();
  return p.block_tables == nullptr && major >= 9;
}

// Fa2Order for a launch: problems whose blocks all cost the same (non-causal, one block) keep kHead; causal problems of >= 64 query
// blocks take kLpt (fa3's measured choice at that size: the balance is
// worth more than the L2 reuse), shorter ones kPair (balanced and
// head-major, since there every resident CTA on its own head would read
// its K/V from DRAM).
int fa2_order(const AttnParams& p, int n_m_blocks) {
  if (!p.causal || n_m_blocks < 2) return kFa2OrderHead;
  const int order = n_m_blocks >= 64 ? kFa2OrderLpt : kFa2OrderPair;
  return order == kFa2OrderPair && !fa2_two_pass(p) ? kFa2OrderLpt : order;
}

template <typename T, int D, Fa2Mode kMode, bool kSoftcap, bool kSinks>
void launch_fa2(const AttnParams& p) {
  constexpr int BM = fa2_bm<D>();
  size_t smem = fa2_smem_bytes<D>();
  if (p.max_seqlen_q == 0) return;
  int log2_bs = 0;
  if (kMode != Fa2Mode::kContig) {
    while ((1 << log2_bs) < p.block_size) ++log2_bs;
    RUNLM_CHECK((1 << log2_bs) == p.block_size, "fa2: paged K/V block_size=%d unsupported; supported: powers of two",
                p.block_size);
  }
  const int n_m = ceil_div(p.max_seqlen_q, BM);
  Fa2ArgsOf<kMode> a{};
  static_cast<Fa2Args&>(a) = Fa2Args{p.q,       p.k,          p.v,           p.out,         p.lse,    p.cu_seqlens_q,
                                     p.cu_seqlens_k, p.total_q, p.n_heads, p.n_kv_heads, p.window_left, p.causal,
                                     kSoftcap ? 1.0f : p.scale * kLog2e, kSoftcap ? p.scale / p.softcap : 0.0f,
                                     kSoftcap ? p.softcap * kLog2e : 0.0f, p.block_tables, p.max_blocks_per_seq,
                                     log2_bs, n_m, p.n_heads * p.batch, fa2_order(p, n_m), p.sinks};
  const int64_t units = int64_t(a.order == kFa2OrderPair ? (n_m + 1) / 2 : n_m) * a.n_hb;
  RUNLM_CHECK(units < (int64_t(1) << 31), "fa2: %lld CTAs unsupported; supported: < 2^31",
              static_cast<long long>(units));
  const dim3 grid = dim3(unsigned(units));
  if constexpr (kMode == Fa2Mode::kTyped) {
    a.k_type = attn_kv_type(p, false);
    a.v_type = attn_kv_type(p, true);
    a.lk = kv_pool_layout(a.k_type, p.block_size, p.n_kv_heads, D);
    a.lv = kv_pool_layout(a.v_type, p.block_size, p.n_kv_heads, D);
    smem = fa2_typed_smem<D>(a);
    int dev = 0, max_smem = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    RUNLM_CHECK(smem <= size_t(max_smem),
                "fa2: paged K=%s V=%s at head_dim=%d need %zu bytes of shared memory; this device has %d",
                kv_type_name(a.k_type), kv_type_name(a.v_type), D, smem, max_smem);
  }
  cudaCheck(cudaFuncSetAttribute(attn_fa2_fwd<T, D, kMode, kSoftcap, kSinks>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  attn_fa2_fwd<T, D, kMode, kSoftcap, kSinks>
      <<<grid, Fa2Traits<D>::kWarps * 32, smem, static_cast<cudaStream_t>(p.stream)>>>(a);
  cudaCheckLaunch();
}

template <typename T, int D, Fa2Mode kMode>
void launch_fa2_cap(const AttnParams& p) {
  if (p.softcap > 0.0f)
    return p.sinks ? launch_fa2<T, D, kMode, true, true>(p) : launch_fa2<T, D, kMode, true, false>(p);
  return p.sinks ? launch_fa2<T, D, kMode, false, true>(p) : launch_fa2<T, D, kMode, false, false>(p);
}

template <typename T, int D>
void launch_fa2_dim(const AttnParams& p) {
  if (!p.block_tables) return launch_fa2_cap<T, D, Fa2Mode::kContig>(p);
  if (!attn_kv_typed(p)) return launch_fa2_cap<T, D, Fa2Mode::kPaged>(p);
  // Typed pools decode to the f16 tiles the mma reads: dtype f16 only, so
  // bf16 attention needs no instantiation of its own.
  if constexpr (std::is_same_v<T, __half>) return launch_fa2_cap<T, D, Fa2Mode::kTyped>(p);
  fail("fa2: paged K/V types K=%s V=%s with dtype %s unsupported; supported: dtype f16",
       kv_type_name(attn_kv_type(p, false)), kv_type_name(attn_kv_type(p, true)), dtype_name(p.dtype));
}

template <typename T>
void launch_fa2_typed(const AttnParams& p) {
  switch (p.head_dim) {
    case 64: return launch_fa2_dim<T, 64>(p);
    case 128: return launch_fa2_dim<T, 128>(p);
    case 256: return launch_fa2_dim<T, 256>(p);
    default: fail("fa2: head_dim=%d unsupported; supported: head_dim {64,128,256}", p.head_dim);
  }
}

}  // namespace

void attn_fa2_launch(const AttnParams& p) {
  if (p.dtype == DType::BF16)
    launch_fa2_typed<__nv_bfloat16>(p);
  else
    launch_fa2_typed<__half>(p);
}

}  // namespace runlm
