// safetensors.cpp — mmap reader with strict header validation, and an atomic writer.
#include "promptcache/model/safetensors.hpp"

#include "promptcache/atomic_file.hpp"
#include "promptcache/error.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

namespace promptcache {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::size_t kMaxHeaderBytes = 100u * 1024u * 1024u;

struct DtypeInfo {
  const char* name;
  torch::Dtype dtype;
  std::size_t itemsize;
};

const DtypeInfo kDtypes[] = {
    {"F32", torch::kFloat32, 4}, {"F16", torch::kFloat16, 2}, {"BF16", torch::kBFloat16, 2},
    {"F64", torch::kFloat64, 8}, {"I64", torch::kInt64, 8},   {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2},   {"I8", torch::kInt8, 1},     {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
};

const DtypeInfo* dtype_by_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeInfo* dtype_by_torch(torch::Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return &d;
  }
  return nullptr;
}

std::size_t itemsize_of(torch::Dtype dtype) {
  const DtypeInfo* d = dtype_by_torch(dtype);
  return d ? d->itemsize : 0;
}

std::string supported_dtypes() {
  std::string out;
  for (const auto& d : kDtypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& message,
                       const std::string& tensor = {}) {
  SourceLocation where;
  where.file = path;
  if (!tensor.empty()) where.element = "tensor '" + tensor + "'";
  throw Error(ErrorKind::kSafetensors, message, where);
}

// Reads a non-negative integer from a JSON value, or fails with `what` in the message.
uint64_t json_uint(const json& v, const std::string& path, const std::string& tensor,
                   const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    if (v.get<int64_t>() < 0) fail(path, what + " must not be negative", tensor);
    return static_cast<uint64_t>(v.get<int64_t>());
  }
  fail(path, what + " must be an integer, got " + std::string(v.type_name()), tensor);
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->self_ = file;

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw Error(ErrorKind::kIo,
                "cannot open safetensors file: " + std::string(std::strerror(errno)),
                SourceLocation{path, 0, 0, {}});
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kIo, "not a regular file", SourceLocation{path, 0, 0, {}});
  }
  const auto file_size = static_cast<std::size_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    fail(path,
         "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    throw Error(ErrorKind::kIo,
                "cannot mmap safetensors file: " + std::string(std::strerror(map_errno)),
                SourceLocation{path, 0, 0, {}});
  }
  // From here on the destructor unmaps on any error.
  file->map_ = map;
  file->map_size_ = file_size;
  const auto* bytes = static_cast<const unsigned char*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len > file_size - 8) {
    fail(path, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                   std::to_string(file_size) + " bytes)");
  }
  file->data_start_ = 8 + static_cast<std::size_t>(header_len);
  const std::size_t data_size = file_size - file->data_start_;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(bytes + 8),
                         reinterpret_cast<const char*>(bytes + 8 + header_len));
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) {
    fail(path, "header must be a JSON object, got " + std::string(header.type_name()));
  }

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          fail(path, "__metadata__ value for '" + m.key() + "' must be a string");
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail(path, "entry must be an object", name);
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!v.contains(key)) fail(path, std::string("entry is missing '") + key + "'", name);
    }
    SafetensorsEntry entry;
    entry.name = name;

    const json& jd = v["dtype"];
    if (!jd.is_string()) fail(path, "dtype must be a string", name);
    const DtypeInfo* info = dtype_by_name(jd.get<std::string>());
    if (!info) {
      fail(path,
           "unknown dtype '" + jd.get<std::string>() + "' (supported: " + supported_dtypes() + ")",
           name);
    }
    entry.dtype = info->dtype;

    const json& js = v["shape"];
    if (!js.is_array()) fail(path, "shape must be an array", name);
    // numel * itemsize, with overflow detection (anything beyond the file is wrong anyway).
    uint64_t nbytes = info->itemsize;
    bool overflow = false;
    for (const json& d : js) {
      if (d.is_number_integer() && !d.is_number_unsigned() && d.get<int64_t>() < 0) {
        fail(path, "shape has negative dimension " + std::to_string(d.get<int64_t>()), name);
      }
      const uint64_t dim = json_uint(d, path, name, "shape dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(path, "shape dimension too large", name);
      }
      entry.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && nbytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
      nbytes *= dim;
    }

    const json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2) fail(path, "data_offsets must be [begin, end]", name);
    const uint64_t begin = json_uint(jo[0], path, name, "data_offsets begin");
    const uint64_t end = json_uint(jo[1], path, name, "data_offsets end");
    if (begin > end) {
      fail(path, "data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end),
           name);
    }
    if (end > data_size) {
      fail(path,
           "data_offsets end " + std::to_string(end) + " is beyond the data section (" +
               std::to_string(data_size) + " bytes)",
           name);
    }
    if (overflow || nbytes != end - begin) {
      fail(path,
           "data_offsets cover " + std::to_string(end - begin) + " bytes but shape x dtype needs " +
               (overflow ? std::string("more than 2^64") : std::to_string(nbytes)),
           name);
    }
    entry.begin = static_cast<std::size_t>(begin);
    entry.end = static_cast<std::size_t>(end);
    file->entries_.emplace(name, std::move(entry));
  }

  // Overlap check: sort non-empty ranges by begin; each must start at or after the previous end.
  std::vector<const SafetensorsEntry*> ranges;
  for (const auto& kv : file->entries_) {
    if (kv.second.end > kv.second.begin) ranges.push_back(&kv.second);
  }
  std::sort(ranges.begin(), ranges.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin < b->begin || (a->begin == b->begin && a->name < b->name);
  });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i]->begin < ranges[i - 1]->end) {
      fail(path,
           "data [" + std::to_string(ranges[i]->begin) + ", " + std::to_string(ranges[i]->end) +
               ") overlaps tensor '" + ranges[i - 1]->name + "' [" +
               std::to_string(ranges[i - 1]->begin) + ", " + std::to_string(ranges[i - 1]->end) +
               ")",
           ranges[i]->name);
    }
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail(path_, "no such tensor", name);
  const SafetensorsEntry& e = it->second;
  auto options = torch::TensorOptions().dtype(e.dtype).device(torch::kCPU);
  char* ptr = static_cast<char*>(map_) + data_start_ + e.begin;
  const std::size_t itemsize = itemsize_of(e.dtype);
  if (e.end == e.begin) return torch::empty(e.shape, options);
  if (reinterpret_cast<std::uintptr_t>(ptr) % itemsize != 0) {
    // Misaligned data (a writer that does not pad): copy into an aligned buffer.
    torch::Tensor out = torch::empty(e.shape, options);
    std::memcpy(out.data_ptr(), ptr, e.end - e.begin);
    return out;
  }
  std::shared_ptr<SafetensorsFile> keep = self_.lock();
  return torch::from_blob(
      ptr, e.shape, [keep](void*) mutable { keep.reset(); }, options);
}

