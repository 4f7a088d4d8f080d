// promptcache/model/gguf.hpp — read (mmap) and write GGUF files, the single-file model format of
// llama.cpp, Ollama and LM Studio. LibTorch-free, so that the reader can be fuzzed cheaply; the
// model side (hyper-parameters, tensors as LibTorch views) is gguf_model.hpp.
//
// Format (v2 and v3, little-endian): "GGUF", uint32 version, uint64 tensor count, uint64
// key/value count; the key/values (a string key, a uint32 value type, the value: integers,
// floats, bool, strings as uint64 length + bytes, arrays as element type + uint64 count + the
// elements, arrays of arrays included); the tensor infos (name, uint32 dimension count, uint64
// dimensions innermost first, uint32 ggml type, uint64 offset into the data section); padding to
// `general.alignment` (default 32); the data section.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache::gguf {

// Limits that keep a hostile file from making the reader allocate or recurse without bound.
constexpr uint64_t kMaxStringBytes = 64ull << 20;  // one string (a chat template, a token)
constexpr int kMaxArrayDepth = 4;                  // arrays of arrays of ...
constexpr uint32_t kMaxDims = 4;                   // GGML_MAX_DIMS
// Metadata values in all (array elements included): a 150k-token vocabulary with its merges
// holds about half a million; each takes ~100 bytes in memory, whatever its size in the file.
constexpr uint64_t kMaxValues = 4u << 20;
constexpr uint32_t kDefaultAlignment = 32;

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view value_type_name(ValueType type);

// One metadata value. Integers keep their value in `i` (signed types, bool) or `u` (unsigned
// types); floats in `f`; strings in `str`; arrays in `items` (all of type `item_type`).
struct Value {
  ValueType type = ValueType::kUint32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  ValueType item_type = ValueType::kUint32;
  std::vector<Value> items;

  bool is_integer() const;  // any of the integer types (not bool)
  bool is_float() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }
  // The integer as int64, nullopt when it is not an integer or does not fit.
  std::optional<int64_t> as_int() const;
  // The number (integer or float) as double, nullopt for anything else.
  std::optional<double> as_number() const;

  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value u64(uint64_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value strings(const std::vector<std::string>& v);
  static Value f32s(const std::vector<float>& v);
  static Value i32s(const std::vector<int32_t>& v);
};

// GGML tensor types this build reads (their ids as stored in tensor infos). The sizes are
// llama.cpp's: block_elements values per block of block_bytes bytes.
struct TypeInfo {
  uint32_t id;
  const char* name;
  int64_t block_elements;
  int64_t block_bytes;
};
// The type with this id, nullptr when this build does not read it.
const TypeInfo* type_info(uint32_t id);
// The GGML name of any id llama.cpp defines ("Q3_K"), else "unknown".
std::string type_name_of_id(uint32_t id);
// "F32, F16, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16", for messages.
std::string supported_types();

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // as stored: innermost (the row's elements) first
  uint32_t type = 0;          // a type_info() id
  uint64_t offset = 0;        // into the data section, a multiple of the alignment
  uint64_t nbytes = 0;
  int64_t elements() const;
};

// What a GGUF file's header says, validated: counts against the bytes they need (and the
// metadata's values against kMaxValues) before anything is allocated, strings against
// kMaxStringBytes and the file's end, array nesting against kMaxArrayDepth, every tensor of a known
// type, of at most kMaxDims dimensions whose product (and byte count) does not overflow and whose
// rows are whole blocks, at an aligned offset, inside the data section and overlapping no other;
// unique keys and names.
struct Header {
  uint32_t version = 3;
  std::map<std::string, Value> metadata;
  std::vector<TensorInfo> tensors;  // in file order
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // where the data section starts in the file
};
// Parses and validates; Error(kModel) naming `origin` and the key or tensor on any problem.
Header parse(const uint8_t* data, std::size_t size, const std::string& origin);

// True for a regular file that starts with the GGUF magic (whatever its name).
bool is_gguf_file(const std::string& path);

// One mmapped GGUF file.
class File {
 public:
  static std::shared_ptr<File> open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::map<std::string, Value>& metadata() const { return header_.metadata; }
  const Value* find(const std::string& key) const;
  const TensorInfo* tensor(const std::string& name) const;
  // The tensor's bytes inside the mapping (read-only).
  const uint8_t* data(const TensorInfo& t) const;
  // Tells the kernel that the tensor's pages (those wholly inside it) are not needed for now
  // (MADV_DONTNEED): for a tensor copied out of the mapping (repacked, or rows permuted), so that
  // the copy and the file's pages are not both resident. Reading the bytes again afterwards is
  // still correct (the pages come back from the file).
  void drop_pages(const TensorInfo& t) const;
  std::size_t file_size() const { return size_; }
  // Frees the parsed metadata (metadata() is empty and find() finds nothing afterwards); the
  // tensor infos and the mapping stay. For a File kept alive by tensors that view its mapping
  // (a loaded model's weights) once the config is read: a 32000-token vocabulary's parsed
  // values alone are some 9 MB that the model would otherwise hold for its lifetime.
  void release_metadata();

  // Typed metadata look-ups: nullopt when the key is absent; Error(kModel) naming the key when
  // it holds another type (or a negative / out-of-range number for integers).
  std::optional<int64_t> get_int(const std::string& key) const;
  std::optional<double> get_number(const std::string& key) const;
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<bool> get_bool(const std::string& key) const;

 private:
  File() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t size_ = 0;
  Header header_;
  std::map<std::string, std::size_t> by_name_;
};

// Builds a GGUF v3 file: metadata in insertion order, then tensors in insertion order.
class Writer {
 public:
  void set(const std::string& key, Value value);
  // dims innermost first; `bytes` must hold exactly the tensor's bytes for `type`
  // (Error(kInvalidArgument) otherwise).
  void add_tensor(const std::string& name, std::vector<int64_t> dims, uint32_t type,
                  std::string bytes);
  // Writes atomically (write_file_atomically): published whole or not at all.
  void write(const std::string& path) const;

 private:
  std::vector<std::pair<std::string, Value>> metadata_;
  struct Pending {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t type;
    std::string bytes;
  };
  std::vector<Pending> tensors_;
  uint32_t alignment_ = kDefaultAlignment;
};

}  // namespace promptcache::gguf
