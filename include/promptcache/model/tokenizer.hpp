// promptcache/model/tokenizer.hpp — the tokenizer interface (no LibTorch).
//
// PML layout and the engine only see this interface; SentencePieceTokenizer implements it for
// HuggingFace checkpoints that ship a tokenizer.model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache {

using TokenId = std::int32_t;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Encodes text into ids. SentencePiece-style tokenizers prepend their dummy-prefix space ("▁")
  // to the first word exactly as they do for a whole prompt; add_bos prepends the BOS id.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_bos = false) const = 0;
  virtual std::string decode(const std::vector<TokenId>& ids) const = 0;
  // The text of one id in the middle of a text ("▁" becomes a space, byte pieces become their
  // byte, control ids become nothing) — used when streaming tokens one by one.
  virtual std::string decode_piece(TokenId id) const = 0;

  virtual TokenId bos_id() const = 0;
  virtual TokenId eos_id() const = 0;
  virtual TokenId unk_id() const = 0;
  virtual TokenId pad_id() const = 0;  // -1 when the tokenizer has none
  virtual std::size_t vocab_size() const = 0;
  // The id of an exact piece (e.g. "<s>", "▁Once"), or -1 if the vocabulary has no such piece.
  virtual TokenId piece_to_id(std::string_view piece) const = 0;
  virtual std::string id_to_piece(TokenId id) const = 0;
};

// Loads a SentencePiece model file (tokenizer.model). Throws Error(kTokenizer) naming the file.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path);
// Loads a SentencePiece model from its serialized bytes.
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer_from_bytes(const std::string& bytes,
                                                                   const std::string& origin);

// Trains a small BPE SentencePiece model (byte fallback, <unk>=0 <s>=1 </s>=2, like Llama's) on
// the given text and writes it to out_model_path. Used by tests and `promptcache make-model`.
void train_sentencepiece_tokenizer(const std::string& corpus_text, int vocab_size,
                                   const std::string& out_model_path);

}  // namespace promptcache
