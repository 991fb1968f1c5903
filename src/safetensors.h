// Reader for Hugging Face .safetensors files (mmap): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then the
// raw tensor bytes. Every size in the header is checked against the file
// before use. SafetensorsModel opens a model directory: one model.safetensors
// or the shards listed by model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtype.h"

namespace runlm {

class MappedFile;

struct SafetensorsTensor {
  std::string name;
  std::string file;            // path of the file holding it, for messages
  DType dtype = DType::F32;    // F32, F16 or BF16; I8 for U8 (packed bytes, read from data)
  std::vector<int64_t> shape;  // row-major as stored: shape.back() is contiguous
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t n_elements() const;
  // A 2-D view: rows of row_length() contiguous elements (a 1-D tensor is
  // one row; a scalar one row of one).
  int64_t row_length() const;
  int64_t n_rows() const;
  // Converts elements [first, first + n) to f32. The data need not be
  // aligned (safetensors offsets only promise byte alignment).
  void read_f32(int64_t first, int64_t n, float* out) const;
};

class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses an in-memory image (used by tests and fuzzers): the same checks as
  // open(); `data` must outlive the SafetensorsFile, `name` stands for the
  // path in messages.
  static std::unique_ptr<SafetensorsFile> from_memory(const uint8_t* data, size_t size,
                                                      const std::string& name = "<memory>");
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // The optional "__metadata__" string map.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  std::unique_ptr<MappedFile> map_;  // null for from_memory()
  const uint8_t* data_ = nullptr;    // the whole file image
  size_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a Hugging Face model directory.
class SafetensorsModel {
 public:
  // DIR/model.safetensors.index.json (sharded) if present, else
  // DIR/model.safetensors; neither is an Error naming DIR.
  static std::unique_ptr<SafetensorsModel> open_dir(const std::string& dir);
  ~SafetensorsModel();

  const std::string& dir() const { return dir_; }
  const SafetensorsTensor* find(const std::string& name) const;
  // Throws "tensor NAME not found in DIR".
  const SafetensorsTensor& get(const std::string& name) const;
  // Sorted tensor names.
  std::vector<std::string> names() const;
  // Renames every tensor to f(name), or drops it where f gives nullopt;
  // returns how many were dropped. Two tensors given one name are an Error.
  size_t rename(const std::function<std::optional<std::string>(const std::string&)>& f);

 private:
  SafetensorsModel() = default;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*> index_;
};

}  // namespace runlm
