// gguf.cpp — the GGUF reader (bounds-checked parse of an mmapped file) and writer. LibTorch-free:
// it lives in promptcache_core so the `gguf` fuzz target needs no LibTorch.
#include "promptcache/model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "promptcache/atomic_file.hpp"
#include "promptcache/error.hpp"

namespace promptcache::gguf {
namespace {

const TypeInfo kTypes[] = {
    {0, "F32", 1, 4},       {1, "F16", 1, 2},    {2, "Q4_0", 32, 18},    {6, "Q5_0", 32, 22},
    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210}, {30, "BF16", 1, 2},
};

// llama.cpp's names for the ids, for messages about types this build does not read.
const char* const kAllTypeNames[] = {
    "F32",     "F16",   "Q4_0",   "Q4_1",  "Q4_2",     "Q4_3",     "Q5_0",     "Q5_1",    "Q8_0",
    "Q8_1",    "Q2_K",  "Q3_K",   "Q4_K",  "Q5_K",     "Q6_K",     "Q8_K",     "IQ2_XXS", "IQ2_XS",
    "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",    "IQ4_XS",   "I8",       "I16",     "I32",
    "I64",     "F64",   "IQ1_M",  "BF16",  "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",   "TQ2_0"};

[[noreturn]] void fail(const std::string& origin, const std::string& message,
                       const std::string& element = {}) {
  throw Error(ErrorKind::kModel, message, SourceLocation{origin, 0, 0, element});
}

// Smallest encoded size of one value of each type (an empty string or array included), to
// check a count against the bytes left before allocating for it.
uint64_t min_bytes(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:
      return 8;
    case ValueType::kArray:
      return 12;
  }
  return 1;
}

bool known_value_type(uint32_t t) {
  return t <= 12;
}

class Reader {
 public:
  Reader(const uint8_t* data, std::size_t size, const std::string& origin)
      : data_(data), size_(size), origin_(origin) {}

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what, const std::string& element) {
    if (n > left()) {
      fail(origin_,
           "file is truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
               std::to_string(pos_) + " but " + std::to_string(left()) + " remain",
           element);
    }
  }
  template <typename T>
  T scalar(const std::string& what, const std::string& element) {
    need(sizeof(T), what, element);
    T v;
    std::memcpy(&v, data_ + pos_,
                sizeof(T));  // the file is little-endian, as is every host we build for
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& what, const std::string& element) {
    const auto n = scalar<uint64_t>(what + " length", element);
    if (n > kMaxStringBytes) {
      fail(origin_,
           what + " is " + std::to_string(n) + " bytes, over the limit of " +
               std::to_string(kMaxStringBytes),
           element);
    }
    need(n, what, element);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }

  Value value(ValueType type, int depth, const std::string& key) {
    if (++values_ > kMaxValues) {
      fail(origin_, "metadata holds more than " + std::to_string(kMaxValues) + " values", key);
    }
    Value v;
    v.type = type;
    switch (type) {
      case ValueType::kUint8:
        v.u = scalar<uint8_t>("value", key);
        break;
      case ValueType::kInt8:
        v.i = scalar<int8_t>("value", key);
        break;
      case ValueType::kUint16:
        v.u = scalar<uint16_t>("value", key);
        break;
      case ValueType::kInt16:
        v.i = scalar<int16_t>("value", key);
        break;
      case ValueType::kUint32:
        v.u = scalar<uint32_t>("value", key);
        break;
      case ValueType::kInt32:
        v.i = scalar<int32_t>("value", key);
        break;
      case ValueType::kUint64:
        v.u = scalar<uint64_t>("value", key);
        break;
      case ValueType::kInt64:
        v.i = scalar<int64_t>("value", key);
        break;
      case ValueType::kFloat32:
        v.f = scalar<float>("value", key);
        break;
      case ValueType::kFloat64:
        v.f = scalar<double>("value", key);
        break;
      case ValueType::kBool: {
        const auto b = scalar<uint8_t>("value", key);
        if (b > 1) fail(origin_, "bool value is " + std::to_string(b) + ", not 0 or 1", key);
        v.i = b;
        break;
      }
      case ValueType::kString:
        v.str = string("string value", key);
        break;
      case ValueType::kArray: {
        if (depth >= kMaxArrayDepth) {
          fail(origin_, "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels",
               key);
        }
        const auto t = scalar<uint32_t>("array type", key);
        if (!known_value_type(t)) {
          fail(origin_, "array of unknown value type " + std::to_string(t), key);
        }
        v.item_type = static_cast<ValueType>(t);
        const auto n = scalar<uint64_t>("array length", key);
        if (n > left() / min_bytes(v.item_type) || n > kMaxValues - values_) {
          fail(origin_,
               "array of " + std::to_string(n) + " " + std::string(value_type_name(v.item_type)) +
                   " values cannot fit in the " + std::to_string(left()) +
                   " bytes left in the file",
               key);
        }
        v.items.reserve(static_cast<std::size_t>(n));
        for (uint64_t k = 0; k < n; ++k) v.items.push_back(value(v.item_type, depth + 1, key));
        break;
      }
    }
    return v;
  }

 private:
  const uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  uint64_t values_ = 0;
  const std::string& origin_;
};

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

