// GGUF v2/v3 reader (mmap, fully validated at open) and v3 writer (streams
// tensor data one tensor at a time). See gguf.h for the contract.
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "common.h"

namespace runlm {

// The format is little endian and we copy scalars straight out of the bytes.
static_assert(std::endian::native == std::endian::little, "runlm's GGUF code assumes a little-endian host");

namespace {

constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kWriteVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";
constexpr uint32_t kMaxDims = 4;
// Nested arrays recurse; a hostile file must not be able to exhaust the stack.
constexpr int kMaxArrayDepth = 16;
// Smallest encodings, used to bound counts by the bytes left before allocating.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                   // empty key, type, u8 value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset
constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;

constexpr uint32_t kMaxTypeId = static_cast<uint32_t>(GgufType::F64);
// Each metadata value is held as a GgufValue (~88 bytes however small it is
// on disk), so a file of N bytes could otherwise ask for ~88 N bytes of
// memory. Real vocabularies hold well under a million values (tokens, scores,
// types, merges); this cap (1.5 GB of GgufValues) stops a hostile array first.
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;

bool is_valid_type(uint32_t raw) { return raw <= kMaxTypeId; }

// Bytes of one scalar on disk; 0 for STRING and ARRAY (variable size).
uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::STRING: case GgufType::ARRAY: return 0;
  }
  return 0;
}

// Smallest on-disk size of one array element of type t.
uint64_t min_elem_size(GgufType t) {
  if (t == GgufType::STRING) return 8;      // length
  if (t == GgufType::ARRAY) return 4 + 8;   // elem type + count
  return scalar_size(t);
}

bool is_unsigned_type(GgufType t) {
  return t == GgufType::U8 || t == GgufType::U16 || t == GgufType::U32 || t == GgufType::U64;
}
bool is_signed_type(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

bool is_number_type(GgufType t) {
  return is_unsigned_type(t) || is_signed_type(t) || t == GgufType::F32 || t == GgufType::F64;
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Rounds v up to a multiple of `align` (a power of two); false on overflow.
bool align_up(uint64_t v, uint64_t align, uint64_t* out) {
  uint64_t t;
  if (add_overflows(v, align - 1, &t)) return false;
  *out = t & ~(align - 1);
  return true;
}

// Bounds-checked little-endian cursor over the file image. Every read checks
// the bytes left first, so a truncated file fails with the offset and what
// was being read.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const std::string& path() const { return path_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > left())
      fail("%s: file truncated: reading %s at offset %zu needs %llu bytes but only %llu are left (file size %zu)",
           path_.c_str(), what.c_str(), pos_, static_cast<unsigned long long>(n),
           static_cast<unsigned long long>(left()), size_);
  }

  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const size_t at = pos_;
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > left())
      fail("%s: %s at offset %zu: string length %llu runs past the end of the file (%llu bytes left)",
           path_.c_str(), what.c_str(), at, static_cast<unsigned long long>(n),
           static_cast<unsigned long long>(left()));
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  void read_bytes(void* dst, size_t n, const std::string& what) {
    need(n, what);
    std::memcpy(dst, data_ + pos_, n);
    pos_ += n;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
};

GgufType read_type(Reader& r, const std::string& what) {
  const size_t at = r.pos();
  const uint32_t raw = r.read<uint32_t>(what);
  if (!is_valid_type(raw))
    fail("%s: %s at offset %zu: unknown value type %u (valid: 0..%u)", r.path().c_str(), what.c_str(), at, raw,
         kMaxTypeId);
  return static_cast<GgufType>(raw);
}

