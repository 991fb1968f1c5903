// Tests for the GPU engine's ops (kernels/cuda/gpu_ops.h) against the CPU
// references (kernels/cpu/ops.h, kernels/cpu/quant.h): random inputs from
// fixed seeds, outputs poisoned with NaN before each run, relative error
// ||y - ref|| / ||ref||. Skipped in a CPU-only build or without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cpu/ops.h"
#include "cpu/quant.h"
#include "dtype.h"
#include "sampler.h"
#include "thread_pool.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>
#include <sys/mman.h>

#include "cuda/gpu_ops.h"
#include "gpu_test_buffers.h"
#include "paged_kv.h"
#endif

using namespace runlm;
#ifdef RUNLM_CUDA
using namespace runlm::test;
#endif

#ifndef RUNLM_CUDA

TEST(GpuOps, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA (RUNLM_CUDA off)"; }

#else

namespace {

// ||a - b|| / ||b||; any non-finite value of a makes it infinite.
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_err(a, std::vector<double>(b.begin(), b.end()));
}

std::vector<float> f16_to_f32(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = fp16_to_fp32(h[i]);
  return f;
}

// A host matrix in GGUF bytes with random content: quantize_row of random
// floats where quant.h can quantize the type, else (Q5_K) random blocks with
// small positive f16 d/dmin so every value is finite.
struct HostMatrix {
  std::vector<uint8_t> bytes;
  QMatrix q;
};

HostMatrix make_matrix(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  HostMatrix m;
  const size_t rb = dtype_row_bytes(t, cols);
  m.bytes.resize(rb * rows);
  if (can_quantize(t)) {
    const std::vector<float> f = randn(static_cast<size_t>(rows * cols), seed);
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, f.data() + r * cols, m.bytes.data() + r * rb, cols);
  } else {
    RUNLM_CHECK(t == DType::Q5_K, "make_matrix: no generator for %s", dtype_name(t));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> scale(0.001f, 0.01f);
    for (auto& b : m.bytes) b = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < m.bytes.size(); i += sizeof(BlockQ5_K)) {
      auto* blk = reinterpret_cast<BlockQ5_K*>(m.bytes.data() + i);
      blk->d = fp32_to_fp16(scale(rng));
      blk->dmin = fp32_to_fp16(scale(rng));
    }
  }
  m.q = QMatrix{t, m.bytes.data(), rb, cols, rows};
  return m;
}

std::vector<float> dequantize(const QMatrix& q) {
  std::vector<float> w(static_cast<size_t>(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r) get_row(q, r, w.data() + r * q.cols);
  return w;
}

// y[t, r] = W[r] . x[t] in double (the truth the fp32 kernels are held to).
std::vector<double> ref_matmul(const std::vector<float>& w, int64_t rows, int64_t cols, const std::vector<float>& x,
                               int n) {
  static ThreadPool pool(0);
  std::vector<double> y(static_cast<size_t>(n * rows));
  pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r)
      for (int t = 0; t < n; ++t) {
        double acc = 0;
        const float* wr = w.data() + r * cols;
        const float* xt = x.data() + t * cols;
        for (int64_t c = 0; c < cols; ++c) acc += static_cast<double>(wr[c]) * xt[c];
        y[t * rows + r] = acc;
      }
  });
  return y;
}

// Every weight type upload_matrix takes.
const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,   DType::Q4_0,   DType::Q4_1,
                           DType::Q5_0, DType::Q5_1, DType::Q2_K, DType::Q3_K,   DType::Q4_K,   DType::Q5_K,
                           DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};
// The types the f32-x GEMV (gpu::gemv) is instantiated for.
const DType kF32xTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0,
                            DType::Q4_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};
// The int8-x GEMV's types: every quantized one.
const DType kX8Types[] = {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,   DType::Q2_K, DType::Q3_K,
                          DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4};

// RUNLM_GPU_OPS_SMALL=1 drops the large shapes (for compute-sanitizer runs).
bool small_only() {
  const char* e = std::getenv("RUNLM_GPU_OPS_SMALL");
  return e && std::string(e) == "1";
}

// Types of 256-element super-blocks (the k-quants and IQ4_XS): test widths
// are a multiple of 256 for them, else of 32 only.
bool is_k_quant(DType t) { return dtype_info(t).block_size == 256; }

// Most the device layout may add to a GGUF matrix's bytes: 4 parts' 256-byte
// alignment, and 4 bytes per 256 values where the 6-bit scales are unpacked
// to a byte each (Q3_K, Q4_K, Q5_K; gpu_codec.cuh).
size_t layout_allowance(DType t, size_t gguf_bytes) {
  const bool unpacked = t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K;
  return (unpacked ? gguf_bytes / dtype_info(t).type_size * 4 : 0) + 4 * 256;
}

}  // namespace

// ---- gemv ---------------------------------------------------------------------
//
// Tolerance: the reference is the exact dequantized matrix dotted in double;
// the kernels decode exactly (F32/F16/BF16/Q8_0/Q4_0/Q6_K levels, scales) or
// within one rounding (Q4_K/Q5_K use fma(d, q, -m) where ggml rounds d*q
// then subtracts), and sum in fp32 in a different order, so the expected
// error is ~1e-7 for every type; 1e-5 leaves room for long rows (11008) and
// still catches any wrong level, scale or element order (those give > 1e-2).
TEST(GpuOps, GemvEveryTypeAndTokenCount) {
  REQUIRE_GPU();
  constexpr double kTol = 1e-5;
  struct Shape { int64_t rows, cols; };
  for (DType t : kF32xTypes) {
    // 333 rows: not a multiple of the 16 rows a block covers (tail rows).
    const Shape shapes[] = {{333, is_k_quant(t) ? 1280 : 1056}, {4096, 11008}};
    for (const Shape& s : shapes) {
      if (small_only() && s.rows > 1000) continue;
      const HostMatrix hm = make_matrix(t, s.rows, s.cols, 1000 + static_cast<uint32_t>(t));
      const std::vector<float> wf = dequantize(hm.q);
      constexpr int kMaxTok = 16;
      const std::vector<float> x = randn(static_cast<size_t>(kMaxTok * s.cols), 7);
      const std::vector<double> ref = ref_matmul(wf, s.rows, s.cols, x, kMaxTok);  // token t depends on x[t] only
      gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
      EXPECT_LE(gm.bytes, hm.bytes.size() + layout_allowance(t, hm.bytes.size())) << dtype_name(t);
      auto dx = upload(x);
      DevBuf dy(sizeof(float) * kMaxTok * s.rows);
      for (int n : {1, 2, 3, 8, 16}) {
        dy.poison();
        gpu::gemv(gm, dx->as<float>(), dy.as<float>(), n, nullptr);
        const std::vector<float> y = dy.get<float>(static_cast<size_t>(n * s.rows));
        const double err = rel_err(y, std::vector<double>(ref.begin(), ref.begin() + n * s.rows));
        EXPECT_LT(err, kTol) << dtype_name(t) << " " << s.rows << "x" << s.cols << " n=" << n;
        // Rows past n tokens stay untouched (poison still there).
        const std::vector<float> all = dy.get<float>(static_cast<size_t>(kMaxTok * s.rows));
        if (n < kMaxTok) {
          EXPECT_TRUE(std::isnan(all[n * s.rows])) << dtype_name(t) << " n=" << n;
        }
      }
      gpu::free_matrix(gm);
    }
  }
}

// Several matrices in one launch give what each gives alone (bit for bit:
// the same kernel and the same per-row work), and only their own rows.
TEST(GpuOps, GemvMultiEqualsSingleLaunches) {
  REQUIRE_GPU();
  for (DType t : {DType::F16, DType::Q4_0, DType::Q6_K}) {
    const int64_t cols = 1280;
    const int64_t rows[3] = {333, 128, 96};
    std::vector<HostMatrix> hm;
    std::vector<gpu::GpuMatrix> gm;
    for (int i = 0; i < 3; ++i) hm.push_back(make_matrix(t, rows[i], cols, 50 + i));
    for (int i = 0; i < 3; ++i) gm.push_back(gpu::upload_matrix(hm[i].q));
    const std::vector<float> x = randn(static_cast<size_t>(16 * cols), 9);
    auto dx = upload(x);
    for (int n : {1, 5, 16}) {
      std::vector<std::unique_ptr<DevBuf>> multi, single;
      gpu::GemvOut outs[3];
      for (int i = 0; i < 3; ++i) {
        multi.push_back(std::make_unique<DevBuf>(sizeof(float) * 16 * rows[i]));
        single.push_back(std::make_unique<DevBuf>(sizeof(float) * 16 * rows[i]));
        multi[i]->poison();
        single[i]->poison();
        outs[i] = gpu::GemvOut{&gm[i], multi[i]->as<float>()};
        gpu::gemv(gm[i], dx->as<float>(), single[i]->as<float>(), n, nullptr);
      }
      gpu::gemv_multi(outs, 3, dx->as<float>(), n, nullptr);
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> a = multi[i]->get<float>(static_cast<size_t>(16 * rows[i]));
        const std::vector<float> b = single[i]->get<float>(static_cast<size_t>(16 * rows[i]));
        for (size_t k = 0; k < static_cast<size_t>(n * rows[i]); ++k)
          ASSERT_EQ(a[k], b[k]) << dtype_name(t) << " n=" << n << " matrix " << i << " at " << k;
        EXPECT_TRUE(std::isnan(a[static_cast<size_t>(n * rows[i])]) || n == 16) << "wrote past its rows";
      }
    }
    for (auto& m : gm) gpu::free_matrix(m);
  }
}

