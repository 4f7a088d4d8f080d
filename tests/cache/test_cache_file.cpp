// Compiled states on disk: round trip, stale files recompiled, corrupt files refused.
#include "support/catch_torch.hpp"

#include <fstream>

#include "promptcache/cache/cache_file.hpp"
#include "promptcache/model/safetensors.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {
const char* kSchema = R"(<schema name="kb">
  <module name="a">The river flows from the mountains to the sea.</module>
  <union scaffold="b"><module name="b">Paris is the capital of France.</module>
    <module name="c">Tokyo is the capital of Japan.</module></union>
</schema>)";
const char* kPrompt = R"(<prompt schema="kb"><a/><c/>What is the capital?</prompt>)";
}  // namespace

TEST_CASE("cache file round trip gives the same answer without compiling", "[cache][file]") {
  test::TempDir dir;
  const std::string file = dir.file("kb.states");
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  greedy.stop_at_eos = false;
  auto first = test::tiny_engine(3);
  first->add_schema(pml::parse_schema_string(kSchema), {}, file);
  CHECK_THAT(first->compile_report("kb").source, Catch::StartsWith("compiled, saved"));
  const auto expected = first->generate_xml(kPrompt, greedy);

  auto second = test::tiny_engine(3);
  bool compiled = false;
  second->add_schema(
      pml::parse_schema_string(kSchema),
      [&](const std::string&, const CompileProgress&) { compiled = true; }, file);
  CHECK_FALSE(compiled);
  CHECK_THAT(second->compile_report("kb").source, Catch::StartsWith("loaded from"));
  CHECK(second->store().bytes("kb") == first->store().bytes("kb"));
  const auto got = second->generate_xml(kPrompt, greedy);
  CHECK(got.tokens == expected.tokens);
  // The states themselves are identical.
  for (const auto& [span, states] : first->store().spans_of("kb")) {
    const auto* other = second->store().find("kb", span);
    REQUIRE(other != nullptr);
    CHECK(torch::equal(states.k, other->k));
    CHECK(torch::equal(states.v, other->v));
  }
  // Mapped, not copied (on the CPU): every span's states are the file's own bytes, as far apart
  // in memory as the file's tensors are apart in the file.
  if (!second->model().device().is_cpu()) return;
  const auto mapped = SafetensorsFile::open(file);
  const auto& spans = second->store().spans_of("kb");
  REQUIRE(spans.size() >= 2);
  const auto& [first_span, first_states] = *spans.begin();
  const auto first_entry = mapped->entries().at("span." + std::to_string(first_span) + ".kv");
  for (const auto& [span, states] : spans) {
    const auto entry = mapped->entries().at("span." + std::to_string(span) + ".kv");
    CHECK(static_cast<const char*>(states.kv.data_ptr()) -
              static_cast<const char*>(first_states.kv.data_ptr()) ==
          static_cast<std::ptrdiff_t>(entry.begin) -
              static_cast<std::ptrdiff_t>(first_entry.begin));
  }
}

TEST_CASE("a stale cache file is recompiled, never used", "[cache][file]") {
  test::TempDir dir;
  const std::string file = dir.file("kb.states");
  test::tiny_engine(3)->add_schema(pml::parse_schema_string(kSchema), {}, file);
  // Another model (other weights): refused by fingerprint, recompiled, replaced.
  auto other_model = test::tiny_engine(4);
  other_model->add_schema(pml::parse_schema_string(kSchema), {}, file);
  CHECK_THAT(other_model->compile_report("kb").source,
             Catch::Contains("stale") && Catch::Contains("another model"));
  // Another version of the schema text.
  std::string edited = kSchema;
  edited.replace(edited.find("Paris"), 5, "Rome!");
  auto engine = test::tiny_engine(4);
  engine->add_schema(pml::parse_schema_string(edited), {}, file);
  CHECK_THAT(engine->compile_report("kb").source, Catch::Contains("another version"));
  // Loading by hand names the file.
  CacheStore store;
  const auto layout = engine->layout_only(pml::parse_schema_string(kSchema));
  try {
    load_cache_file(file, layout, store, engine->model(), EncodingMode::kScaffold);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kCacheFile);
    CHECK_THAT(e.what(), Catch::Contains(file));
  }
  CHECK_THROWS_WITH(
      load_cache_file(file, engine->layout("kb"), store, engine->model(), EncodingMode::kIsolated),
      Catch::Contains("encoding mode"));
}

TEST_CASE("corrupt or foreign cache files give clear errors", "[cache][file]") {
  test::TempDir dir;
  auto engine = test::tiny_engine(3);
  const std::string file = dir.file("kb.states");
  engine->add_schema(pml::parse_schema_string(kSchema), {}, file);
  // Truncate it: the safetensors reader refuses it, and the engine does not overwrite it.
  const auto size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size / 2);
  auto again = test::tiny_engine(3);
  try {
    again->add_schema(pml::parse_schema_string(kSchema), {}, file);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kSafetensors);
    CHECK_THAT(e.what(), Catch::Contains(file));
  }
  CHECK(std::filesystem::file_size(file) == size / 2);
  // A valid safetensors file that is not a states file.
  const std::string foreign = dir.file("weights.safetensors");
  write_safetensors(foreign, {{"x", torch::zeros({2})}});
  CacheStore store;
  CHECK_THROWS_WITH(load_cache_file(foreign, engine->layout("kb"), store, engine->model(),
                                    EncodingMode::kScaffold),
                    Catch::Contains("not a promptcache states file") && Catch::Contains(foreign));
}

TEST_CASE("any changed byte of a cache file's tensors or metadata is caught", "[cache][file]") {
  test::TempDir dir;
  auto engine = test::tiny_engine(3);
  const std::string file = dir.file("kb.states");
  engine->add_schema(pml::parse_schema_string(kSchema), {}, file);
  // Written under a temporary name and renamed: nothing else is left in the folder.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path()),
                      std::filesystem::directory_iterator()) == 1);
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[i]);
  const std::size_t data = 8 + header;
  REQUIRE(bytes.size() > data + 1000);
  auto load_changed = [&](std::size_t at, char value) {
    std::string changed = bytes;
    changed[at] = value;
    const std::string path = dir.file("changed.states");
    std::ofstream(path, std::ios::binary) << changed;
    CacheStore store;
    load_cache_file(path, engine->layout("kb"), store, engine->model(), EncodingMode::kScaffold);
  };
  // One bit of one byte, at many places in the tensor data: each names the file and a tensor.
  int caught = 0;
  for (std::size_t at = data; at < bytes.size(); at += 211) {
    try {
      load_changed(at, static_cast<char>(bytes[at] ^ 0x10));
      FAIL("a changed byte at " << at << " was not caught");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kCacheFile);
      CHECK_THAT(e.what(), Catch::Contains("changed.states") && Catch::Contains("checksum") &&
                               Catch::Contains("tensor 'span."));
      ++caught;
    }
  }
  CHECK(caught > 20);
  // A metadata value changed so that the header is still valid JSON.
  const auto at = bytes.find("scaffold");
  REQUIRE(at != std::string::npos);
  REQUIRE(at < data);
  CHECK_THROWS_WITH(load_changed(at, 'S'), Catch::Contains("changed.states") &&
                                               Catch::Contains("metadata does not match"));
  // The unchanged file still loads.
  CacheStore store;
  load_cache_file(file, engine->layout("kb"), store, engine->model(), EncodingMode::kScaffold);
  CHECK(store.tokens("kb") > 0);
}