// Reads the payload of one value whose type is already known. `what` names
// the value (e.g. "value of key 'x'") and is only formatted into errors.
GgufValue read_value(Reader& r, GgufType type, const std::string& what, int depth, uint64_t* values_left) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8: v.u = r.read<uint8_t>(what); break;
    case GgufType::I8: v.i = r.read<int8_t>(what); break;
    case GgufType::U16: v.u = r.read<uint16_t>(what); break;
    case GgufType::I16: v.i = r.read<int16_t>(what); break;
    case GgufType::U32: v.u = r.read<uint32_t>(what); break;
    case GgufType::I32: v.i = r.read<int32_t>(what); break;
    case GgufType::U64: v.u = r.read<uint64_t>(what); break;
    case GgufType::I64: v.i = r.read<int64_t>(what); break;
    case GgufType::F32: v.f = r.read<float>(what); break;
    case GgufType::F64: v.f = r.read<double>(what); break;
    case GgufType::BOOL: v.u = r.read<uint8_t>(what) != 0; break;
    case GgufType::STRING: v.s = r.read_string(what); break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        fail("%s: %s: arrays nested deeper than %d levels", r.path().c_str(), what.c_str(), kMaxArrayDepth);
      v.elem_type = read_type(r, what + " element type");
      const size_t at = r.pos();
      const uint64_t count = r.read<uint64_t>(what + " element count");
      // Bound the count by the bytes left before reserving anything.
      const uint64_t min_size = min_elem_size(v.elem_type);
      if (count > r.left() / min_size)
        fail("%s: %s at offset %zu: array count %llu of %s needs at least %llu bytes per element, "
             "but only %llu bytes are left in the file",
             r.path().c_str(), what.c_str(), at, static_cast<unsigned long long>(count),
             gguf_type_name(v.elem_type), static_cast<unsigned long long>(min_size),
             static_cast<unsigned long long>(r.left()));
      if (count > *values_left)
        fail("%s: %s at offset %zu: array count %llu exceeds the limit of %llu metadata values per file",
             r.path().c_str(), what.c_str(), at, static_cast<unsigned long long>(count),
             static_cast<unsigned long long>(kMaxMetadataValues));
      *values_left -= count;
      v.arr.reserve(static_cast<size_t>(count));
      for (uint64_t k = 0; k < count; ++k)
        v.arr.push_back(read_value(r, v.elem_type, what, depth + 1, values_left));
      break;
    }
  }
  return v;
}

// ---- writer helpers --------------------------------------------------------

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  // resize + memcpy rather than insert(): GCC 12 reports a false
  // -Wstringop-overflow for insert() of a few bytes into an empty vector.
  const size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, p, n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

// Checks that an unsigned value fits the width of its type before truncating.
template <class T>
void put_unsigned(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
  if (v.u > std::numeric_limits<T>::max())
    fail("gguf writer: key '%s': value %llu does not fit in %s", key.c_str(), static_cast<unsigned long long>(v.u),
         gguf_type_name(v.type));
  put<T>(out, static_cast<T>(v.u));
}
template <class T>
void put_signed(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
  if (v.i < std::numeric_limits<T>::min() || v.i > std::numeric_limits<T>::max())
    fail("gguf writer: key '%s': value %lld does not fit in %s", key.c_str(), static_cast<long long>(v.i),
         gguf_type_name(v.type));
  put<T>(out, static_cast<T>(v.i));
}

// Writes the payload of v (without its type tag; arrays carry their element
// type and count). Element types are checked so the file is always readable.
void put_value(std::vector<uint8_t>& out, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::U8: put_unsigned<uint8_t>(out, v, key); break;
    case GgufType::U16: put_unsigned<uint16_t>(out, v, key); break;
    case GgufType::U32: put_unsigned<uint32_t>(out, v, key); break;
    case GgufType::U64: put_unsigned<uint64_t>(out, v, key); break;
    case GgufType::I8: put_signed<int8_t>(out, v, key); break;
    case GgufType::I16: put_signed<int16_t>(out, v, key); break;
    case GgufType::I32: put_signed<int32_t>(out, v, key); break;
    case GgufType::I64: put_signed<int64_t>(out, v, key); break;
    case GgufType::F32: put<float>(out, static_cast<float>(v.f)); break;
    case GgufType::F64: put<double>(out, v.f); break;
    case GgufType::BOOL: put<uint8_t>(out, v.u ? 1 : 0); break;
    case GgufType::STRING: put_string(out, v.s); break;
    case GgufType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.arr.size());
      for (size_t k = 0; k < v.arr.size(); ++k) {
        if (v.arr[k].type != v.elem_type)
          fail("gguf writer: key '%s': array of %s has element %zu of type %s", key.c_str(),
               gguf_type_name(v.elem_type), k, gguf_type_name(v.arr[k].type));
        put_value(out, v.arr[k], key);
      }
      break;
    default:
      fail("gguf writer: key '%s': invalid value type %u", key.c_str(), static_cast<unsigned>(v.type));
  }
}