// ---- gemv_x8 (int8 activations) ---------------------------------------------
namespace {

// Host copy of quantize_x8: d = amax / 127 and q = round(x / d) per 32
// values, in the same float operations as the kernel (round half to even
// like __float2int_rn; ties need x / d exactly k + 0.5, which random
// Gaussian inputs do not produce).
struct HostX8 {
  std::vector<int8_t> q;
  std::vector<float> d;
};
HostX8 host_quantize_x8(const std::vector<float>& x) {
  HostX8 h;
  h.q.resize(x.size());
  h.d.resize(x.size() / 32);
  for (size_t b = 0; b < h.d.size(); ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) h.q[b * 32 + j] = static_cast<int8_t>(std::nearbyint(x[b * 32 + j] * id));
    h.d[b] = d;
  }
  return h;
}

}  // namespace

// Against the dequantized matrix (the CPU's decoder) dotted in double with
// the same int8 x (host_quantize_x8): the integer dot products are exact,
// the only differences are the fp32 products with the scales, the sums of
// the per-block results and their order, ~1e-7, so 1e-5 (a wrong level,
// scale, offset or element order gives > 1e-2). Also against the f32
// x, where the error is x's rounding: step amax/127 with amax ~2 sigma over
// 32 Gaussian values, uniform error of std step/sqrt(12) ~ 0.5% of sigma,
// so ~5e-3 relative per dot product; bound 1.5e-2.
TEST(GpuOps, GemvX8MatchesInt8Reference) {
  REQUIRE_GPU();
  struct Shape { int64_t rows, cols; };
  for (DType t : kX8Types) {
    ASSERT_TRUE(gpu::gemv_x8_supports(t)) << dtype_name(t);
    // 333 rows: tail rows; the 7B FFN shape (4096 x 11008) at 1 and 3 tokens
    // (the double reference costs rows x cols x n).
    for (const Shape& s : {Shape{333, is_k_quant(t) ? 1280 : 1056}, Shape{4096, 11008}}) {
      if (small_only() && s.rows > 1000) continue;
      const bool big = s.rows > 1000;
      const HostMatrix hm = make_matrix(t, s.rows, s.cols, 2000 + static_cast<uint32_t>(t));
      const std::vector<float> wf = dequantize(hm.q);
      constexpr int kMaxTok = 16;
      const std::vector<float> x = randn(static_cast<size_t>(kMaxTok * s.cols), 11);
      gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
      EXPECT_LE(gm.bytes, hm.bytes.size() + layout_allowance(t, hm.bytes.size())) << dtype_name(t);
      auto dx = upload(x);
      DevBuf x8(gpu::x8_bytes(kMaxTok, s.cols));
      DevBuf dy(sizeof(float) * kMaxTok * s.rows);
      for (int n : {1, 2, 3, 8, 9, 16}) {
        if (big && n != 1 && n != 3) continue;
        const std::vector<float> xn(x.begin(), x.begin() + n * s.cols);
        const HostX8 hx = host_quantize_x8(xn);
        std::vector<float> xq(xn.size());
        for (size_t i = 0; i < xq.size(); ++i) xq[i] = hx.q[i] * hx.d[i / 32];
        const std::vector<double> ref_q = ref_matmul(wf, s.rows, s.cols, xq, n);
        const std::vector<double> ref_f = ref_matmul(wf, s.rows, s.cols, xn, n);
        x8.poison();
        dy.poison();
        gpu::quantize_x8(dx->as<float>(), n, s.cols, x8.p, nullptr);
        const gpu::GemvOut out{&gm, dy.as<float>()};
        gpu::gemv_x8(&out, 1, x8.p, n, nullptr);
        const std::vector<float> all = dy.get<float>(static_cast<size_t>(kMaxTok * s.rows));
        const std::vector<float> y(all.begin(), all.begin() + n * s.rows);
        EXPECT_LT(rel_err(y, ref_q), 1e-5) << dtype_name(t) << " " << s.rows << "x" << s.cols << " n=" << n;
        // Every output written (poison gone) and finite.
        EXPECT_EQ(std::count_if(y.begin(), y.end(), [](float v) { return !std::isfinite(v); }), 0)
            << dtype_name(t) << " n=" << n;
        const double err_f = rel_err(y, ref_f);
        EXPECT_LT(err_f, 1.5e-2) << dtype_name(t) << " n=" << n;
        EXPECT_GT(err_f, 1e-4) << "x was not quantized?";
        if (n < kMaxTok) {
          EXPECT_TRUE(std::isnan(all[n * s.rows])) << dtype_name(t) << " n=" << n;
        }
      }
      gpu::free_matrix(gm);
    }
  }
  EXPECT_FALSE(gpu::gemv_x8_supports(DType::F16));
  EXPECT_FALSE(gpu::gemv_x8_supports(DType::BF16));
}

// Three matrices in one gemv_x8 launch equal three single launches.
TEST(GpuOps, GemvX8MultiEqualsSingleLaunches) {
  REQUIRE_GPU();
  const int64_t cols = 2048;
  const int64_t rows[3] = {200, 64, 72};
  std::vector<HostMatrix> hm;
  std::vector<gpu::GpuMatrix> gm;
  for (int i = 0; i < 3; ++i) hm.push_back(make_matrix(DType::Q4_0, rows[i], cols, 70 + i));
  for (int i = 0; i < 3; ++i) gm.push_back(gpu::upload_matrix(hm[i].q));
  const std::vector<float> x = randn(static_cast<size_t>(4 * cols), 12);
  auto dx = upload(x);
  DevBuf x8(gpu::x8_bytes(4, cols));
  gpu::quantize_x8(dx->as<float>(), 4, cols, x8.p, nullptr);
  std::vector<std::unique_ptr<DevBuf>> multi, single;
  gpu::GemvOut outs[3];
  for (int i = 0; i < 3; ++i) {
    multi.push_back(std::make_unique<DevBuf>(sizeof(float) * 4 * rows[i]));
    single.push_back(std::make_unique<DevBuf>(sizeof(float) * 4 * rows[i]));
    multi[i]->poison();
    outs[i] = gpu::GemvOut{&gm[i], multi[i]->as<float>()};
    const gpu::GemvOut one{&gm[i], single[i]->as<float>()};
    gpu::gemv_x8(&one, 1, x8.p, 4, nullptr);
  }
  gpu::gemv_x8(outs, 3, x8.p, 4, nullptr);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(multi[i]->get<float>(static_cast<size_t>(4 * rows[i])),
              single[i]->get<float>(static_cast<size_t>(4 * rows[i])))
        << "matrix " << i;
  // One launch needs one type and width.
  const HostMatrix other = make_matrix(DType::Q8_0, 64, cols, 80);
  gpu::GpuMatrix go = gpu::upload_matrix(other.q);
  const gpu::GemvOut mixed[2] = {outs[0], gpu::GemvOut{&go, multi[1]->as<float>()}};
  try {
    gpu::gemv_x8(mixed, 2, x8.p, 4, nullptr);
    FAIL() << "mixed types in one launch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share type and width"), std::string::npos) << e.what();
  }
  gpu::free_matrix(go);
  for (auto& m : gm) gpu::free_matrix(m);
}

TEST(GpuOps, UnsupportedTypeAndArgumentsThrow) {
  REQUIRE_GPU();
  std::vector<uint8_t> bytes(dtype_row_bytes(DType::IQ2_XXS, 256) * 4, 1);
  const QMatrix q{DType::IQ2_XXS, bytes.data(), dtype_row_bytes(DType::IQ2_XXS, 256), 256, 4};
  EXPECT_FALSE(gpu::gemv_supports(DType::IQ2_XXS));
  EXPECT_TRUE(gpu::gemv_supports(DType::Q5_K));
  EXPECT_TRUE(gpu::gemv_supports(DType::Q4_1));
  try {
    gpu::upload_matrix(q);
    FAIL() << "iq2_xxs uploaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
  }
  const HostMatrix hm = make_matrix(DType::Q4_0, 16, 64, 3);
  gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
  DevBuf x(64 * 17 * 4), y(16 * 17 * 4);
  EXPECT_THROW(gpu::gemv(gm, x.as<float>(), y.as<float>(), 17, nullptr), Error);
  EXPECT_THROW(gpu::gemv(gm, x.as<float>(), y.as<float>(), 0, nullptr), Error);
  gpu::free_matrix(gm);
  // F16 rows must be a multiple of 8 wide for 16-byte aligned rows.
  std::vector<uint16_t> h(12 * 2, 0x3C00);
  EXPECT_THROW(gpu::upload_matrix(QMatrix{DType::F16, reinterpret_cast<uint8_t*>(h.data()), 24, 12, 2}), Error);
}

TEST(GpuOps, UploadOutOfMemoryNamesBytes) {
  REQUIRE_GPU();
  if (small_only()) GTEST_SKIP() << "RUNLM_GPU_OPS_SMALL=1";
  size_t free_b = 0, total_b = 0;
  ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  // A Q4_0 matrix larger than the card. Its host bytes are a read-only
  // anonymous mapping that is never touched: upload checks the size first.
  const int64_t cols = 4096;
  const size_t rb = dtype_row_bytes(DType::Q4_0, cols);
  const int64_t rows = static_cast<int64_t>(total_b / rb) + 1024;
  const size_t host_bytes = rb * static_cast<size_t>(rows);
  void* map = mmap(nullptr, host_bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) GTEST_SKIP() << "cannot reserve " << host_bytes << " bytes of address space";
  const uint8_t* bytes = static_cast<const uint8_t*>(map);
  try {
    gpu::upload_matrix(QMatrix{DType::Q4_0, bytes, rb, cols, rows});
    FAIL() << "upload larger than the GPU succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needed"), std::string::npos) << m;
    EXPECT_NE(m.find("free"), std::string::npos) << m;
  }
  munmap(map, host_bytes);
}

