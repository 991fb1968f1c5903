// Weight upload: repacks a host QMatrix (GGUF blocks) into the device layout
// of gpu_codec.cuh on the host, then copies it in one allocation. The total
// stays the GGUF size plus at most 3 x 256 bytes of part alignment.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/gpu_codec.cuh"
#include "cuda/gpu_ops.h"
#include "cuda/moe_ops.h"
#include "cpu/quant.h"
#include "thread_pool.h"

namespace runlm::gpu {

bool gemv_supports(DType t) { return packed_layout(t, 1, 256).ok; }

WView make_view(const GpuMatrix& m) {
  const PackedLayout l = packed_layout(m.type, m.rows, m.cols);
  const uint8_t* base = static_cast<const uint8_t*>(m.data);
  return WView{base + l.off[0], base + l.off[1], base + l.off[2], base + l.off[3], m.rows, m.cols,
               static_cast<int>(m.cols / l.unit)};
}

namespace {

// The device tables of gpu_codec.cuh hold quant.h's values.
bool tables_match() {
  for (int i = 0; i < 16; ++i) {
    if (static_cast<int8_t>(Iq4nlTable::w[i / 4] >> (8 * (i % 4))) != kIq4nlValues[i]) return false;
    if (static_cast<int8_t>(Mxfp4Table::w[i / 4] >> (8 * (i % 4))) != kMxfp4Values[i]) return false;
  }
  return true;
}

// One bit per element of a 32-element unit into a bit plane: element e = 4g
// + b goes to bit 8b + g (gpu_codec.cuh plane_bits).
uint32_t bit_plane(const uint8_t* bits) {
  uint32_t p = 0;
  for (int e = 0; e < 32; ++e) p |= static_cast<uint32_t>(bits[e] & 1) << (8 * (e % 4) + e / 4);
  return p;
}

// 2-bit levels of a 32-element unit into a 2-bit plane (two_bit_levels):
// element e = 4g + b goes to bits 8b + 2(g % 4) of word g / 4.
void two_bit_plane(const uint8_t* lv, uint8_t* dst) {
  uint32_t w[2] = {0, 0};
  for (int e = 0; e < 32; ++e) {
    const int g = e / 4;
    w[g / 4] |= static_cast<uint32_t>(lv[e] & 3) << (8 * (e % 4) + 2 * (g % 4));
  }
  std::memcpy(dst, w, 8);
}

// The low 4 bits of a 32-element unit's levels as 16 bytes in Q4_0 order:
// byte j holds element j (low nibble) and element j + 16 (high).
void nibble_unit(const uint8_t* lv, uint8_t* dst) {
  for (int j = 0; j < 16; ++j) dst[j] = static_cast<uint8_t>((lv[j] & 0xF) | (lv[j + 16] & 0xF) << 4);
}

// ggml's Q3_K 6-bit scale j (kernels/cpu/quant_q2_q3_k.cpp), bias removed.
int q3_k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  return (lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
}

// The 5th bits of a Q5_0 / Q5_1 block (qh bit e = element e) as a bit plane.
uint32_t q5_plane(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  uint8_t bits[32];
  for (int e = 0; e < 32; ++e) bits[e] = (h >> e) & 1;
  return bit_plane(bits);
}

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
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool q5 = t == DType::Q5_K;
      const size_t bs = dtype_info(t).type_size;
      for (int64_t i = 0; i < nb256; ++i) {
        const int64_t k = r * nb256 + i;
        const uint8_t* b = src + i * bs;  // d, dmin, scales[12], [qh[32],] qs[128]
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + (q5 ? 48 : 16);
        // Element 64c + l is the low nibble of qs[32c + l], 64c + 32 + l the
        // high one; Q5_K's 5th bits are bits 2c, 2c + 1 of qh[l].
        uint8_t lv[256];
        for (int c = 0; c < 4; ++c)
          for (int e = 0; e < 32; ++e) {
            const uint8_t q = qs[32 * c + e];
            lv[64 * c + e] = (q & 0xF) | (q5 ? ((qh[e] >> (2 * c)) & 1) << 4 : 0);
            lv[64 * c + 32 + e] = (q >> 4) | (q5 ? ((qh[e] >> (2 * c + 1)) & 1) << 4 : 0);
          }
        uint8_t sc[8], mn[8];
        unpack_k_scales(b + 4, sc, mn);
        for (int j = 0; j < 8; ++j) {
          nibble_unit(lv + 32 * j, dst + l.off[0] + (k * 8 + j) * 16);
          dst[l.off[1] + (k * 8 + j) * 2] = sc[j];
          dst[l.off[1] + (k * 8 + j) * 2 + 1] = mn[j];
          if (q5) {
            uint8_t hb[32];
            for (int e = 0; e < 32; ++e) hb[e] = lv[32 * j + e] >> 4;
            const uint32_t p = bit_plane(hb);
            std::memcpy(dst + l.off[2] + (k * 8 + j) * 4, &p, 4);
          }
        }
        std::memcpy(dst + l.off[q5 ? 3 : 2] + k * 4, b, 4);  // d, dmin
      }
      break;
    }
    case DType::Q6_K: {
      const auto* b = reinterpret_cast<const BlockQ6_K*>(src);
      for (int64_t i = 0; i < nb256; ++i) {
        const int64_t k = r * nb256 + i;
        // Element 128h + 32g + e: low 4 bits from ql[64h + 32(g % 2) + e]
        // (low nibble for g < 2), high 2 bits at bits 2g of qh[32h + e].
        uint8_t lv[256];
        for (int h = 0; h < 2; ++h)
          for (int g = 0; g < 4; ++g)
            for (int e = 0; e < 32; ++e)
              lv[128 * h + 32 * g + e] = ((b[i].ql[64 * h + 32 * (g & 1) + e] >> (4 * (g >> 1))) & 0xF) |
                                         ((b[i].qh[32 * h + e] >> (2 * g)) & 3) << 4;
        for (int j = 0; j < 8; ++j) {
          uint8_t hi[32];
          for (int e = 0; e < 32; ++e) hi[e] = lv[32 * j + e] >> 4;
          nibble_unit(lv + 32 * j, dst + l.off[0] + (k * 8 + j) * 16);
          two_bit_plane(hi, dst + l.off[1] + (k * 8 + j) * 8);
        }
        std::memcpy(dst + l.off[2] + k * 16, b[i].scales, 16);  // scale j: elements 16j.., in order
        std::memcpy(dst + l.off[3] + k * 2, &b[i].d, 2);
      }
      break;
    }
    case DType::Q4_1:
    case DType::Q5_1: {
      const bool q5 = t == DType::Q5_1;
      const size_t bs = dtype_info(t).type_size;
      for (int64_t i = 0; i < nb32; ++i) {
        const uint8_t* b = src + i * bs;  // d, m, [qh,] qs
        const int64_t k = r * nb32 + i;
        std::memcpy(dst + l.off[0] + k * 16, b + (q5 ? 8 : 4), 16);
        std::memcpy(dst + l.off[1] + k * 4, b, 4);
        if (q5) {
          const uint32_t p = q5_plane(b + 4);
          std::memcpy(dst + l.off[2] + k * 4, &p, 4);
        }
      }
      break;
    }
    case DType::Q5_0: {
      const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
      for (int64_t i = 0; i < nb32; ++i) {
        const int64_t k = r * nb32 + i;
        const uint32_t p = q5_plane(b[i].qh);
        std::memcpy(dst + l.off[0] + k * 16, b[i].qs, 16);
        std::memcpy(dst + l.off[1] + k * 2, &b[i].d, 2);
        std::memcpy(dst + l.off[2] + k * 4, &p, 4);
      }
      break;
    }
    case DType::IQ4_NL: {
      const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src);
      for (int64_t i = 0; i < nb32; ++i) {
        const int64_t k = r * nb32 + i;
        std::memcpy(dst + l.off[0] + k * 16, b[i].qs, 16);
        std::memcpy(dst + l.off[1] + k * 2, &b[i].d, 2);
      }
      break;
    }
    case DType::MXFP4: {
      const auto* b = reinterpret_cast<const BlockMXFP4*>(src);
      for (int64_t i = 0; i < nb32; ++i) {
        const int64_t k = r * nb32 + i;
        std::memcpy(dst + l.off[0] + k * 16, b[i].qs, 16);
        dst[l.off[1] + k] = b[i].e;
      }
      break;
    }
    case DType::IQ4_XS: {
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(src);
      static_assert(offsetof(BlockIQ4_XS, qs) == 8, "IQ4_XS header is 8 bytes");
      for (int64_t i = 0; i < nb256; ++i) {
        const int64_t k = r * nb256 + i;
        std::memcpy(dst + l.off[0] + k * 128, b[i].qs, 128);  // sub-block j = unit j, nibble order already
        std::memcpy(dst + l.off[1] + k * 8, &b[i], 8);
      }
      break;
    }
    case DType::Q2_K:
    case DType::Q3_K: {
      const bool q3 = t == DType::Q3_K;
      for (int64_t i = 0; i < nb256; ++i) {
        const int64_t k = r * nb256 + i;
        const uint8_t* qs = q3 ? reinterpret_cast<const BlockQ3_K*>(src)[i].qs : reinterpret_cast<const BlockQ2_K*>(src)[i].qs;
        // Element 32c + e: 2 bits at shift 2 (c % 4) of qs[32 (c / 4) + e];
        // Q3_K's high bit is bit c of hmask[e].
        for (int c = 0; c < 8; ++c) {
          uint8_t lv[32], hb[32];
          for (int e = 0; e < 32; ++e) {
            lv[e] = (qs[32 * (c / 4) + e] >> (2 * (c % 4))) & 3;
            if (q3) hb[e] = (reinterpret_cast<const BlockQ3_K*>(src)[i].hmask[e] >> c) & 1;
          }
          two_bit_plane(lv, dst + l.off[0] + (k * 8 + c) * 8);
          if (q3) {
            const uint32_t p = bit_plane(hb);
            std::memcpy(dst + l.off[1] + (k * 8 + c) * 4, &p, 4);
          }
        }
        if (q3) {
          const auto& b = reinterpret_cast<const BlockQ3_K*>(src)[i];
          for (int j = 0; j < 16; ++j) dst[l.off[2] + k * 16 + j] = static_cast<uint8_t>(static_cast<int8_t>(q3_k_scale(b.scales, j)));
          std::memcpy(dst + l.off[3] + k * 2, &b.d, 2);
        } else {
          const auto& b = reinterpret_cast<const BlockQ2_K*>(src)[i];
          std::memcpy(dst + l.off[1] + k * 16, b.scales, 16);  // sub-block j = elements 16j.., in order
          std::memcpy(dst + l.off[2] + k * 4, &b.d, 2);
          std::memcpy(dst + l.off[2] + k * 4 + 2, &b.dmin, 2);
        }
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
    return strfmt("weight type %s unsupported on the GPU; supported: %s", dtype_name(host.type), kGpuWeightTypes);
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

namespace {

// Repacking is host work proportional to the file (a 7B Q4_K_M is 4 GB):
// rows go to every core. Rows are disjoint in every part of every layout.
ThreadPool& repack_pool() {
  static ThreadPool pool(0);
  return pool;
}

// n matrices of host's shape, matrix e's GGUF rows host_stride * e bytes
// after host.data, into one allocation of n layouts of l.bytes each.
void* upload_packed(const QMatrix& host, int n, size_t host_stride, const char* who) {
  RUNLM_CHECK(tables_match(), "%s: the GPU's IQ4 / MXFP4 tables differ from the CPU's", who);
  const std::string why = upload_unsupported_reason(host);
  RUNLM_CHECK(why.empty(), "%s: %s", who, why.c_str());
  RUNLM_CHECK(n >= 1, "%s: %d matrices", who, n);
  const PackedLayout l = packed_layout(host.type, host.rows, host.cols);
  RUNLM_CHECK(host.rows <= INT32_MAX / 8 && host.cols / l.unit <= INT32_MAX, "%s: %lld x %lld too large", who,
              static_cast<long long>(host.rows), static_cast<long long>(host.cols));
  RUNLM_CHECK(host.row_bytes >= dtype_row_bytes(host.type, host.cols), "%s: row_bytes %zu < %zu", who,
              host.row_bytes, dtype_row_bytes(host.type, host.cols));
  const size_t total = l.bytes * static_cast<size_t>(n);  // l.bytes is a multiple of kPartAlign
  // Allocate before repacking so a model that does not fit fails fast.
  size_t free_b = 0, total_b = 0;
  cudaCheck(cudaMemGetInfo(&free_b, &total_b));
  void* p = nullptr;
  if (total > free_b || cudaMalloc(&p, total) != cudaSuccess) {
    cudaGetLastError();  // clear the allocation error so later checks see none
    fail("%s: out of GPU memory for %d %s matri%s of %lld x %lld: needed %zu bytes, free %zu bytes", who, n,
         dtype_name(host.type), n == 1 ? "x" : "ces", static_cast<long long>(host.rows),
         static_cast<long long>(host.cols), total, free_b);
  }
  try {
    // One matrix staged at a time: the host holds one expert's repacking, not the tensor's.
    std::vector<uint8_t> staging(l.bytes);
    for (int e = 0; e < n; ++e) {
      std::fill(staging.begin(), staging.end(), uint8_t{0});
      const uint8_t* src = host.data + host_stride * static_cast<size_t>(e);
      repack_pool().parallel_for(host.rows, [&](int64_t begin, int64_t end, int) {
        for (int64_t r = begin; r < end; ++r)
          repack_row(host.type, src + host.row_bytes * static_cast<size_t>(r), r, host.cols, l, staging.data());
      });
      cudaCheck(cudaMemcpy(static_cast<uint8_t*>(p) + l.bytes * static_cast<size_t>(e), staging.data(), l.bytes,
                           cudaMemcpyHostToDevice));
    }
  } catch (...) {
    cudaFree(p);
    throw;
  }
  return p;
}

}  // namespace

GpuMatrix upload_matrix(const QMatrix& host) {
  GpuMatrix m;
  m.data = upload_packed(host, 1, 0, "upload_matrix");
  m.type = host.type;
  m.rows = host.rows;
  m.cols = host.cols;
  m.bytes = packed_layout(host.type, host.rows, host.cols).bytes;
  return m;
}

GpuExperts upload_experts(const QMatrix& host, int n_expert, size_t host_stride) {
  GpuExperts x;
  x.data = upload_packed(host, n_expert, host_stride, "upload_experts");
  x.type = host.type;
  x.rows = host.rows;
  x.cols = host.cols;
  x.n = n_expert;
  x.stride = packed_layout(host.type, host.rows, host.cols).bytes;
  x.bytes = x.stride * static_cast<size_t>(n_expert);
  return x;
}

GpuMatrix expert_matrix(const GpuExperts& x, int e) {
  RUNLM_CHECK(e >= 0 && e < x.n, "expert_matrix: expert %d of %d", e, x.n);
  GpuMatrix m;
  m.type = x.type;
  m.rows = x.rows;
  m.cols = x.cols;
  m.data = static_cast<uint8_t*>(x.data) + x.stride * static_cast<size_t>(e);
  m.bytes = x.stride;
  return m;
}

void free_experts(GpuExperts& x) {
  if (x.data) cudaCheck(cudaFree(x.data));
  x = GpuExperts{};
}

void free_matrix(GpuMatrix& m) {
  if (m.data) cudaCheck(cudaFree(m.data));
  m = GpuMatrix{};
}

}  // namespace runlm::gpu