std::string_view value_type_name(ValueType type) {
  static const char* const names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                      "int32",  "float32", "bool",   "string", "array",
                                      "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(type);
  return i < 13 ? names[i] : "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

std::optional<int64_t> Value::as_int() const {
  if (!is_integer()) return std::nullopt;
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kUint16:
    case ValueType::kUint32:
    case ValueType::kUint64:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
    default:
      return i;
  }
}

std::optional<double> Value::as_number() const {
  if (is_float()) return f;
  if (auto v = as_int()) return static_cast<double>(*v);
  if (is_integer()) return static_cast<double>(u);
  return std::nullopt;
}

Value Value::u32(uint32_t v) {
  Value out;
  out.type = ValueType::kUint32;
  out.u = v;
  return out;
}
Value Value::i32(int32_t v) {
  Value out;
  out.type = ValueType::kInt32;
  out.i = v;
  return out;
}
Value Value::u64(uint64_t v) {
  Value out;
  out.type = ValueType::kUint64;
  out.u = v;
  return out;
}
Value Value::f32(float v) {
  Value out;
  out.type = ValueType::kFloat32;
  out.f = v;
  return out;
}
Value Value::boolean(bool v) {
  Value out;
  out.type = ValueType::kBool;
  out.i = v ? 1 : 0;
  return out;
}
Value Value::string(std::string v) {
  Value out;
  out.type = ValueType::kString;
  out.str = std::move(v);
  return out;
}
Value Value::strings(const std::vector<std::string>& v) {
  Value out;
  out.type = ValueType::kArray;
  out.item_type = ValueType::kString;
  for (const auto& s : v) out.items.push_back(string(s));
  return out;
}
Value Value::f32s(const std::vector<float>& v) {
  Value out;
  out.type = ValueType::kArray;
  out.item_type = ValueType::kFloat32;
  for (float x : v) out.items.push_back(f32(x));
  return out;
}
Value Value::i32s(const std::vector<int32_t>& v) {
  Value out;
  out.type = ValueType::kArray;
  out.item_type = ValueType::kInt32;
  for (int32_t x : v) out.items.push_back(i32(x));
  return out;
}