// Computes n_elements and nbytes for a tensor shape with overflow checks.
// `where` prefixes errors ("PATH: tensor 'x'"); a bad shape throws.
void tensor_sizes(const std::string& where, const DTypeInfo& info, const std::vector<int64_t>& ne,
                  int64_t* n_elements, uint64_t* nbytes) {
  uint64_t n = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] < 0) fail("%s: ne[%zu] = %lld is negative", where.c_str(), d, static_cast<long long>(ne[d]));
    if (mul_overflows(n, static_cast<uint64_t>(ne[d]), &n) || n > static_cast<uint64_t>(INT64_MAX))
      fail("%s: element count overflows (product of ne overflows int64)", where.c_str());
  }
  if (ne[0] % info.block_size != 0)
    fail("%s: ne[0] = %lld is not a multiple of the %s block size %lld", where.c_str(),
         static_cast<long long>(ne[0]), info.name, static_cast<long long>(info.block_size));
  uint64_t bytes = static_cast<uint64_t>(ne[0] / info.block_size);
  bool overflow = mul_overflows(bytes, info.type_size, &bytes);
  for (size_t d = 1; d < ne.size() && !overflow; ++d) overflow = mul_overflows(bytes, static_cast<uint64_t>(ne[d]), &bytes);
  if (overflow) fail("%s: byte size overflows", where.c_str());
  *n_elements = static_cast<int64_t>(n);
  *nbytes = bytes;
}

// Full write(2) with EINTR retry; throws naming the file on failure.
void write_all(int fd, const void* p, size_t n, const std::string& path) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("%s: write failed: %s", path.c_str(), std::strerror(errno));
    }
    if (w == 0) fail("%s: write failed: short write (0 bytes written)", path.c_str());
    b += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "unknown";
}

// ---- GgufValue ---------------------------------------------------------------

bool GgufValue::is_int() const { return is_unsigned_type(type) || is_signed_type(type); }
bool GgufValue::is_float() const { return type == GgufType::F32 || type == GgufType::F64; }

int64_t GgufValue::as_int() const {
  if (is_signed_type(type)) return i;
  if (is_unsigned_type(type)) {
    if (u > static_cast<uint64_t>(INT64_MAX))
      fail("value %llu of type %s does not fit in int64", static_cast<unsigned long long>(u), gguf_type_name(type));
    return static_cast<int64_t>(u);
  }
  fail("expected an integer, got %s", gguf_type_name(type));
}

uint64_t GgufValue::as_uint() const {
  if (is_unsigned_type(type)) return u;
  if (is_signed_type(type)) {
    if (i < 0) fail("expected a non-negative integer, got %lld", static_cast<long long>(i));
    return static_cast<uint64_t>(i);
  }
  fail("expected an integer, got %s", gguf_type_name(type));
}

double GgufValue::as_float() const {
  if (is_float()) return f;
  if (is_signed_type(type)) return static_cast<double>(i);
  if (is_unsigned_type(type)) return static_cast<double>(u);
  fail("expected a number, got %s", gguf_type_name(type));
}

bool GgufValue::as_bool() const {
  if (type == GgufType::BOOL) return u != 0;
  if (is_int()) {
    const bool neg = is_signed_type(type) && i < 0;
    const uint64_t mag = is_signed_type(type) ? static_cast<uint64_t>(i) : u;
    if (!neg && mag <= 1) return mag == 1;
    fail("expected a bool (or integer 0/1), got %s %lld", gguf_type_name(type),
         static_cast<long long>(is_signed_type(type) ? i : static_cast<int64_t>(u)));
  }
  fail("expected a bool, got %s", gguf_type_name(type));
}

const std::string& GgufValue::as_string() const {
  if (type != GgufType::STRING) fail("expected a string, got %s", gguf_type_name(type));
  return s;
}

