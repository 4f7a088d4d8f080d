// promptcache/model/tokenizer.hpp — the tokenizer interface (no LibTorch).
//
// PML layout and the engine only see this interface. Two implementations: SentencePiece
// (tokenizer.model: Llama 2, TinyLlama, Mistral) and byte-level BPE (HuggingFace tokenizer.json:
// Qwen2.5/Qwen3, Llama 3.x, ...). load_tokenizer() picks one from what a model folder holds.
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

  // Whether encode() reads the start of a text as following a space, as SentencePiece's
  // add_dummy_prefix does ("Hi" and " Hi" give the same ids). Byte-level BPE does not: there a
  // leading space is a byte of the first token. The PML span rule (pml/source.hpp, encode_span)
  // depends on it.
  virtual bool prefixes_space() const { return true; }
  // Whether the model's own tokenizer puts BOS before a prompt (Llama 2/3: yes; Qwen: no, it has
  // no BOS). Read from tokenizer_config.json (add_bos_token) where the folder has one.
  virtual bool adds_bos() const { return bos_id() >= 0; }
  // Ids that end a turn, eos_id() first when there is one (e.g. <|im_end|>, <|eot_id|>,
  // <|endoftext|>), from tokenizer_config.json, generation_config.json (eos_token_id) and the
  // special tokens; generation stops at any of them.
  virtual std::vector<TokenId> end_of_turn_ids() const {
    return eos_id() >= 0 ? std::vector<TokenId>{eos_id()} : std::vector<TokenId>{};
  }
  // "sentencepiece" or "bpe", for messages and --json output.
  virtual std::string kind() const { return "sentencepiece"; }
};

// The tokenizer of a model folder or file: a folder's tokenizer.json (byte-level BPE) when it has
// one, else its tokenizer.model (SentencePiece), with BOS/EOS and end-of-turn ids from the
// folder's tokenizer_config.json and generation_config.json when present. A file path is read by
// its name: *.json as BPE, anything else as SentencePiece. Error(kTokenizer/kIo/kModel) naming the
// folder or file and what is missing or wrong.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& folder_or_file);

// Loads a HuggingFace tokenizer.json whose model is BPE: byte-level (Qwen2.5/Qwen3, Llama 3.x) or
// SentencePiece-style with Metaspace and byte fallback (Llama 2, Mistral). Reads vocab, merges in
// either the "a b" or the ["a", "b"] form, added/special tokens (matched in the raw text, longest
// first), the normalizers (NFC, Replace, Prepend, ...), the pre-tokenizers (Split regex, ByteLevel,
// Metaspace) and the decoders. encode() gives the ids the JS reference tokenizers
// (transformers.js) give, invalid UTF-8 included (each invalid sequence read as U+FFFD, as
// TextDecoder does); decode() renders every token, special ones included. BOS/EOS/end-of-turn ids
// come from tokenizer_config.json and generation_config.json beside the file when present, else
// from the special tokens (<|begin_of_text|> or <s> is BOS). Error(kIo) for a missing file,
// Error(kTokenizer) naming the file and the JSON field for anything malformed or unsupported.
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json_path);

// The tokenizer.json pipeline train_bpe_tokenizer writes and trains under: Qwen2's (NFC, the
// Qwen2 split regex; also what Llama 3 and the trained test tokenizers use), BLOOM's (its split
// regex, no normalizer), GPT-NeoX's (MPT's: NFC, GPT-2's ByteLevel regex, runs of 2-24 spaces as
// plain added tokens) or Falcon's (Punctuation, ByteLevel, Digits, groups of three digits).
enum class BpeFamily { kQwen2, kBloom, kGptNeox, kFalcon };
// "qwen2", "bloom", "gpt-neox" (or "mpt"), "falcon"; Error(kInvalidArgument) otherwise.
BpeFamily bpe_family_from_name(const std::string& name);

// Trains a small byte-level BPE tokenizer on `corpus_text` (GPT-2 byte mapping, the family's
// normalizer and pre-tokenizer, `special_tokens` as added special tokens after the learned vocab)
// and writes a HuggingFace tokenizer.json that load_bpe_tokenizer (and HF tokenizers) read, with
// the family's pipeline sections. Used by tests and `promptcache make-model` for the BPE
// families. vocab_size counts the 256 byte tokens, the learned merges and the special tokens;
// learning stops early when no pair occurs twice. Deterministic: the same corpus gives the same
// file. Error(kInvalidArgument) when vocab_size leaves no room for the merges, Error(kIo) when
// the file cannot be written.
void train_bpe_tokenizer(const std::string& corpus_text, int vocab_size,
                         const std::vector<std::string>& special_tokens,
                         const std::string& out_json_path, BpeFamily family = BpeFamily::kQwen2);

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