// ---- gemm -----------------------------------------------------------------------
//
// Tolerance 2e-3: x is f16 in both (the reference uses the same f16 values),
// the kernel rounds each dequantized weight to f16 (relative 2^-11 per
// element, ~2^-12 / sqrt-averaged over a row) and accumulates in fp32.
TEST(GpuOps, GemmEveryTypeAgainstMatmul) {
  REQUIRE_GPU();
  constexpr double kTol = 2e-3;
  for (DType t : kAllTypes) {
    const int64_t rows = 333, cols = is_k_quant(t) ? 1280 : 1056;
    const HostMatrix hm = make_matrix(t, rows, cols, 2000 + static_cast<uint32_t>(t));
    const std::vector<float> wf = dequantize(hm.q);
    gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
    DevBuf scratch(gpu::gemm_scratch_bytes(gm));
    for (int n : {1, 17, 37, 100, 300}) {
      const std::vector<float> x = randn(static_cast<size_t>(n * cols), 11 + n);
      std::vector<uint16_t> xh(x.size());
      std::vector<float> xr(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xh[i] = fp32_to_fp16(x[i]);
        xr[i] = fp16_to_fp32(xh[i]);
      }
      const std::vector<double> ref = ref_matmul(wf, rows, cols, xr, n);
      auto dx = upload(xh);
      DevBuf dy(sizeof(float) * n * rows);  // NaN-filled: every output must be written
      gpu::gemm(gm, dx->as<uint16_t>(), dy.as<float>(), n, scratch.p, nullptr);
      const double err = rel_err(dy.get<float>(static_cast<size_t>(n * rows)), ref);
      EXPECT_LT(err, kTol) << dtype_name(t) << " n=" << n;
    }
    gpu::free_matrix(gm);
  }
}

// The fused Q4_0 / Q8_0 kernels (gemm_fused_q, called directly so the test
// does not depend on kGemmFusedMaxTokens) against the float64 product, same
// tolerance as above (their f16 weights are bit-identical to the cuBLAS
// path's). Every kernel (MmaSm80; Wgmma, WgmmaOverlap, WgmmaStreamK on sm_90
// only), rows not a multiple of the 128-row tile, every token tile
// (16/32/64/128) with partial tiles, column slices chosen (0), none (1) and
// forced (3); WgmmaOverlap bit-identical to Wgmma at forced slices (1, 3);
// cols % 128 == 64 gives a half-full last k-tile. Auto split must be
// bit-for-bit repeatable. WgmmaStreamK (n > 64; Wgmma / WgmmaOverlap below):
// stream-K over 256-row tiles; splits 1 = one CTA a tile, 3 = 3 x tiles
// CTAs, whose ranges cut tiles mid-way and cross tile boundaries (200 x 960
// at 300 tokens: 24 units, 8 CTAs of 3). 256 / 300 / 512 tokens are the
// engine's batched decode and prefill chunks.
TEST(GpuOps, GemmFusedQuantAgainstMatmul) {
  REQUIRE_GPU();
  constexpr double kTol = 2e-3;
  struct Shape {
    int64_t rows, cols;
  };
  std::vector<Shape> shapes = {{272, 512}, {1000, 1024}, {200, 960}};
  if (!small_only()) shapes.push_back({4096 + 48, 2048});
  using K = gpu::GemmFusedKernel;
  std::vector<K> kernels = {K::MmaSm80};
  if (gpu::gemm_fused_has_wgmma()) kernels.insert(kernels.end(), {K::Wgmma, K::WgmmaOverlap, K::WgmmaStreamK});
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    for (const Shape& sh : shapes) {
      const HostMatrix hm = make_matrix(t, sh.rows, sh.cols, 5000 + static_cast<uint32_t>(sh.rows));
      const std::vector<float> wf = dequantize(hm.q);
      gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
      ASSERT_TRUE(gpu::gemm_fused_supports(gm));
      const size_t scratch_bytes = gpu::gemm_scratch_bytes(gm);
      DevBuf scratch(scratch_bytes);  // poisoned: the tickets must be reset by the call
      // WgmmaStreamK at forced splits 3 gets 40 MB: its 128 KB partial slots (2
      // a CTA) would otherwise hold the small shapes to whole tiles, no cuts.
      const size_t v4_scratch_bytes = std::max(scratch_bytes, size_t(40) << 20);
      DevBuf v4_scratch(v4_scratch_bytes);
      for (int n : {1, 7, 16, 17, 33, 64, 100, 128, 200, 256, 300, 512}) {
        const std::vector<float> x = randn(static_cast<size_t>(n * sh.cols), 17 + n);
        std::vector<uint16_t> xh(x.size());
        std::vector<float> xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          xh[i] = fp32_to_fp16(x[i]);
          xr[i] = fp16_to_fp32(xh[i]);
        }
        const std::vector<double> ref = ref_matmul(wf, sh.rows, sh.cols, xr, n);
        auto dx = upload(xh);
        DevBuf dy(sizeof(float) * n * sh.rows);
        std::vector<float> wgmma_forced[2];  // Wgmma's output at splits 1 and 3
        for (K kernel : kernels) {
          const char* kname = gpu::gemm_fused_kernel_name(kernel);
          std::vector<float> first;
          for (int splits : {0, 1, 3, 0}) {
            dy.poison();
            const bool big = kernel == K::WgmmaStreamK && splits == 3;
            gpu::gemm_fused_q(gm, dx->as<uint16_t>(), dy.as<float>(), n, big ? v4_scratch.p : scratch.p,
                              big ? v4_scratch_bytes : scratch_bytes, nullptr, splits, kernel);
            const std::vector<float> y = dy.get<float>(static_cast<size_t>(n * sh.rows));
            EXPECT_LT(rel_err(y, ref), kTol) << dtype_name(t) << " " << sh.rows << "x" << sh.cols << " n=" << n
                                             << " splits=" << splits << " kernel=" << kname;
            if (splits == 0 && first.empty()) {
              first = y;
            } else if (splits == 0) {
              EXPECT_EQ(0, std::memcmp(first.data(), y.data(), y.size() * sizeof(float)))
                  << "split-K not deterministic: " << dtype_name(t) << " n=" << n << " kernel=" << kname;
            }
            // WgmmaOverlap issues Wgmma's wgmmas in the same order on the
            // same f16 operands: with the same slices, the same bits.
            std::vector<float>& wg_y = wgmma_forced[splits == 3];
            if (splits != 0 && kernel == K::Wgmma) wg_y = y;
            if (splits != 0 && kernel == K::WgmmaOverlap && !wg_y.empty()) {
              EXPECT_EQ(0, std::memcmp(wg_y.data(), y.data(), y.size() * sizeof(float)))
                  << "gemm_q_wgmma_overlap differs from gemm_q_wgmma: " << dtype_name(t) << " " << sh.rows << "x" << sh.cols
                  << " n=" << n << " splits=" << splits;
            }
          }
        }
      }
      gpu::free_matrix(gm);
    }
  }
  // Not supported: cols % 64 != 0, other types; both name what is.
  for (const auto& [t, cols] : {std::pair{DType::Q4_0, int64_t{1056}}, std::pair{DType::F16, int64_t{512}}}) {
    const HostMatrix hm = make_matrix(t, 64, cols, 6000);
    gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
    EXPECT_FALSE(gpu::gemm_fused_supports(gm));
    DevBuf x(cols * 2 * 4), y(64 * 4 * 4);
    try {
      gpu::gemm_fused_q(gm, x.as<uint16_t>(), y.as<float>(), 4, nullptr, 0, nullptr);
      FAIL() << "gemm_fused_q took " << dtype_name(t) << " cols=" << cols;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cols % 64"), std::string::npos) << e.what();
    }
    gpu::free_matrix(gm);
  }
}

