// runlm bench-matmul: the weight-product kernels alone on the Llama-2-7B
// shapes (4096 x 4096, 11008 x 4096, 4096 x 11008, 32000 x 4096). Decode
// GEMV (f32 x where gemv_f32x_supports, int8 x for every quantized type) at
// a few tokens: microseconds, GB/s of the bytes read and their share of the
// device's copy bandwidth (measured first: a device-to-device copy, read +
// write bytes over time); prefill GEMM at more tokens: every fused kernel
// the device runs (Q4_0 / Q8_0) and dequantization + cuBLAS, microseconds
// and TFLOP/s. Weights rotate over > 200 MB of copies so that small
// products read DRAM, not L2. Random bytes with finite scales: realistic
// traffic, not exact data (the tests check the arithmetic).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "cuda_bench.h"
#include "common.h"
#include "dtype.h"

#ifdef RUNLM_CUDA
#include <cuda_runtime.h>

#include "cuda/gpu_ops.h"
#endif

namespace runlm {

namespace {

std::vector<int> int_list(const std::string& s, const char* flag) {
  std::vector<int> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    RUNLM_CHECK(used == item.size() && used > 0 && v >= 1, "bench-matmul: %s: '%s' is not a positive integer", flag,
                item.c_str());
    r.push_back(v);
  }
  RUNLM_CHECK(!r.empty() && s.back() != ',', "bench-matmul: %s '%s' is not a list of positive integers", flag,
              s.c_str());
  return r;
}

#ifdef RUNLM_CUDA
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench-matmul: %s: %s", what, cudaGetErrorString(e));
}

// Random GGUF bytes of a rows x cols matrix: plain types uniform in (-1, 1),
// block types random quants with every scale 0.01 (finite).
std::vector<uint8_t> random_matrix(DType t, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const size_t rb = dtype_row_bytes(t, cols), n = rb * size_t(rows);
  std::vector<uint8_t> b(n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
    const size_t es = t == DType::F32 ? 4 : 2;
    for (size_t i = 0; i < n; i += es) {
      const float f = u(rng);
      if (t == DType::F32) std::memcpy(&b[i], &f, 4);
      const uint16_t h = t == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
      if (t != DType::F32) std::memcpy(&b[i], &h, 2);
    }
    return b;
  }
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(&b[i], &r, 8);
  }
  // The f16 scale fields of each block (kernels/cpu/quant.h layouts).
  std::vector<size_t> offs = {0};
  switch (t) {
    case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: offs = {0, 2}; break;
    case DType::Q6_K: offs = {208}; break;
    case DType::Q2_K: offs = {80, 82}; break;
    case DType::Q3_K: offs = {108}; break;
    case DType::MXFP4: offs = {}; break;  // an E8M0 byte, set below
    default: break;
  }
  const uint16_t d = fp32_to_fp16(0.01f);
  const size_t bs = dtype_info(t).type_size;
  for (size_t i = 0; i < n; i += bs) {
    for (size_t o : offs) std::memcpy(&b[i + o], &d, 2);
    if (t == DType::MXFP4) b[i] = 120;  // 2^-8
  }
  return b;
}

// Device-to-device copy bandwidth in GB/s (bytes read + written over time),
// the reference the GEMV figures are given against.
double copy_gbps() {
  const size_t bytes = size_t{512} << 20;
  void *a = nullptr, *b = nullptr;
  ck(cudaMalloc(&a, bytes), "malloc");
  ck(cudaMalloc(&b, bytes), "malloc");
  ck(cudaMemset(a, 1, bytes), "memset");
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  ck(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
  constexpr int kIters = 10;
  ck(cudaEventRecord(e0), "record");
  for (int i = 0; i < kIters; ++i) ck(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
  ck(cudaEventRecord(e1), "record");
  ck(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) * kIters / (double(ms) * 1e6);
}

// Milliseconds a call (fn(i) for the i-th call), after 3 warm-up calls.
float time_ms(const std::function<void(int)>& fn, int iters) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) fn(i);
  ck(cudaEventRecord(a), "record");
  for (int i = 0; i < iters; ++i) fn(i);
  ck(cudaEventRecord(b), "record");
  ck(cudaEventSynchronize(b), "sync");
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}
#endif

}  // namespace