const TypeInfo* type_info(uint32_t id) {
  for (const auto& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::string type_name_of_id(uint32_t id) {
  return id < sizeof(kAllTypeNames) / sizeof(kAllTypeNames[0]) ? kAllTypeNames[id] : "unknown";
}

std::string supported_types() {
  std::string out;
  for (const auto& t : kTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // checked against overflow by parse()
  return n;
}

Header parse(const uint8_t* data, std::size_t size, const std::string& origin) {
  Reader r(data, size, origin);
  Header h;
  r.need(4, "the magic", {});
  if (std::memcmp(data, "GGUF", 4) != 0) fail(origin, "not a GGUF file (no 'GGUF' magic)");
  (void)r.scalar<uint32_t>("magic", {});
  h.version = r.scalar<uint32_t>("version", {});
  if (h.version != 2 && h.version != 3) {
    fail(origin, "GGUF version " + std::to_string(h.version) +
                     " is not supported (this build reads versions 2 and 3)");
  }
  const auto tensor_count = r.scalar<uint64_t>("tensor count", {});
  const auto kv_count = r.scalar<uint64_t>("metadata count", {});
  // A key/value needs at least a key length, a type and one byte; a tensor info at least a name
  // length, a dimension count, a type and an offset.
  if (kv_count > r.left() / 13) {
    fail(origin, "metadata count " + std::to_string(kv_count) + " cannot fit in the file (" +
                     std::to_string(size) + " bytes)");
  }
  if (tensor_count > r.left() / 24) {
    fail(origin, "tensor count " + std::to_string(tensor_count) + " cannot fit in the file (" +
                     std::to_string(size) + " bytes)");
  }
  for (uint64_t k = 0; k < kv_count; ++k) {
    const std::string key = r.string("metadata key", "metadata entry " + std::to_string(k));
    const std::string element = "key '" + key + "'";
    const auto t = r.scalar<uint32_t>("value type", element);
    if (!known_value_type(t)) fail(origin, "unknown value type " + std::to_string(t), element);
    Value v = r.value(static_cast<ValueType>(t), 0, element);
    if (!h.metadata.emplace(key, std::move(v)).second) fail(origin, "duplicate key", element);
  }
  auto align = h.metadata.find("general.alignment");
  if (align != h.metadata.end()) {
    const Value& a = align->second;
    if (a.type != ValueType::kUint32 || a.u == 0 || (a.u & (a.u - 1)) != 0) {
      fail(origin, "general.alignment must be a uint32 power of two", "key 'general.alignment'");
    }
    h.alignment = static_cast<uint32_t>(a.u);
  }

  std::set<std::string> names;
  h.tensors.reserve(static_cast<std::size_t>(tensor_count));
  for (uint64_t k = 0; k < tensor_count; ++k) {
    TensorInfo t;
    t.name = r.string("tensor name", "tensor info " + std::to_string(k));
    const std::string element = "tensor '" + t.name + "'";
    if (t.name.empty()) fail(origin, "tensor name is empty", "tensor info " + std::to_string(k));
    if (!names.insert(t.name).second) fail(origin, "duplicate tensor name", element);
    const auto n_dims = r.scalar<uint32_t>("dimension count", element);
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail(origin,
           "has " + std::to_string(n_dims) + " dimensions (1 to " + std::to_string(kMaxDims) +
               " allowed)",
           element);
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = r.scalar<uint64_t>("dimension", element);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(origin, "dimension " + std::to_string(dim) + " is too large", element);
      }
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.type = r.scalar<uint32_t>("tensor type", element);
    const TypeInfo* info = type_info(t.type);
    if (!info) {
      fail(origin,
           "has ggml type id " + std::to_string(t.type) + " (" + type_name_of_id(t.type) +
               "), which this build does not read (supported: " + supported_types() + ")",
           element);
    }
    t.offset = r.scalar<uint64_t>("tensor offset", element);
    if (t.dims[0] % info->block_elements != 0) {
      fail(origin,
           "rows of " + std::to_string(t.dims[0]) + " elements are not whole " + info->name +
               " blocks of " + std::to_string(info->block_elements),
           element);
    }
    // Bytes = blocks per row x block bytes x the other dimensions, each product checked.
    uint64_t bytes = static_cast<uint64_t>(t.dims[0] / info->block_elements);
    uint64_t elements = static_cast<uint64_t>(t.dims[0]);
    bool overflow = false;
    auto mul = [&overflow](uint64_t& acc, uint64_t by) {
      if (by != 0 && acc > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / by) {
        overflow = true;
      }
      acc *= by;
    };
    mul(bytes, static_cast<uint64_t>(info->block_bytes));
    for (std::size_t d = 1; d < t.dims.size(); ++d) {
      mul(bytes, static_cast<uint64_t>(t.dims[d]));
      mul(elements, static_cast<uint64_t>(t.dims[d]));
    }
    if (overflow) fail(origin, "dimensions " + dims_string(t.dims) + " overflow", element);
    t.nbytes = bytes;
    if (t.offset % h.alignment != 0) {
      fail(origin,
           "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
               std::to_string(h.alignment),
           element);
    }
    h.tensors.push_back(std::move(t));
  }
  const uint64_t pos = r.pos();
  h.data_offset = (pos + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_offset > size && !h.tensors.empty()) {
    fail(origin,
         "file ends before its data section (at byte " + std::to_string(h.data_offset) + ")");
  }
  const uint64_t data_size = h.data_offset <= size ? size - h.data_offset : 0;
  for (const TensorInfo& t : h.tensors) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      fail(origin,
           "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
               ") runs past the end of the data section (" + std::to_string(data_size) +
               " bytes; the file is truncated or the offset is wrong)",
           "tensor '" + t.name + "'");
    }
  }
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : h.tensors) {
    if (t.nbytes > 0) order.push_back(&t);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    if (order[k]->offset < order[k - 1]->offset + order[k - 1]->nbytes) {
      fail(origin, "data overlaps tensor '" + order[k - 1]->name + "'",
           "tensor '" + order[k]->name + "'");
    }
  }
  return h;
}

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in && in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

