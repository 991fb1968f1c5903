// Weight-type choice (llama.cpp's quantization mixes as a table), parallel
// row encoding and GGUF re-quantization (see quantize.h).
#include "quantize.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <sys/stat.h>
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

using A = AttnVRule;
using F = FfnDownRule;

// llama.cpp's file types as llama-quantize names them, with the per-tensor
// rules of llama_tensor_get_type_impl (src/llama-quant.cpp) as columns. The
// rules common to every mix live in choose_tensor_type: the output matrix
// (and token_embd when tied) is Q6_K unless the base is Q8_0; with 8 experts
// attn_v is Q8_0; in 70B llama models a Q3_K/Q4_K attn_v becomes Q5_K.
//
// attn_v rules (i: the attn_v's layer, n: their count):
//   Q2K: n_gqa >= 4 ? Q4_K : Q3_K.       Q3KM: i < 2 ? Q5_K : Q4_K.
//   Q5K: Q5_K.                           Iq4: Q5_K if n_gqa >= 4.
//   MoreBitsQ6K: Q6_K if use_more_bits(i, n).   First4Q5K: Q5_K if i < 4.
// ffn_down rules (i: layer, n: block_count):
//   Q3K: Q3_K.   Q3KM: i < n/16 ? Q5_K : Q4_K (Falcon: Q3_K unless use_more_bits).
//   Q5K: Q5_K (Falcon: Q4_K).   MoreBitsQ6K: Q6_K if use_more_bits(i, n)
//   (Falcon Q4_K_M: Q6_K / Q5_K / Q4_K).   FirstEighthQ5K: Q5_K if i < n/8.
// attn_output is the listed type (for 8 experts, Q5_K in the low-bit mixes).
constexpr QuantTarget kTargets[] = {
    // name      base         ftype attn_v          ffn_down              attn_output   mxfp4_moe
    {"f32",      DType::F32,    0,  A::Keep,        F::Keep,              DType::F32,   false},
    {"f16",      DType::F16,    1,  A::Keep,        F::Keep,              DType::F16,   false},
    {"bf16",     DType::BF16,  32,  A::Keep,        F::Keep,              DType::BF16,  false},
    {"q8_0",     DType::Q8_0,   7,  A::Keep,        F::Keep,              DType::Q8_0,  false},
    {"q4_0",     DType::Q4_0,   2,  A::Keep,        F::Keep,              DType::Q4_0,  false},
    {"q4_1",     DType::Q4_1,   3,  A::Keep,        F::Keep,              DType::Q4_1,  false},
    {"q5_0",     DType::Q5_0,   8,  A::Keep,        F::Keep,              DType::Q5_0,  false},
    {"q5_1",     DType::Q5_1,   9,  A::Keep,        F::Keep,              DType::Q5_1,  false},
    {"q2_k",     DType::Q2_K,  10,  A::Q2K,         F::Q3K,               DType::Q3_K,  false},
    {"q3_k_s",   DType::Q3_K,  11,  A::Keep,        F::Keep,              DType::Q3_K,  false},
    {"q3_k_m",   DType::Q3_K,  12,  A::Q3KM,        F::Q3KM,              DType::Q4_K,  false},
    {"q3_k_l",   DType::Q3_K,  13,  A::Q5K,         F::Q5K,               DType::Q5_K,  false},
    {"q4_k_s",   DType::Q4_K,  14,  A::First4Q5K,   F::FirstEighthQ5K,    DType::Q4_K,  false},
    {"q4_k_m",   DType::Q4_K,  15,  A::MoreBitsQ6K, F::MoreBitsQ6K,       DType::Q4_K,  false},
    {"q5_k_s",   DType::Q5_K,  16,  A::Keep,        F::Keep,              DType::Q5_K,  false},
    {"q5_k_m",   DType::Q5_K,  17,  A::MoreBitsQ6K, F::MoreBitsQ6K,       DType::Q5_K,  false},
    {"q6_k",     DType::Q6_K,  18,  A::Keep,        F::Keep,              DType::Q6_K,  false},
    {"iq4_nl",   DType::IQ4_NL,25,  A::Iq4,         F::FirstEighthQ5K,    DType::IQ4_NL, false},
    {"iq4_xs",   DType::IQ4_XS,30,  A::Iq4,         F::FirstEighthQ5K,    DType::IQ4_XS, false},
    {"mxfp4_moe",DType::MXFP4, 38,  A::Keep,        F::Keep,              DType::MXFP4, true},
};

