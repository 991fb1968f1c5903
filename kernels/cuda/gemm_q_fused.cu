// gemm_q_fused: fused prefill GEMM for Q4_0 and Q8_0 weights on tensor cores:
// y[t, r] = sum_c W[r, c] * x[t, c], W in the repacked device layout
// (gpu_codec.cuh), x f16 [n_tokens, cols], y f32 [n_tokens, rows]. No f16
// copy of W: raw quant bytes and f16 scales stream through a cp.async ring
// in shared memory and are dequantized straight into A fragments in
// registers.
//
// Kernels (GemmFusedKernel, gpu_ops.h; measured on the H100 in
// docs/performance.md):
//   gemm_q_mma_sm80_kernel (MmaSm80): mma.sync m16n8k16 (sm_80+), described
//     first below; what runs off sm_90.
//   gemm_q_wgmma_kernel (Wgmma): wgmma m64nBNk16 with A from registers
//     (sm_90a), see "wgmma" further down; up to 16 tokens.
//   gemm_q_wgmma_overlap_kernel (WgmmaOverlap): the wgmma kernel with the
//     decode of quant block b + 1 overlapping the wgmmas of block b (A double
//     buffered per block, wait_group 1) and an L2 prefetch hint on the
//     quants; sm_90a, past 16 tokens. See "overlap" further down.
//   gemm_q_wgmma_streamk_kernel (WgmmaStreamK): the overlap kernel's loop on
//     256-row tiles (4 warpgroups, 512 threads) over a persistent stream-K
//     grid; sm_90a, past 64 tokens in launches of many row tiles
//     (auto_kernel). See "stream-K" further down.
// Every kernel takes 1 to 3 matrices of one type and cols reading the same
// x in one launch (gemm_fused_q_multi; MatSet below).
//
// Tile: a CTA computes kBM = 128 weight rows (the mma M side) x BN tokens
// (N side, BN in {16, 32, 64, 128} picked from n_tokens) over a range of
// k-tiles of kBK = 128 columns (4 quant blocks). 8 warps: BN <= 32 as 8 x 1
// warps of 16 rows x BN tokens, BN >= 64 as 4 x 2 warps of 32 rows x BN/2
// (halves the x reads from shared memory per mma; the two N-warps decode the
// same A fragments, which the ALU budget allows at those sizes).
//
// Dequantization in registers, not into a shared f16 tile: a thread's A
// fragment of a 32-block needs, per row, 4 consecutive quant bytes once the
// k order inside the block is permuted (any permutation applied to both A
// and B leaves the sum unchanged): logical k 2t, 2t+1 (a0/a1, b0) is
// physical element 4t, 4t+1 and logical 8+2t, 9+2t (a2/a3, b1) is 4t+2,
// 4t+3. So A is one 4-byte shared load per row (Q4_0: low nibbles give k16
// step 0, high nibbles step 1 of the block, GGUF nibble order) and B one
// 8-byte load x[token][4t .. 4t+3] per n8 tile (no ldmatrix: it would give
// the natural order). Levels become f16 exactly through the exponent trick
// (0x6400 | q is 1024 + q), minus the offset (exact), times the f16 scale in
// one f16 multiply: the exact product rounded once, bit-identical to the
// cuBLAS path's dequantization (level * d in f32, exact, rounded to f16).
// Scaling the accumulators per 32-block instead would need a partial
// accumulator per block (an extra FMA per output per block).
//
// Shared memory per stage (swizzled so every load above is conflict free):
//   quants [kBM][kBK/2 or kBK] bytes, 16-byte chunk c of row r at
//          c ^ ((r >> 1) & 3) (Q4_0, 64-byte rows) or c ^ (r & 7) (Q8_0)
//   scales [kBM][4] f16 (cp.async 4 bytes: rows of the scale part are only
//          4-byte aligned when cols % 64 == 0, the requirement below)
//   x      [BN][kBK] f16, chunk c of token j at c ^ ((j & 3) << 1)
// Rows past `rows`, tokens past n_tokens and columns past cols are zero
// filled by cp.async (zero scale, zero x: no NaN from garbage); only valid
// outputs are stored. cols % 64 == 0 is required (the tail k-tile may be
// half full); gemm_fused_q says so otherwise.
//
// Split-K: with few row tiles (4096 rows = 32 tiles) the grid is also split
// over k into S slices so about one wave of CTAs fills the SMs. Each slice
// writes its fp32 tile to the scratch in fragment order (16-byte coalesced);
// the last CTA of a tile to finish (atomic ticket) sums the S partials in
// slice order (deterministic, whichever CTA is last) and writes y.
//
// Prediction (H100 SXM: 3.0 TB/s; dense f16 ~990 TFLOP/s by wgmma, mma.sync
// ~600, ~6 cycles per m16n8k16 per SM sub-partition), written before the
// measurement (docs/performance.md has the measured table: small n came in
// ~2x slower than this, 256-512 tokens at 240-440 TFLOP/s).
// Q4_0 = 0.5625 B/weight, Q8_0 = 1.0625; FLOP = 2 rows cols n.
//   shape (rows x cols)   Q4_0 MB  Q8_0 MB  GFLOP at n = 16 / 64 / 128 / 256 / 512
//   4096 x 4096              9.4     17.8   0.54 / 2.1 / 4.3 / 8.6 / 17.2
//   11008 x 4096, 4096 x 11008  25.4  47.9   1.44 / 5.8 / 11.5 / 23.1 / 46.2
// The A decode costs ~16-18 instructions per k16 step per 16 rows (4-byte
// loads, byte_perm, lop3, hsub2, hmul2 per pair).
// mma.sync: next to 2 (BN=16) to 16 (BN=128) mma per warp and k16 plus the
// B loads, issue slots, not DRAM, bound everything past ~32 tokens, and at
// BN >= 64 both N-warps decode the same A. Large shapes, Q4_0:
//   n = 16: weight-bound, ~11 us (~2.3 TB/s; Q8_0 ~20 us)
//   n = 64: issue-bound, ~15 us (the dequant + cuBLAS path: ~45 us)
//   n = 128..512: ~300-350 TFLOP/s (33 / 70 / 140 us)
// wgmma: a warp decodes only its 16 rows and issues one wgmma per k16,
// so per CTA and k16 ~34 issue cycles against 16 (BN=16) to 128 (BN=128)
// tensor cycles:
//   n = 16: weight-bound, ~11 us Q4_0, ~20 us Q8_0
//   n = 64: tensor ~9 us at 65% of peak against the 10 us weight read:
//           ~11-12 us Q4_0 (~4x today), ~20 us Q8_0
//   n = 128..512: decode and wgmma alternate per k-tile at BN=128 (one CTA
//           a SM; ~20% of the tensor time lost): ~450-550 TFLOP/s (23 / 46
//           / 92 us). Dequant + cuBLAS (27.5 us + ~600 TFLOP/s) ~ 57 / 66 /
//           99 us: the fused path should win up to ~512 tokens, hence the
//           default threshold 256 (gpu_ops.h) with margin.
// 4096 x 4096: about a third of these times, split-K included.
#include <algorithm>
#include <climits>
#include <mutex>