GgufValue GgufValue::make_string(std::string v) {
  GgufValue r;
  r.type = GgufType::STRING;
  r.s = std::move(v);
  return r;
}
GgufValue GgufValue::make_u32(uint32_t v) {
  GgufValue r;
  r.type = GgufType::U32;
  r.u = v;
  return r;
}
GgufValue GgufValue::make_i32(int32_t v) {
  GgufValue r;
  r.type = GgufType::I32;
  r.i = v;
  return r;
}
GgufValue GgufValue::make_u64(uint64_t v) {
  GgufValue r;
  r.type = GgufType::U64;
  r.u = v;
  return r;
}
GgufValue GgufValue::make_f32(float v) {
  GgufValue r;
  r.type = GgufType::F32;
  r.f = v;
  return r;
}
GgufValue GgufValue::make_bool(bool v) {
  GgufValue r;
  r.type = GgufType::BOOL;
  r.u = v ? 1 : 0;
  return r;
}
GgufValue GgufValue::make_array(GgufType elem_type, std::vector<GgufValue> items) {
  for (size_t k = 0; k < items.size(); ++k)
    RUNLM_CHECK(items[k].type == elem_type, "GGUF array of %s: element %zu has type %s", gguf_type_name(elem_type), k,
                gguf_type_name(items[k].type));
  GgufValue r;
  r.type = GgufType::ARRAY;
  r.elem_type = elem_type;
  r.arr = std::move(items);
  return r;
}
GgufValue GgufValue::make_string_array(const std::vector<std::string>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (const auto& s : items) v.push_back(make_string(s));
  return make_array(GgufType::STRING, std::move(v));
}
GgufValue GgufValue::make_f32_array(const std::vector<float>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (float x : items) v.push_back(make_f32(x));
  return make_array(GgufType::F32, std::move(v));
}
GgufValue GgufValue::make_i32_array(const std::vector<int32_t>& items) {
  std::vector<GgufValue> v;
  v.reserve(items.size());
  for (int32_t x : items) v.push_back(make_i32(x));
  return make_array(GgufType::I32, std::move(v));
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // checked against overflow when parsed/added
  return n;
}