// Several Q4_0 / Q8_0 matrices of one type and cols, different row counts,
// in one launch (gemm_fused_q_multi: q/k/v, gate/up). Every kernel and the
// auto choice: each output against the float64 product (tolerance of
// GemmFusedQuantAgainstMatmul), auto splits repeatable bit for bit; at
// forced column slices (1, 2; WgmmaStreamK: 1 = whole tiles, 2 = half tiles,
// k-tiles even here) each output bit-equal to that matrix's launch alone
// (same slices, same wgmma order, same fixup order). Outputs poisoned, with
// a poisoned guard after each y that must stay untouched (no matrix's tile
// writes into another's y). gemm_multi (the engine's entry) against gemm().
TEST(GpuOps, GemmFusedQuantMulti) {
  REQUIRE_GPU();
  constexpr double kTol = 2e-3;
  constexpr size_t kGuard = 4096;  // floats after each y
  struct Group {
    std::vector<int64_t> rows;
    int64_t cols;
  };
  std::vector<Group> groups = {{{1000, 272, 200}, 1024}, {{200, 1000}, 960}};
  if (!small_only()) groups.push_back({{4096 + 48, 1024, 1024}, 2048});
  using K = gpu::GemmFusedKernel;
  std::vector<K> kernels = {K::Auto, K::MmaSm80};
  if (gpu::gemm_fused_has_wgmma()) kernels.insert(kernels.end(), {K::Wgmma, K::WgmmaOverlap, K::WgmmaStreamK});
  const size_t scratch_bytes = size_t(64) << 20;  // every forced slice count fits: no slice capped
  DevBuf scratch(scratch_bytes);
  for (DType t : {DType::Q4_0, DType::Q8_0}) {
    for (const Group& gr : groups) {
      const int k = static_cast<int>(gr.rows.size());
      std::vector<std::vector<float>> wf;
      std::vector<gpu::GpuMatrix> gms;
      for (int i = 0; i < k; ++i) {
        const HostMatrix hm = make_matrix(t, gr.rows[i], gr.cols, 7000 + 10 * static_cast<uint32_t>(t) + i);
        wf.push_back(dequantize(hm.q));
        gms.push_back(gpu::upload_matrix(hm.q));
      }
      for (int n : {1, 16, 64, 128, 200, 256, 300, 512}) {
        const std::vector<float> x = randn(static_cast<size_t>(n * gr.cols), 31 + n);
        std::vector<uint16_t> xh(x.size());
        std::vector<float> xr(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          xh[i] = fp32_to_fp16(x[i]);
          xr[i] = fp16_to_fp32(xh[i]);
        }
        auto dx = upload(xh);
        std::vector<std::vector<double>> refs;
        std::vector<std::unique_ptr<DevBuf>> ys, ys1;  // multi launch's outputs, single launches'
        std::vector<gpu::GemmOut> outs, outs1;
        for (int i = 0; i < k; ++i) {
          refs.push_back(ref_matmul(wf[i], gr.rows[i], gr.cols, xr, n));
          const size_t bytes = sizeof(float) * (size_t(n) * gr.rows[i] + kGuard);
          ys.push_back(std::make_unique<DevBuf>(bytes));
          ys1.push_back(std::make_unique<DevBuf>(bytes));
          outs.push_back({&gms[i], ys.back()->as<float>()});
          outs1.push_back({&gms[i], ys1.back()->as<float>()});
        }
        auto read = [&](DevBuf& b, int i, bool* guard_ok) {
          std::vector<float> all = b.get<float>(size_t(n) * gr.rows[i] + kGuard);
          uint32_t bad = 0;
          for (size_t j = size_t(n) * gr.rows[i]; j < all.size(); ++j) {
            uint32_t u;
            std::memcpy(&u, &all[j], 4);
            bad |= u ^ 0xFFFFFFFFu;
          }
          *guard_ok = bad == 0;
          all.resize(size_t(n) * gr.rows[i]);
          return all;
        };
        for (K kernel : kernels) {
          std::vector<std::vector<float>> first;
          for (int splits : {0, 1, 2, 0}) {
            for (auto& b : ys) b->poison();
            gpu::gemm_fused_q_multi(outs.data(), k, dx->as<uint16_t>(), n, scratch.p, scratch_bytes, nullptr, splits,
                                    kernel);
            const bool compare_single = splits != 0 && kernel != K::Auto;  // auto may pick other kernels alone
            if (compare_single) {
              for (auto& b : ys1) b->poison();
              for (int i = 0; i < k; ++i)
                gpu::gemm_fused_q(gms[i], dx->as<uint16_t>(), outs1[i].y, n, scratch.p, scratch_bytes, nullptr, splits,
                                  kernel);
            }
            const bool record = splits == 0 && first.empty();
            for (int i = 0; i < k; ++i) {
              const std::string what = std::string(dtype_name(t)) + " matrix " + std::to_string(i) + " of " +
                                       std::to_string(k) + " (" + std::to_string(gr.rows[i]) + "x" +
                                       std::to_string(gr.cols) + ") n=" + std::to_string(n) +
                                       " splits=" + std::to_string(splits) + " kernel=" + gpu::gemm_fused_kernel_name(kernel);
              bool guard_ok = false;
              const std::vector<float> y = read(*ys[i], i, &guard_ok);
              EXPECT_TRUE(guard_ok) << "write past y: " << what;
              EXPECT_LT(rel_err(y, refs[i]), kTol) << what;
              if (record) {
                first.push_back(y);
              } else if (splits == 0) {
                EXPECT_EQ(0, std::memcmp(first[i].data(), y.data(), y.size() * sizeof(float)))
                    << "auto split not repeatable: " << what;
              }
              if (compare_single) {
                bool guard1 = false;
                const std::vector<float> y1 = read(*ys1[i], i, &guard1);
                EXPECT_TRUE(guard1) << "single launch wrote past y: " << what;
                EXPECT_EQ(0, std::memcmp(y1.data(), y.data(), y.size() * sizeof(float)))
                    << "multi launch differs from the single launch: " << what;
              }
            }
          }
        }
        // gemm_multi (the engine's call) against the products.
        const bool fused = n <= gpu::kGemmFusedMaxTokens && gpu::gemm_fused_fits_device(gms[0]);
        EXPECT_EQ(fused, gpu::gemm_multi_fused(outs.data(), k, n)) << "n=" << n;
        for (auto& b : ys) b->poison();
        gpu::gemm_multi(outs.data(), k, dx->as<uint16_t>(), n, scratch.p, nullptr);
        for (int i = 0; i < k; ++i) {
          bool guard_ok = false;
          const std::vector<float> y = read(*ys[i], i, &guard_ok);
          EXPECT_TRUE(guard_ok) << "gemm_multi wrote past y " << i << " n=" << n;
          EXPECT_LT(rel_err(y, refs[i]), kTol) << "gemm_multi " << dtype_name(t) << " matrix " << i << " n=" << n;
        }
      }
      for (auto& m : gms) gpu::free_matrix(m);
    }
  }
  // One launch takes one type and cols; names what it needs.
  const HostMatrix a = make_matrix(DType::Q4_0, 64, 512, 7100), b = make_matrix(DType::Q4_0, 64, 1024, 7101);
  gpu::GpuMatrix ga = gpu::upload_matrix(a.q), gb = gpu::upload_matrix(b.q);
  DevBuf x(1024 * 2 * 4), y(64 * 4 * 4 * 2);
  const gpu::GemmOut outs[2] = {{&ga, y.as<float>()}, {&gb, y.as<float>() + 256}};
  EXPECT_FALSE(gpu::gemm_multi_fused(outs, 2, 4));
  try {
    gpu::gemm_fused_q_multi(outs, 2, x.as<uint16_t>(), 4, nullptr, 0, nullptr);
    FAIL() << "gemm_fused_q_multi took cols 512 and 1024 in one launch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one type and cols"), std::string::npos) << e.what();
  }
  gpu::free_matrix(ga);
  gpu::free_matrix(gb);
}

// Three f16 matrices of one shape in one batched call (q/k/v, gate/up): each
// output against the float64 product, same tolerance as gemm above; a
// different x per matrix checks that the pointer arrays are not mixed up.
TEST(GpuOps, GemmBatchedMatchesEachProduct) {
  REQUIRE_GPU();
  constexpr double kTol = 2e-3;
  constexpr int kN = 3;
  const int64_t rows = 200, cols = 288;  // a multiple of 32: the Q4_0 case below
  std::vector<HostMatrix> hms;
  std::vector<gpu::GpuMatrix> gms;
  for (int i = 0; i < kN; ++i) {
    hms.push_back(make_matrix(DType::F16, rows, cols, 4100 + i));
    gms.push_back(gpu::upload_matrix(hms.back().q));
  }
  const gpu::GpuMatrix* ws[kN] = {&gms[0], &gms[1], &gms[2]};
  EXPECT_TRUE(gpu::gemm_batched_ok(ws, kN));
  for (int n : {1, 37, 256}) {
    std::vector<std::unique_ptr<DevBuf>> xs, ys;
    std::vector<std::vector<double>> refs;
    std::vector<const void*> wp;
    std::vector<const uint16_t*> xp;
    std::vector<float*> yp;
    for (int i = 0; i < kN; ++i) {
      const std::vector<float> x = randn(static_cast<size_t>(n * cols), 60 + n + i);
      std::vector<uint16_t> xh(x.size());
      std::vector<float> xr(x.size());
      for (size_t j = 0; j < x.size(); ++j) {
        xh[j] = fp32_to_fp16(x[j]);
        xr[j] = fp16_to_fp32(xh[j]);
      }
      refs.push_back(ref_matmul(dequantize(hms[i].q), rows, cols, xr, n));
      xs.push_back(upload(xh));
      ys.push_back(std::make_unique<DevBuf>(sizeof(float) * n * rows));  // poisoned (NaN)
      wp.push_back(gpu::gemm_f16_data(gms[i]));
      xp.push_back(xs.back()->as<uint16_t>());
      yp.push_back(ys.back()->as<float>());
    }
    auto dw = upload(wp);
    auto dx = upload(xp);
    auto dy = upload(yp);
    gpu::gemm_batched(dw->as<const void*>(), dx->as<const uint16_t*>(), dy->as<float*>(), kN, rows, cols, n, nullptr);
    for (int i = 0; i < kN; ++i)
      EXPECT_LT(rel_err(ys[i]->get<float>(static_cast<size_t>(n * rows)), refs[i]), kTol) << "matrix " << i << " n=" << n;
  }
  // Another shape or type does not qualify.
  const HostMatrix other = make_matrix(DType::F16, rows + 8, cols, 4200);
  gpu::GpuMatrix go = gpu::upload_matrix(other.q);
  const gpu::GpuMatrix* mixed[2] = {&gms[0], &go};
  EXPECT_FALSE(gpu::gemm_batched_ok(mixed, 2));
  const HostMatrix q4 = make_matrix(DType::Q4_0, rows, cols, 4201);
  gpu::GpuMatrix gq = gpu::upload_matrix(q4.q);
  const gpu::GpuMatrix* quant[2] = {&gq, &gq};
  EXPECT_FALSE(gpu::gemm_batched_ok(quant, 2));
  gpu::free_matrix(go);
  gpu::free_matrix(gq);
  for (auto& g : gms) gpu::free_matrix(g);
}

// ---- argmax_rows (greedy sampling on the device) ---------------------------------

