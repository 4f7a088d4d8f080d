// Fuzz entries "safetensors" (SafetensorsFile::open, tensor()) and "cache_file" (load_cache_file
// against a fixed schema layout and a tiny random model); these link LibTorch. The seeds of all
// three, "redis_value" (entries_states.cpp) included, are written here.
#include <torch/types.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "pml/fake_tokenizer.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/cache/redis_tier.hpp"
#include "promptcache/cache/store.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/schema.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

const detail::ScratchDir& scratch() {
  static const detail::ScratchDir dir("model");
  return dir;
}

std::uint64_t header_length(const std::uint8_t* data, std::size_t size) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0 && size >= 8; --i) n = (n << 8) | data[i];
  return n;
}

// The schema, model and layout the cache_file target loads against (and its seeds are made
// with): one layer, so that a compiled file stays a few KB.
const char* const kCacheSchema = R"(<schema name="fzc">
  <module name="a">The river flows to the sea.</module>
  <union scaffold="b">
    <module name="b">Paris is in France.</module>
    <module name="c" cache="false">Tokyo.</module>
    <module name="d">Rome is old.</module>
  </union>
  <module name="p">Say <parameter name="x" length="2"/> now.</module>
</schema>)";

struct CacheFixture {
  std::unique_ptr<LlamaModel> model;
  pml::Layout layout;
};

const CacheFixture& fixture() {
  static const CacheFixture f = [] {
    configure_threads(1);  // one core: the fuzzer runs one input at a time
    ModelConfig config = synthetic_config("tiny");
    config.num_hidden_layers = 1;
    CacheFixture out;
    out.model = LlamaModel::from_tensors(config, random_llama_weights(config, 7, 0.1));
    pml_test::FakeTokenizer tokenizer;
    out.layout = pml::layout(pml::parse_schema_string(kCacheSchema, "fzc.xml"), tokenizer,
                             pml::chat_template("plain"));
    return out;
  }();
  return f;
}

// Loads in both encoding modes; a load that succeeds must have stored every cacheable span at
// its own positions.
void load_both_modes(const std::string& path) {
  const CacheFixture& f = fixture();
  for (EncodingMode mode : {EncodingMode::kScaffold, EncodingMode::kIsolated}) {
    CacheStore store;
    try {
      load_cache_file(path, f.layout, store, *f.model, mode);
    } catch (const Error& e) {
      detail::rejected(e);  // a clean rejection
      continue;
    }
    for (std::size_t s = 0; s < f.layout.spans.size(); ++s) {
      const pml::Span& span = f.layout.spans[s];
      const SpanStates* states = store.find(f.layout.schema_name, s);
      if (!span.cacheable || span.size() == 0) {
        check(states == nullptr, "states loaded for a span that is never cached");
        continue;
      }
      check(states != nullptr, "a cacheable span has no states after a successful load");
      check(states->begin == static_cast<int64_t>(span.begin) &&
                states->length() == static_cast<int64_t>(span.size()),
            "loaded states sit at the wrong positions");
    }
  }
}

// Rewrites a cache file with its checksums recomputed (false when it is no safetensors file
// with promptcache metadata), so that mutated tensors and metadata reach the checks behind the
// checksums.
bool rewrite_with_checksums(const std::string& in, const std::string& out) {
  std::shared_ptr<SafetensorsFile> file;
  try {
    file = SafetensorsFile::open(in);
  } catch (const Error&) {
    return false;
  }
  std::map<std::string, std::string> meta = file->metadata();
  if (meta.count("format") == 0) return false;
  std::map<std::string, torch::Tensor> tensors;
  for (const auto& [name, entry] : file->entries()) {
    tensors[name] = file->tensor(name);
    meta["xxh3." + name] = tensor_checksum(tensors[name]);
  }
  meta["metadata_xxh3"] = metadata_checksum(meta);
  try {
    write_safetensors(out, tensors, meta);
  } catch (const Error&) {
    return false;
  }
  return true;
}

// The dtypes and shapes of the redis_value target's seeds (entries_states.cpp opens values as
// these).

struct RedisExpectation {
  const char* seed;
  torch::Dtype dtype;
  std::vector<int64_t> shape;
};

const std::vector<RedisExpectation>& redis_expectations() {
  static const std::vector<RedisExpectation> e = {
      {"f32.value", torch::kFloat32, {1, 2, 1, 3, 2}},
      {"bf16.value", torch::kBFloat16, {2, 2, 2, 1, 4}},
      {"empty.value", torch::kFloat16, {1, 2, 1, 0, 2}},
  };
  return e;
}

}  // namespace

