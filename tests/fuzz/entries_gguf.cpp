// Fuzz entry "gguf": a GGUF file (gguf::File::open, then the config and the tokenizer a model
// load reads from its metadata), and its seeds. LibTorch-free: the reader, its config and the
// tokenizers are part of promptcache_core.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_config.hpp"
#include "promptcache/model/gguf_vocab.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

const detail::ScratchDir& scratch() {
  static const detail::ScratchDir dir("gguf");
  return dir;
}

}  // namespace

void gguf_entry(const std::uint8_t* data, std::size_t size) {
  const detail::ScratchFile input(scratch().file("input.gguf"), data, size);
  std::shared_ptr<gguf::File> file;
  try {
    file = gguf::File::open(input.path());
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
    return;
  }
  // What the reader promises: an aligned data section, and every tensor inside it.
  const gguf::Header& h = file->header();
  check(h.alignment > 0 && (h.alignment & (h.alignment - 1)) == 0, "alignment not a power of 2");
  check(h.data_offset % h.alignment == 0, "data section not aligned");
  unsigned sum = 0;
  for (const gguf::TensorInfo& t : h.tensors) {
    check(t.offset % h.alignment == 0, "tensor offset not aligned");
    check(h.data_offset + t.offset + t.nbytes <= size, "tensor bytes outside the file");
    check(gguf::type_info(t.type) != nullptr, "a tensor of a type the reader does not know");
    check(!t.dims.empty() && t.dims.size() <= gguf::kMaxDims, "dimension count out of range");
    if (t.nbytes > 0) sum += file->data(t)[0] + file->data(t)[t.nbytes - 1];  // touch both ends
  }
  (void)sum;
  try {
    const ModelConfig c = gguf::config_from_file(*file);
    check(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 &&
              c.head_dim > 0 && c.vocab_size > 0,
          "a size of the config is not positive");
  } catch (const Error& e) {
    detail::rejected(e);
  }
  try {
    const gguf::Vocab v = gguf::read_vocab(*file);
    const auto tok = gguf::tokenizer_from_vocab(v, input.path());
    for (TokenId id : tok->encode("Hello world, caf\xC3\xA9 <s> 42\n", true)) {
      check(id >= 0 && static_cast<std::size_t>(id) < tok->vocab_size(), "an id outside the vocab");
    }
  } catch (const Error& e) {
    detail::rejected(e);
  }
}

void write_gguf_seeds(const std::string& corpus_root) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(corpus_root) / "gguf";
  fs::create_directories(dir);
  // A two-layer llama of hidden size 32 with a SentencePiece vocabulary, and a qwen2 one with a
  // byte-level BPE vocabulary; the tensors hold zeros (the entry reads no weights).
  for (const std::string arch : {"llama", "qwen2"}) {
    gguf::Writer w;
    const std::string p = arch + ".";
    w.set("general.architecture", gguf::Value::string(arch));
    w.set(p + "context_length", gguf::Value::u32(64));
    w.set(p + "embedding_length", gguf::Value::u32(32));
    w.set(p + "block_count", gguf::Value::u32(1));
    w.set(p + "feed_forward_length", gguf::Value::u32(64));
    w.set(p + "attention.head_count", gguf::Value::u32(2));
    w.set(p + "attention.head_count_kv", gguf::Value::u32(1));
    w.set(p + "rope.freq_base", gguf::Value::f32(10000));
    w.set(p + "attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
    gguf::Vocab v;
    v.tokens = {"<unk>", "<s>", "</s>"};
    v.token_types = {2, 3, 3};
    if (arch == "llama") {
      v.model = "llama";
      for (int b = 0; b < 256; ++b) {
        char piece[8];
        std::snprintf(piece, sizeof piece, "<0x%02X>", b);
        v.tokens.push_back(piece);
        v.token_types.push_back(6);
      }
      for (const char* t : {"\xE2\x96\x81", "H", "e", "l", "o", "\xE2\x96\x81H", "ll", "He"}) {
        v.tokens.push_back(t);
        v.token_types.push_back(1);
      }
      for (std::size_t i = 0; i < v.tokens.size(); ++i) v.scores.push_back(-float(i));
      v.unk = 0;
    } else {
      v.model = "gpt2";
      v.pre = "qwen2";
      for (const char* t : {"H", "e", "l", "o", "\xC4\xA0", "w", "r", "d", "ll", "He"}) {
        v.tokens.push_back(t);
        v.token_types.push_back(1);
      }
      v.merges = {"l l", "H e"};
    }
    v.bos = 1;
    v.eos = 2;
    v.add_bos = arch == "llama";
    gguf::put_vocab(w, v);
    const int64_t vocab = static_cast<int64_t>(v.tokens.size());
    auto zeros = [](int64_t n, int64_t bytes_per) {
      return std::string(static_cast<std::size_t>(n * bytes_per), '\0');
    };
    w.add_tensor("token_embd.weight", {32, vocab}, 1, zeros(32 * vocab, 2));
    w.add_tensor("output_norm.weight", {32}, 0, zeros(32, 4));
    w.add_tensor("blk.0.attn_norm.weight", {32}, 0, zeros(32, 4));
    w.add_tensor("blk.0.attn_q.weight", {32, 32}, 8, zeros(32, 34));
    w.add_tensor("blk.0.attn_k.weight", {32, 16}, 30, zeros(32 * 16, 2));
    w.add_tensor("blk.0.ffn_down.weight", {256, 1}, 12, zeros(1, 144));
    w.write((dir / (arch + ".gguf")).string());
  }
}

}  // namespace promptcache::fuzz
