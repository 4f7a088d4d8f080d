// promptcache/cache/cache_file.hpp — compiled module states on disk.
//
// A cache file is a safetensors file: one tensor "span.<index>.kv" of shape
// [layers, 2 (K, V), kv_heads, n, head_dim] per stored span (the store's own block layout), and
// metadata that pins what the states are valid for — the schema's layout (a fingerprint of every
// span's tokens and positions), the model (config and sampled weights), the compute and KV
// dtypes and the encoding mode, and an XXH3 checksum of every tensor and of the metadata. Loading
// checks all of it, so a file from another schema version, model or mode, or one with any byte
// changed, is refused with an error naming the file (and the tensor) instead of giving a wrong
// cache. Files are written to a temporary name, flushed and renamed, so a crash mid-write leaves
// the old file or none.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "promptcache/cache/compiler.hpp"
#include "promptcache/cache/store.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/pml/layout.hpp"

namespace promptcache {

// The checksums a cache file carries (hex XXH3-64): of a tensor's dense bytes as stored (its
// dtype, little-endian), and of every metadata entry but "metadata_xxh3" itself, in key order.
std::string tensor_checksum(const torch::Tensor& t);
std::string metadata_checksum(const std::map<std::string, std::string>& meta);

// A stable hash of the model: its config and a few logits of fixed tokens (one short forward).
std::string model_fingerprint(const LlamaModel& model);

// A stable hash of everything the states depend on in the layout.
std::string layout_fingerprint(const pml::Layout& layout);

// The file name for these states under a cache directory: "<schema>-<16 hex digits>.states",
// the digits a hash of the layout, the model, its dtypes and the encoding mode, so schemas,
// models and settings sharing a directory never overwrite each other's files.
std::string cache_file_name(const pml::Layout& layout, const LlamaModel& model, EncodingMode mode);

// What a cache file says about itself, from its header alone (`promptcache cache ls`).
struct CacheFileInfo {
  std::string path, format, schema, dtype, kv_dtype, encoding, model_fingerprint,
      layout_fingerprint;
  bool current_format = false;  // written by this version (older files are compiled again)
  int64_t spans = 0;            // stored spans
  int64_t tokens = 0;           // stored tokens (current format only)
  int64_t bytes = 0;            // the file's size
};
// Error(kSafetensors) naming the file when it is not a readable safetensors file,
// Error(kCacheFile) when it is not a promptcache states file.
CacheFileInfo read_cache_file_info(const std::string& path);

// Reads every byte and checks the metadata's checksum and every tensor's: Error(kCacheFile)
// naming the file (and the tensor) at the first mismatch; Error(kSafetensors) when malformed.
void verify_cache_file(const std::string& path);

void save_cache_file(const std::string& path, const pml::Layout& layout, const CacheStore& store,
                     const LlamaModel& model, EncodingMode mode);

// Loads the states of `layout` into the store. On the CPU the file stays memory-mapped and the
// stored states are views of it (no copy: a span's pages are read when a request uses it); on
// another device they are copied there. Error(kCacheFile) naming
// the file when it does not belong to this schema layout, model, dtypes or mode (files of the
// earlier format included), when a span's tensor is missing, mis-shaped or of another dtype, or
// when a checksum does not match (naming the tensor);
// Error(kSafetensors) when the file itself is malformed.
void load_cache_file(const std::string& path, const pml::Layout& layout, CacheStore& store,
                     const LlamaModel& model, EncodingMode mode);

// One span's states from a cache file, with the same checks as load_cache_file (the layout's
// and model's fingerprints passed in, computed once by the caller), reading only that span's
// bytes (its checksum). Mapped on the CPU, copied to the model's device elsewhere.
SpanStates load_cache_span(const std::string& path, const pml::Layout& layout, std::size_t span,
                           const LlamaModel& model, EncodingMode mode, const std::string& layout_fp,
                           const std::string& model_fp);

}  // namespace promptcache
