// Hostile and broken GGUF files: each is refused with an Error naming the file and the key or
// tensor at fault (truncated files, absurd counts and lengths, unknown types, offsets out of
// range, overlapping or misaligned data, unsupported architectures and tensor types); a good
// file loads afterwards.
#include "support/catch_torch.hpp"

#include <filesystem>
#include <fstream>

#include "bad_inputs/bad_input.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_convert.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/synthetic.hpp"

using namespace promptcache;
using bad::Expect;

namespace {

// A GGUF file written byte by byte, to break one field at a time.
struct Bytes {
  std::string s;
  Bytes& u32(uint32_t v) {
    s.append(reinterpret_cast<const char*>(&v), 4);
    return *this;
  }
  Bytes& u64(uint64_t v) {
    s.append(reinterpret_cast<const char*>(&v), 8);
    return *this;
  }
  Bytes& str(const std::string& v) {
    u64(v.size());
    s += v;
    return *this;
  }
  Bytes& raw(const std::string& v) {
    s += v;
    return *this;
  }
  Bytes& pad(std::size_t to = 32) {
    s.append((to - s.size() % to) % to, '\0');
    return *this;
  }
};

Bytes header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
  Bytes b;
  b.raw("GGUF").u32(version).u64(tensors).u64(kvs);
  return b;
}

// One F32 tensor info: name, dims, type, offset.
Bytes& tensor_info(Bytes& b, const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                   uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) b.u64(d);
  return b.u32(type).u64(offset);
}

std::string write(const test::TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.file(name + ".gguf");
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

void open_file(const std::string& path) {
  gguf::File::open(path);
}

}  // namespace

TEST_CASE("bad gguf: format errors name the file and the field", "[bad_inputs][gguf]") {
  test::TempDir dir("promptcache-bad-gguf");
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<std::string> mentions;
  };
  Bytes nested = header(0, 1);
  nested.str("deep");
  for (int i = 0; i < 6; ++i) nested.u32(9).u32(9).u64(1);  // array of array of ...
  Bytes six_dims = header(1, 0);
  tensor_info(six_dims, "t", {1, 1, 1, 1, 1}, 0, 0);
  Bytes overflow = header(1, 0);
  tensor_info(overflow, "t", {1ull << 40, 1ull << 40}, 0, 0);
  Bytes q3k = header(1, 0);
  tensor_info(q3k, "blk.0.attn_q.weight", {256, 1}, 11, 0);
  Bytes misaligned = header(1, 0);
  tensor_info(misaligned, "t", {4}, 0, 8).pad().raw(std::string(64, '\0'));
  Bytes past_end = header(1, 0);
  tensor_info(past_end, "t", {64}, 0, 0).pad().raw(std::string(100, '\0'));
  Bytes overlap = header(2, 0);
  tensor_info(overlap, "a", {16}, 0, 0);
  tensor_info(overlap, "b", {16}, 0, 32).pad().raw(std::string(128, '\0'));
  Bytes blocks = header(1, 0);
  tensor_info(blocks, "t", {33, 1}, 8, 0).pad().raw(std::string(64, '\0'));
  Bytes dup = header(0, 2);
  dup.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  Bytes dup_tensor = header(2, 0);
  tensor_info(dup_tensor, "t", {8}, 0, 0);
  tensor_info(dup_tensor, "t", {8}, 0, 32).pad().raw(std::string(64, '\0'));
  const std::vector<Case> cases = {
      {"gguf: not a GGUF file", std::string("GGUX") + std::string(40, '\0'), {"GGUF", ".gguf"}},
      {"gguf: version 1", header(0, 0, 1).s, {"version 1"}},
      {"gguf: shorter than a header",
       std::string("GGUF\3\0\0\0", 8),
       {"shorter than a GGUF header"}},
      {"gguf: absurd metadata count", header(0, 1ull << 40).s, {"metadata count"}},
      {"gguf: absurd tensor count", header(1ull << 40, 0).s, {"tensor count"}},
      {"gguf: absurd key length",
       header(0, 1).u64(1ull << 62).s,
       {"over the limit", "metadata entry 0"}},
      {"gguf: string past the end",
       header(0, 1).str("k").u32(8).u64(1000).raw("abc").s,
       {"truncated", "key 'k'"}},
      {"gguf: unknown value type",
       header(0, 1).str("k").u32(13).u32(0).s,
       {"unknown value type 13", "key 'k'"}},
      {"gguf: bool neither 0 nor 1", header(0, 1).str("b").u32(7).raw("\x05").s, {"not 0 or 1"}},
      {"gguf: arrays nested too deep", nested.s, {"nested deeper", "key 'deep'"}},
      {"gguf: absurd array length",
       header(0, 1).str("a").u32(9).u32(4).u64(1ull << 50).s,
       {"cannot fit", "key 'a'"}},
      {"gguf: duplicate key", dup.s, {"duplicate key", "key 'k'"}},
      {"gguf: alignment not a power of two",
       header(0, 1).str("general.alignment").u32(4).u32(48).s,
       {"power of two"}},
      {"gguf: five dimensions", six_dims.s, {"5 dimensions", "tensor 't'"}},
      {"gguf: dimensions overflow", overflow.s, {"overflow", "tensor 't'"}},
      {"gguf: unknown tensor type", q3k.s, {"type id 11 (Q3_K)", "tensor 'blk.0.attn_q.weight'"}},
      {"gguf: misaligned offset", misaligned.s, {"not a multiple of the alignment"}},
      {"gguf: tensor past the end of the file", past_end.s, {"runs past the end", "tensor 't'"}},
      {"gguf: overlapping tensors", overlap.s, {"overlaps tensor 'a'", "tensor 'b'"}},
      {"gguf: rows of partial blocks", blocks.s, {"not whole Q8_0 blocks"}},
      {"gguf: duplicate tensor name", dup_tensor.s, {"duplicate tensor name"}},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = write(dir, "case" + std::to_string(i++), c.bytes);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(path);
    bad::expect_error(
        c.what, [&] { open_file(path); }, Expect{ErrorKind::kModel, mentions});
  }
}