TEST(GpuOps, ArgmaxRowsMatchesHostArgmax) {
  REQUIRE_GPU();
  const int rows = 37, cols = 32000;
  std::vector<float> x = randn(static_cast<size_t>(rows) * cols, 77, 3.0f);
  // Ties (the first index wins), NaNs (skipped), all -inf, all NaN, a max in
  // the last column.
  float* r0 = x.data();
  r0[100] = r0[20000] = 50.0f;
  float* r1 = x.data() + cols;
  r1[0] = std::nanf("");
  r1[5] = 60.0f;
  r1[6] = std::nanf("");
  std::fill(x.begin() + 2 * cols, x.begin() + 3 * cols, -INFINITY);
  std::fill(x.begin() + 3 * cols, x.begin() + 4 * cols, std::nanf(""));
  x[5 * cols - 1] = 99.0f;
  auto dx = upload(x);
  DevBuf out(sizeof(int) * rows);  // poisoned
  gpu::argmax_rows(dx->as<float>(), rows, cols, out.as<int>(), nullptr);
  const std::vector<int> got = out.get<int>(rows);
  for (int r = 0; r < rows; ++r)
    EXPECT_EQ(got[r], argmax(x.data() + static_cast<size_t>(r) * cols, cols)) << "row " << r;
  EXPECT_EQ(got[0], 100);
  EXPECT_EQ(got[1], 5);
  EXPECT_EQ(got[2], 0);
  EXPECT_EQ(got[4], cols - 1);
}

// ---- embed_rows ---------------------------------------------------------------------

TEST(GpuOps, EmbedRowsEveryType) {
  REQUIRE_GPU();
  for (DType t : kAllTypes) {
    const int64_t rows = 333, cols = is_k_quant(t) ? 1280 : 1056;
    const HostMatrix hm = make_matrix(t, rows, cols, 3000 + static_cast<uint32_t>(t));
    gpu::GpuMatrix gm = gpu::upload_matrix(hm.q);
    const std::vector<int> tokens = {5, 0, 332, 5, 100};
    auto dt = upload(tokens);
    DevBuf out(sizeof(float) * tokens.size() * cols);
    gpu::embed_rows(gm, dt->as<int>(), static_cast<int>(tokens.size()), out.as<float>(), nullptr);
    const std::vector<float> got = out.get<float>(tokens.size() * cols);
    std::vector<float> ref(tokens.size() * cols);
    for (size_t i = 0; i < tokens.size(); ++i) get_row(hm.q, tokens[i], ref.data() + i * cols);
    // Bit-exact with the CPU's decoder for every type: each value is one
    // rounding of the same exact level x scale (+ offset) on both sides.
    size_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) differ += !(got[i] == ref[i]);
    EXPECT_EQ(differ, 0u) << dtype_name(t) << ": " << differ << " of " << ref.size() << " values differ";
    gpu::free_matrix(gm);
  }
}

// ---- rmsnorm, swiglu, to_f16, add -------------------------------------------------

TEST(GpuOps, RmsNormF32AndF16InPlace) {
  REQUIRE_GPU();
  for (int cols : {4096, 1000, 8}) {
    const int rows = 5;
    const std::vector<float> x = randn(static_cast<size_t>(rows) * cols, 21, 3.0f);
    const std::vector<float> w = randn(cols, 22);
    std::vector<float> ref(x.size());
    for (int r = 0; r < rows; ++r) rmsnorm(ref.data() + r * cols, x.data() + r * cols, w.data(), cols, 1e-5f);
    auto dx = upload(x);
    auto dw = upload(w);
    DevBuf o32(x.size() * 4), o16(x.size() * 2);
    gpu::rmsnorm(dx->as<float>(), dw->as<float>(), o32.as<float>(), o16.as<uint16_t>(), rows, cols, 1e-5f, nullptr);
    EXPECT_LT(rel_err(o32.get<float>(x.size()), ref), 1e-6) << cols;  // fp32 sum vs double: ~1e-7
    EXPECT_LT(rel_err(f16_to_f32(o16.get<uint16_t>(x.size())), ref), 1e-3) << cols;  // f16 rounding 2^-11
    // In place, f32 only.
    gpu::rmsnorm(dx->as<float>(), dw->as<float>(), dx->as<float>(), nullptr, rows, cols, 1e-5f, nullptr);
    EXPECT_LT(rel_err(dx->get<float>(x.size()), ref), 1e-6) << cols;
  }
}

TEST(GpuOps, SwigluToF16Add) {
  REQUIRE_GPU();
  const int64_t n = 100003;
  const std::vector<float> g = randn(n, 31, 4.0f), u = randn(n, 32);
  std::vector<float> ref = g;
  swiglu(ref.data(), u.data(), n);
  auto dg = upload(g);
  auto du = upload(u);
  DevBuf h(n * 2);
  gpu::swiglu(dg->as<float>(), du->as<float>(), h.as<uint16_t>(), n, nullptr);
  EXPECT_LT(rel_err(dg->get<float>(n), ref), 1e-6);  // expf vs std::exp: ~1 ulp
  EXPECT_LT(rel_err(f16_to_f32(h.get<uint16_t>(n)), ref), 1e-3);
  gpu::swiglu(dg->as<float>(), du->as<float>(), nullptr, n, nullptr);  // no f16 copy requested

  const std::vector<float> a = randn(n, 33), b = randn(n, 34);
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  auto da = upload(a);
  auto db = upload(b);
  gpu::add_inplace(da->as<float>(), db->as<float>(), n, nullptr);
  EXPECT_EQ(da->get<float>(n), sum);  // one fp32 add: bit-exact

  DevBuf hf(n * 2);
  gpu::to_f16(db->as<float>(), hf.as<uint16_t>(), n, nullptr);
  const std::vector<uint16_t> got = hf.get<uint16_t>(n);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) mismatches += got[i] != fp32_to_fp16(b[i]);
  EXPECT_EQ(mismatches, 0);  // both round to nearest even
}

// The x8 bytes of a device buffer: q and d per 32 values (x8_layout.cuh).
HostX8 read_x8(DevBuf& buf, int rows, int64_t cols) {
  const size_t q_bytes = (static_cast<size_t>(rows) * cols + 15) / 16 * 16;
  const size_t nb = static_cast<size_t>(rows) * cols / 32;
  const std::vector<uint8_t> raw = buf.get<uint8_t>(q_bytes + nb * 8);
  HostX8 h;
  h.q.resize(static_cast<size_t>(rows) * cols);
  std::memcpy(h.q.data(), raw.data(), h.q.size());
  h.d.resize(nb);
  for (size_t b = 0; b < nb; ++b) std::memcpy(&h.d[b], raw.data() + q_bytes + 8 * b, 4);  // (d, d*sum): d
  return h;
}

// rmsnorm_fused: the residual add written back bit-exact (one fp32 add),
// the norm as gpu::rmsnorm's (same operations: bit-exact), and the int8 x
// equal to the host quantizer applied to that f32 output, value for value.
TEST(GpuOps, RmsNormFusedAddAndInt8) {
  REQUIRE_GPU();
  const int rows = 3, cols = 4096;
  const std::vector<float> x = randn(static_cast<size_t>(rows) * cols, 23, 3.0f);
  const std::vector<float> add = randn(x.size(), 24);
  const std::vector<float> w = randn(cols, 25);
  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + add[i];
  auto dsum = upload(sum);
  auto dw = upload(w);
  DevBuf plain(x.size() * 4);
  gpu::rmsnorm(dsum->as<float>(), dw->as<float>(), plain.as<float>(), nullptr, rows, cols, 1e-5f, nullptr);
  auto dx = upload(x);
  auto dadd = upload(add);
  DevBuf o32(x.size() * 4), o16(x.size() * 2), x8(gpu::x8_bytes(rows, cols));
  o32.poison();
  o16.poison();
  x8.poison();
  gpu::rmsnorm_fused(dx->as<float>(), dadd->as<float>(), dw->as<float>(), o32.as<float>(), o16.as<uint16_t>(), x8.p,
                     rows, cols, 1e-5f, nullptr);
  EXPECT_EQ(dx->get<float>(x.size()), sum);
  const std::vector<float> y = o32.get<float>(x.size());
  EXPECT_EQ(y, plain.get<float>(x.size()));
  EXPECT_LT(rel_err(f16_to_f32(o16.get<uint16_t>(x.size())), y), 1e-3);
  const HostX8 want = host_quantize_x8(y);
  const HostX8 got = read_x8(x8, rows, cols);
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(got.d, want.d);
  // Without add and outputs: x untouched, only x8 written.
  gpu::rmsnorm_fused(dsum->as<float>(), nullptr, dw->as<float>(), nullptr, nullptr, x8.p, rows, cols, 1e-5f, nullptr);
  EXPECT_EQ(dsum->get<float>(x.size()), sum);
  EXPECT_EQ(read_x8(x8, rows, cols).q, want.q);
  EXPECT_THROW(gpu::rmsnorm_fused(dsum->as<float>(), nullptr, dw->as<float>(), nullptr, nullptr, x8.p, rows, 1000,
                                  1e-5f, nullptr),
               Error);  // int8 x needs whole blocks of 32
}

