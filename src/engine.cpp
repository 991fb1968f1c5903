#include "engine.h"

#include "common.h"

namespace runlm {

Device device_from_name(const std::string& name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail("unknown device '%s'; expected auto, cpu or cuda", name.c_str());
}

const char* device_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

#ifndef RUNLM_CUDA
bool cuda_device_available() { return false; }
std::unique_ptr<Engine> make_cuda_engine(const Model&, const EngineOptions&) {
  fail("--device cuda: runlm was built without CUDA (no nvcc at configure time); use --device cpu");
}
#endif

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  Device device = options.device;
  if (device == Device::Auto) device = cuda_device_available() ? Device::Cuda : Device::Cpu;
  if (device == Device::Cuda) return make_cuda_engine(model, options);
  // The CPU engine has one attention implementation; asking it for a GPU
  // backend is an error, never a silent substitute.
  RUNLM_CHECK(options.attn == AttnBackend::Auto,
              "--attn %s runs on the GPU only; the CPU backend has its own attention (use --attn auto or --device cuda)",
              attn_backend_name(options.attn));
  return make_cpu_engine(model, options);
}

}  // namespace runlm