int cmd_bench_matmul(int argc, char** argv) {
  cxxopts::Options opts("runlm bench-matmul", "Decode GEMV and prefill GEMM kernels on the Llama-2-7B shapes");
  opts.add_options()
      ("type", "weight types, comma separated, or all (every GPU weight type)",
       cxxopts::value<std::string>()->default_value("f16,q8_0,q4_0"))
      ("gemv-tokens", "GEMV token counts", cxxopts::value<std::string>()->default_value("1,8"))
      ("gemm-tokens", "GEMM token counts", cxxopts::value<std::string>()->default_value("128,256,512"))
      ("o,output", "table or json", cxxopts::value<std::string>()->default_value("table"))
      ("h,help", "show help");
  cxxopts::ParseResult args;
  try {
    args = opts.parse(argc, argv);
  } catch (const std::exception& e) {
    fail("bench-matmul: %s", e.what());
  }
  if (args.count("help")) {
    std::printf("%s\n", opts.help().c_str());
    return 0;
  }
  std::vector<DType> types;
  {
    std::stringstream ss(args["type"].as<std::string>());
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item != "all") {
        types.push_back(dtype_from_name(item));
        continue;
      }
      for (uint32_t raw = 0; raw < 256; ++raw) {
        const DTypeInfo* info = dtype_info_or_null(raw);
#ifdef RUNLM_CUDA
        if (info && gpu::gemv_supports(info->type)) types.push_back(info->type);
#else
        (void)info;
        fail("bench-matmul: runlm was built without CUDA");
#endif
      }
    }
    RUNLM_CHECK(!types.empty(), "bench-matmul: --type is empty");
  }
  const std::vector<int> gemv_tokens = int_list(args["gemv-tokens"].as<std::string>(), "--gemv-tokens");
  const std::vector<int> gemm_tokens = int_list(args["gemm-tokens"].as<std::string>(), "--gemm-tokens");
  for (int n : gemv_tokens) RUNLM_CHECK(n <= 16, "bench-matmul: --gemv-tokens %d unsupported; supported: 1..16", n);
  const std::string out_fmt = args["output"].as<std::string>();
  RUNLM_CHECK(out_fmt == "table" || out_fmt == "json", "bench-matmul: -o %s unknown; supported: table, json",
              out_fmt.c_str());

#ifndef RUNLM_CUDA
  fail("bench-matmul: runlm was built without CUDA");