#include "cuda/common.cuh"
#include "cuda/gemm_q_fused_common.cuh"
#include "cuda/gemm_q_mma_sm80.cuh"
#include "cuda/gemm_q_wgmma_sm90.cuh"
#include "cuda/gpu_ops.h"

namespace runlm::gpu {

namespace {

struct DeviceInfo {
  int sms = 0;
  int smem_optin = 0;
  bool sm90 = false;  // the sm_90a binary (wgmma) runs here
  int index = 0;
};

DeviceInfo device_info() {
  static DeviceInfo info[16];
  int dev = 0;
  cudaCheck(cudaGetDevice(&dev));
  RUNLM_CHECK(dev >= 0 && dev < 16, "gemm_fused_q: device %d beyond 16", dev);
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  DeviceInfo& d = info[dev];
  if (d.sms == 0) {
    int major = 0, minor = 0;
    cudaCheck(cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    cudaCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    d.sm90 = major == 9 && minor == 0;
    d.index = dev;
    cudaCheck(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  }
  return d;
}

// A launch's matrices on the host (1 to kMaxMats, one type and cols).
struct Mats {
  WView v[kMaxMats];
  float* y[kMaxMats];
  int count = 0;
  // The kernels' MatSet for row tiles of tile_rows rows; row_tiles = the
  // launch's, every matrix's concatenated. Absent entries repeat matrix 0
  // (valid pointers) behind a first tile of INT_MAX.
  MatSet set(int tile_rows, int& row_tiles) const {
    MatSet m;
    int first[kMaxMats] = {0, INT_MAX, INT_MAX};
    row_tiles = 0;
    for (int i = 0; i < kMaxMats; ++i) {
      const int j = i < count ? i : 0;
      m.m[i] = MatView{v[j].q, reinterpret_cast<const __half*>(v[j].a), y[j], static_cast<int>(v[j].rows)};
      if (i < count) {
        first[i] = row_tiles;
        row_tiles += ceil_div(static_cast<int>(v[i].rows), tile_rows);
      }
    }
    m.tile1 = first[1];
    m.tile2 = first[2];
    return m;
  }
};

// The kernel arguments of a grid of tiles x column slices (all but the
// stream-K kernel): `splits` capped by what the scratch holds (a kBM x bn f32 partial a
// tile and slice past the tickets) and by k_tiles, no empty slice; with
// more than one slice the tickets (shared with the dequantization path's
// use of the scratch) are zeroed on stream s.
MmaArgs sliced_args(const MatSet& set, const uint16_t* x, int cols, int n, int tiles, int k_tiles, int splits, int bn,
                    void* scratch, size_t scratch_bytes, cudaStream_t s) {
  const size_t ticket_bytes = align_up(size_t(tiles) * sizeof(int), kPartAlign);
  const size_t slice_bytes = size_t(tiles) * kBM * bn * sizeof(float);
  const size_t fit = scratch && scratch_bytes > ticket_bytes ? (scratch_bytes - ticket_bytes) / slice_bytes : 0;
  splits = std::max(1, std::min<int>(splits, static_cast<int>(std::min<size_t>(fit, k_tiles))));
  const int per_split = ceil_div(k_tiles, splits);
  splits = ceil_div(k_tiles, per_split);  // no empty slice
  MmaArgs a{set, reinterpret_cast<const __half*>(x), nullptr, nullptr, cols, n, k_tiles, per_split, splits};
  if (splits > 1) {
    a.tickets = static_cast<int*>(scratch);
    a.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + ticket_bytes);
    cudaCheck(cudaMemsetAsync(a.tickets, 0, size_t(tiles) * sizeof(int), s));
  }
  return a;
}

template <DType kT, int BN, GemmFusedKernel kK>
void launch_fused(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes, int force_splits,
                  cudaStream_t s) {
  constexpr int kSmem = kK == GemmFusedKernel::WgmmaOverlap ? WgOverlapTraits<kT, BN>::kSmem
                       : kK == GemmFusedKernel::Wgmma      ? WgTraits<kT, BN>::kSmem
                                                           : MmaTraits<kT, BN>::kSmem;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(kSmem <= dev.smem_optin,
              "gemm_fused_q: %s BN=%d %s needs %d bytes of shared memory per block; the device allows %d",
              dtype_name(kT), BN, gemm_fused_kernel_name(kK), kSmem, dev.smem_optin);
  auto kernel = kK == GemmFusedKernel::WgmmaOverlap ? gemm_q_wgmma_overlap_kernel<kT, BN>
                : kK == GemmFusedKernel::Wgmma      ? gemm_q_wgmma_kernel<kT, BN>
                                                    : gemm_q_mma_sm80_kernel<kT, BN>;
  // Set once per device and instantiation, and the occupancy queried once:
  // the first call (the engine's warm-up) is outside any graph capture.
  static bool smem_set[16] = {};
  if (!smem_set[dev.index]) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    smem_set[dev.index] = true;
  }
  static const int per_sm = [&] {
    int b = 0;
    cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, kSmem));
    return std::max(b, 1);
  }();