void safetensors_entry(const std::uint8_t* data, std::size_t size) {
  const detail::ScratchFile input(scratch().file("input.safetensors"), data, size);
  try {
    const auto file = SafetensorsFile::open(input.path());
    // The reader promises every tensor inside the data section and matching shape x dtype.
    const std::uint64_t data_start = 8 + header_length(data, size);
    for (const auto& [name, entry] : file->entries()) {
      check(entry.begin <= entry.end && data_start + entry.end <= size,
            "tensor bytes outside the file's data section");
      const torch::Tensor t = file->tensor(name);
      check(t.sizes().vec() == entry.shape, "tensor() has another shape than the header");
      const auto nbytes = static_cast<std::size_t>(t.numel()) * t.element_size();
      check(nbytes == entry.end - entry.begin, "tensor() covers other bytes than data_offsets");
      if (nbytes > 0) (void)tensor_checksum(t);  // touches every byte
    }
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

void cache_file_entry(const std::uint8_t* data, std::size_t size) {
  const detail::ScratchFile input(scratch().file("input.states"), data, size);
  const detail::ScratchFile fixed(scratch().file("fixed.states"));
  load_both_modes(input.path());
  if (rewrite_with_checksums(input.path(), fixed.path())) load_both_modes(fixed.path());
}

void write_model_seeds(const std::string& corpus_root) {
  namespace fs = std::filesystem;
  const fs::path st = fs::path(corpus_root) / "safetensors";
  const fs::path cf = fs::path(corpus_root) / "cache_file";
  const fs::path rv = fs::path(corpus_root) / "redis_value";
  fs::create_directories(st);
  fs::create_directories(cf);
  fs::create_directories(rv);

  // redis values: one per expectation of the redis_value target, sealed with its key and secret.
  for (const RedisExpectation& e : redis_expectations()) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    const torch::Tensor block =
        (torch::arange(n, torch::kFloat64) * 0.25 - 1).to(e.dtype).reshape(e.shape);
    const std::string value = RedisTier::encode(kRedisValueKey, block, kRedisValueSecret);
    detail::write_bytes((rv / e.seed).string(), value.data(), value.size());
  }

  // safetensors: every dtype, empty and scalar shapes, metadata; one tensor without metadata;
  // an empty file; a hand-written header that is not padded (misaligned data).
  const auto range = [](int64_t n, torch::Dtype dtype) {
    return torch::arange(n, torch::kFloat64).to(dtype);
  };
  write_safetensors((st / "all-dtypes.safetensors").string(),
                    {{"f32", range(6, torch::kFloat32).reshape({2, 3})},
                     {"f16", range(4, torch::kFloat16)},
                     {"bf16", range(2, torch::kBFloat16).reshape({1, 2})},
                     {"f64", range(1, torch::kFloat64)},
                     {"i64", range(2, torch::kInt64)},
                     {"i32", range(4, torch::kInt32).reshape({2, 2})},
                     {"i16", range(1, torch::kInt16)},
                     {"i8", torch::tensor(int64_t{5}).to(torch::kInt8)},
                     {"u8", torch::empty({0}, torch::kUInt8)},
                     {"bool", torch::tensor({true, false, true})}},
                    {{"note", "seed"}});
  write_safetensors((st / "one-tensor.safetensors").string(),
                    {{"model.embed_tokens.weight", range(12, torch::kFloat32).reshape({3, 4})}});
  write_safetensors((st / "empty.safetensors").string(), {});
  {
    const std::string header =
        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
        R"("b":{"dtype":"I16","shape":[0],"data_offsets":[9,9]},"__metadata__":{"k":"v"}})";
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string("\x00\x00\x00\x80\x3f\x00\x00\x00\x40", 9);
    detail::write_bytes((st / "misaligned.safetensors").string(), bytes.data(), bytes.size());
  }

  // cache files: the fixed schema compiled with the fixed model, in both encoding modes.
  const CacheFixture& f = fixture();
  for (EncodingMode mode : {EncodingMode::kScaffold, EncodingMode::kIsolated}) {
    CacheStore store;
    CompileOptions options;
    options.mode = mode;
    ModuleCompiler(*f.model).compile(f.layout, store, options);
    save_cache_file((cf / (std::string(to_string(mode)) + ".states")).string(), f.layout, store,
                    *f.model, mode);
  }
}

}  // namespace promptcache::fuzz
