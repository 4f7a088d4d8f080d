// safetensors: round trips, sharded folders, zero-copy mmap, and a catalogue of malformed files.
#include "support/catch_torch.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "promptcache/error.hpp"
#include "promptcache/model/safetensors.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

// Writes a raw file: 8-byte little-endian header length, the header, then `data` bytes.
void write_raw(const std::string& path, const std::string& header, std::size_t data_bytes,
               std::uint64_t declared_length = UINT64_MAX) {
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = declared_length == UINT64_MAX ? header.size() : declared_length;
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xFF));
  f << header << std::string(data_bytes, '\0');
}

}  // namespace

TEST_CASE("safetensors round trip in f32, f16, bf16 with metadata", "[safetensors]") {
  test::TempDir dir;
  const auto a = torch::randn({3, 5});
  const auto b = torch::randn({7}).to(torch::kFloat16);
  const auto c = torch::randn({2, 2, 2}).to(torch::kBFloat16);
  const auto i = torch::arange(6, torch::kInt64).view({2, 3});
  write_safetensors(dir.file("t.safetensors"), {{"a", a}, {"b", b}, {"c", c}, {"ids", i}},
                    {{"format", "pt"}, {"note", "hello"}});
  const auto f = SafetensorsFile::open(dir.file("t.safetensors"));
  CHECK(f->entries().size() == 4);
  CHECK(f->metadata().at("note") == "hello");
  CHECK(torch::equal(f->tensor("a"), a));
  CHECK(torch::equal(f->tensor("b"), b));
  CHECK(torch::equal(f->tensor("c"), c));
  CHECK(torch::equal(f->tensor("ids"), i));
  CHECK(f->tensor("b").scalar_type() == torch::kFloat16);
  CHECK(f->entries().at("a").shape == std::vector<int64_t>{3, 5});
  CHECK_THROWS_AS(f->tensor("nope"), Error);
}

TEST_CASE("mmapped tensors alias the mapping and outlive the file object", "[safetensors]") {
  test::TempDir dir;
  const auto big = torch::randn({256, 256});
  write_safetensors(dir.file("m.safetensors"), {{"w", big}});
  torch::Tensor w;
  const void* first = nullptr;
  {
    const auto f = SafetensorsFile::open(dir.file("m.safetensors"));
    w = f->tensor("w");
    first = f->tensor("w").data_ptr();
    CHECK(w.data_ptr() == first);  // the same bytes both times: no copy
  }
  // The SafetensorsFile handle is gone; the tensor keeps the mapping alive.
  CHECK(torch::equal(w, big));
  // Header + data: the data starts 8 + header bytes into the file, 8-byte aligned.
  CHECK(reinterpret_cast<std::uintptr_t>(w.data_ptr()) % 8 == 0);
  // The bytes lie inside a mapping of the file itself (/proc/self/maps), not in a heap copy.
  const auto addr = reinterpret_cast<std::uintptr_t>(w.data_ptr());
  std::ifstream maps("/proc/self/maps");
  bool inside = false;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("m.safetensors") == std::string::npos) continue;
    const auto dash = line.find('-'), space = line.find(' ');
    const auto lo = std::stoull(line.substr(0, dash), nullptr, 16);
    const auto hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
    if (addr >= lo && addr + big.numel() * sizeof(float) <= hi) inside = true;
  }
  CHECK(inside);
}

TEST_CASE("tensors of one file are views at their offsets in one mapping", "[safetensors]") {
  test::TempDir dir;
  const auto a = torch::randn({16}), b = torch::randn({8, 4});
  write_safetensors(dir.file("v.safetensors"), {{"a", a}, {"b", b}});
  const auto f = SafetensorsFile::open(dir.file("v.safetensors"));
  const auto& ea = f->entries().at("a");
  const auto& eb = f->entries().at("b");
  const auto* pa = static_cast<const char*>(f->tensor("a").data_ptr());
  const auto* pb = static_cast<const char*>(f->tensor("b").data_ptr());
  CHECK(pb - pa == static_cast<std::ptrdiff_t>(eb.begin) - static_cast<std::ptrdiff_t>(ea.begin));
  CHECK(ea.end - ea.begin == 16 * sizeof(float));
}