  const int cols = static_cast<int>(ms.v[0].cols);
  int tiles_m = 0;
  const MatSet set = ms.set(kBM, tiles_m);
  const int tiles_n = ceil_div(n, BN), tiles = tiles_m * tiles_n;
  const int k_tiles = ceil_div(cols, kBK);
  // Slices: about one wave of CTAs, at least 2 k-tiles a slice (so the ring
  // has something to overlap), and no more than the scratch holds.
  const int slots = dev.sms * per_sm;
  int splits = force_splits > 0 ? force_splits : std::max(1, slots / tiles);
  // The overlap kernel at BN = 128 (tensor-bound, one CTA an SM): the slice count
  // from 1 to 4 (or the one above) with the shortest waves, each extra slice
  // charged 10% for its fixup (a 64 KB partial a CTA, mostly in L2; a guess
  // until measured). 11008 rows: 128 tokens = 86 tiles on 132 SMs (65% busy)
  // -> 3 slices, 2 waves of 1/3 (0.8 with the charge); 256 tokens = 172
  // tiles, 2 waves (the second 30% full) -> 3 slices, 4 waves of 1/3 (1.6).
  if (kK == GemmFusedKernel::WgmmaOverlap && BN == 128 && force_splits <= 0) {
    auto cost = [&](int sp) { return ceil_div(tiles * sp, slots) * (1.0 + 0.1 * (sp - 1)) / sp; };
    int best = splits;
    for (int sp = 1; sp <= 4; ++sp)
      if (cost(sp) < cost(best)) best = sp;
    splits = best;
  }
  splits = std::min(splits, force_splits > 0 ? k_tiles : std::max(1, k_tiles / 2));
  const MmaArgs a = sliced_args(set, x, cols, n, tiles, k_tiles, splits, BN, scratch, scratch_bytes, s);
  RUNLM_CHECK(tiles_n <= 65535 && a.splits <= 65535, "gemm_fused_q: n_tokens=%d too large for the grid", n);
  RUNLM_CHECK(tiles_m <= INT32_MAX / 2, "gemm_fused_q: %d row tiles too many for the grid", tiles_m);
  kernel<<<dim3(tiles_m, tiles_n, a.splits), kThreads, kSmem, s>>>(a);
  cudaCheckLaunch();
}