// swiglu_x8 against the host SwiGLU quantized: the device expf may differ
// from std::exp by an ulp, which can move a value across a rounding
// boundary, so each dequantized value is within half a step (+ that ulp)
// of the exact one rather than bit-equal.
TEST(GpuOps, SwigluInt8) {
  REQUIRE_GPU();
  const int rows = 2;
  const int64_t cols = 11008;
  const std::vector<float> g = randn(static_cast<size_t>(rows * cols), 35, 4.0f), u = randn(g.size(), 36);
  std::vector<float> ref = g;
  swiglu(ref.data(), u.data(), static_cast<int64_t>(ref.size()));
  auto dg = upload(g);
  auto du = upload(u);
  DevBuf x8(gpu::x8_bytes(rows, cols));
  x8.poison();
  gpu::swiglu_x8(dg->as<float>(), du->as<float>(), x8.p, rows, cols, nullptr);
  const HostX8 got = read_x8(x8, rows, cols);
  const HostX8 want = host_quantize_x8(ref);
  size_t differ = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float d = got.d[i / 32];
    ASSERT_NEAR(got.q[i] * d, ref[i], 0.5f * d * 1.001f + 1e-6f) << i;
    differ += got.q[i] != want.q[i];
  }
  EXPECT_LT(differ, ref.size() / 1000) << "more than 0.1% of levels differ from the host's";
  EXPECT_EQ(dg->get<float>(g.size()), g);  // inputs untouched
}

// ---- rope_and_store_kv ------------------------------------------------------------

TEST(GpuOps, RopeAndStoreKvLongPositions) {
  REQUIRE_GPU();
  const int n_heads = 8, n_kv = 2, hd = 128, n_ctx = 32001;
  const std::vector<int> pos = {0, 1, 777, 16384, 32000};  // 16 MB of cache, fine under the sanitizer too
  const int n = static_cast<int>(pos.size());
  for (float freq_scale : {1.0f, 0.25f}) {
    for (float theta : {10000.0f, 500000.0f}) {
      const std::vector<float> q = randn(static_cast<size_t>(n) * n_heads * hd, 41);
      const std::vector<float> k = randn(static_cast<size_t>(n) * n_kv * hd, 42);
      const std::vector<float> v = randn(static_cast<size_t>(n) * n_kv * hd, 43);
      std::vector<float> qr = q, kr = k;
      for (int i = 0; i < n; ++i) {
        rope(qr.data() + i * n_heads * hd, n_heads, hd, pos[i], theta, freq_scale);
        rope(kr.data() + i * n_kv * hd, n_kv, hd, pos[i], theta, freq_scale);
      }
      auto dq = upload(q);
      auto dk = upload(k);
      auto dv = upload(v);
      auto dp = upload(pos);
      DevBuf kc(size_t(n_ctx) * n_kv * hd * 2), vc(size_t(n_ctx) * n_kv * hd * 2), qo(q.size() * 2);
      gpu::rope_and_store_kv(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), n, n_heads, n_kv, hd,
                             theta, freq_scale, kc.as<uint16_t>(), vc.as<uint16_t>(), qo.as<uint16_t>(), nullptr);
      // Angles reduced in double then sincosf: ~1e-7 absolute per rotation.
      EXPECT_LT(rel_err(dq->get<float>(q.size()), qr), 1e-6) << theta << " " << freq_scale;
      EXPECT_LT(rel_err(f16_to_f32(qo.get<uint16_t>(q.size())), qr), 1e-3);
      const std::vector<float> kcf = f16_to_f32(kc.get<uint16_t>(size_t(n_ctx) * n_kv * hd));
      const std::vector<float> vcf = f16_to_f32(vc.get<uint16_t>(size_t(n_ctx) * n_kv * hd));
      std::vector<float> kg, vg;
      for (int i = 0; i < n; ++i) {
        const size_t row = size_t(pos[i]) * n_kv * hd;
        kg.insert(kg.end(), kcf.begin() + row, kcf.begin() + row + n_kv * hd);
        vg.insert(vg.end(), vcf.begin() + row, vcf.begin() + row + n_kv * hd);
      }
      EXPECT_LT(rel_err(kg, kr), 1e-3);  // f16 cache rounding
      EXPECT_LT(rel_err(vg, v), 1e-3);
      EXPECT_TRUE(std::isnan(kcf[size_t(2) * n_kv * hd])) << "row 2 was never a position: must stay poisoned";
      EXPECT_TRUE(std::isnan(vcf[size_t(31999) * n_kv * hd]));
    }
  }
}

// ---- KV cache types: the store and gather_kv ------------------------------------

const KvType kGpuKvTypes[] = {KvType::F16, KvType::BF16, KvType::Q8_0, KvType::Q4_0, KvType::FP8};

// The store's bytes against kv_encode_row: position 0 for every token makes
// RoPE the identity (cos 1, sin 0: exact), so K and V go into the encoder
// unchanged on both sides and the bytes must be equal (the GPU encoder does
// the CPU's IEEE operations in its order). Tokens go to shuffled slots over
// several pages of a pool poisoned with 0xFF; a slot never written keeps it.
// A q4_0 K is stored a second time with K smoothing (src/k_smoothing.h; a
// random shift, scale and weight a channel): the bytes must equal
// kv_encode_row's of (k - shift) * k_mul with the weights.
TEST(GpuOps, StoreKvTypesBitExactWithCpuEncode) {
  REQUIRE_GPU();
  const int n_heads = 8, n_kv = 4, bs = 16, n_pages = 6;
  for (int hd : {32, 128, 256})
    for (KvType kt : kGpuKvTypes)
      for (KvType vt : {KvType::Q8_0, KvType::Q4_0, KvType::FP8, KvType::BF16, KvType::F16}) {
        if (kt == vt && kt != KvType::Q8_0) continue;  // each type as K and V, and mixed pairs
        const int n = 40;
        const int row = n_kv * hd;
        std::vector<int> pos(n, 0), slots(n_pages * bs);
        std::iota(slots.begin(), slots.end(), 0);
        std::mt19937 rng(hd * 31 + int(kt) * 7 + int(vt));
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(n);
        // Values over several magnitudes (never zero), some blocks with a
        // large outlier, so the scales differ block to block.
        std::vector<float> q = randn(size_t(n) * n_heads * hd, 51), k = randn(size_t(n) * row, 52, 2.0f),
                           v = randn(size_t(n) * row, 53, 0.5f);
        for (size_t i = 0; i < k.size(); i += 97) k[i] *= 40.0f;
        for (size_t i = 0; i < v.size(); i += 89) v[i] *= -30.0f;
        const KvPoolLayout lk = kv_pool_layout(kt, bs, n_kv, hd), lv = kv_pool_layout(vt, bs, n_kv, hd);
        auto dq = upload(q);
        auto dk = upload(k);
        auto dv = upload(v);
        auto dp = upload(pos);
        auto ds = upload(slots);
        // smooth: [shift, k_mul, q_mul, k_weight] x row, or empty (none).
        auto store_and_compare = [&](const std::vector<float>& smooth) -> std::vector<uint8_t> {
          DevBuf kc(size_t(n_pages) * lk.page), vc(size_t(n_pages) * lv.page);
          auto dsm = upload(smooth.empty() ? std::vector<float>(1) : smooth);
          gpu::rope_and_store_kv_slots(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(),
                                       ds->as<int>(), n, n_heads, n_kv, hd, 10000.0f, 1.0f, kc.p, vc.p, kt, vt, bs,
                                       nullptr, nullptr, smooth.empty() ? nullptr : dsm->as<float>());
          const std::vector<uint8_t> kb = kc.get<uint8_t>(kc.n), vb = vc.get<uint8_t>(vc.n);
          std::vector<uint8_t> want(kv_row_bytes(kt, row, hd)), got(want.size());
          std::vector<uint8_t> want_v(kv_row_bytes(vt, row, hd)), got_v(want_v.size());
          std::vector<float> ks(row);
          int bad = 0;
          for (int i = 0; i < n; ++i) {
            for (int e = 0; e < row; ++e) {
              const float x = k[size_t(i) * row + e];
              ks[e] = smooth.empty() ? x : (x - smooth[e]) * smooth[row + e];
            }
            kv_encode_row(kt, ks.data(), want.data(), row, hd, smooth.empty() ? nullptr : smooth.data() + 3 * row);
            kv_pool_read_row(kt, lk, kb.data(), slots[i], got.data());
            kv_encode_row(vt, v.data() + size_t(i) * row, want_v.data(), row, hd);
            kv_pool_read_row(vt, lv, vb.data(), slots[i], got_v.data());
            if (want != got || want_v != got_v) ++bad;
          }
          EXPECT_EQ(bad, 0) << "hd " << hd << " K=" << kv_type_name(kt) << " V=" << kv_type_name(vt)
                            << (smooth.empty() ? "" : " smoothed")
                            << ": tokens whose stored bytes differ from kv_encode_row";
          return kb;
        };
        const std::vector<uint8_t> kb = store_and_compare({});
        if (kt == KvType::Q4_0) {
          std::vector<float> smooth(4 * size_t(row));
          std::uniform_real_distribution<float> u(-1, 1);
          for (int e = 0; e < row; ++e) {
            smooth[e] = u(rng);                      // shift
            smooth[row + e] = std::exp(u(rng));      // k_mul
            smooth[2 * row + e] = 1 / smooth[row + e];
            smooth[3 * row + e] = std::exp(2 * u(rng));  // weight
          }
          store_and_compare(smooth);
        }
        std::vector<uint8_t> got(kv_row_bytes(kt, row, hd));
        // A slot nobody wrote stays poisoned.
        int unused = 0;
        while (std::find(slots.begin(), slots.end(), unused) != slots.end()) ++unused;
        kv_pool_read_row(kt, lk, kb.data(), unused, got.data());
        EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0xFF; })) << "slot " << unused;
      }
}

