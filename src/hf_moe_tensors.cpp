// Hugging Face router and expert tensors to GGUF rows (see hf_moe_tensors.h).
#include "hf_moe_tensors.h"

#include <functional>
#include <memory>

#include "common.h"
#include "safetensors.h"

namespace runlm {

namespace {

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const SafetensorsTensor* shaped(const SafetensorsModel& st, const std::string& name, const std::vector<int64_t>& shape,
                                std::vector<std::string>& used) {
  const SafetensorsTensor* t = st.find(name);
  RUNLM_CHECK(t, "%s: tensor '%s' is missing", st.dir().c_str(), name.c_str());
  RUNLM_CHECK(t->shape == shape, "%s: tensor '%s' has shape %s, expected %s from config.json", t->file.c_str(),
              name.c_str(), shape_str(t->shape).c_str(), shape_str(shape).c_str());
  used.push_back(name);
  return t;
}

// Rows of n_cols values: row r starts at element first(r) of t, its values
// `stride` elements apart (1: contiguous).
RowSource gather(const SafetensorsTensor* t, int64_t n_cols, std::function<int64_t(int64_t)> first, int64_t stride) {
  if (stride == 1) return [t, n_cols, first](int64_t r, float* buf) { t->read_f32(first(r), n_cols, buf); };
  return [t, n_cols, first, stride](int64_t r, float* buf) {
    const int64_t f = first(r);
    for (int64_t c = 0; c < n_cols; ++c) t->read_f32(f + c * stride, 1, buf + c);
  };
}

enum class Layout { PerExpert, Fused, GptOss };

}  // namespace

bool is_moe_role(TensorRole role) {
  switch (role) {
    case TensorRole::FfnGateInp:
    case TensorRole::FfnGateInpBias:
    case TensorRole::FfnGateExps:
    case TensorRole::FfnUpExps:
    case TensorRole::FfnDownExps:
    case TensorRole::FfnGateExpsBias:
    case TensorRole::FfnUpExpsBias:
    case TensorRole::FfnDownExpsBias: return true;
    default: return false;
  }
}

RowSource hf_moe_rows(const SafetensorsModel& st, const HfConfig& cfg, const LlamaTensorSpec& spec,
                      std::vector<std::string>& used) {
  const std::string p = strfmt("model.layers.%d.", spec.layer);
  const int64_t E = cfg.n_expert, H = cfg.hidden_size, I = cfg.expert_intermediate_size;
  const bool oss = cfg.arch == Arch::GptOss;
  // Mixtral's names as saved by transformers before its fused experts.
  const bool mixtral_names = st.find(p + "block_sparse_moe.gate.weight") != nullptr;
  const std::string experts = p + (mixtral_names ? "block_sparse_moe.experts." : "mlp.experts.");
  // The per-expert names: Mixtral's w1 (gate), w3 (up), w2 (down), else gate_proj, up_proj, down_proj.
  const bool w123 = st.find(experts + "0.w1.weight") != nullptr;
  const Layout layout = oss ? Layout::GptOss
                        : w123 || st.find(experts + "0.gate_proj.weight") ? Layout::PerExpert
                                                                          : Layout::Fused;
  auto per_expert = [&](const char* proj, int64_t rows, int64_t cols) {
    const char* name = !w123 ? proj : std::string(proj) == "gate_proj" ? "w1" : std::string(proj) == "up_proj" ? "w3" : "w2";
    auto ts = std::make_shared<std::vector<const SafetensorsTensor*>>();
    for (int64_t e = 0; e < E; ++e)
      ts->push_back(shaped(st, experts + std::to_string(e) + "." + name + ".weight", {rows, cols}, used));
    return RowSource([ts, rows, cols](int64_t r, float* buf) {
      (*ts)[size_t(r / rows)]->read_f32((r % rows) * cols, cols, buf);
    });
  };

  switch (spec.role) {
    case TensorRole::FfnGateInp: {
      const std::string name = oss ? p + "mlp.router.weight"
                               : mixtral_names ? p + "block_sparse_moe.gate.weight"
                                               : p + "mlp.gate.weight";
      return gather(shaped(st, name, {E, H}, used), H, [H](int64_t r) { return r * H; }, 1);
    }
    case TensorRole::FfnGateInpBias:
      return gather(shaped(st, p + "mlp.router.bias", {E}, used), E, [](int64_t) { return int64_t{0}; }, 1);
    case TensorRole::FfnGateExps:
    case TensorRole::FfnUpExps: {
      const int64_t up = spec.role == TensorRole::FfnUpExps;  // row r: expert r / I, its row r % I
      if (layout == Layout::PerExpert) return per_expert(up ? "up_proj" : "gate_proj", I, H);
      const SafetensorsTensor* t =
          shaped(st, experts + "gate_up_proj", oss ? std::vector<int64_t>{E, H, 2 * I} : std::vector<int64_t>{E, 2 * I, H}, used);
      if (layout == Layout::Fused)
        return gather(t, H, [I, H, up](int64_t r) { return ((r / I) * 2 * I + up * I + r % I) * H; }, 1);
      // gpt-oss: column 2o (gate) or 2o + 1 (up) of expert e's [H, 2I].
      return gather(t, H, [I, H, up](int64_t r) { return (r / I) * H * 2 * I + 2 * (r % I) + up; }, 2 * I);
    }
    case TensorRole::FfnDownExps: {  // row r: expert r / H, its output r % H
      if (layout == Layout::PerExpert) return per_expert("down_proj", H, I);
      if (layout == Layout::Fused)
        return gather(shaped(st, experts + "down_proj", {E, H, I}, used), I, [I](int64_t r) { return r * I; }, 1);
      // gpt-oss: column o of expert e's [I, H].
      return gather(shaped(st, experts + "down_proj", {E, I, H}, used), I,
                    [I, H](int64_t r) { return (r / H) * I * H + r % H; }, H);
    }
    case TensorRole::FfnGateExpsBias:
    case TensorRole::FfnUpExpsBias: {  // row e: the interleaved half of [E, 2I]
      const int64_t up = spec.role == TensorRole::FfnUpExpsBias;
      return gather(shaped(st, experts + "gate_up_proj_bias", {E, 2 * I}, used), I,
                    [I, up](int64_t e) { return e * 2 * I + up; }, 2);
    }
    case TensorRole::FfnDownExpsBias:
      return gather(shaped(st, experts + "down_proj_bias", {E, H}, used), H, [H](int64_t e) { return e * H; }, 1);
    default: break;
  }
  fail("%s is not a mixture-of-experts tensor", spec.name.c_str());
}

bool is_mxfp4_expert_role(const HfConfig& cfg, TensorRole role) {
  return cfg.mxfp4_experts &&
         (role == TensorRole::FfnGateExps || role == TensorRole::FfnUpExps || role == TensorRole::FfnDownExps);
}

ByteRowSource hf_mxfp4_expert_rows(const SafetensorsModel& st, const HfConfig& cfg, const LlamaTensorSpec& spec,
                                   std::vector<std::string>& used) {
  RUNLM_CHECK(is_mxfp4_expert_role(cfg, spec.role), "%s is not an MXFP4 expert tensor", spec.name.c_str());
  const int64_t E = cfg.n_expert, H = cfg.hidden_size, I = cfg.expert_intermediate_size;
  const bool down = spec.role == TensorRole::FfnDownExps;
  const int64_t in = down ? I : H, out = down ? H : 2 * I;  // the checkpoint's rows per expert: out
  RUNLM_CHECK(in % 32 == 0, "%s: MXFP4 experts need rows of whole 32-value blocks, but %s is %lld",
              st.dir().c_str(), down ? "intermediate_size" : "hidden_size", static_cast<long long>(in));
  const int64_t nb = in / 32;
  const std::string base = strfmt("model.layers.%d.mlp.experts.%s", spec.layer, down ? "down_proj" : "gate_up_proj");
  const SafetensorsTensor* blocks = shaped(st, base + "_blocks", {E, out, nb, 16}, used);
  const SafetensorsTensor* scales = shaped(st, base + "_scales", {E, out, nb}, used);
  for (const SafetensorsTensor* t : {blocks, scales})
    RUNLM_CHECK(t->dtype == DType::I8, "%s: tensor '%s' must hold bytes (U8) for MXFP4 experts", t->file.c_str(),
                t->name.c_str());
  // GGUF row r: expert r / rows, its row r % rows; gate and up take every
  // other checkpoint row.
  const int64_t rows = down ? H : I;
  const int64_t up = spec.role == TensorRole::FfnUpExps;
  return [blocks, scales, nb, rows, out, down, up](int64_t r, uint8_t* dst) {
    const int64_t e = r / rows, o = r % rows;
    const int64_t src_row = e * out + (down ? o : 2 * o + up);
    const uint8_t* b = blocks->data + src_row * nb * 16;
    const uint8_t* sc = scales->data + src_row * nb;
    for (int64_t k = 0; k < nb; ++k, b += 16, dst += 17) {
      dst[0] = sc[k];
      for (int j = 0; j < 16; ++j) {
        // Value j: nibble j % 2 of byte j / 2; value j + 16 likewise in byte 8 + j / 2.
        const int lo = (b[j / 2] >> (4 * (j % 2))) & 0xF;
        const int hi = (b[8 + j / 2] >> (4 * (j % 2))) & 0xF;
        dst[1 + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  };
}

}  // namespace runlm