#else
  struct Shape {
    int64_t rows, cols;
  };
  const Shape shapes[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
  const int max_n = std::max(*std::max_element(gemm_tokens.begin(), gemm_tokens.end()), 16);
  const bool json = out_fmt == "json";
  const double copy = copy_gbps();
  if (json)
    std::printf("{\"bench\": \"matmul\", \"copy_gbps\": %.1f}\n", copy);
  else
    std::printf("device copy bandwidth %.0f GB/s (read + write); %%copy = GB/s of the kernel's bytes / that\n"
                "%-22s %-6s %13s %5s %10s %9s %6s %9s\n",
                copy, "kernel", "type", "rows x cols", "n", "us", "GB/s", "%copy", "TFLOP/s");
  auto report = [&](const char* kernel, DType t, const Shape& s, int n, float ms, double bytes) {
    const double tflops = 2.0 * double(s.rows) * double(s.cols) * n / (ms * 1e-3) / 1e12;
    const double gbps = bytes / (ms * 1e6);
    if (json)
      std::printf("{\"bench\": \"matmul\", \"kernel\": \"%s\", \"type\": \"%s\", \"rows\": %lld, \"cols\": %lld, "
                  "\"n\": %d, \"us\": %.2f, \"gbps\": %.1f, \"copy_share\": %.3f, \"tflops\": %.2f}\n",
                  kernel, dtype_name(t), static_cast<long long>(s.rows), static_cast<long long>(s.cols), n, ms * 1e3,
                  gbps, gbps / copy, tflops);
    else
      std::printf("%-22s %-6s %6lldx%-6lld %5d %10.1f %9.0f %5.0f%% %9.1f\n", kernel, dtype_name(t),
                  static_cast<long long>(s.rows), static_cast<long long>(s.cols), n, ms * 1e3, gbps,
                  100.0 * gbps / copy, tflops);
    std::fflush(stdout);
  };
  std::mt19937_64 rng(77);
  for (DType t : types) {
    for (const Shape& s : shapes) {
      const std::vector<uint8_t> host = random_matrix(t, s.rows, s.cols, rng);
      const QMatrix q{t, host.data(), dtype_row_bytes(t, s.cols), s.cols, s.rows};
      const std::string why = gpu::upload_unsupported_reason(q);
      RUNLM_CHECK(why.empty(), "bench-matmul: %s", why.c_str());
      gpu::GpuMatrix base = gpu::upload_matrix(q);
      // Copies spanning > 200 MB: a bench cycling through them reads DRAM.
      const int copies = static_cast<int>(std::max<size_t>(2, (size_t{200} << 20) / base.bytes + 1));
      std::vector<gpu::GpuMatrix> ms(copies, base);
      std::vector<std::unique_ptr<DevMem>> store;
      for (int i = 1; i < copies; ++i) {
        store.push_back(std::make_unique<DevMem>(base.bytes));
        ck(cudaMemcpy(store.back()->p, base.data, base.bytes, cudaMemcpyDeviceToDevice), "clone");
        ms[i].data = store.back()->p;
      }
      DevMem x(sizeof(float) * max_n * s.cols), xh(2 * size_t(max_n) * s.cols), y(sizeof(float) * max_n * s.rows);
      ck(cudaMemset(x.p, 0, sizeof(float) * max_n * s.cols), "memset");  // zeros: finite, and f16 zeros too
      ck(cudaMemset(xh.p, 0, 2 * size_t(max_n) * s.cols), "memset");
      float* xf = static_cast<float*>(x.p);
      float* yf = static_cast<float*>(y.p);
      for (int n : gemv_tokens) {
        const double bytes = double(base.bytes) + 4.0 * n * double(s.cols + s.rows);
        if (gpu::gemv_f32x_supports(t))
          report("gemv", t, s, n, time_ms([&](int i) { gpu::gemv(ms[i % copies], xf, yf, n, nullptr); }, 50),
                 bytes);
        if (gpu::gemv_x8_supports(t)) {
          DevMem x8(gpu::x8_bytes(n, s.cols));
          gpu::quantize_x8(xf, n, s.cols, x8.p, nullptr);  // once, as the engine shares it between matrices
          const float x8_ms = time_ms(
              [&](int i) {
                const gpu::GemvOut out{&ms[i % copies], yf};
                gpu::gemv_x8(&out, 1, x8.p, n, nullptr);
              },
              50);
          report("gemv_x8", t, s, n, x8_ms, double(base.bytes) + double(n) * s.cols + 4.0 * n * s.rows);
        }
      }
      const size_t scratch_bytes = gpu::gemm_scratch_bytes(base);
      DevMem scratch(scratch_bytes);
      const auto* xh16 = static_cast<const uint16_t*>(xh.p);
      for (int n : gemm_tokens) {
        const double bytes = double(base.bytes) + 2.0 * n * s.cols + 4.0 * n * s.rows;
        if (gpu::gemm_fused_supports(base) && gpu::gemm_fused_fits_device(base)) {
          std::vector<gpu::GemmFusedKernel> ks = {gpu::GemmFusedKernel::MmaSm80};
          if (gpu::gemm_fused_has_wgmma())
            ks.insert(ks.end(), {gpu::GemmFusedKernel::Wgmma, gpu::GemmFusedKernel::WgmmaOverlap,
                                 gpu::GemmFusedKernel::WgmmaStreamK});
          ks.push_back(gpu::GemmFusedKernel::Auto);
          for (gpu::GemmFusedKernel k : ks) {
            const float f_ms = time_ms(
                [&](int i) {
                  gpu::gemm_fused_q(ms[i % copies], xh16, yf, n, scratch.p, scratch_bytes, nullptr, 0, k);
                },
                20);
            report(k == gpu::GemmFusedKernel::Auto ? "fused auto" : gpu::gemm_fused_kernel_name(k), t, s, n, f_ms,
                   bytes);
          }
        }
        const float c_ms =
            time_ms([&](int i) { gpu::gemm_cublas(ms[i % copies], xh16, yf, n, scratch.p, nullptr); }, 20);
        report(t == DType::F16 ? "cublas" : "dequant + cublas", t, s, n, c_ms, bytes);
      }
      gpu::free_matrix(base);
    }
  }
  return 0;
#endif
}

}  // namespace runlm
