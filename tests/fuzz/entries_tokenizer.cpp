// Fuzz entries "tokenizer_json" (load_bpe_tokenizer) and "sentencepiece" (the library's own
// tokenizer.model reader), both through the Tokenizer interface; promptcache_core only.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

// Texts every loaded tokenizer encodes: edge white space, Unicode, invalid UTF-8, the special
// pieces of the chat templates.
const std::vector<std::string>& fixed_texts() {
  static const std::vector<std::string> texts = {
      "",
      " ",
      "Hello world",
      "  two  spaces\n\nnew line\t tab ",
      "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82",
      "\xFF\xFE invalid \xC3 \xE2\x82 \xED\xA0\x80 end\xF0",
      "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nq [/INST] a </s>",
      "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>",
      "don't we'll I'M 12345 67.8",
      std::string("nul\0inside", 10),
  };
  return texts;
}

// Encodes and decodes; every id encode() gives must be a vocabulary id (the model's embedding
// is indexed with them), and the special ids must be -1 or vocabulary ids.
void exercise(const Tokenizer& tok, const std::vector<std::string>& texts) {
  const auto vocab = static_cast<long long>(tok.vocab_size());
  auto valid = [&](TokenId id) { return id >= 0 && id < vocab; };
  for (TokenId id : {tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()}) {
    check(id == -1 || valid(id), "a special id outside the vocabulary");
  }
  for (TokenId id : tok.end_of_turn_ids()) check(valid(id), "an end-of-turn id outside the vocab");
  for (const std::string& text : texts) {
    for (bool bos : {false, true}) {
      const std::vector<TokenId> ids = tok.encode(text, bos);
      for (TokenId id : ids) check(valid(id), "encode() gave an id outside the vocabulary");
      (void)tok.decode(ids);
    }
  }
  // Decoding any ids (out-of-range ones included) is safe.
  std::vector<TokenId> ids;
  const TokenId last = static_cast<TokenId>(std::min<long long>(vocab, 600));
  for (TokenId id = -2; id <= last + 1; ++id) {
    ids.push_back(id);
    (void)tok.decode_piece(id);
    const std::string piece = tok.id_to_piece(id);
    (void)tok.piece_to_id(piece);
  }
  (void)tok.decode(ids);
  std::reverse(ids.begin(), ids.end());
  (void)tok.decode(ids);
  (void)tok.prefixes_space();
  (void)tok.adds_bos();
  (void)tok.kind();
}

// The model's first pieces run together, so that encode() has merges to make.
std::string pieces_text(const Tokenizer& tok) {
  std::string out;
  const auto n = static_cast<TokenId>(std::min<std::size_t>(tok.vocab_size(), 400));
  for (TokenId id = 0; id < n; ++id) out += tok.id_to_piece(id) + (id % 7 == 6 ? " " : "");
  return out;
}

const detail::ScratchDir& scratch() {
  static const detail::ScratchDir dir("tokenizer");
  return dir;
}

}  // namespace

void tokenizer_json_entry(const std::uint8_t* data, std::size_t size) {
  // tokenizer.json cannot hold a raw NUL, so NULs separate up to three more parts:
  // tokenizer.json \0 text to encode \0 tokenizer_config.json \0 generation_config.json.
  std::vector<std::string> parts(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0 && parts.size() < 4) {
      parts.emplace_back();
    } else {
      parts.back() += static_cast<char>(data[i]);
    }
  }
  std::vector<std::string> texts = fixed_texts();
  if (parts.size() > 1) texts.push_back(parts[1]);
  // load_bpe_tokenizer reads a file, and the two config files beside it when they are there.
  const detail::ScratchFile json(scratch().file("tokenizer.json"), parts[0].data(),
                                 parts[0].size());
  std::vector<std::unique_ptr<detail::ScratchFile>> configs;
  const char* const names[] = {"tokenizer_config.json", "generation_config.json"};
  for (std::size_t k = 0; k + 2 < parts.size(); ++k) {
    configs.push_back(std::make_unique<detail::ScratchFile>(
        scratch().file(names[k]), parts[k + 2].data(), parts[k + 2].size()));
  }
  try {
    const std::unique_ptr<Tokenizer> tok = load_bpe_tokenizer(json.path());
    texts.push_back(pieces_text(*tok));
    exercise(*tok, texts);
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

void sentencepiece_entry(const std::uint8_t* data, std::size_t size) {
  try {
    const std::unique_ptr<Tokenizer> tok = load_sentencepiece_tokenizer_from_bytes(
        std::string(reinterpret_cast<const char*>(data), size), "<fuzz>");
    std::vector<std::string> texts = fixed_texts();
    texts.push_back(pieces_text(*tok));
    exercise(*tok, texts);
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

void write_tokenizer_seeds(const std::string& corpus_root) {
  namespace fs = std::filesystem;
  const fs::path bpe = fs::path(corpus_root) / "tokenizer_json";
  const fs::path spm = fs::path(corpus_root) / "sentencepiece";
  fs::create_directories(bpe);
  fs::create_directories(spm);
  const std::string corpus = builtin_corpus();
  // Byte-level BPE as `promptcache make-model` trains it (Qwen-style special tokens), small
  // enough for a seed: 256 byte tokens and a few merges.
  train_bpe_tokenizer(corpus.substr(0, 1500), 300, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                      (bpe / "trained-bytelevel.json").string());
  // SentencePiece BPE with byte fallback, like Llama 2's (needs Debian's spm_train).
  try {
    train_sentencepiece_tokenizer(corpus, 400, (spm / "trained-400.model").string());
    train_sentencepiece_tokenizer(corpus.substr(0, 1200), 330,
                                  (spm / "trained-330.model").string());
  } catch (const Error& e) {
    throw Error(e.kind(), std::string("SentencePiece seeds: ") + e.what());
  }
}

}  // namespace promptcache::fuzz
