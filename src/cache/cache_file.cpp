#include "promptcache/cache/cache_file.hpp"

#include <cstdio>
#include <filesystem>

// Header-only xxHash (Debian libxxhash-dev): nothing to link, for this library or its users.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "promptcache/error.hpp"
#include "promptcache/model/safetensors.hpp"

namespace promptcache {
namespace {

// v2: every tensor and the metadata carry an XXH3 checksum (v1 files had none and are compiled
// again).
// v3: one [layers, 2, kv_heads, n, head_dim] tensor per span, the store's own block layout, so
// a CPU engine keeps the mapped bytes as the span's states (v2 had K and V apart: a copy).
constexpr const char* kFormat = "promptcache-states-v3";

struct Fnv64 {
  std::uint64_t h = 1469598103934665603ull;
  void bytes(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  template <typename T>
  void value(const T& v) {
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    value(s.size());
    bytes(s.data(), s.size());
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
  }
};

}  // namespace

std::string model_fingerprint(const LlamaModel& model) {
  Fnv64 f;
  f.text(model.config().to_json_string());
  // A few logits of fixed tokens: cheap, and different for different weights.
  KVCache cache = model.make_cache(4);
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t vocab = model.config().vocab_size;
  auto ids = torch::tensor({int64_t{0}, 1 % vocab, 7 % vocab, 42 % vocab}, int64).unsqueeze(0);
  auto logits = model.forward(ids, torch::arange(4, int64).unsqueeze(0), cache)
                    .reshape({-1})
                    .narrow(0, 0, std::min<int64_t>(vocab, 64))
                    .to(torch::kCPU, torch::kFloat32)
                    .contiguous();
  // Rounded so that bit-level noise across runs of the same weights does not matter.
  for (int64_t i = 0; i < logits.numel(); ++i) {
    f.value(static_cast<int64_t>(std::llround(logits.data_ptr<float>()[i] * 1000.0)));
  }
  return f.hex();
}

namespace {

std::string tensor_name(std::size_t span) {
  return "span." + std::to_string(span) + ".kv";
}

std::string hex64(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

std::string tensor_checksum(const torch::Tensor& t) {
  const auto dense = t.to(torch::kCPU).contiguous();
  return hex64(XXH3_64bits(dense.data_ptr(), dense.numel() * dense.element_size()));
}

std::string metadata_checksum(const std::map<std::string, std::string>& meta) {
  std::string all;
  for (const auto& [key, value] : meta) {
    if (key == "metadata_xxh3") continue;
    all += key;
    all += '\0';
    all += value;
    all += '\0';
  }
  return hex64(XXH3_64bits(all.data(), all.size()));
}

namespace {

// Published whole or not at all (write_safetensors writes through write_file_atomically: a
// uniquely named temporary file beside `path`, fsync'd, renamed over it), so a crash, a full
// disk or a failed write leaves the old file byte for byte (or none), never a torn one.
void write_atomically(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& meta) {
  try {
    write_safetensors(path, tensors, meta);
  } catch (const Error& e) {
    throw Error(e.kind(), "cannot write the cache file: " + e.message(), e.where());
  }
}

}  // namespace

std::string layout_fingerprint(const pml::Layout& layout) {
  Fnv64 f;
  f.text(layout.schema_name);
  f.value(layout.total_length);
  for (const pml::Span& s : layout.spans) {
    f.value(static_cast<int>(s.kind));
    f.value(s.begin);
    f.value(s.cacheable);
    f.value(s.tokens.size());
    f.bytes(s.tokens.data(), s.tokens.size() * sizeof(TokenId));
    f.value(s.unions.size());
    for (const auto& u : s.unions) {
      f.value(u.union_id);
      f.value(u.member);
    }
  }
  for (const pml::UnionLayout& u : layout.unions) f.value(u.scaffold ? *u.scaffold + 1 : 0);
  return f.hex();
}

std::string cache_file_name(const pml::Layout& layout, const LlamaModel& model, EncodingMode mode) {
  Fnv64 f;
  f.text(layout_fingerprint(layout));
  f.text(model_fingerprint(model));
  f.text(dtype_name(model.dtype()));
  f.text(dtype_name(model.kv_dtype()));
  f.text(to_string(mode));
  return layout.schema_name + "-" + f.hex() + ".states";
}

CacheFileInfo read_cache_file_info(const std::string& path) {
  const auto file = SafetensorsFile::open(path);
  const auto& meta = file->metadata();
  auto field = [&](const char* key) {
    const auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  CacheFileInfo info;
  info.path = path;
  info.format = field("format");
  if (info.format.rfind("promptcache-states-", 0) != 0) {
    throw Error(ErrorKind::kCacheFile, "not a promptcache states file (no 'format' metadata)",
                {path});
  }
  info.current_format = info.format == kFormat;
  info.schema = field("schema");
  info.dtype = field("dtype");
  info.kv_dtype = meta.count("kv_dtype") != 0 ? field("kv_dtype") : info.dtype;
  info.encoding = field("encoding");
  info.model_fingerprint = field("model");
  info.layout_fingerprint = field("layout");
  std::error_code ec;
  info.bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  for (const auto& [name, entry] : file->entries()) {
    if (name.rfind("span.", 0) != 0) continue;
    if (info.current_format && entry.shape.size() == 5) {
      ++info.spans;
      info.tokens += entry.shape[3];
    } else if (!info.current_format && name.size() > 2 &&
               name.compare(name.size() - 2, 2, ".k") == 0) {
      ++info.spans;  // the earlier format: K and V apart
    }
  }
  return info;
}

void verify_cache_file(const std::string& path) {
  const auto file = SafetensorsFile::open(path);
  const auto& meta = file->metadata();
  const auto checksum = meta.find("metadata_xxh3");
  if (checksum == meta.end() || checksum->second != metadata_checksum(meta)) {
    throw Error(ErrorKind::kCacheFile,
                "corrupt cache file: its metadata does not match its checksum", {path});
  }
  for (const auto& [name, entry] : file->entries()) {
    const auto sum = meta.find("xxh3." + name);
    if (sum == meta.end() || sum->second != tensor_checksum(file->tensor(name))) {
      throw Error(ErrorKind::kCacheFile,
                  "corrupt cache file: the tensor's bytes do not match its checksum",
                  {path, 0, 0, "tensor '" + name + "'"});
    }
  }
}

void save_cache_file(const std::string& path, const pml::Layout& layout, const CacheStore& store,
                     const LlamaModel& model, EncodingMode mode) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [span, states] : store.spans_of(layout.schema_name)) {
    tensors[tensor_name(span)] = states.kv;
  }
  if (tensors.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "schema '" + layout.schema_name + "' has no compiled states to save", {path});
  }
  std::map<std::string, std::string> meta = {{"format", kFormat},
                                             {"schema", layout.schema_name},
                                             {"layout", layout_fingerprint(layout)},
                                             {"model", model_fingerprint(model)},
                                             {"dtype", dtype_name(model.dtype())},
                                             {"kv_dtype", dtype_name(model.kv_dtype())},
                                             {"encoding", to_string(mode)}};
  for (const auto& [name, t] : tensors) meta["xxh3." + name] = tensor_checksum(t);
  meta["metadata_xxh3"] = metadata_checksum(meta);
  write_atomically(path, tensors, meta);
}

namespace {

// Error(kCacheFile) naming the file unless its metadata says it holds states of this schema
// layout (`layout_fp`), model (`model_fp`), dtypes and encoding mode, and its metadata checksum
// holds.
void check_cache_metadata(const SafetensorsFile& file, const std::string& path,
                          const pml::Layout& layout, const std::string& layout_fp,
                          const LlamaModel& model, const std::string& model_fp, EncodingMode mode) {
  const auto& meta = file.metadata();
  auto expect = [&](const std::string& key, const std::string& want, const std::string& what) {
    auto it = meta.find(key);
    if (it == meta.end()) {
      throw Error(ErrorKind::kCacheFile,
                  "not a promptcache states file (metadata '" + key + "' is missing)", {path});
    }
    if (it->second != want) {
      // `what` may open a parenthesis ("another model (fingerprint"): close it.
      const bool paren = what.find('(') != std::string::npos;
      throw Error(ErrorKind::kCacheFile,
                  "cache file was made for " + what + " '" + it->second + "'" + (paren ? ")" : "") +
                      ", not '" + want + "'; delete it or compile again",
                  {path});
    }
  };
  expect("format", kFormat, "format");
  {
    auto it = meta.find("metadata_xxh3");
    if (it == meta.end() || it->second != metadata_checksum(meta)) {
      throw Error(ErrorKind::kCacheFile,
                  "corrupt cache file: its metadata does not match its checksum; compile again",
                  {path});
    }
  }
  expect("schema", layout.schema_name, "schema");
  expect("layout", layout_fp, "another version of the schema (layout");
  expect("dtype", dtype_name(model.dtype()), "dtype");
  {
    // Files written before the KV dtype could differ from the compute dtype have no kv_dtype:
    // their states are in the compute dtype.
    const auto kv = meta.find("kv_dtype");
    const std::string file_kv = kv != meta.end() ? kv->second : meta.at("dtype");
    if (file_kv != dtype_name(model.kv_dtype())) {
      throw Error(ErrorKind::kCacheFile,
                  "cache file was made for KV dtype '" + file_kv + "', not '" +
                      dtype_name(model.kv_dtype()) + "'; delete it or compile again",
                  {path});
    }
  }
  expect("encoding", to_string(mode), "encoding mode");
  expect("model", model_fp, "another model (fingerprint");
}

// Span `s`'s states from a file whose metadata was checked: its shape, dtype and checksum
// checked too. On the CPU the states are the mapped bytes themselves: nothing is copied, and the
// attention reads them in place (read-only memory; nothing writes into stored states). A file
// replaced later (renamed over) leaves this mapping valid. Elsewhere they are copied onto the
// model's device.
SpanStates span_from_file(const SafetensorsFile& file, const std::string& path,
                          const pml::Layout& layout, std::size_t s, const LlamaModel& model) {
  const auto& c = model.config();
  const pml::Span& span = layout.spans[s];
  const std::vector<int64_t> shape = {c.num_hidden_layers, 2, c.num_key_value_heads,
                                      static_cast<int64_t>(span.size()), c.head_dim};
  const std::string name = tensor_name(s);
  const SourceLocation where{path, 0, 0, "tensor '" + name + "'"};
  if (!file.contains(name))
    throw Error(ErrorKind::kCacheFile, "states of a span are missing", where);
  torch::Tensor block = file.tensor(name);
  if (block.sizes() != at::IntArrayRef(shape)) {
    throw Error(ErrorKind::kCacheFile, "tensor has the wrong shape for its span", where);
  }
  // States of another dtype than the metadata says (and the engine's KV cache) would be
  // converted silently: refused like a file of another dtype, so the engine compiles it again.
  if (block.scalar_type() != model.kv_dtype()) {
    throw Error(ErrorKind::kCacheFile,
                "tensor holds " + dtype_name(block.scalar_type()) + " states, not the " +
                    dtype_name(model.kv_dtype()) + " of this engine's KV cache; compile again",
                where);
  }
  const auto sum = file.metadata().find("xxh3." + name);
  if (sum == file.metadata().end() || sum->second != tensor_checksum(block)) {
    throw Error(ErrorKind::kCacheFile,
                "corrupt cache file: the tensor's bytes do not match its checksum; compile again",
                where);
  }
  if (!model.device().is_cpu()) block = block.to(model.kv_options());
  return SpanStates::from_block(block, static_cast<int64_t>(span.begin));
}

}  // namespace

void load_cache_file(const std::string& path, const pml::Layout& layout, CacheStore& store,
                     const LlamaModel& model, EncodingMode mode) {
  const auto file = SafetensorsFile::open(path);
  check_cache_metadata(*file, path, layout, layout_fingerprint(layout), model,
                       model_fingerprint(model), mode);
  std::map<std::size_t, SpanStates> loaded;
  for (std::size_t s = 0; s < layout.spans.size(); ++s) {
    const pml::Span& span = layout.spans[s];
    if (!span.cacheable || span.size() == 0) continue;
    loaded.emplace(s, span_from_file(*file, path, layout, s, model));
  }
  store.erase_schema(layout.schema_name);
  for (auto& [s, states] : loaded) store.put(layout.schema_name, s, std::move(states));
}

SpanStates load_cache_span(const std::string& path, const pml::Layout& layout, std::size_t span,
                           const LlamaModel& model, EncodingMode mode, const std::string& layout_fp,
                           const std::string& model_fp) {
  const auto file = SafetensorsFile::open(path);
  check_cache_metadata(*file, path, layout, layout_fp, model, model_fp, mode);
  return span_from_file(*file, path, layout, span, model);
}

}  // namespace promptcache