// The stream-K kernel (BN = 128): grid = one CTA per SM unless forced (tests:
// force_splits = s > 0 gives s x tiles CTAs, s = 1 one CTA a tile, no
// partials), at least kMinPer k-tiles a CTA, and ranges lengthened until
// the partial slots they use fit the scratch (none: whole tiles).
template <DType kT>
void launch_streamk(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes, int force_splits,
               cudaStream_t s) {
  constexpr int BN = 128, kMinPer = 4;
  using Tr = WgStreamKTraits<kT, BN>;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(Tr::kSmem <= dev.smem_optin,
              "gemm_fused_q: %s stream-K kernel needs %d bytes of shared memory per block; the device allows %d",
              dtype_name(kT), Tr::kSmem, dev.smem_optin);
  auto kernel = gemm_q_wgmma_streamk_kernel<kT, BN>;
  static bool smem_set[16] = {};
  if (!smem_set[dev.index]) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmem));
    smem_set[dev.index] = true;
  }
  const int cols = static_cast<int>(ms.v[0].cols);
  int tiles_m = 0;
  const MatSet set = ms.set(Tr::kM, tiles_m);
  const int tiles_n = ceil_div(n, BN), tiles = tiles_m * tiles_n;
  const int k_tiles = ceil_div(cols, kBK);
  const int units = tiles * k_tiles;
  const int grid0 = force_splits > 0 ? tiles * force_splits : std::min(dev.sms, ceil_div(units, kMinPer));
  const size_t ticket_bytes = align_up(size_t(tiles) * sizeof(int), kPartAlign);
  const size_t slot_bytes = size_t(Tr::kNT) * Tr::kThr * sizeof(float4);
  const size_t slots = scratch && scratch_bytes > ticket_bytes ? (scratch_bytes - ticket_bytes) / slot_bytes : 0;
  // Partial slots the kernel's indexing reaches at range length p: CTA c
  // writes slot 2c if its first tile is cut, 2c + 1 if its last tile is
  // another one and cut. (gemm() passes the matrix's own scratch: 32 MB
  // for 4096 x 4096 holds 255 slots, enough for 128 CTAs of 8 k-tiles,
  // which only ever use slot 2c.)
  auto slots_needed = [&](int p) {
    size_t need = 0;
    for (int c = 0; c * p < units; ++c) {
      const int u0 = c * p, u1 = std::min(units, u0 + p), t0 = u0 / k_tiles, t1 = (u1 - 1) / k_tiles;
      if (t0 == t1 ? u1 - u0 != k_tiles : u0 % k_tiles != 0) need = std::max(need, size_t(2 * c + 1));
      if (t1 != t0 && u1 % k_tiles != 0) need = std::max(need, size_t(2 * c + 2));
    }
    return need;
  };
  int per = ceil_div(units, std::max(1, std::min(grid0, units)));
  while (slots_needed(per) > slots) ++per;  // ends by per % k_tiles == 0 (no cut tile) at the latest
  const int grid = ceil_div(units, per);
  SkArgs a{set, reinterpret_cast<const __half*>(x), nullptr, nullptr, cols, n, k_tiles, tiles_n, units, per};
  if (per % k_tiles != 0) {  // some tile is cut: partials and tickets
    a.tickets = static_cast<int*>(scratch);
    a.partial = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + ticket_bytes);
    cudaCheck(cudaMemsetAsync(a.tickets, 0, size_t(tiles) * sizeof(int), s));
  }
  kernel<<<grid, Tr::kThr, Tr::kSmem, s>>>(a);
  cudaCheckLaunch();
}