// ---- GgufFile ------------------------------------------------------------------

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("%s: cannot open: %s", path.c_str(), std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("%s: cannot stat: %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("%s: not a regular file", path.c_str());
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    fail("%s: file too small to be GGUF (%zu bytes, header needs %llu)", path.c_str(), size,
         static_cast<unsigned long long>(kHeaderBytes));
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) fail("%s: mmap of %zu bytes failed: %s", path.c_str(), size, std::strerror(e));
  f->data_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  f->parse();  // on error the unique_ptr unmaps
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  f->data_ = data;
  f->size_ = size;
  f->mapped_ = false;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_ && data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void GgufFile::parse() {
  const char* path = path_.c_str();
  if (data_ == nullptr && size_ > 0) fail("%s: null data pointer", path);
  Reader r(data_, size_, path_);

  uint8_t magic[4];
  r.read_bytes(magic, 4, "magic");
  if (std::memcmp(magic, kMagic, 4) != 0)
    fail("%s: bad magic %02x %02x %02x %02x: not a GGUF file (expected \"GGUF\")", path, magic[0], magic[1], magic[2],
         magic[3]);
  version_ = r.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    if (swapped == 2 || swapped == 3) fail("%s: big-endian GGUF (version %u) is not supported", path, swapped);
    fail("%s: unsupported GGUF version %u (supported: 2, 3)", path, version_);
  }
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // A count that could not fit in the file even at the smallest encoding is
  // corrupt; checking here keeps reserve() from making huge allocations.
  if (n_kv > r.left() / kMinKvBytes)
    fail("%s: metadata count %llu is impossible for a file of %zu bytes", path,
         static_cast<unsigned long long>(n_kv), size_);
  if (n_tensors > r.left() / kMinTensorInfoBytes)
    fail("%s: tensor count %llu is impossible for a file of %zu bytes", path,
         static_cast<unsigned long long>(n_tensors), size_);

  kv_.clear();
  kv_.reserve(static_cast<size_t>(n_kv));
  std::unordered_set<std::string> keys;
  uint64_t values_left = kMaxMetadataValues;
  for (uint64_t k = 0; k < n_kv; ++k) {
    const std::string idx = strfmt("metadata key #%llu", static_cast<unsigned long long>(k));
    GgufKV kv;
    kv.key = r.read_string(idx);
    const std::string what = "value of key '" + kv.key + "'";
    const GgufType type = read_type(r, what + " type");
    kv.value = read_value(r, type, what, 0, &values_left);
    if (!keys.insert(kv.key).second) fail("%s: duplicate metadata key '%s'", path, kv.key.c_str());
    kv_.push_back(std::move(kv));
  }

  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = find(kAlignmentKey)) {
    if (!a->is_int()) fail("%s: %s has type %s, expected an integer", path, kAlignmentKey, gguf_type_name(a->type));
    if (is_signed_type(a->type) && a->i <= 0)
      fail("%s: %s = %lld is not a power of two > 0", path, kAlignmentKey, static_cast<long long>(a->i));
    const uint64_t al = a->as_uint();
    if (!is_power_of_two(al))
      fail("%s: %s = %llu is not a power of two > 0", path, kAlignmentKey, static_cast<unsigned long long>(al));
    alignment_ = al;
  }

  tensors_.clear();
  tensors_.reserve(static_cast<size_t>(n_tensors));
  std::unordered_set<std::string> names;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    t.name = r.read_string(strfmt("name of tensor #%llu", static_cast<unsigned long long>(k)));
    const std::string where = path_ + ": tensor '" + t.name + "'";
    const uint32_t n_dims = r.read<uint32_t>("n_dims of tensor '" + t.name + "'");
    if (n_dims < 1 || n_dims > kMaxDims)
      fail("%s: n_dims = %u is out of range (1..%u)", where.c_str(), n_dims, kMaxDims);
    t.ne.resize(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = r.read<uint64_t>(strfmt("ne[%u] of tensor '%s'", d, t.name.c_str()));
      if (ne > static_cast<uint64_t>(INT64_MAX))
        fail("%s: ne[%u] = %llu is negative as int64", where.c_str(), d, static_cast<unsigned long long>(ne));
      t.ne[d] = static_cast<int64_t>(ne);
    }
    const uint32_t raw_type = r.read<uint32_t>("type of tensor '" + t.name + "'");
    const DTypeInfo* info = dtype_info_or_null(raw_type);
    if (!info) fail("%s: unknown tensor type id %u", where.c_str(), raw_type);
    t.type = info->type;
    t.offset = r.read<uint64_t>("offset of tensor '" + t.name + "'");
    int64_t n_elements = 0;
    uint64_t nbytes = 0;
    tensor_sizes(where, *info, t.ne, &n_elements, &nbytes);
    t.nbytes = static_cast<size_t>(nbytes);
    if (t.offset % alignment_ != 0)
      fail("%s: data offset %llu is misaligned (not a multiple of the alignment %llu)", where.c_str(),
           static_cast<unsigned long long>(t.offset), static_cast<unsigned long long>(alignment_));
    if (!names.insert(t.name).second) fail("%s: duplicate tensor name '%s'", path, t.name.c_str());
    tensors_.push_back(std::move(t));
  }

  if (!align_up(r.pos(), alignment_, &data_offset_))
    fail("%s: data section offset overflows with alignment %llu", path, static_cast<unsigned long long>(alignment_));
  // Data bounds are checked last, once the data section start is known.
  for (const GgufTensorInfo& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (add_overflows(data_offset_, t.offset, &begin) || add_overflows(begin, t.nbytes, &end) || end > size_)
      fail("%s: tensor '%s' data [offset %llu, %zu bytes] lies outside the file (size %zu, data section at %llu)",
           path, t.name.c_str(), static_cast<unsigned long long>(t.offset), t.nbytes, size_,
           static_cast<unsigned long long>(data_offset_));
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  for (const GgufKV& kv : kv_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) fail("key not found in model: %s (%s)", key.c_str(), path_.c_str());
  return *v;
}

namespace {
// Runs a conversion and prefixes any type error with the file and key.
template <class F>
auto with_key(const std::string& path, const std::string& key, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    fail("%s: key '%s': %s", path.c_str(), key.c_str(), e.what());
  }
}

