#include "promptcache/cache/cache_file.hpp"

#include <cstdio>

#include "promptcache/error.hpp"
#include "promptcache/model/safetensors.hpp"

namespace promptcache {
namespace {

constexpr const char* kFormat = "promptcache-states-v1";

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

std::string tensor_name(std::size_t span, char kind) {
  return "span." + std::to_string(span) + "." + kind;
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

void save_cache_file(const std::string& path, const pml::Layout& layout, const CacheStore& store,
                     const LlamaModel& model, EncodingMode mode) {
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [span, states] : store.spans_of(layout.schema_name)) {
    tensors[tensor_name(span, 'k')] = states.k;
    tensors[tensor_name(span, 'v')] = states.v;
  }
  if (tensors.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "schema '" + layout.schema_name + "' has no compiled states to save", {path});
  }
  write_safetensors(path, tensors,
                    {{"format", kFormat},
                     {"schema", layout.schema_name},
                     {"layout", layout_fingerprint(layout)},
                     {"model", model_fingerprint(model)},
                     {"dtype", dtype_name(model.dtype())},
                     {"encoding", to_string(mode)}});
}

void load_cache_file(const std::string& path, const pml::Layout& layout, CacheStore& store,
                     const LlamaModel& model, EncodingMode mode) {
  const auto file = SafetensorsFile::open(path);
  const auto& meta = file->metadata();
  auto expect = [&](const std::string& key, const std::string& want, const std::string& what) {
    auto it = meta.find(key);
    if (it == meta.end()) {
      throw Error(ErrorKind::kCacheFile,
                  "not a promptcache states file (metadata '" + key + "' is missing)", {path});
    }
    if (it->second != want) {
      throw Error(ErrorKind::kCacheFile,
                  "cache file was made for " + what + " '" + it->second + "', not '" + want +
                      "'; delete it or compile again",
                  {path});
    }
  };
  expect("format", kFormat, "format");
  expect("schema", layout.schema_name, "schema");
  expect("layout", layout_fingerprint(layout), "another version of the schema (layout");
  expect("dtype", dtype_name(model.dtype()), "dtype");
  expect("encoding", to_string(mode), "encoding mode");
  expect("model", model_fingerprint(model), "another model (fingerprint");

  const auto& c = model.config();
  std::map<std::size_t, SpanStates> loaded;
  for (std::size_t s = 0; s < layout.spans.size(); ++s) {
    const pml::Span& span = layout.spans[s];
    if (!span.cacheable || span.size() == 0) continue;
    const std::vector<int64_t> shape = {c.num_hidden_layers, c.num_key_value_heads,
                                        static_cast<int64_t>(span.size()), c.head_dim};
    torch::Tensor parts[2];
    for (int i = 0; i < 2; ++i) {
      const std::string name = tensor_name(s, i == 0 ? 'k' : 'v');
      if (!file->contains(name)) {
        throw Error(ErrorKind::kCacheFile, "states of a span are missing",
                    {path, 0, 0, "tensor '" + name + "'"});
      }
      parts[i] = file->tensor(name);
      if (parts[i].sizes() != at::IntArrayRef(shape)) {
        throw Error(ErrorKind::kCacheFile, "tensor has the wrong shape for its span",
                    {path, 0, 0, "tensor '" + name + "'"});
      }
    }
    // Copied off the mapping onto the model's device, so the file may be replaced later.
    SpanStates states =
        SpanStates::from_block(torch::stack({parts[0], parts[1]}, 1).to(model.tensor_options()),
                               static_cast<int64_t>(span.begin));
    loaded.emplace(s, std::move(states));
  }
  store.erase_schema(layout.schema_name);
  for (auto& [s, states] : loaded) store.put(layout.schema_name, s, std::move(states));
}

}  // namespace promptcache
