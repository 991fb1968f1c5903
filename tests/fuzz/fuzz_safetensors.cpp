// libFuzzer target: the safetensors reader (SafetensorsFile::from_memory):
// the 8-byte header length, the JSON header, dtypes, shapes and data_offsets,
// then a read through every tensor view it hands out. A runlm::Error is a
// correct rejection; anything else is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common.h"
#include "safetensors.h"

using namespace runlm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = SafetensorsFile::from_memory(data, size, "fuzz.safetensors");
    for (const SafetensorsTensor& t : f->tensors()) {
      (void)f->find(t.name);
      const int64_t n = t.n_elements();
      const int64_t rows = t.n_rows(), len = t.row_length();
      if (rows > 0 && len > 0 && rows * len != n) __builtin_trap();  // the 2-D view must cover the tensor
      // The head and the tail of the tensor: ASan checks the views.
      const int64_t k = std::min<int64_t>(n, 64);
      std::vector<float> buf(static_cast<size_t>(std::max<int64_t>(k, 1)));
      t.read_f32(0, k, buf.data());
      if (n > 0) t.read_f32(n - 1, 1, buf.data());
      try {
        t.read_f32(n, 1, buf.data());  // one past the end must be refused
        __builtin_trap();
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
  return 0;
}
