// GGUF v2/v3 reader (mmap) and writer. Knows the file format only, nothing
// about models. Every size and offset read from the file is checked before
// use: a corrupt or truncated file is an Error naming the file and the fault,
// never a crash.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtype.h"

namespace runlm {

enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);

// One metadata value. Scalars keep their GGUF type; integers of any width are
// read through as_int()/as_uint(), floats through as_float().
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;  // for ARRAY
  uint64_t u = 0;                     // unsigned ints and BOOL
  int64_t i = 0;                      // signed ints
  double f = 0;                       // F32/F64
  std::string s;                      // STRING
  std::vector<GgufValue> arr;         // ARRAY (nested arrays allowed)

  bool is_int() const;
  bool is_float() const;
  int64_t as_int() const;    // throws unless an integer type fits in int64
  uint64_t as_uint() const;  // throws unless a non-negative integer
  double as_float() const;   // floats and integers
  bool as_bool() const;      // BOOL (or integer 0/1)
  const std::string& as_string() const;  // throws unless STRING

  static GgufValue make_string(std::string v);
  static GgufValue make_u32(uint32_t v);
  static GgufValue make_i32(int32_t v);
  static GgufValue make_u64(uint64_t v);
  static GgufValue make_f32(float v);
  static GgufValue make_bool(bool v);
  static GgufValue make_array(GgufType elem_type, std::vector<GgufValue> items);
  static GgufValue make_string_array(const std::vector<std::string>& items);
  static GgufValue make_f32_array(const std::vector<float>& items);
  static GgufValue make_i32_array(const std::vector<int32_t>& items);
};

struct GgufKV {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> ne;  // GGUF order: ne[0] is the contiguous (row) dimension
  uint64_t offset = 0;      // relative to the start of the tensor data section
  size_t nbytes = 0;
  int64_t n_elements() const;
};

class GgufFile {
 public:
  // mmaps the file and parses header, metadata and tensor infos.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // Parses an in-memory image (used by tests and fuzzers); `data` must
  // outlive the GgufFile.
  static std::unique_ptr<GgufFile> from_memory(const uint8_t* data, size_t size,
                                               const std::string& name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }

  const std::vector<GgufKV>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters throw "key not found in model: KEY (PATH)" or a type error.
  const GgufValue& get(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<float> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::optional<int64_t> get_int_opt(const std::string& key) const;
  std::optional<double> get_float_opt(const std::string& key) const;
  std::optional<std::string> get_string_opt(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(const std::string& name) const;
  // Pointer to the tensor's bytes inside the mapping (checked in bounds at open).
  const uint8_t* tensor_data(const GgufTensorInfo& t) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kv_;
  std::vector<GgufTensorInfo> tensors_;
};

// Writes a GGUF v3 file. Metadata keeps insertion order (a key set twice is
// replaced in place). Tensor data is produced at write() time, one tensor at a
// time, so converting a 13 GB model never holds it all in memory.
class GgufWriter {
 public:
  // Fills exactly the tensor's nbytes at dst.
  using FillFn = std::function<void(uint8_t* dst)>;

  explicit GgufWriter(uint64_t alignment = 32) : alignment_(alignment) {}

  void set(const std::string& key, GgufValue value);
  void set_string(const std::string& key, const std::string& v) { set(key, GgufValue::make_string(v)); }
  void set_u32(const std::string& key, uint32_t v) { set(key, GgufValue::make_u32(v)); }
  void set_f32(const std::string& key, float v) { set(key, GgufValue::make_f32(v)); }
  void set_bool(const std::string& key, bool v) { set(key, GgufValue::make_bool(v)); }
  // Copies every metadata pair of `src` (used by quantize).
  void copy_metadata(const GgufFile& src);

  // ne in GGUF order; data is produced by fill() during write().
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, FillFn fill);
  // Convenience: bytes taken from `data`, which must stay valid until write().
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, const void* data);

  // Writes the whole file (to PATH.tmp, then renamed, so a failed write never
  // leaves a truncated file under the final name). `progress`, if set, is
  // called after each tensor with (done, total).
  void write(const std::string& path,
             const std::function<void(size_t done, size_t total)>& progress = nullptr) const;

 private:
  struct PendingTensor {
    GgufTensorInfo info;
    FillFn fill;
  };
  uint64_t alignment_;
  std::vector<GgufKV> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace runlm