template <DType kT, GemmFusedKernel kK>
void launch_fused_tokens(const Mats& ms, const uint16_t* x, int n, void* scratch, size_t scratch_bytes,
                         int force_splits, cudaStream_t s) {
  if (n <= 16)
    launch_fused<kT, 16, kK>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (n <= 32)
    launch_fused<kT, 32, kK>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (n <= 64)
    launch_fused<kT, 64, kK>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else
    launch_fused<kT, 128, kK>(ms, x, n, scratch, scratch_bytes, force_splits, s);
}

template <DType kT>
void launch_fused_kernel(GemmFusedKernel k, const Mats& ms, const uint16_t* x, int n, void* scratch,
                         size_t scratch_bytes, int force_splits, cudaStream_t s) {
  // The stream-K kernel runs from 65 tokens; below, what auto picks (overlap, and wgmma up to 16).
  if (k == GemmFusedKernel::WgmmaStreamK && n > 64)
    launch_streamk<kT>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (k == GemmFusedKernel::WgmmaStreamK && n <= 16)
    launch_fused_tokens<kT, GemmFusedKernel::Wgmma>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (k == GemmFusedKernel::WgmmaStreamK || k == GemmFusedKernel::WgmmaOverlap)
    launch_fused_tokens<kT, GemmFusedKernel::WgmmaOverlap>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else if (k == GemmFusedKernel::Wgmma)
    launch_fused_tokens<kT, GemmFusedKernel::Wgmma>(ms, x, n, scratch, scratch_bytes, force_splits, s);
  else
    launch_fused_tokens<kT, GemmFusedKernel::MmaSm80>(ms, x, n, scratch, scratch_bytes, force_splits, s);
}

