// promptcache/model/gguf_vocab.hpp — a GGUF file's tokenizer (the tokenizer.ggml.* metadata with
// llama.cpp's key names): read into a Tokenizer, made from a model folder, written by
// `promptcache convert`. LibTorch-free (promptcache_core).
//
// tokenizer.ggml.model "llama" is a SentencePiece BPE vocabulary (tokens, scores, token types:
// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), run by the project's
// SentencePiece encoder; "gpt2" is a byte-level BPE vocabulary (tokens, merges,
// tokenizer.ggml.pre naming the pre-tokenizer), run by the project's tokenizer.json encoder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "promptcache/model/gguf.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::gguf {

struct Vocab {
  std::string model;  // "llama" or "gpt2"
  std::string pre;    // gpt2: llama.cpp's pre-tokenizer name ("qwen2", "llama-bpe", "gpt2", ...)
  std::vector<std::string> tokens;
  std::vector<float> scores;         // llama: one per token
  std::vector<int32_t> token_types;  // one per token (empty: all normal)
  std::vector<std::string> merges;   // gpt2: "left right", highest priority first
  int64_t bos = -1, eos = -1, unk = -1, pad = -1;
  std::optional<bool> add_bos, add_eos;
  // llama: SentencePiece's normalizer switches (llama.cpp: add_space_prefix,
  // remove_extra_whitespaces); absent means true and false, llama.cpp's defaults.
  std::optional<bool> add_space_prefix, remove_extra_whitespaces;
  std::string chat_template;  // tokenizer.chat_template (Jinja), empty when absent
};

// Reads and checks the tokenizer.ggml.* keys: Error(kModel) naming the file and key when one is
// missing, of another type, of another length than the token list, or an id out of range;
// Error(kTokenizer) for a tokenizer.ggml.model or pre this build does not run.
Vocab read_vocab(const File& file);
// Adds the vocabulary's keys to a file being written.
void put_vocab(Writer& writer, const Vocab& vocab);
// The vocabulary of a model folder (tokenizer.model: "llama"; tokenizer.json with a byte-level
// BPE model: "gpt2"), with BOS/EOS/add_bos as load_tokenizer resolves them for the folder and the
// chat template of its tokenizer_config.json.
Vocab vocab_from_folder(const std::string& dir);
// The tokenizer a vocabulary describes; `origin` names it in errors.
std::unique_ptr<Tokenizer> tokenizer_from_vocab(const Vocab& vocab, const std::string& origin);
// load_tokenizer() for a *.gguf file.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);

}  // namespace promptcache::gguf