// --- checkpoint folder -------------------------------------------------------------------------

SafetensorsCheckpoint SafetensorsCheckpoint::open_folder(const std::string& dir) {
  SafetensorsCheckpoint ckpt;
  ckpt.dir_ = dir;
  const SourceLocation where{dir, 0, 0, {}};
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorKind::kModel, "checkpoint folder does not exist or is not a directory", where);
  }

  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // from the index, if any
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const SourceLocation iwhere{index_path.string(), 0, 0, {}};
    std::ifstream in(index_path);
    if (!in) throw Error(ErrorKind::kIo, "cannot read index file", iwhere);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      throw Error(ErrorKind::kModel, std::string("index is not valid JSON: ") + e.what(), iwhere);
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw Error(ErrorKind::kModel, "index has no 'weight_map' object", iwhere);
    }
    std::set<std::string> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        throw Error(ErrorKind::kModel, "weight_map value must be a file name",
                    SourceLocation{index_path.string(), 0, 0, "tensor '" + it.key() + "'"});
      }
      const std::string shard = it.value().get<std::string>();
      weight_map[it.key()] = shard;
      if (seen.insert(shard).second) files.push_back(shard);
    }
    std::sort(files.begin(), files.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors", ec)) {
    files.push_back("model.safetensors");
  } else {
    for (const auto& de : fs::directory_iterator(dir, ec)) {
      const std::string fname = de.path().filename().string();
      if (de.is_regular_file(ec) && de.path().extension() == ".safetensors") files.push_back(fname);
    }
    std::sort(files.begin(), files.end());
  }
  if (files.empty()) throw Error(ErrorKind::kModel, "no *.safetensors files in folder", where);

  for (const std::string& fname : files) {
    const std::string path = (fs::path(dir) / fname).string();
    if (!fs::exists(path, ec)) {
      throw Error(ErrorKind::kModel, "shard '" + fname + "' named by the index is missing", where);
    }
    auto file = SafetensorsFile::open(path);
    const std::size_t idx = ckpt.files_.size();
    for (const auto& kv : file->entries()) {
      auto [pos, inserted] = ckpt.where_.emplace(kv.first, idx);
      if (!inserted) {
        throw Error(
            ErrorKind::kModel,
            "tensor appears in both '" + ckpt.files_[pos->second]->path() + "' and '" + path + "'",
            SourceLocation{dir, 0, 0, "tensor '" + kv.first + "'"});
      }
    }
    ckpt.files_.push_back(std::move(file));
  }
  for (const auto& kv : weight_map) {
    auto it = ckpt.where_.find(kv.first);
    const std::string expected = (fs::path(dir) / kv.second).string();
    if (it == ckpt.where_.end() || ckpt.files_[it->second]->path() != expected) {
      throw Error(ErrorKind::kModel,
                  "index places the tensor in '" + kv.second + "' but it is not there",
                  SourceLocation{dir, 0, 0, "tensor '" + kv.first + "'"});
    }
  }
  return ckpt;
}