// --- File --------------------------------------------------------------------------------------

std::shared_ptr<File> File::open(const std::string& path) {
  std::shared_ptr<File> file(new File());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(ErrorKind::kIo, "cannot open GGUF file: " + std::string(std::strerror(errno)),
                {path});
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kIo, "not a regular file", {path});
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    fail(path, "file is " + std::to_string(size) + " bytes, shorter than a GGUF header (24)");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    throw Error(ErrorKind::kIo, "cannot mmap GGUF file: " + std::string(std::strerror(map_errno)),
                {path});
  }
  file->map_ = map;  // unmapped by the destructor from here on, errors included
  file->size_ = size;
  file->header_ = parse(static_cast<const uint8_t*>(map), size, path);
  for (std::size_t i = 0; i < file->header_.tensors.size(); ++i) {
    file->by_name_.emplace(file->header_.tensors[i].name, i);
  }
  return file;
}

File::~File() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void File::release_metadata() {
  std::map<std::string, Value>().swap(header_.metadata);
}

const Value* File::find(const std::string& key) const {
  auto it = header_.metadata.find(key);
  return it == header_.metadata.end() ? nullptr : &it->second;
}

const TensorInfo* File::tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

const uint8_t* File::data(const TensorInfo& t) const {
  return static_cast<const uint8_t*>(map_) + header_.data_offset + t.offset;
}

void File::drop_pages(const TensorInfo& t) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data(t));
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + t.nbytes) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

std::optional<int64_t> File::get_int(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const auto i = v->as_int();
  if (!i || *i < 0) {
    fail(path_, "must be a non-negative integer, got " + std::string(value_type_name(v->type)),
         "key '" + key + "'");
  }
  return i;
}

std::optional<double> File::get_number(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  const auto d = v->as_number();
  if (!d || !std::isfinite(*d)) {
    fail(path_, "must be a finite number, got " + std::string(value_type_name(v->type)),
         "key '" + key + "'");
  }
  return d;
}

std::optional<std::string> File::get_string(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::kString) {
    fail(path_, "must be a string, got " + std::string(value_type_name(v->type)),
         "key '" + key + "'");
  }
  return v->str;
}