// With real positions the GPU's RoPE (angle reduced in double, sincosf)
// differs from the CPU's by ~1e-7, which can move a value across a
// quantization level: compare decoded values with the rotated reference,
// within each type's rounding (half a level of the block's scale).
TEST(GpuOps, StoreKvTypesWithRopeWithinQuantError) {
  REQUIRE_GPU();
  const int n_heads = 4, n_kv = 2, hd = 128, bs = 16, n = 5;
  const std::vector<int> pos = {0, 1, 777, 16384, 32000}, slots = {3, 17, 40, 9, 63};
  const std::vector<float> q = randn(size_t(n) * n_heads * hd, 61), k = randn(size_t(n) * n_kv * hd, 62);
  const std::vector<float> v = randn(size_t(n) * n_kv * hd, 63);
  std::vector<float> kr = k;
  for (int i = 0; i < n; ++i) rope(kr.data() + i * n_kv * hd, n_kv, hd, pos[i], 10000.0f, 1.0f);
  // Bound on |decoded - exact| relative to the block's largest |value|:
  // f16 2^-11 of the value, bf16 2^-8; q8_0 half a level (amax / 254) plus
  // 127 levels times the f16 rounding of the scale (2^-11 of it); q4_0 3/16
  // (its least-squares scale maps the signed maximum to 6.4-9.4 levels and
  // may clip the values opposite it at +7: measured at most 0.168 of amax
  // over 2M random blocks); fp8 e4m3 2^-4 of the value (3 mantissa bits).
  // Then a little for the RoPE difference.
  auto bound = [](KvType t) {
    switch (t) {
      case KvType::F16: return 1.0 / 2048;
      case KvType::BF16: return 1.0 / 256;
      case KvType::Q8_0: return (0.5 + 127.0 / 2048) / 127;
      case KvType::Q4_0: return 3.0 / 16;
      default: return 1.0 / 16;
    }
  };
  for (KvType t : kGpuKvTypes) {
    const KvPoolLayout l = kv_pool_layout(t, bs, n_kv, hd);
    auto dq = upload(q);
    auto dk = upload(k);
    auto dv = upload(v);
    auto dp = upload(pos);
    auto ds = upload(slots);
    DevBuf kc(size_t(4) * l.page), vc(size_t(4) * l.page);
    gpu::rope_and_store_kv_slots(dq->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), ds->as<int>(), n,
                                 n_heads, n_kv, hd, 10000.0f, 1.0f, kc.p, vc.p, t, t, bs, nullptr, nullptr);
    const std::vector<uint8_t> kb = kc.get<uint8_t>(kc.n), vb = vc.get<uint8_t>(vc.n);
    std::vector<uint8_t> rowb(kv_row_bytes(t, n_kv * hd, hd));
    std::vector<float> dec(n_kv * hd);
    for (int i = 0; i < n; ++i)
      for (int which = 0; which < 2; ++which) {
        kv_pool_read_row(t, l, (which ? vb : kb).data(), slots[i], rowb.data());
        kv_decode_row(t, rowb.data(), dec.data(), n_kv * hd, hd);
        const float* want = (which ? v : kr).data() + size_t(i) * n_kv * hd;
        for (int b = 0; b < n_kv * hd / 32; ++b) {
          float amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(want[b * 32 + j]));
          for (int j = 0; j < 32; ++j) {
            const double e = std::fabs(dec[b * 32 + j] - want[b * 32 + j]);
            ASSERT_LE(e, bound(t) * amax * 1.01 + 1e-5)
                << kv_type_name(t) << (which ? " V" : " K") << " token " << i << " elem " << b * 32 + j;
          }
        }
      }
  }
}

TEST(GpuOps, StoreKvTypesRejectHeadDim) {
  REQUIRE_GPU();
  DevBuf b(1 << 16);
  try {
    gpu::rope_and_store_kv_slots(b.as<float>(), b.as<float>(), b.as<float>(), b.as<int>(), b.as<int>(), 1, 2, 1, 48,
                                 10000.0f, 1.0f, b.p, b.p, KvType::F16, KvType::Q4_0, 16, nullptr, nullptr);
    ADD_FAILURE() << "no error for head_dim 48 with q4_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim=48 with KV type q4_0"), std::string::npos) << e.what();
  }
}

// gather_kv decodes a pool of any type to f16: each value is the exact
// decoded value (kv_decode_row) rounded once to f16, so bit-exact.
TEST(GpuOps, GatherKvDecodesEveryTypeToF16) {
  REQUIRE_GPU();
  const int n_kv = 2, hd = 128, bs = 16, n_pages = 8, kv_dim = n_kv * hd;
  const std::vector<int> lens = {5, 40};
  const std::vector<int32_t> cu_k = {0, 5, 45};
  const int max_blocks = 3;
  const std::vector<int32_t> tables = {6, -1, -1, 2, 7, 0};  // seq 0: page 6; seq 1: pages 2, 7, 0
  for (KvType kt : kGpuKvTypes)
    for (KvType vt : {KvType::Q4_0, KvType::FP8, KvType::Q8_0}) {
      const KvPoolLayout lk = kv_pool_layout(kt, bs, n_kv, hd), lv = kv_pool_layout(vt, bs, n_kv, hd);
      std::vector<uint8_t> kp(size_t(n_pages) * lk.page), vp(size_t(n_pages) * lv.page);
      std::vector<uint8_t> krow(kv_row_bytes(kt, kv_dim, hd)), vrow(kv_row_bytes(vt, kv_dim, hd));
      std::vector<float> want_k(size_t(cu_k.back()) * kv_dim), want_v(want_k.size());
      const std::vector<float> x = randn(size_t(n_pages) * bs * kv_dim * 2, 70 + int(kt) * 5 + int(vt));
      for (int slot = 0; slot < n_pages * bs; ++slot) {
        kv_encode_row(kt, x.data() + size_t(slot) * kv_dim, krow.data(), kv_dim, hd);
        kv_pool_write_row(kt, lk, kp.data(), slot, krow.data());
        kv_encode_row(vt, x.data() + size_t(n_pages * bs + slot) * kv_dim, vrow.data(), kv_dim, hd);
        kv_pool_write_row(vt, lv, vp.data(), slot, vrow.data());
      }
      for (int s = 0; s < 2; ++s)
        for (int p = 0; p < lens[s]; ++p) {
          const int slot = tables[s * max_blocks + p / bs] * bs + p % bs;
          kv_pool_read_row(kt, lk, kp.data(), slot, krow.data());
          kv_decode_row(kt, krow.data(), &want_k[size_t(cu_k[s] + p) * kv_dim], kv_dim, hd);
          kv_pool_read_row(vt, lv, vp.data(), slot, vrow.data());
          kv_decode_row(vt, vrow.data(), &want_v[size_t(cu_k[s] + p) * kv_dim], kv_dim, hd);
        }
      auto dk = upload(kp);
      auto dv = upload(vp);
      auto dt = upload(tables);
      auto dc = upload(cu_k);
      DevBuf ko(want_k.size() * 2), vo(want_v.size() * 2);
      gpu::gather_kv(dk->p, dv->p, kt, vt, dt->as<int32_t>(), max_blocks, dc->as<int32_t>(), 2, cu_k.back(), bs, kv_dim,
                     ko.as<uint16_t>(), vo.as<uint16_t>(), nullptr);
      const std::vector<uint16_t> gk = ko.get<uint16_t>(want_k.size()), gv = vo.get<uint16_t>(want_v.size());
      size_t bad = 0;
      for (size_t i = 0; i < want_k.size(); ++i)
        bad += (gk[i] != fp32_to_fp16(want_k[i])) + (gv[i] != fp32_to_fp16(want_v[i]));
      EXPECT_EQ(bad, 0u) << "K=" << kv_type_name(kt) << " V=" << kv_type_name(vt);
    }
}

// ---- decode_attention ----------------------------------------------------------------

