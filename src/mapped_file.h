// Read-only memory mapping of a whole file (RAII). Used by the safetensors
// reader and the llama2.c converter, whose inputs can be tens of GB: mapping
// lets the OS page weights in as they are converted instead of reading them
// all up front.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace runlm {

class MappedFile {
 public:
  // Throws Error naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace runlm