TEST_CASE("the writer pads the header, records format pt, and leaves no temp file",
          "[safetensors]") {
  test::TempDir dir;
  const auto t = torch::arange(12, torch::kFloat32).view({3, 4}).t();  // not contiguous
  write_safetensors(dir.file("w.safetensors"), {{"t", t}, {"flag", torch::ones({3}, torch::kBool)}},
                    {{"source", "test"}});
  std::ifstream in(dir.file("w.safetensors"), std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  CHECK(n % 8 == 0);
  const auto f = SafetensorsFile::open(dir.file("w.safetensors"));
  CHECK(f->metadata().at("format") == "pt");
  CHECK(f->metadata().at("source") == "test");
  CHECK(torch::equal(f->tensor("t"), t.contiguous()));
  CHECK(f->tensor("flag").scalar_type() == torch::kBool);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  CHECK(files == 1);  // the temp file was renamed into place
  // Without metadata there is no __metadata__ entry at all.
  write_safetensors(dir.file("plain.safetensors"), {{"t", t}});
  CHECK(SafetensorsFile::open(dir.file("plain.safetensors"))->metadata().empty());
}

TEST_CASE("checkpoint folders: single file, index.json shards, and errors", "[safetensors]") {
  test::TempDir dir;
  const auto a = torch::randn({4}), b = torch::randn({2, 2});
  std::filesystem::create_directories(dir.path() / "sharded");
  write_safetensors(dir.file("sharded/model-00001-of-00002.safetensors"), {{"a", a}});
  write_safetensors(dir.file("sharded/model-00002-of-00002.safetensors"), {{"b", b}});
  {
    std::ofstream idx(dir.file("sharded/model.safetensors.index.json"));
    idx << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}})";
  }
  const auto ck = SafetensorsCheckpoint::open_folder(dir.file("sharded"));
  CHECK(ck.names() == std::vector<std::string>{"a", "b"});
  CHECK(torch::equal(ck.tensor("a"), a));
  CHECK(torch::equal(ck.tensor("b"), b));
  CHECK_THROWS_WITH(ck.tensor("c"), Catch::Contains("'c'"));

  std::filesystem::create_directories(dir.path() / "empty");
  CHECK_THROWS_WITH(SafetensorsCheckpoint::open_folder(dir.file("empty")),
                    Catch::Contains("empty"));
  CHECK_THROWS_AS(SafetensorsCheckpoint::open_folder(dir.file("missing")), Error);

  // No index, no model.safetensors: every *.safetensors file, in name order.
  std::filesystem::create_directories(dir.path() / "loose");
  write_safetensors(dir.file("loose/z.safetensors"), {{"b", b}});
  write_safetensors(dir.file("loose/a.safetensors"), {{"a", a}});
  const auto loose = SafetensorsCheckpoint::open_folder(dir.file("loose"));
  CHECK(loose.names() == std::vector<std::string>{"a", "b"});
  CHECK(torch::equal(loose.tensor("b"), b));

  // model.safetensors wins over other files in the folder.
  write_safetensors(dir.file("loose/model.safetensors"), {{"only", a}});
  CHECK(SafetensorsCheckpoint::open_folder(dir.file("loose")).names() ==
        std::vector<std::string>{"only"});

  // The same tensor in two shards is an error naming the tensor.
  std::filesystem::create_directories(dir.path() / "dup");
  write_safetensors(dir.file("dup/x.safetensors"), {{"a", a}});
  write_safetensors(dir.file("dup/y.safetensors"), {{"a", a}});
  try {
    SafetensorsCheckpoint::open_folder(dir.file("dup"));
    FAIL("accepted a tensor in two shards");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kModel);
    CHECK_THAT(e.what(), Catch::Contains("tensor 'a'") && Catch::Contains("dup"));
  }
}

TEST_CASE("malformed safetensors files are rejected with the file and tensor named",
          "[safetensors]") {
  test::TempDir dir;
  struct Bad {
    std::string name, header;
    std::size_t data;
    std::string expect;  // substring of the message
    std::uint64_t declared = UINT64_MAX;
  };
  const std::vector<Bad> cases = {
      {"not json", "{not json", 0, "not valid JSON"},
      {"not an object", "[1, 2]", 0, "JSON object"},
      {"entry missing dtype", R"({"t": {"shape": [1], "data_offsets": [0, 4]}})", 4, "dtype"},
      {"entry missing shape", R"({"t": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, "shape"},
      {"unknown dtype", R"({"t": {"dtype": "F7", "shape": [1], "data_offsets": [0, 4]}})", 4,
       "unknown dtype"},
      {"negative dim", R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
       "negative"},
      {"begin after end", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4,
       "begin"},
      {"entry missing offsets", R"({"t": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {"fractional dim", R"({"t": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       "integer"},
      {"offsets not a pair", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4,
       "data_offsets"},
      {"past the end", R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8,
       "beyond the data section"},
      {"size mismatch", R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
       "shape x dtype"},
      {"entry not an object", R"({"t": 5})", 0, "object"},
      {"overlap",
       R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "u": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "overlap"},
      {"bad metadata", R"({"__metadata__": {"x": 1}})", 0, "__metadata__"},
      {"header longer than file", R"({})", 0, "past the end", 1000},
      {"absurd header length", R"({})", 0, "limit", 1ull << 40},
  };
  for (const Bad& b : cases) {
    const std::string path = dir.file(b.name + ".safetensors");
    write_raw(path, b.header, b.data, b.declared);
    INFO(b.name);
    try {
      SafetensorsFile::open(path);
      FAIL("accepted a malformed file: " << b.name);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kSafetensors);
      CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains(b.expect));
      // Errors about one entry name it.
      if (b.header.find(R"("t")") != std::string::npos) {
        CHECK_THAT(e.what(), Catch::Contains("tensor '"));
      }
    }
  }
  // A file too short for the length prefix, and one that does not exist.
  { std::ofstream(dir.file("short.safetensors")) << "abc"; }
  CHECK_THROWS_WITH(SafetensorsFile::open(dir.file("short.safetensors")),
                    Catch::Contains("short.safetensors"));
  CHECK_THROWS_WITH(SafetensorsFile::open(dir.file("none.safetensors")),
                    Catch::Contains("none.safetensors"));
}
