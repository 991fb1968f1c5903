// Weight upload: repacks a host QMatrix (GGUF blocks) into the device layout
// of gpu_codec.cuh on the host, then copies it in one allocation. The total
// stays the GGUF size plus at most 3 x 256 bytes of part alignment.
#include <cstring>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cpu/quant.h"

namespace runlm::gpu {

bool gemv_supports(DType t) { return packed_layout(t, 1, 256).ok; }

WView make_view(const GpuMatrix& m) {
  const PackedLayout l = packed_layout(m.type, m.rows, m.cols);
  const uint8_t* base = static_cast<const uint8_t*>(m.data);
  return WView{base + l.off[0], base + l.off[1], base + l.off[2], base + l.off[3], m.rows, m.cols,
               static_cast<int>(m.cols / l.unit)};
}

namespace {

// Host repack of one row (GGUF bytes at src) into the parts of dst.
void repack_row(DType t, const uint8_t* src, int64_t r, int64_t cols, const PackedLayout& l, uint8_t* dst) {
  const int64_t nb32 = cols / 32, nb256 = cols / 256;
  switch (t) {
    case DType::F32: std::memcpy(dst + l.off[0] + r * cols * 4, src, cols * 4); break;
    case DType::F16:
    case DType::BF16: std::memcpy(dst + l.off[0] + r * cols * 2, src, cols * 2); break;
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < nb32; ++i) {
        std::memcpy(dst + l.off[0] + r * cols + i * 32, b[i].qs, 32);
        std::memcpy(dst + l.off[1] + (r * nb32 + i) * 2, &b[i].d, 2);
      }
      break;
    }
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < nb32; ++i) {
        std::memcpy(dst + l.off[0] + r * (cols / 2) + i * 16, b[i].qs, 16);
        std::memcpy(dst + l.off[1] + (r * nb32 + i) * 2, &b[i].d, 2);
      }
      break;
    }
    case DType::Q4_K: std::memcpy(dst + l.off[0] + r * nb256 * 144, src, nb256 * 144); break;
    case DType::Q5_K: std::memcpy(dst + l.off[0] + r * nb256 * 176, src, nb256 * 176); break;
    case DType::Q6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(src);
      for (int64_t i = 0; i < nb256; ++i) {
        const int64_t k = r * nb256 + i;
        std::memcpy(dst + l.off[0] + k * 128, b[i].ql, 128);
        std::memcpy(dst + l.off[1] + k * 64, b[i].qh, 64);
        std::memcpy(dst + l.off[2] + k * 16, b[i].scales, 16);
        std::memcpy(dst + l.off[3] + k * 2, &b[i].d, 2);
      }
      break;
    }
    default: fail("upload_matrix: unreachable type %s", dtype_name(t));
  }
}

}  // namespace

std::string upload_unsupported_reason(const QMatrix& host) {
  const PackedLayout l = packed_layout(host.type, host.rows, host.cols);
  if (!l.ok)
    return strfmt("weight type %s unsupported on the GPU; supported: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k",
                  dtype_name(host.type));
  if (host.rows <= 0 || host.cols <= 0)
    return strfmt("empty %s matrix (%lld x %lld)", dtype_name(host.type), static_cast<long long>(host.rows),
                  static_cast<long long>(host.cols));
  // Plain types need cols % 8 so that rows stay 16-byte aligned; block types
  // need whole blocks (the GGUF loader already guarantees that).
  const int64_t granule = host.type == DType::F32 || host.type == DType::F16 || host.type == DType::BF16
                              ? 8
                              : dtype_info(host.type).block_size;
  if (host.cols % granule != 0)
    return strfmt("%s matrix with %lld columns; the GPU layout needs a multiple of %lld", dtype_name(host.type),
                  static_cast<long long>(host.cols), static_cast<long long>(granule));
  return "";
}

GpuMatrix upload_matrix(const QMatrix& host) {
  const std::string why = upload_unsupported_reason(host);
  RUNLM_CHECK(why.empty(), "upload_matrix: %s", why.c_str());
  const PackedLayout l = packed_layout(host.type, host.rows, host.cols);
  RUNLM_CHECK(host.rows <= INT32_MAX / 8 && host.cols / l.unit <= INT32_MAX,
              "upload_matrix: %lld x %lld too large", static_cast<long long>(host.rows),
              static_cast<long long>(host.cols));
  RUNLM_CHECK(host.row_bytes >= dtype_row_bytes(host.type, host.cols), "upload_matrix: row_bytes %zu < %zu",
              host.row_bytes, dtype_row_bytes(host.type, host.cols));

  // Allocate before repacking so a model that does not fit fails fast.
  size_t free_b = 0, total_b = 0;
  cudaCheck(cudaMemGetInfo(&free_b, &total_b));
  void* p = nullptr;
  if (l.bytes > free_b || cudaMalloc(&p, l.bytes) != cudaSuccess) {
    cudaGetLastError();  // clear the allocation error so later checks see none
    fail("upload_matrix: out of GPU memory for a %s %lld x %lld matrix: needed %zu bytes, free %zu bytes",
         dtype_name(host.type), static_cast<long long>(host.rows), static_cast<long long>(host.cols), l.bytes,
         free_b);
  }
  try {
    std::vector<uint8_t> staging(l.bytes, 0);
    for (int64_t r = 0; r < host.rows; ++r)
      repack_row(host.type, host.data + host.row_bytes * static_cast<size_t>(r), r, host.cols, l, staging.data());
    cudaCheck(cudaMemcpy(p, staging.data(), l.bytes, cudaMemcpyHostToDevice));
  } catch (...) {
    cudaFree(p);
    throw;
  }
  GpuMatrix m;
  m.type = host.type;
  m.rows = host.rows;
  m.cols = host.cols;
  m.data = p;
  m.bytes = l.bytes;
  return m;
}

void free_matrix(GpuMatrix& m) {
  if (m.data) cudaCheck(cudaFree(m.data));
  m = GpuMatrix{};
}

}  // namespace runlm::gpu
