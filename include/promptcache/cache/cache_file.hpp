// promptcache/cache/cache_file.hpp — compiled module states on disk.
//
// A cache file is a safetensors file: tensors "span.<index>.k" / "span.<index>.v" of shape
// [layers, kv_heads, n, head_dim], and metadata that pins what the states are valid for — the
// schema's layout (a fingerprint of every span's tokens and positions), the model (config and
// sampled weights), the dtype and the encoding mode, and an XXH3 checksum of every tensor and of
// the metadata. Loading checks all of it, so a file from another schema version, model or mode,
// or one with any byte changed, is refused with an error naming the file (and the tensor)
// instead of giving a wrong cache. Files are written to a temporary name, flushed and renamed,
// so a crash mid-write leaves the old file or none.
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

// A stable hash of everything the states depend on in the layout.
std::string layout_fingerprint(const pml::Layout& layout);

void save_cache_file(const std::string& path, const pml::Layout& layout, const CacheStore& store,
                     const LlamaModel& model, EncodingMode mode);

// Loads the states of `layout` into the store (on the model's device). Error(kCacheFile) naming
// the file when it does not belong to this schema layout, model, dtype or mode, when a span's
// tensors are missing or mis-shaped, or when a checksum does not match (naming the tensor);
// Error(kSafetensors) when the file itself is malformed.
void load_cache_file(const std::string& path, const pml::Layout& layout, CacheStore& store,
                     const LlamaModel& model, EncodingMode mode);

}  // namespace promptcache