// llama-quantize's aliases.
struct Alias {
  const char* name;
  const char* target;
};
constexpr Alias kAliases[] = {{"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"}};

// Plain single-type targets for convert (ftype: llama.cpp's "mostly" type;
// 1024 = LLAMA_FTYPE_GUESSED for types with no file type of their own).
constexpr QuantTarget kPlainTargets[] = {
    {"q2_k", DType::Q2_K, 10, A::Keep, F::Keep, DType::Q2_K, false},
    {"q3_k", DType::Q3_K, 12, A::Keep, F::Keep, DType::Q3_K, false},
    {"q4_k", DType::Q4_K, 14, A::Keep, F::Keep, DType::Q4_K, false},
    {"q5_k", DType::Q5_K, 16, A::Keep, F::Keep, DType::Q5_K, false},
    {"mxfp4", DType::MXFP4, 1024, A::Keep, F::Keep, DType::MXFP4, false},
};

// Below this many elements per thread, starting a thread costs more than it saves.
constexpr int64_t kMinElementsPerThread = 1 << 16;

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
bool ends_with(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

std::string lower(const std::string& s) {
  std::string out;
  for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool is_quantized_type(DType t) { return dtype_info(t).block_size > 1; }

// llama.cpp's tensor_allows_quantization for the architectures runlm reads:
// matrices whose name ends in "weight", except norms and the MoE router.
bool llama_quantizes(const std::string& name, const std::vector<int64_t>& ne) {
  int n_dims = 0;
  for (size_t d = 0; d < ne.size(); ++d)
    if (ne[d] > 1) n_dims = static_cast<int>(d) + 1;
  if (n_dims < 2) return false;
  return ends_with(name, "weight") && !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight") &&
         !contains(name, "ssm_conv1d") && name != "position_embd.weight" && name != "token_types.weight";
}

// llama.cpp's tensor_type_fallback: a smaller block of similar precision.
DType fallback_type(DType t) {
  switch (t) {
    case DType::Q2_K:
    case DType::Q3_K: return DType::Q4_0;
    case DType::Q4_K: return DType::Q5_0;
    case DType::Q5_K: return DType::Q5_1;
    case DType::Q6_K: return DType::Q8_0;
    case DType::IQ4_XS: return DType::IQ4_NL;
    default: return t;  // a 32-element type has no smaller block: F16 below
  }
}

enum class Role { Output, TokenEmbd, AttnV, AttnK, AttnQ, AttnOutput, FfnUp, FfnGate, FfnDown, Other };

// llama.cpp's tensor_get_category, in its order of tests.
Role role_of(const std::string& name) {
  if (name == "output.weight") return Role::Output;
  if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::TokenEmbd;
  if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") || contains(name, "attn_v.weight"))
    return Role::AttnV;
  if (contains(name, "attn_k.weight")) return Role::AttnK;
  if (contains(name, "attn_q.weight")) return Role::AttnQ;
  if (contains(name, "attn_output.weight")) return Role::AttnOutput;
  if (contains(name, "ffn_up")) return Role::FfnUp;
  if (contains(name, "ffn_gate")) return Role::FfnGate;
  if (contains(name, "ffn_down")) return Role::FfnDown;
  return Role::Other;
}

DType attn_v_type(const QuantTarget& t, DType type, int i, const QuantModelInfo& m) {
  switch (t.attn_v) {
    case A::Keep: break;
    case A::Q2K: type = m.n_gqa() >= 4 ? DType::Q4_K : DType::Q3_K; break;
    case A::Q3KM: type = i < 2 ? DType::Q5_K : DType::Q4_K; break;
    case A::Q5K: type = DType::Q5_K; break;
    case A::Iq4:
      if (m.n_gqa() >= 4) type = DType::Q5_K;
      break;
    case A::MoreBitsQ6K:
      if (llama_use_more_bits(i, m.n_layers)) type = DType::Q6_K;
      break;
    case A::First4Q5K:
      if (i < 4) type = DType::Q5_K;
      break;
  }
  if (m.is_70b && (type == DType::Q3_K || type == DType::Q4_K)) type = DType::Q5_K;
  if (m.n_expert == 8) type = DType::Q8_0;
  return type;
}

DType ffn_down_type(const QuantTarget& t, DType type, int i, const QuantModelInfo& m) {
  const int n = m.n_layers;
  switch (t.ffn_down) {
    case F::Keep: break;
    case F::Q3K: type = DType::Q3_K; break;
    case F::Q3KM:
      type = i < n / 16 ? DType::Q5_K : !m.falcon || llama_use_more_bits(i, n) ? DType::Q4_K : DType::Q3_K;
      break;
    case F::Q5K: type = m.falcon ? DType::Q4_K : DType::Q5_K; break;
    case F::MoreBitsQ6K:
      if (m.falcon && t.base == DType::Q4_K)
        type = i < n / 16 ? DType::Q6_K : llama_use_more_bits(i, n) ? DType::Q5_K : DType::Q4_K;
      else if (llama_use_more_bits(i, n))
        type = DType::Q6_K;
      break;
    case F::FirstEighthQ5K:
      // Q4_K_S skips this for Falcon; the IQ4 mixes apply it to every arch.
      if (i < n / 8 && !(m.falcon && t.base == DType::Q4_K)) type = DType::Q5_K;
      break;
  }
  return type;
}

}  // namespace

const QuantTarget& quant_target_from_name(const std::string& name) {
  std::string want = lower(name);
  for (const auto& a : kAliases)
    if (want == a.name) want = a.target;
  for (const auto& t : kTargets)
    if (want == t.name) return t;
  fail("unknown quantization type '%s'; supported: %s", name.c_str(), quant_target_names().c_str());
}

std::string quant_target_names() {
  std::string known;
  for (const auto& t : kTargets) known += std::string(known.empty() ? "" : ", ") + t.name;
  for (const auto& a : kAliases) known += strfmt(", %s (= %s)", a.name, a.target);
  return known;
}

const QuantTarget& quant_target_for_type(DType type) {
  for (const auto& t : kPlainTargets)
    if (t.base == type) return t;
  for (const auto& t : kTargets)
    if (t.base == type && !t.mxfp4_moe) return t;
  fail("no quantization target writes type %s", dtype_name(type));
}

bool llama_use_more_bits(int layer, int n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

QuantModelInfo quant_model_info(const GgufFile& g) {
  QuantModelInfo m;
  const std::string arch = g.get_string_opt("general.architecture").value_or("");
  if (!arch.empty()) {
    m.n_layers = static_cast<int>(g.get_int_opt(arch + ".block_count").value_or(0));
    m.n_head = static_cast<int>(g.get_int_opt(arch + ".attention.head_count").value_or(1));
    m.n_head_kv = static_cast<int>(g.get_int_opt(arch + ".attention.head_count_kv").value_or(m.n_head));
    m.n_expert = static_cast<int>(g.get_int_opt(arch + ".expert_count").value_or(0));
  }
  if (m.n_layers <= 0)
    for (const auto& t : g.tensors()) m.n_layers = std::max(m.n_layers, layer_of(t.name) + 1);
  m.has_output = g.find_tensor("output.weight") != nullptr;
  m.falcon = arch == "falcon";
  // llama.cpp's llama loader: 80 layers is LLM_TYPE_70B when K/V heads are shared.
  m.is_70b = arch == "llama" && m.n_layers == 80 && m.n_head != m.n_head_kv;
  return m;
}

TensorTypeChoice choose_tensor_type(const QuantTarget& target, const std::string& name,
                                    const std::vector<int64_t>& ne, const QuantModelInfo& model, bool pure) {
  if (!llama_quantizes(name, ne)) return {DType::F32, DType::F32, "", false};
  DType wanted = target.base;
  // Plain (unquantized) targets take no mix rules and no fallback.
  if (!is_quantized_type(target.base)) return {wanted, wanted, ""};

  if (!pure) {
    const Role role = role_of(name);
    const int layer = layer_of(name);
    const int64_t block = dtype_info(wanted).block_size;
    if (role == Role::Output || (!model.has_output && role == Role::TokenEmbd)) {
      if (target.mxfp4_moe || model.falcon || ne[0] % block != 0) wanted = DType::Q8_0;
      else if (wanted != DType::Q8_0) wanted = DType::Q6_K;
    } else if (target.mxfp4_moe) {
      // Expert tensors (3-D, one matrix per expert) MXFP4, the rest Q8_0.
      wanted = ne.size() > 2 && ne[2] > 1 ? DType::MXFP4 : DType::Q8_0;
    } else if (role == Role::AttnV) {
      wanted = attn_v_type(target, wanted, layer, model);
    } else if (role == Role::AttnK) {
      if (model.n_expert == 8) wanted = DType::Q8_0;
    } else if (role == Role::FfnDown) {
      wanted = ffn_down_type(target, wanted, layer, model);
    } else if (role == Role::AttnOutput) {
      if (model.falcon) {
        if (target.ftype == 13) wanted = DType::Q4_K;  // Q3_K_L
      } else if (model.n_expert == 8) {
        // Q2_K, Q3_K_S, Q3_K_M, IQ4_NL, Q4_K_S, Q4_K_M, IQ4_XS (and IQ3 mixes runlm does not write)
        for (uint32_t f : {10u, 11u, 12u, 25u, 14u, 15u, 30u})
          if (target.ftype == f) wanted = DType::Q5_K;
      } else {
        wanted = target.attn_output;
      }
    }
  }

  const int64_t block = dtype_info(wanted).block_size;
  if (ne[0] % block == 0) return {wanted, wanted, ""};
  DType fallback = fallback_type(wanted);
  if (ne[0] % dtype_info(fallback).block_size != 0) fallback = DType::F16;
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

namespace {

// True when a and b name the same existing file (same device and inode, so a
// symbolic or hard link to the input counts).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

QuantizeReport quantize_gguf(const std::string& in, const std::string& out, const std::string& target_name,
                             const QuantizeOptions& options) {
  const QuantTarget& target = quant_target_from_name(target_name);
  RUNLM_CHECK(in != out && !same_file(in, out),
              "quantize: output '%s' is the input file; write the result to a new path", out.c_str());
  const auto src = GgufFile::open(in);
  QuantizeReport report;
  const QuantModelInfo model = quant_model_info(*src);

  struct Plan {
    const GgufTensorInfo* t;
    TensorTypeChoice choice;
  };
  std::vector<Plan> plan;
  for (const GgufTensorInfo& t : src->tensors()) {
    const DTypeInfo& in_info = dtype_info(t.type);
    RUNLM_CHECK(!t.ne.empty() && t.ne[0] > 0, "%s: tensor '%s' has an empty shape", in.c_str(), t.name.c_str());
    TensorTypeChoice choice = choose_tensor_type(target, t.name, t.ne, model, options.pure);
    if (!choice.quantized) choice.type = choice.wanted = t.type;  // kept as it is, as llama.cpp does
    if (choice.type != t.type) {
      RUNLM_CHECK(in_info.can_decode, "%s: tensor '%s' has type %s, which cannot be decoded", in.c_str(),
                  t.name.c_str(), in_info.name);
      RUNLM_CHECK(!is_quantized_type(t.type) || options.allow_requantize,
                  "%s: tensor '%s' is already quantized (%s); re-quantizing it to %s compounds the rounding "
                  "error. Quantize from the f16/bf16/f32 file, or pass --allow-requantize",
                  in.c_str(), t.name.c_str(), in_info.name, dtype_name(choice.type));
    }
    plan.push_back({&t, std::move(choice)});
  }

  GgufWriter w(src->alignment());
  w.copy_metadata(*src);
  w.set_u32("general.file_type", target.ftype);

  for (const Plan& p : plan) {
    const GgufTensorInfo& t = *p.t;
    const TensorTypeChoice& choice = p.choice;
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
    const int n_threads = options.n_threads;
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