torch::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    throw Error(ErrorKind::kModel, "checkpoint has no tensor '" + name + "'",
                SourceLocation{dir_, 0, 0, "tensor '" + name + "'"});
  }
  return files_[it->second]->tensor(name);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  return out;
}

// --- writer ------------------------------------------------------------------------------------

void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> cpu;
  cpu.reserve(tensors.size());
  json header = json::object();
  std::size_t offset = 0;
  for (const auto& kv : tensors) {  // std::map: already in name order
    if (kv.first.empty() || kv.first == "__metadata__") {
      fail(path, "invalid tensor name", kv.first.empty() ? "<empty>" : kv.first);
    }
    if (!kv.second.defined()) fail(path, "tensor is undefined", kv.first);
    const DtypeInfo* info = dtype_by_torch(kv.second.scalar_type());
    if (!info) {
      fail(path, std::string("cannot write dtype ") + c10::toString(kv.second.scalar_type()),
           kv.first);
    }
    torch::Tensor t = kv.second.detach().to(torch::kCPU).contiguous();
    const std::size_t nbytes = static_cast<std::size_t>(t.numel()) * info->itemsize;
    header[kv.first] = {{"dtype", info->name},
                        {"shape", t.sizes().vec()},
                        {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    cpu.emplace_back(kv.first, std::move(t));
  }
  if (!metadata.empty()) {
    json meta = json::object();
    meta["format"] = "pt";
    for (const auto& kv : metadata) meta[kv.first] = kv.second;
    header["__metadata__"] = meta;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  // Published whole or not at all: a full disk or a failed write leaves the old file.
  write_file_atomically(path, [&](const FileSink& write) {
    unsigned char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
    write(len, 8);
    write(text.data(), text.size());
    for (const auto& kv : cpu) {
      const std::size_t nbytes =
          static_cast<std::size_t>(kv.second.numel()) * itemsize_of(kv.second.scalar_type());
      if (nbytes > 0) write(kv.second.data_ptr(), nbytes);
    }
  });
}

}  // namespace promptcache