TEST_CASE("bad gguf: model files the loader refuses", "[bad_inputs][gguf]") {
  test::TempDir dir("promptcache-bad-gguf-model");
  const std::string folder = dir.file("m");
  make_synthetic_model(folder, "tiny", 4);
  const std::string good = dir.file("good.gguf");
  gguf::convert_folder(folder, good, gguf::FileType::kF32);
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  // Cut in half: the last tensors' data is gone.
  const std::string truncated = write(dir, "truncated", bytes.substr(0, bytes.size() / 2));
  bad::expect_error(
      "gguf: truncated model file", [&] { LlamaModel::load(truncated); },
      Expect{ErrorKind::kModel, {truncated, "runs past the end"}});

  // The architecture renamed (same length, so the file stays well-formed).
  auto renamed = [&](const std::string& from, const std::string& to) {
    std::string b = bytes;
    const auto at = b.find(from);
    REQUIRE(at != std::string::npos);
    b.replace(at, from.size(), to);
    return b;
  };
  const std::string gemma = write(dir, "gemma",
                                  renamed(std::string("\x05\0\0\0\0\0\0\0llama", 13),
                                          std::string("\x05\0\0\0\0\0\0\0gemma", 13)));
  bad::expect_error(
      "gguf: unsupported architecture", [&] { LlamaModel::load(gemma); },
      Expect{ErrorKind::kModel, {gemma, "architecture 'gemma'", "general.architecture"}});
  const std::string odd_name =
      write(dir, "odd-name", renamed("blk.0.ffn_up.weight", "blk.0.ffn_xx.weight"));
  bad::expect_error(
      "gguf: a tensor llama.cpp's llama does not have", [&] { LlamaModel::load(odd_name); },
      Expect{ErrorKind::kModel, {odd_name, "tensor 'blk.0.ffn_xx.weight'"}});

  // A Q4_K tensor: read, but not run by this build yet.
  gguf::Writer w;
  {
    const auto f = gguf::File::open(good);
    for (const auto& [key, value] : f->metadata()) w.set(key, value);
    for (const gguf::TensorInfo& t : f->header().tensors) {
      std::string data(reinterpret_cast<const char*>(f->data(t)), t.nbytes);
      w.add_tensor(t.name, t.dims, t.type, std::move(data));
    }
    w.add_tensor("blk.0.extra.weight", {256, 2}, 12, std::string(288, '\0'));
  }
  const std::string q4k = dir.file("q4k.gguf");
  w.write(q4k);
  bad::expect_error(
      "gguf: a Q4_K tensor in a build without the K-quants", [&] { LlamaModel::load(q4k); },
      Expect{ErrorKind::kModel, {q4k, "Q4_K", "not in this build"}});

  const auto model = LlamaModel::load(good);  // the good file still loads
  CHECK(model->config().num_hidden_layers == synthetic_config("tiny").num_hidden_layers);
}