const GgufValue& expect_array(const std::string& path, const std::string& key, const GgufValue& v) {
  if (v.type != GgufType::ARRAY)
    fail("%s: key '%s': expected an array, got %s", path.c_str(), key.c_str(), gguf_type_name(v.type));
  return v;
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  return with_key(path_, key, [&] { return v.as_string(); });
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  return with_key(path_, key, [&] { return v.as_int(); });
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  return with_key(path_, key, [&] { return v.as_float(); });
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = get(key);
  return with_key(path_, key, [&] { return v.as_bool(); });
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = expect_array(path_, key, get(key));
  if (v.elem_type != GgufType::STRING)
    fail("%s: key '%s': expected an array of string, got an array of %s", path_.c_str(), key.c_str(),
         gguf_type_name(v.elem_type));
  std::vector<std::string> out;
  out.reserve(v.arr.size());
  for (const GgufValue& e : v.arr) out.push_back(e.s);
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = expect_array(path_, key, get(key));
  if (!is_number_type(v.elem_type))
    fail("%s: key '%s': expected an array of numbers, got an array of %s", path_.c_str(), key.c_str(),
         gguf_type_name(v.elem_type));
  std::vector<float> out;
  out.reserve(v.arr.size());
  for (const GgufValue& e : v.arr) out.push_back(static_cast<float>(e.as_float()));
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = expect_array(path_, key, get(key));
  if (!is_unsigned_type(v.elem_type) && !is_signed_type(v.elem_type))
    fail("%s: key '%s': expected an array of integers, got an array of %s", path_.c_str(), key.c_str(),
         gguf_type_name(v.elem_type));
  std::vector<int64_t> out;
  out.reserve(v.arr.size());
  for (size_t k = 0; k < v.arr.size(); ++k)
    out.push_back(with_key(path_, strfmt("%s[%zu]", key.c_str(), k), [&] { return v.arr[k].as_int(); }));
  return out;
}

std::optional<int64_t> GgufFile::get_int_opt(const std::string& key) const {
  if (!find(key)) return std::nullopt;
  return get_int(key);
}

std::optional<double> GgufFile::get_float_opt(const std::string& key) const {
  if (!find(key)) return std::nullopt;
  return get_float(key);
}

