// Safetensors reader (see safetensors.h). The header is untrusted input: its
// length, each tensor's offsets and its shape are all checked against the
// file (with overflow-checked arithmetic) before a pointer is formed.
#include "safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common.h"
#include "json_brief.h"
#include "mapped_file.h"

namespace runlm {

namespace {

using nlohmann::json;

constexpr size_t kHeaderLenBytes = 8;

struct StDType {
  const char* name;
  DType dtype;
  size_t size;
};
// The dtypes a checkpoint of the supported families uses; others (I8, F64,
// F8_*...) are refused. U8 holds packed bytes (gpt-oss's MXFP4 blocks and
// scales), kept as one-byte elements under DType::I8: read_f32 refuses them,
// their reader takes the bytes.
constexpr StDType kDTypes[] = {
    {"F32", DType::F32, 4}, {"F16", DType::F16, 2}, {"BF16", DType::BF16, 2}, {"U8", DType::I8, 1}};

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

uint64_t json_uint(const json& v, const std::string& file, const std::string& tensor, const char* what) {
  RUNLM_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
              "%s: tensor '%s': %s must be non-negative integers, got %s", file.c_str(), tensor.c_str(), what,
              json_brief(v).c_str());
  return v.get<uint64_t>();
}

}  // namespace

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked against nbytes at parse time
  return n;
}

int64_t SafetensorsTensor::row_length() const { return shape.empty() ? 1 : shape.back(); }

int64_t SafetensorsTensor::n_rows() const {
  const int64_t len = row_length();
  return len == 0 ? 0 : n_elements() / len;
}

void SafetensorsTensor::read_f32(int64_t first, int64_t n, float* out) const {
  RUNLM_CHECK(first >= 0 && n >= 0 && first + n <= n_elements(), "%s: tensor '%s': read of [%lld, %lld) out of %lld",
              file.c_str(), name.c_str(), static_cast<long long>(first), static_cast<long long>(first + n),
              static_cast<long long>(n_elements()));
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, data + first * 4, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16: {
      const uint8_t* p = data + first * 2;
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + i * 2, 2);
        out[i] = dtype == DType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
      return;
    }
    default:
      fail("%s: tensor '%s' holds packed bytes (U8), not numbers", file.c_str(), name.c_str());
  }
}

// ---- SafetensorsFile ------------------------------------------------------

SafetensorsFile::~SafetensorsFile() = default;

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->data_ = f->map_->data();
  f->size_ = f->map_->size();
  f->parse();
  return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* data, size_t size,
                                                              const std::string& name) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = name;
  f->data_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

void SafetensorsFile::parse() {
  const char* p = path_.c_str();
  const size_t size = size_;
  const uint8_t* base = data_;
  RUNLM_CHECK(base != nullptr || size == 0, "%s: null data pointer", p);
  RUNLM_CHECK(size >= kHeaderLenBytes, "%s: file of %zu bytes is too small for a safetensors header", p, size);
  uint64_t header_len = 0;
  for (size_t i = 0; i < kHeaderLenBytes; ++i) header_len |= static_cast<uint64_t>(base[i]) << (8 * i);
  RUNLM_CHECK(header_len <= size - kHeaderLenBytes,
              "%s: header length %llu runs past the end of the file (%zu bytes)", p,
              static_cast<unsigned long long>(header_len), size);
  const char* hdr = reinterpret_cast<const char*>(base + kHeaderLenBytes);
  json j;
  try {
    j = json::parse(hdr, hdr + header_len);
  } catch (const json::exception& e) {
    fail("%s: bad JSON header: %s", p, e.what());
  }
  RUNLM_CHECK(j.is_object(), "%s: JSON header is not an object", p);

  const uint64_t data_start = kHeaderLenBytes + header_len;
  const uint64_t data_size = size - data_start;
  const uint8_t* data = base + data_start;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      RUNLM_CHECK(v.is_object(), "%s: __metadata__ is not an object", p);
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    const char* tn = name.c_str();
    RUNLM_CHECK(v.is_object(), "%s: tensor '%s': entry is not an object", p, tn);
    RUNLM_CHECK(v.contains("dtype") && v["dtype"].is_string(), "%s: tensor '%s': missing dtype", p, tn);
    RUNLM_CHECK(v.contains("shape") && v["shape"].is_array(), "%s: tensor '%s': missing shape", p, tn);
    RUNLM_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                "%s: tensor '%s': data_offsets must be [begin, end]", p, tn);

    SafetensorsTensor t;
    t.name = name;
    t.file = path_;
    const std::string dt = v["dtype"].get<std::string>();
    const StDType* row = nullptr;
    for (const auto& d : kDTypes)
      if (dt == d.name) row = &d;
    RUNLM_CHECK(row, "%s: tensor '%s': dtype %s is not supported (supported: F32, F16, BF16, U8)", p, tn, dt.c_str());
    t.dtype = row->dtype;

    uint64_t expect_bytes = row->size;
    for (const json& d : v["shape"]) {
      const uint64_t dim = json_uint(d, path_, name, "shape dimensions");
      RUNLM_CHECK(dim <= static_cast<uint64_t>(INT64_MAX), "%s: tensor '%s': dimension %llu too large", p, tn,
                  static_cast<unsigned long long>(dim));
      RUNLM_CHECK(!mul_overflows(expect_bytes, dim, &expect_bytes), "%s: tensor '%s': shape %s overflows", p, tn,
                  json_brief(v["shape"]).c_str());
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint64_t begin = json_uint(v["data_offsets"][0], path_, name, "data_offsets");
    const uint64_t end = json_uint(v["data_offsets"][1], path_, name, "data_offsets");
    RUNLM_CHECK(begin <= end && end <= data_size,
                "%s: tensor '%s': data_offsets [%llu, %llu] out of bounds of the %llu-byte data section", p, tn,
                static_cast<unsigned long long>(begin), static_cast<unsigned long long>(end),
                static_cast<unsigned long long>(data_size));
    RUNLM_CHECK(end - begin == expect_bytes,
                "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets span %llu", p, tn,
                json_brief(v["shape"]).c_str(), dt.c_str(), static_cast<unsigned long long>(expect_bytes),
                static_cast<unsigned long long>(end - begin));
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    tensors_.push_back(std::move(t));
  }
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

