// Broken cache (states) files: a truncated or malformed file is an error naming it; a changed
// byte or a file of another model is caught by checksum or fingerprint (load_cache_file names
// the file and the tensor; the engine recompiles and replaces it, saying why) — never a wrong
// cache. The engine that met them answers the good prompt as before.
#include "support/catch_torch.hpp"

#include <filesystem>

#include "bad_inputs/bad_input.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/model/safetensors.hpp"

using namespace promptcache;
using bad::EngineUnderTest;
using bad::Expect;
namespace fs = std::filesystem;

namespace {

std::uint64_t header_length(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  return n;
}

}  // namespace

TEST_CASE("broken cache files: refused or recompiled, never used", "[bad][cache]") {
  EngineUnderTest engine;
  test::TempDir dir;
  const pml::Schema good = pml::parse_schema_string(bad::kGoodSchema, "good.xml");
  // A valid states file of the good schema for this very model (same seed).
  const std::string valid = dir.file("good.states");
  test::tiny_engine(5)->add_schema(good, {}, valid);
  const std::string bytes = bad::read_file(valid);
  const std::size_t data = 8 + header_length(bytes);
  REQUIRE(bytes.size() > data + 100);

  auto variant = [&](const std::string& name, const std::function<void(std::string&)>& change) {
    std::string b = bytes;
    change(b);
    const std::string path = dir.file(name);
    bad::write_file(path, b);
    return path;
  };
  auto load = [&](const std::string& path, const LlamaModel& model) {
    CacheStore store;
    load_cache_file(path, engine->layout("good"), store, model, EncodingMode::kScaffold);
  };

  const std::string truncated =
      variant("truncated.states", [](std::string& b) { b.resize(b.size() / 2); });
  engine.expect("a truncated cache file", [&](Engine& e) { e.add_schema(good, {}, truncated); },
                {ErrorKind::kSafetensors, {truncated, "beyond the data section", "tensor 'span."}});
  CHECK(fs::file_size(truncated) == bytes.size() / 2);  // left alone for the user to look at

  const std::string garbage = variant("garbage.states", [](std::string& b) {
    for (std::size_t i = 0; i < 8; ++i) b[i] = '\xff';
  });
  engine.expect("a cache file that is not safetensors",
                [&](Engine& e) { e.add_schema(good, {}, garbage); },
                {ErrorKind::kSafetensors, {garbage, "exceeds the 100 MB limit"}});

  const std::string folder = dir.file("folder.states");
  fs::create_directory(folder);
  engine.expect("a cache path that is a folder", [&](Engine& e) { e.add_schema(good, {}, folder); },
                {ErrorKind::kIo, {folder, "not a regular file"}});

  // One flipped bit in the tensor data: the checksum names the file and the tensor.
  const std::string flipped = variant("flipped.states", [&](std::string& b) {
    b[data + 37] = static_cast<char>(b[data + 37] ^ 0x01);
  });
  bad::expect_error("one flipped bit in a cache file's tensors",
                    [&] { load(flipped, engine->model()); },
                    {ErrorKind::kCacheFile, {flipped, "checksum", "tensor 'span."}});
  // One changed byte in the metadata (a digit of the layout fingerprint).
  const std::string meta = variant("meta.states", [&](std::string& b) {
    const auto at = b.find("\"layout\":\"");
    REQUIRE(at != std::string::npos);
    char& c = b[at + 10];
    c = c == '0' ? '1' : '0';
  });
  bad::expect_error("one changed byte in a cache file's metadata",
                    [&] { load(meta, engine->model()); },
                    {ErrorKind::kCacheFile, {meta, "metadata does not match its checksum"}});
  // The engine does not use such a file: it compiles again, says why, and replaces it.
  engine->add_schema(good, {}, flipped);
  CHECK_THAT(engine->compile_report("good").source,
             Catch::Contains("stale") && Catch::Contains("checksum"));
  engine.still_answers();
  CacheStore reloaded;
  load_cache_file(flipped, engine->layout("good"), reloaded, engine->model(),
                  EncodingMode::kScaffold);  // now valid

  // A file made by another model (other weights): its fingerprint does not match.
  auto other = test::tiny_engine(6);
  bad::expect_error("a cache file of another model", [&] { load(valid, other->model()); },
                    {ErrorKind::kCacheFile, {valid, "another model"}});
  const std::string mine = dir.file("other-model.states");
  fs::copy_file(valid, mine);
  other->add_schema(good, {}, mine);
  CHECK_THAT(other->compile_report("good").source, Catch::Contains("another model"));

  // The right shapes and metadata, valid checksums, but bf16 states where the engine runs f32:
  // refused (never converted silently), and the engine compiles the file again, saying why.
  const std::string narrow = dir.file("bf16.states");
  {
    const auto file = SafetensorsFile::open(valid);
    std::map<std::string, std::string> m = file->metadata();
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& [name, entry] : file->entries()) {
      tensors[name] = file->tensor(name).to(torch::kBFloat16);
      m["xxh3." + name] = tensor_checksum(tensors[name]);
    }
    m["metadata_xxh3"] = metadata_checksum(m);
    write_safetensors(narrow, tensors, m);
  }
  bad::expect_error("a cache file whose tensors have another dtype",
                    [&] { load(narrow, engine->model()); },
                    {ErrorKind::kCacheFile, {narrow, "tensor 'span.", "bf16 states", "f32"}});
  engine->add_schema(good, {}, narrow);
  CHECK_THAT(engine->compile_report("good").source,
             Catch::Contains("stale") && Catch::Contains("bf16 states"));
  engine.still_answers();
  load(narrow, engine->model());  // replaced by a valid file

  // A file of another schema, and a safetensors file that holds no states at all.
  bad::expect_error(
      "a cache file of another schema",
      [&] {
        CacheStore store;
        const auto layout = engine->layout_only(pml::parse_schema_string(
            "<schema name=\"other\"><module name=\"m\">Some text.</module></schema>"));
        load_cache_file(valid, layout, store, engine->model(), EncodingMode::kScaffold);
      },
      {ErrorKind::kCacheFile, {valid, "schema 'good', not 'other'"}});
  const std::string foreign = dir.file("weights.safetensors");
  write_safetensors(foreign, {{"x", torch::zeros({2})}});
  bad::expect_error("a safetensors file that is no states file",
                    [&] { load(foreign, engine->model()); },
                    {ErrorKind::kCacheFile, {foreign, "not a promptcache states file"}});
  engine.still_answers();
}