std::optional<std::string> GgufFile::get_string_opt(const std::string& key) const {
  if (!find(key)) return std::nullopt;
  return get_string(key);
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  for (const GgufTensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& t) const {
  // Guards against an info that belongs to another file.
  uint64_t begin = 0, end = 0;
  if (add_overflows(data_offset_, t.offset, &begin) || add_overflows(begin, t.nbytes, &end) || end > size_)
    fail("%s: tensor '%s' data [offset %llu, %zu bytes] lies outside the file (size %zu)", path_.c_str(),
         t.name.c_str(), static_cast<unsigned long long>(t.offset), t.nbytes, size_);
  return data_ + begin;
}

// ---- GgufWriter --------------------------------------------------------------

void GgufWriter::set(const std::string& key, GgufValue value) {
  for (GgufKV& kv : kv_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kv_.push_back({key, std::move(value)});
}

void GgufWriter::copy_metadata(const GgufFile& src) {
  for (const GgufKV& kv : src.metadata()) set(kv.key, kv.value);
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, FillFn fill) {
  const std::string where = "gguf writer: tensor '" + name + "'";
  RUNLM_CHECK(!ne.empty() && ne.size() <= kMaxDims, "%s: n_dims = %zu is out of range (1..%u)", where.c_str(),
              ne.size(), kMaxDims);
  RUNLM_CHECK(fill != nullptr, "%s: no fill function", where.c_str());
  for (const PendingTensor& t : tensors_)
    RUNLM_CHECK(t.info.name != name, "gguf writer: duplicate tensor name '%s'", name.c_str());
  const DTypeInfo* info = dtype_info_or_null(static_cast<uint32_t>(type));
  RUNLM_CHECK(info, "%s: unknown tensor type id %u", where.c_str(), static_cast<unsigned>(type));
  PendingTensor p;
  p.info.name = name;
  p.info.type = type;
  p.info.ne = std::move(ne);
  int64_t n_elements = 0;
  uint64_t nbytes = 0;
  tensor_sizes(where, *info, p.info.ne, &n_elements, &nbytes);
  p.info.nbytes = static_cast<size_t>(nbytes);
  p.fill = std::move(fill);
  tensors_.push_back(std::move(p));
}

void GgufWriter::add_tensor(const std::string& name, DType type, std::vector<int64_t> ne, const void* data) {
  // The fill needs the size, which add_tensor computes; patch it in afterwards.
  add_tensor(name, type, std::move(ne), [](uint8_t*) {});
  PendingTensor& p = tensors_.back();
  const size_t n = p.info.nbytes;
  if (data == nullptr && n > 0) {
    tensors_.pop_back();
    fail("gguf writer: tensor '%s': null data for %zu bytes", name.c_str(), n);
  }
  p.fill = [data, n](uint8_t* dst) {
    if (n > 0) std::memcpy(dst, data, n);  // data may be null for an empty tensor
  };
}

void GgufWriter::write(const std::string& path, const std::function<void(size_t, size_t)>& progress) const {
  if (!is_power_of_two(alignment_) || alignment_ > (1ull << 31))
    fail("%s: alignment %llu is not a power of two in 1..2^31", path.c_str(),
         static_cast<unsigned long long>(alignment_));

  // Header and metadata are built in memory (a few MB at most for large
  // vocabularies); tensor data is streamed afterwards.
  std::vector<uint8_t> head;
  put_bytes(head, kMagic, 4);
  put<uint32_t>(head, kWriteVersion);
  put<uint64_t>(head, tensors_.size());
  // The writer's alignment is authoritative: a copied general.alignment is
  // rewritten with it, and the key is added when the alignment is not the
  // default (readers assume 32 without it).
  bool has_alignment_key = false;
  for (const GgufKV& kv : kv_) has_alignment_key |= kv.key == kAlignmentKey;
  const bool add_alignment_key = !has_alignment_key && alignment_ != kDefaultAlignment;
  put<uint64_t>(head, kv_.size() + (add_alignment_key ? 1 : 0));
  auto put_kv = [&](const std::string& key, const GgufValue& v) {
    put_string(head, key);
    put<uint32_t>(head, static_cast<uint32_t>(v.type));
    put_value(head, v, key);
  };
  const GgufValue alignment_value = GgufValue::make_u32(static_cast<uint32_t>(alignment_));
  for (const GgufKV& kv : kv_) put_kv(kv.key, kv.key == kAlignmentKey ? alignment_value : kv.value);
  if (add_alignment_key) put_kv(kAlignmentKey, alignment_value);

  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors_.size());
  for (const PendingTensor& p : tensors_) {
    offsets.push_back(offset);
    put_string(head, p.info.name);
    put<uint32_t>(head, static_cast<uint32_t>(p.info.ne.size()));
    for (int64_t d : p.info.ne) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(p.info.type));
    put<uint64_t>(head, offset);
    uint64_t end = 0;
    if (add_overflows(offset, p.info.nbytes, &end) || !align_up(end, alignment_, &offset))
      fail("%s: tensor '%s': data offset overflows", path.c_str(), p.info.name.c_str());
  }
  uint64_t data_start = 0;
  if (!align_up(head.size(), alignment_, &data_start)) fail("%s: header size overflows", path.c_str());
  head.resize(static_cast<size_t>(data_start), 0);

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  // Any failure below removes the temporary so no partial file is left.
  try {
    write_all(fd, head.data(), head.size(), tmp);
    const std::vector<uint8_t> zeros(static_cast<size_t>(alignment_), 0);
    for (size_t k = 0; k < tensors_.size(); ++k) {
      const PendingTensor& p = tensors_[k];
      {
        // One buffer per tensor, freed before the next: peak memory is the
        // largest tensor, not the model.
        // At least one byte so fill() never sees a null pointer.
        std::vector<uint8_t> buf(std::max<size_t>(p.info.nbytes, 1), 0);
        p.fill(buf.data());
        write_all(fd, buf.data(), p.info.nbytes, tmp);
      }
      const uint64_t end = offsets[k] + p.info.nbytes;
      uint64_t padded = 0;
      align_up(end, alignment_, &padded);  // cannot overflow: checked above
      write_all(fd, zeros.data(), static_cast<size_t>(padded - end), tmp);
      if (progress) progress(k + 1, tensors_.size());
    }
    // Flush before the rename so a crash never leaves a renamed, empty file.
    if (::fsync(fd) != 0) fail("%s: fsync failed: %s", tmp.c_str(), std::strerror(errno));
    const int rc = ::close(fd);
    fd = -1;  // closed even when close() reports an error
    if (rc != 0) fail("%s: close failed: %s", tmp.c_str(), std::strerror(errno));
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("%s: cannot rename %s to it: %s", path.c_str(), tmp.c_str(), std::strerror(e));
  }
}

}  // namespace runlm