// Auto on sm_90, measured on the H100 (132 SMs), Q4_0 Llama-2-7B shapes, us:
//   rows x cols    n  wgmma overlap stream-K
//   4096 x 4096   128   25.9   25.2   29.4
//                 256   37.8   33.6   33.9
//                 512   52.0   43.1   48.1
//   11008 x 4096  128   54.6   50.6   45.1
//                 256   96.9  104.8   67.3
//                 512  142.3  123.2  115.0
//   4096 x 11008  128   46.2   41.0   49.6
//                 256   78.0   64.7   68.1
//                 512  127.4  106.1  109.8
// (Q8_0 the same pattern: 11008 x 4096 at 256, overlap 113.4, stream-K 74.1.)
// wgmma up to 16 tokens (overlap's extra stage only adds latency there:
// 1.10-1.13x wgmma's time), overlap past 16, and past 64 tokens stream-K
// where the launch has many row tiles: overlap's 128-row tiles (all matrices of
// the launch) at least half the SMs. There overlap's grid of row tiles x token
// tiles x column slices lands badly on the SMs (11008 rows = 86 tiles: 0.65
// of a wave at 128 tokens, 1.3 waves at 256, before its 3 column slices and
// their fixups), and stream-K's even split wins by 1.1-1.6x. With fewer
// (4096 rows = 32 tiles) overlap's slices make a wave of 128 CTAs almost exactly
// (32 x 4, 64 x 2, 128 x 1), while stream-K cuts each 256-row tile into 2-8
// pieces: overlap ahead by 3-15%. Several 4096-row matrices in one launch
// (gemm_fused_q_multi: q/k/v = 96 tiles) are the many-tile case.
GemmFusedKernel auto_kernel(const Mats& ms, int n_tokens, const DeviceInfo& dev) {
  if (!dev.sm90) return GemmFusedKernel::MmaSm80;
  if (n_tokens <= 16) return GemmFusedKernel::Wgmma;
  int row_tiles = 0;
  for (int i = 0; i < ms.count; ++i) row_tiles += ceil_div(static_cast<int>(ms.v[i].rows), kBM);
  return n_tokens > 64 && 2 * row_tiles >= dev.sms ? GemmFusedKernel::WgmmaStreamK : GemmFusedKernel::WgmmaOverlap;
}

}  // namespace

const char* gemm_fused_kernel_name(GemmFusedKernel k) {
  switch (k) {
    case GemmFusedKernel::Auto: return "auto";
    case GemmFusedKernel::MmaSm80: return "gemm_q_mma_sm80";
    case GemmFusedKernel::Wgmma: return "gemm_q_wgmma";
    case GemmFusedKernel::WgmmaOverlap: return "gemm_q_wgmma_overlap";
    case GemmFusedKernel::WgmmaStreamK: return "gemm_q_wgmma_streamk";
  }
  return "?";
}

bool gemm_fused_supports(const GpuMatrix& w) {
  return (w.type == DType::Q4_0 || w.type == DType::Q8_0) && w.cols % kColAlign == 0 && w.rows <= INT32_MAX &&
         w.cols <= INT32_MAX;
}

