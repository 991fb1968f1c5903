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

std::unique_ptr<Engine> make_engine(const Model& model, const EngineOptions& options) {
  switch (options.device) {
    case Device::Cuda:
      fail("--device cuda: the CUDA engine is not available in this build yet; use --device cpu");
    case Device::Auto:
    case Device::Cpu:
      return make_cpu_engine(model, options);
  }
  fail("unknown device");
}

}  // namespace runlm