std::optional<bool> File::get_bool(const std::string& key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::kBool) {
    fail(path_, "must be a bool, got " + std::string(value_type_name(v->type)),
         "key '" + key + "'");
  }
  return v->i != 0;
}

// --- Writer ------------------------------------------------------------------------------------

void Writer::set(const std::string& key, Value value) {
  if (key == "general.alignment") alignment_ = static_cast<uint32_t>(value.u);
  for (auto& kv : metadata_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

void Writer::add_tensor(const std::string& name, std::vector<int64_t> dims, uint32_t type,
                        std::string bytes) {
  const TypeInfo* info = type_info(type);
  const SourceLocation where{"<gguf writer>", 0, 0, "tensor '" + name + "'"};
  if (!info) throw Error(ErrorKind::kInvalidArgument, "unknown ggml type", where);
  if (dims.empty() || dims.size() > kMaxDims || dims[0] % info->block_elements != 0) {
    throw Error(ErrorKind::kInvalidArgument, "dimensions do not fit the type", where);
  }
  int64_t n = dims[0] / info->block_elements * info->block_bytes;
  for (std::size_t d = 1; d < dims.size(); ++d) n *= dims[d];
  if (static_cast<std::size_t>(n) != bytes.size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "holds " + std::to_string(bytes.size()) + " bytes, the type and dimensions need " +
                    std::to_string(n),
                where);
  }
  tensors_.push_back({name, std::move(dims), type, std::move(bytes)});
}

namespace {

void put_raw(std::string& out, const void* p, std::size_t n) {
  out.append(static_cast<const char*>(p), n);
}
template <typename T>
void put(std::string& out, T v) {
  put_raw(out, &v, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}
void put_value(std::string& out, const Value& v) {
  switch (v.type) {
    case ValueType::kUint8:
      return put<uint8_t>(out, static_cast<uint8_t>(v.u));
    case ValueType::kInt8:
      return put<int8_t>(out, static_cast<int8_t>(v.i));
    case ValueType::kUint16:
      return put<uint16_t>(out, static_cast<uint16_t>(v.u));
    case ValueType::kInt16:
      return put<int16_t>(out, static_cast<int16_t>(v.i));
    case ValueType::kUint32:
      return put<uint32_t>(out, static_cast<uint32_t>(v.u));
    case ValueType::kInt32:
      return put<int32_t>(out, static_cast<int32_t>(v.i));
    case ValueType::kUint64:
      return put<uint64_t>(out, v.u);
    case ValueType::kInt64:
      return put<int64_t>(out, v.i);
    case ValueType::kFloat32:
      return put<float>(out, static_cast<float>(v.f));
    case ValueType::kFloat64:
      return put<double>(out, v.f);
    case ValueType::kBool:
      return put<uint8_t>(out, v.i ? 1 : 0);
    case ValueType::kString:
      return put_string(out, v.str);
    case ValueType::kArray:
      put<uint32_t>(out, static_cast<uint32_t>(v.item_type));
      put<uint64_t>(out, v.items.size());
      for (const Value& item : v.items) put_value(out, item);
      return;
  }
}

}  // namespace

void Writer::write(const std::string& path) const {
  std::string head = "GGUF";
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    put_string(head, key);
    put<uint32_t>(head, static_cast<uint32_t>(value.type));
    put_value(head, value);
  }
  const uint64_t a = alignment_;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Pending& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, t.type);
    put<uint64_t>(head, offset);
    offsets.push_back(offset);
    offset = (offset + t.bytes.size() + a - 1) / a * a;
  }
  head.append((a - head.size() % a) % a, '\0');
  write_file_atomically(path, [&](const FileSink& sink) {
    sink(head.data(), head.size());
    const std::string zeros(a, '\0');
    for (const Pending& t : tensors_) {
      sink(t.bytes.data(), t.bytes.size());
      sink(zeros.data(), (a - t.bytes.size() % a) % a);
    }
  });
}

}  // namespace promptcache::gguf
