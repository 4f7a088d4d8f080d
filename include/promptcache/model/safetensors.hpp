// promptcache/model/safetensors.hpp — read (mmap) and write HuggingFace safetensors files.
//
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw little-endian tensor bytes; offsets are relative to the end of the header.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace promptcache {

struct SafetensorsEntry {
  std::string name;
  torch::Dtype dtype;
  std::vector<int64_t> shape;
  std::size_t begin = 0;  // byte offset into the data section
  std::size_t end = 0;
};

// One mmapped safetensors file. Tensors returned by tensor() alias the mapping (no copy) and keep
// it alive; the header is validated strictly on open: sizes, dtypes, offsets inside the file,
// byte counts matching shape x dtype, no overlapping tensors. Errors are Error(kSafetensors) naming
// the file and the tensor.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  // A CPU tensor viewing the mapped bytes (read-only memory: clone before writing into it).
  torch::Tensor tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  std::size_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::weak_ptr<SafetensorsFile> self_;
};

// All tensors of a checkpoint folder: model.safetensors, or the shards named by
// model.safetensors.index.json ("weight_map"), or every *.safetensors file in the folder.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open_folder(const std::string& dir);
  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  torch::Tensor tensor(const std::string& name) const;  // Error(kModel) naming the folder if absent
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// Writes tensors (any device; contiguous copies are made on the CPU) in name order.
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace promptcache