namespace {

struct AttnCase {
  int n, n_heads, n_kv, hd, window, pos0;
  float sink_lo = 0, sink_hi = 0;  // sink_hi > sink_lo: attention sinks, one per head uniform in [lo, hi]
};

void check_decode_attention(const AttnCase& c, uint32_t seed) {
  const int max_ctx = c.pos0 + c.n + 3;
  const size_t kv_row = size_t(c.n_kv) * c.hd;
  // Every cache row random (also rows the queries must not see).
  std::vector<uint16_t> kh(max_ctx * kv_row), vh(max_ctx * kv_row);
  {
    const std::vector<float> kf = randn(kh.size(), seed), vf = randn(vh.size(), seed + 1);
    for (size_t i = 0; i < kh.size(); ++i) {
      kh[i] = fp32_to_fp16(kf[i]);
      vh[i] = fp32_to_fp16(vf[i]);
    }
  }
  const std::vector<float> kr = f16_to_f32(kh), vr = f16_to_f32(vh);
  const std::vector<float> q = randn(size_t(c.n) * c.n_heads * c.hd, seed + 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  std::vector<float> sinks;
  if (c.sink_hi > c.sink_lo) {
    std::mt19937 rng(seed + 3);
    std::uniform_real_distribution<float> u(c.sink_lo, c.sink_hi);
    for (int h = 0; h < c.n_heads; ++h) sinks.push_back(u(rng));
  }
  const float* host_sinks = sinks.empty() ? nullptr : sinks.data();
  // The CPU reference reads an f32 cache (kernels/cpu/ops.h KvLayerView).
  KvLayerView kv;
  kv.k = reinterpret_cast<const uint8_t*>(kr.data());
  kv.v = reinterpret_cast<const uint8_t*>(vr.data());
  kv.type_k = kv.type_v = KvType::F32;
  kv.row_bytes_k = kv.row_bytes_v = kv_row * sizeof(float);
  std::vector<float> ref(q.size()), scratch(size_t(c.n_heads) * max_ctx + 2 * kv_row);
  for (int i = 0; i < c.n; ++i)
    attention_one_token(ref.data() + size_t(i) * c.n_heads * c.hd, q.data() + size_t(i) * c.n_heads * c.hd, kv,
                        c.pos0 + i, c.n_heads, c.n_kv, c.hd, c.window, scale, scratch.data(), 0.0f, host_sinks);
  auto dq = upload(q);
  auto ds = upload(sinks);
  auto dk = upload(kh);
  auto dv = upload(vh);
  auto dp = upload(std::vector<int>{c.pos0});
  DevBuf out(q.size() * 4);
  // With head_dim % 32 == 0 the same launch also writes the int8 x of the wo
  // GEMV: it must equal quantize_x8 of the f32 output, bit for bit.
  const int64_t cols = int64_t(c.n_heads) * c.hd;
  const bool with_x8 = c.hd % 32 == 0;
  DevBuf x8(with_x8 ? gpu::x8_bytes(c.n, cols) : 0);  // poisoned
  gpu::decode_attention(dq->as<float>(), dk->as<uint16_t>(), dv->as<uint16_t>(), c.n, dp->as<int>(), c.n_heads,
                        c.n_kv, c.hd, c.window, scale, max_ctx, out.as<float>(), nullptr, with_x8 ? x8.p : nullptr,
                        0.0f, host_sinks ? ds->as<float>() : nullptr);
  const std::vector<float> got = out.get<float>(q.size());
  // Same f16 cache values on both sides: only fp32 ordering and expf differ.
  EXPECT_LT(rel_err(got, ref), 1e-4) << "n=" << c.n << " heads=" << c.n_heads << "/" << c.n_kv << " hd=" << c.hd
                                     << " window=" << c.window << " pos0=" << c.pos0 << " sinks " << c.sink_lo << ".."
                                     << c.sink_hi;
  if (with_x8) {
    const HostX8 want = host_quantize_x8(got);
    const HostX8 got8 = read_x8(x8, c.n, cols);
    EXPECT_EQ(got8.q, want.q) << "hd=" << c.hd;
    EXPECT_EQ(got8.d, want.d) << "hd=" << c.hd;
  }
}

}  // namespace

TEST(GpuOps, DecodeAttentionGqaWindowLongContext) {
  REQUIRE_GPU();
  const AttnCase cases[] = {
      {1, 8, 2, 128, 0, 37},     // GQA 4:1
      {4, 8, 2, 128, 0, 100},    // 4 query tokens
      {4, 8, 8, 64, 16, 100},    // window of 16
      {1, 4, 1, 128, 7, 3},      // window wider than the past
      {1, 32, 8, 128, 0, small_only() ? 499 : 4999},  // long context: 5000 keys
      {4, 8, 8, 8, 0, 250},      // stories260K-like head_dim 8
      {2, 6, 3, 96, 0, 70},      // head_dim not a power of two
  };
  uint32_t seed = 50;
  for (const AttnCase& c : cases) check_decode_attention(c, seed += 10);
}

// Attention sinks (gpt-oss: head_dim 64, GQA, a 128-token window on every
// other layer) against attention_one_token with sinks: sinks in [-2, 4]
// against scores ~N(0, 1), and sinks of e^8..e^10 that dominate every row
// (the output shrinks ~10-100-fold; the relative bound then tests the
// sink's share).
TEST(GpuOps, DecodeAttentionSinks) {
  REQUIRE_GPU();
  const AttnCase cases[] = {
      {1, 8, 2, 64, 0, 37, -2.0f, 4.0f},    {4, 8, 2, 64, 128, 300, -2.0f, 4.0f},
      {2, 8, 8, 128, 16, 100, -2.0f, 4.0f}, {1, 16, 2, 64, 0, small_only() ? 499 : 4999, -2.0f, 4.0f},
      {3, 8, 2, 64, 0, 200, 8.0f, 10.0f},   {1, 4, 1, 256, 128, 3, 8.0f, 10.0f},
  };
  uint32_t seed = 150;
  for (const AttnCase& c : cases) check_decode_attention(c, seed += 10);
}

// decode_attention_rope against the two launches it replaces
// (rope_and_store_kv, then decode_attention) on the same random inputs: the
// cache must come out bit-equal (same rotation and rounding, rope.cuh) and
// the output equal, int8 x included; q must stay unrotated.
TEST(GpuOps, DecodeAttentionRopeMatchesRopeThenAttention) {
  REQUIRE_GPU();
  const AttnCase cases[] = {
      {1, 32, 8, 128, 0, 37},   // 7B-like GQA, one token
      {4, 8, 2, 128, 0, 100},   // 4 tokens: later ones see the earlier new keys
      {16, 8, 8, 64, 16, 40},   // 16 tokens, window 16
      {3, 4, 1, 128, 2, 0},     // window 2, from position 0
      {2, 8, 8, 8, 0, 250},     // head_dim 8 (stories260K)
      {2, 6, 3, 96, 0, 3000},   // head_dim 96, long position
  };
  uint32_t seed = 900;
  for (const AttnCase& c : cases) {
    seed += 10;
    const int max_ctx = c.pos0 + c.n + 3;
    const size_t kv_row = size_t(c.n_kv) * c.hd, cache = size_t(max_ctx) * kv_row;
    std::vector<uint16_t> kh(cache), vh(cache);
    const std::vector<float> kf = randn(cache, seed), vf = randn(cache, seed + 1);
    for (size_t i = 0; i < cache; ++i) {
      kh[i] = fp32_to_fp16(kf[i]);
      vh[i] = fp32_to_fp16(vf[i]);
    }
    const std::vector<float> q = randn(size_t(c.n) * c.n_heads * c.hd, seed + 2);
    const std::vector<float> kn = randn(size_t(c.n) * kv_row, seed + 3), vn = randn(size_t(c.n) * kv_row, seed + 4);
    std::vector<int> pos(c.n);
    for (int i = 0; i < c.n; ++i) pos[i] = c.pos0 + i;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd)), theta = 10000.0f;
    const int64_t cols = int64_t(c.n_heads) * c.hd;
    const bool with_x8 = c.hd % 32 == 0;
    auto dp = upload(pos);
    auto dk = upload(kn);
    auto dv = upload(vn);
    // Two launches: rope_and_store_kv rotates q in place, then attention.
    auto dq_a = upload(q);
    auto kc_a = upload(kh);
    auto vc_a = upload(vh);
    DevBuf out_a(q.size() * 4), x8_a(with_x8 ? gpu::x8_bytes(c.n, cols) : 0);
    gpu::rope_and_store_kv(dq_a->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), c.n, c.n_heads, c.n_kv,
                           c.hd, theta, 1.0f, kc_a->as<uint16_t>(), vc_a->as<uint16_t>(), nullptr, nullptr);
    gpu::decode_attention(dq_a->as<float>(), kc_a->as<uint16_t>(), vc_a->as<uint16_t>(), c.n, dp->as<int>(),
                          c.n_heads, c.n_kv, c.hd, c.window, scale, max_ctx, out_a.as<float>(), nullptr,
                          with_x8 ? x8_a.p : nullptr);
    // One launch.
    auto dq_b = upload(q);
    auto kc_b = upload(kh);
    auto vc_b = upload(vh);
    DevBuf out_b(q.size() * 4), x8_b(with_x8 ? gpu::x8_bytes(c.n, cols) : 0);  // poisoned
    gpu::decode_attention_rope(dq_b->as<float>(), dk->as<float>(), dv->as<float>(), dp->as<int>(), c.n, c.n_heads,
                               c.n_kv, c.hd, theta, 1.0f, kc_b->as<uint16_t>(), vc_b->as<uint16_t>(), c.window, scale,
                               max_ctx, out_b.as<float>(), nullptr, with_x8 ? x8_b.p : nullptr);
    const std::string what = "n=" + std::to_string(c.n) + " heads=" + std::to_string(c.n_heads) + "/" +
                             std::to_string(c.n_kv) + " hd=" + std::to_string(c.hd) +
                             " window=" + std::to_string(c.window) + " pos0=" + std::to_string(c.pos0);
    EXPECT_EQ(kc_b->get<uint16_t>(cache), kc_a->get<uint16_t>(cache)) << what;
    EXPECT_EQ(vc_b->get<uint16_t>(cache), vc_a->get<uint16_t>(cache)) << what;
    const std::vector<float> got = out_b.get<float>(q.size()), want = out_a.get<float>(q.size());
    EXPECT_LT(rel_err(got, want), 1e-6) << what;
    EXPECT_EQ(dq_b->get<float>(q.size()), q) << what << ": q must not be written";
    if (with_x8) {
      const HostX8 a = read_x8(x8_a, c.n, cols), b = read_x8(x8_b, c.n, cols);
      EXPECT_EQ(b.d, host_quantize_x8(got).d) << what;
      EXPECT_EQ(b.q, host_quantize_x8(got).q) << what;
      EXPECT_LT(rel_err(b.d, a.d), 1e-6) << what;
    }
  }
}

TEST(GpuOps, DecodeAttentionPositionPastMaxCtxWritesNan) {
  REQUIRE_GPU();
  const int hd = 64, max_ctx = 8;
  DevBuf q(hd * 4), k(max_ctx * hd * 2), v(max_ctx * hd * 2), out(hd * 4);
  auto dp = upload(std::vector<int>{max_ctx});
  ck(cudaMemset(out.p, 0, hd * 4), "memset");
  gpu::decode_attention(q.as<float>(), k.as<uint16_t>(), v.as<uint16_t>(), 1, dp->as<int>(), 1, 1, hd, 0, 1.0f,
                        max_ctx, out.as<float>(), nullptr);
  const std::vector<float> o = out.get<float>(hd);
  EXPECT_TRUE(std::isnan(o[0]) && std::isnan(o[hd - 1]));
}

#endif  // RUNLM_CUDA