bool gemm_fused_fits_device(const GpuMatrix& w) {
  const DeviceInfo d = device_info();
  const bool q4 = w.type == DType::Q4_0;
  // The wgmma kernels all run on sm_90 (by token count): the largest of their tiles.
  constexpr int kWgQ4 = std::max({WgTraits<DType::Q4_0, 128>::kSmem, WgOverlapTraits<DType::Q4_0, 128>::kSmem,
                                  WgStreamKTraits<DType::Q4_0, 128>::kSmem});
  constexpr int kWgQ8 = std::max({WgTraits<DType::Q8_0, 128>::kSmem, WgOverlapTraits<DType::Q8_0, 128>::kSmem,
                                  WgStreamKTraits<DType::Q8_0, 128>::kSmem});
  const int smem = d.sm90 ? (q4 ? kWgQ4 : kWgQ8)
                          : (q4 ? MmaTraits<DType::Q4_0, 128>::kSmem : MmaTraits<DType::Q8_0, 128>::kSmem);
  return smem <= d.smem_optin;
}

bool gemm_fused_has_wgmma() { return device_info().sm90; }

void gemm_fused_q(const GpuMatrix& w, const uint16_t* x_f16, float* y, int n_tokens, void* scratch,
                  size_t scratch_bytes, Stream stream, int splits, GemmFusedKernel kernel) {
  const GemmOut out{&w, y};
  gemm_fused_q_multi(&out, 1, x_f16, n_tokens, scratch, scratch_bytes, stream, splits, kernel);
}

void gemm_fused_q_multi(const GemmOut* outs, int n_outs, const uint16_t* x_f16, int n_tokens, void* scratch,
                        size_t scratch_bytes, Stream stream, int splits, GemmFusedKernel kernel) {
  RUNLM_CHECK(n_outs >= 1 && n_outs <= kMaxMats, "gemm_fused_q: %d matrices; supported: 1 to %d", n_outs, kMaxMats);
  RUNLM_CHECK(n_tokens >= 1, "gemm_fused_q: n_tokens=%d", n_tokens);
  RUNLM_CHECK(reinterpret_cast<uintptr_t>(x_f16) % 16 == 0, "gemm_fused_q: x must be 16-byte aligned");
  Mats ms{};
  for (int i = 0; i < n_outs; ++i) {
    const GpuMatrix& w = *outs[i].w;
    RUNLM_CHECK(w.data != nullptr, "gemm_fused_q: matrix not uploaded");
    RUNLM_CHECK(gemm_fused_supports(w),
                "gemm_fused_q: %s %lld x %lld unsupported; supported: q4_0, q8_0 with cols %% %d == 0",
                dtype_name(w.type), static_cast<long long>(w.rows), static_cast<long long>(w.cols), kColAlign);
    RUNLM_CHECK(w.type == outs[0].w->type && w.cols == outs[0].w->cols,
                "gemm_fused_q: matrices of one launch differ (%s x %lld, %s x %lld); they need one type and cols",
                dtype_name(outs[0].w->type), static_cast<long long>(outs[0].w->cols), dtype_name(w.type),
                static_cast<long long>(w.cols));
    ms.v[i] = make_view(w);
    ms.y[i] = outs[i].y;
  }
  ms.count = n_outs;
  const DeviceInfo dev = device_info();
  RUNLM_CHECK(kernel == GemmFusedKernel::Auto || kernel == GemmFusedKernel::MmaSm80 || dev.sm90,
              "gemm_fused_q: %s (wgmma) needs sm_90; this device runs gemm_q_mma_sm80",
              gemm_fused_kernel_name(kernel));
  const GemmFusedKernel k = kernel != GemmFusedKernel::Auto ? kernel : auto_kernel(ms, n_tokens, dev);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (outs[0].w->type == DType::Q4_0)
    launch_fused_kernel<DType::Q4_0>(k, ms, x_f16, n_tokens, scratch, scratch_bytes, splits, s);
  else
    launch_fused_kernel<DType::Q8_0>(k, ms, x_f16, n_tokens, scratch, scratch_bytes, splits, s);
}

}  // namespace runlm::gpu

