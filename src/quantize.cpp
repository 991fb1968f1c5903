// Weight-type choice, parallel row encoding and GGUF re-quantization (see
// quantize.h).
#include "quantize.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <memory>
#include <thread>

#include "common.h"
#include "gguf.h"
#include "gguf_llama_writer.h"
#include "cpu/quant.h"

namespace runlm {

namespace {

constexpr QuantTarget kTargets[] = {
    {"f32", DType::F32, 0, false},    {"f16", DType::F16, 1, false},   {"bf16", DType::BF16, 32, false},
    {"q8_0", DType::Q8_0, 7, false},  {"q4_0", DType::Q4_0, 2, false}, {"q4_k", DType::Q4_K, 14, false},
    {"q6_k", DType::Q6_K, 18, false}, {"q4_k_m", DType::Q4_K, kFtypeQ4_K_M, true},
};

// Below this many elements per thread, starting a thread costs more than it saves.
constexpr int64_t kMinElementsPerThread = 1 << 16;

bool is_k_quant(DType t) { return dtype_info(t).block_size == kQK_K; }

// Layer index of "blk.N.xxx", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int v = 0;
  size_t i = 4;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    v = v * 10 + (name[i] - '0');
    if (v > (1 << 20)) return -1;
  }
  return i < name.size() && name[i] == '.' ? v : -1;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

const QuantTarget& quant_target_from_name(const std::string& name) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string known;
  for (const auto& t : kTargets) {
    if (lower == t.name) return t;
    known += std::string(known.empty() ? "" : ", ") + t.name;
  }
  fail("unknown quantization type '%s'; supported: %s", name.c_str(), known.c_str());
}

bool llama_use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

TensorTypeChoice choose_tensor_type(const QuantTarget& target, const std::string& name,
                                    const std::vector<int64_t>& ne, int n_layers, bool has_output) {
  // Norms (and any other vector) are tiny and precision-sensitive.
  if (ne.size() < 2) return {DType::F32, DType::F32, ""};

  DType wanted = target.base;
  if (target.k_mix) {
    const int layer = layer_of(name);
    if (name == "output.weight" || (!has_output && name == "token_embd.weight")) wanted = DType::Q6_K;
    else if ((contains(name, "attn_v.weight") || contains(name, "ffn_down.weight")) && layer >= 0 &&
             llama_use_more_bits(layer, n_layers))
      wanted = DType::Q6_K;
  }

  const int64_t block = dtype_info(wanted).block_size;
  if (ne[0] % block == 0) return {wanted, wanted, ""};
  const DType fallback = is_k_quant(wanted) && ne[0] % kQK == 0 ? DType::Q8_0 : DType::F16;
  return {fallback, wanted,
          strfmt("%s: row length %lld is not a multiple of %s's block of %lld; using %s", name.c_str(),
                 static_cast<long long>(ne[0]), dtype_name(wanted), static_cast<long long>(block),
                 dtype_name(fallback))};
}

void encode_rows_parallel(DType t, int64_t n_cols, int64_t n_rows, const RowSource& src_row, uint8_t* dst,
                          int n_threads) {
  if (n_rows <= 0) return;
  const size_t row_bytes = dtype_row_bytes(t, n_cols);
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t by_work = std::max<int64_t>(1, n_rows * n_cols / kMinElementsPerThread);
  const int64_t n_workers = std::min<int64_t>({n_threads, by_work, n_rows});

  std::vector<std::exception_ptr> errors(static_cast<size_t>(n_workers));
  auto work = [&](int64_t w) {
    try {
      const int64_t r0 = n_rows * w / n_workers, r1 = n_rows * (w + 1) / n_workers;
      std::vector<float> buf(static_cast<size_t>(n_cols));  // [n_cols] one row in f32
      for (int64_t r = r0; r < r1; ++r) {
        src_row(r, buf.data());
        quantize_row(t, buf.data(), dst + static_cast<size_t>(r) * row_bytes, n_cols);
      }
    } catch (...) {
      errors[static_cast<size_t>(w)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < n_workers; ++w) threads.emplace_back(work, w);
  work(0);  // the calling thread takes the first share
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const std::string& target_name,
                             int n_threads) {
  const QuantTarget& target = quant_target_from_name(target_name);
  const auto src = GgufFile::open(in);
  QuantizeReport report;

  // n_layers for the q4_k_m mix: the hparam if present, else counted.
  int n_layers = 0;
  if (auto arch = src->get_string_opt("general.architecture"))
    n_layers = static_cast<int>(src->get_int_opt(*arch + ".block_count").value_or(0));
  if (n_layers <= 0)
    for (const auto& t : src->tensors()) n_layers = std::max(n_layers, layer_of(t.name) + 1);
  const bool has_output = src->find_tensor("output.weight") != nullptr;

  GgufWriter w(src->alignment());
  w.copy_metadata(*src);
  w.set_u32("general.file_type", target.ftype);

  for (const GgufTensorInfo& t : src->tensors()) {
    const DTypeInfo& in_info = dtype_info(t.type);
    RUNLM_CHECK(in_info.can_decode, "%s: tensor '%s' has type %s, which cannot be decoded", in.c_str(),
                t.name.c_str(), in_info.name);
    RUNLM_CHECK(!t.ne.empty() && t.ne[0] > 0, "%s: tensor '%s' has an empty shape", in.c_str(), t.name.c_str());
    const TensorTypeChoice choice = choose_tensor_type(target, t.name, t.ne, n_layers, has_output);
    if (!choice.note.empty()) {
      std::fprintf(stderr, "quantize: %s\n", choice.note.c_str());
      report.fallbacks.push_back(choice.note);
    }
    const uint8_t* data = src->tensor_data(t);
    report.bytes_in += t.nbytes;
    const int64_t n_cols = t.ne[0], n_rows = t.n_elements() / n_cols;
    report.bytes_out += dtype_row_bytes(choice.type, n_cols) * static_cast<uint64_t>(n_rows);
    ++report.n_tensors;
    if (choice.type == t.type) {
      // Already the right type: copying keeps it bit-exact (no second rounding).
      w.add_tensor(t.name, t.type, t.ne, data);
      continue;
    }
    const size_t in_row_bytes = dtype_row_bytes(t.type, n_cols);
    const DType in_type = t.type, out_type = choice.type;
    w.add_tensor(t.name, out_type, t.ne, [=](uint8_t* dst) {
      encode_rows_parallel(
          out_type, n_cols, n_rows,
          [&](int64_t r, float* buf) { dequantize_row(in_type, data + static_cast<size_t>(r) * in_row_bytes, buf, n_cols); },
          dst, n_threads);
    });
  }
  w.write(out, stderr_progress("quantize"));
  return report;
}

}  // namespace runlm