// ---- SafetensorsModel -----------------------------------------------------

SafetensorsModel::~SafetensorsModel() = default;

std::unique_ptr<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
  std::unique_ptr<SafetensorsModel> m(new SafetensorsModel());
  m->dir_ = dir;
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single_path = dir + "/model.safetensors";

  if (!file_exists(index_path)) {
    RUNLM_CHECK(file_exists(single_path), "%s: neither model.safetensors nor model.safetensors.index.json found",
                dir.c_str());
    m->files_.push_back(SafetensorsFile::open(single_path));
    for (const auto& t : m->files_[0]->tensors()) m->index_[t.name] = &t;
    return m;
  }

  const MappedFile index_file(index_path);
  json j;
  try {
    const char* s = reinterpret_cast<const char*>(index_file.data());
    j = json::parse(s, s + index_file.size());
  } catch (const json::exception& e) {
    fail("%s: bad JSON: %s", index_path.c_str(), e.what());
  }
  RUNLM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
              "%s: no weight_map object", index_path.c_str());

  std::map<std::string, SafetensorsFile*> shards;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    const std::string& name = it.key();
    RUNLM_CHECK(it.value().is_string(), "%s: weight_map entry for '%s' is not a file name", index_path.c_str(),
                name.c_str());
    const std::string shard = it.value().get<std::string>();
    // Shards live beside the index; refuse names that would leave the directory.
    RUNLM_CHECK(!shard.empty() && shard[0] != '/' && shard.find("..") == std::string::npos,
                "%s: weight_map entry for '%s' names an unsafe path '%s'", index_path.c_str(), name.c_str(),
                shard.c_str());
    auto sit = shards.find(shard);
    if (sit == shards.end()) {
      m->files_.push_back(SafetensorsFile::open(dir + "/" + shard));
      sit = shards.emplace(shard, m->files_.back().get()).first;
    }
    const SafetensorsTensor* t = sit->second->find(name);
    RUNLM_CHECK(t, "%s: tensor '%s' listed in %s is missing from it", sit->second->path().c_str(), name.c_str(),
                index_path.c_str());
    m->index_[name] = t;
  }
  return m;
}

const SafetensorsTensor* SafetensorsModel::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const SafetensorsTensor& SafetensorsModel::get(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  RUNLM_CHECK(t, "tensor '%s' not found in %s", name.c_str(), dir_.c_str());
  return *t;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : index_) out.push_back(name);
  return out;
}

size_t SafetensorsModel::rename(const std::function<std::optional<std::string>(const std::string&)>& f) {
  std::map<std::string, const SafetensorsTensor*> renamed;
  size_t dropped = 0;
  for (const auto& [name, t] : index_) {
    const std::optional<std::string> to = f(name);
    if (!to) {
      ++dropped;
      continue;
    }
    RUNLM_CHECK(renamed.emplace(*to, t).second, "%s: two tensors are both read as '%s' ('%s' is one)", dir_.c_str(),
                to->c_str(), name.c_str());
  }
  index_ = std::move(renamed);
  return dropped;
}

}  // namespace runlm
