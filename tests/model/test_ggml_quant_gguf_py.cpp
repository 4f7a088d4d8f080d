// GGML's block formats checked against an independent implementation, llama.cpp's gguf-py (pure
// numpy): blocks from our quantize() and random valid blocks dequantized by both, and blocks that
// gguf-py quantizes (Q4_0, Q5_0, Q5_1, Q8_0: it has no K-quant quantizer) dequantized by ours, all
// bitwise equal. Needs PROMPTCACHE_GGUF_PY=<llama.cpp>/gguf-py and a python3 with numpy
// (PROMPTCACHE_PYTHON names it, default python3); skipped visibly without PROMPTCACHE_GGUF_PY
// (docs/architecture.md says how to get the tree).
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "promptcache/model/ggml_quant.hpp"
#include "support/ggml_blocks.hpp"
#include "support/test_support.hpp"

using namespace promptcache;
using ggml::Type;

namespace {

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const torch::Tensor& t) {
  const auto c = t.contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  REQUIRE(out.good());
}

torch::Tensor read_floats(const std::string& path, int64_t rows, int64_t k) {
  const auto bytes = read_all(path);
  REQUIRE(static_cast<int64_t>(bytes.size()) == rows * k * 4);
  auto t = torch::empty({rows, k});
  std::memcpy(t.data_ptr<float>(), bytes.data(), bytes.size());
  return t;
}

torch::Tensor read_blocks(const std::string& path, int64_t rows, int64_t k, Type t) {
  const auto bytes = read_all(path);
  auto q = torch::empty({rows, k / ggml::block_elements(t), ggml::block_bytes(t)}, torch::kUInt8);
  REQUIRE(static_cast<int64_t>(bytes.size()) == q.numel());
  std::memcpy(q.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return q;
}

}  // namespace

TEST_CASE("ggml block formats equal llama.cpp gguf-py's bitwise", "[ggml_quant][gguf_py]") {
  const char* gguf_py = std::getenv("PROMPTCACHE_GGUF_PY");
  if (gguf_py == nullptr || *gguf_py == '\0') {
    WARN(
        "SKIPPED: set PROMPTCACHE_GGUF_PY to llama.cpp's gguf-py folder to cross-check the "
        "block formats against it");
    return;
  }
  test::TempDir dir("ggml-crosscheck");
  constexpr int64_t kRows = 48, kK = 1024;
  torch::manual_seed(5);
  // Normal rows, some scaled far up or down, and a zero row.
  auto x = torch::randn({kRows, kK});
  x[1].mul_(1000);
  x[2].mul_(1e-3);
  x[3].zero_();
  write_all(dir.file("x.f32"), x);
  const Type types[] = {Type::Q4_0, Type::Q5_0, Type::Q5_1, Type::Q8_0,
                        Type::Q4_K, Type::Q5_K, Type::Q6_K};
  for (Type t : types) {
    const std::string name(ggml::type_name(t));
    write_all(dir.file("ours_" + name + ".bin"), ggml::quantize(x, t));
    write_all(dir.file("random_" + name + ".bin"), test::random_blocks(kRows, kK, t));
  }
  const std::string script = test::source_dir() + "/tests/model/gguf_py_crosscheck.py";
  const char* python = std::getenv("PROMPTCACHE_PYTHON");
  const std::string interpreter = python != nullptr && *python != '\0' ? python : "python3";
  const std::string cmd = "'" + interpreter + "' '" + script + "' '" + gguf_py + "' '" +
                          dir.path().string() + "' " + std::to_string(kK) + " > '" +
                          dir.file("log.txt") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const auto log = read_all(dir.file("log.txt"));
  INFO(std::string(log.begin(), log.end()));
  REQUIRE(rc == 0);
  int quantized_by_them = 0;
  for (Type t : types) {
    const std::string name(ggml::type_name(t));
    CAPTURE(name);
    for (const char* stem : {"ours", "random"}) {
      CAPTURE(stem);
      const auto blocks =
          read_blocks(dir.file(std::string(stem) + "_" + name + ".bin"), kRows, kK, t);
      const auto theirs =
          read_floats(dir.file(std::string(stem) + "_" + name + ".deq.f32"), kRows, kK);
      const auto ours = ggml::dequantize(blocks);
      // Bitwise: the f32 bit patterns (NaN-free here) compared as integers.
      CHECK(torch::equal(ours.view(torch::kInt32), theirs.view(torch::kInt32)));
    }
    const std::string theirs_path = dir.file("theirs_" + name + ".bin");
    if (std::ifstream(theirs_path).good()) {
      ++quantized_by_them;
      const auto blocks = read_blocks(theirs_path, kRows, kK, t);
      const auto ours = ggml::dequantize(blocks);
      const auto theirs = read_floats(dir.file("theirs_" + name + ".deq.f32"), kRows, kK);
      CHECK(torch::equal(ours.view(torch::kInt32), theirs.view(torch::kInt32)));
      // Their blocks stand for x within the type's error, as ours do.
      const double rms = ((ours - x).pow(2).sum() / x.pow(2).sum()).sqrt().item<double>();
      CHECK(rms < 0.11);
    }
  }
  CHECK(quantized_by_them >= 4);  // Q4_0, Q5_0, Q5_1 and Q8_0
}
