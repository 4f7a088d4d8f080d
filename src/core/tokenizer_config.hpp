// src/core/tokenizer_config.hpp — BOS/EOS/end-of-turn ids from a model folder's
// tokenizer_config.json and generation_config.json (private to promptcache_core).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"

namespace promptcache::detail {

// What the two files say. A token field is absent (nullopt), null (an empty optional inside) or a
// token string ("<s>" or {"content": "<s>", ...}).
struct FolderTokenConfig {
  std::optional<std::optional<std::string>> bos_token, eos_token, pad_token, unk_token;
  std::optional<bool> add_bos_token;
  std::optional<TokenId> generation_bos_id;
  std::vector<TokenId> generation_eos_ids;  // eos_token_id: an int or a list
  std::string generation_config_file;       // its path, when the folder has one (for errors)
};

// Reads `folder`/tokenizer_config.json and `folder`/generation_config.json where they exist.
// Error(kTokenizer) naming the file and field when one is malformed.
FolderTokenConfig read_folder_token_config(const std::filesystem::path& folder);

struct SpecialIds {
  TokenId bos = -1, eos = -1, pad = -1, unk = -1;
  bool adds_bos = false;
  std::vector<TokenId> end_of_turn;  // eos first, no duplicates
};

// The tokenizer's own ids (`guess`) overridden by what the folder's files say. `lookup` gives the
// id of a token string (-1 when unknown); `end_of_turn_names` are added to end_of_turn where
// lookup finds them. adds_bos: add_bos_token when given, else guess.adds_bos, and never without
// a BOS id. Error(kTokenizer) naming generation_config.json when an id it gives is not below
// vocab_size.
SpecialIds resolve_special_ids(const FolderTokenConfig& config, SpecialIds guess,
                               const std::function<TokenId(const std::string&)>& lookup,
                               const std::vector<std::string>& end_of_turn_names,
                               std::size_t vocab_size);

// load_bpe_tokenizer for a tokenizer.json document in memory, without a folder's config files
// (a GGUF file's "gpt2" vocabulary, gguf_vocab.hpp); `origin` names it in errors.
std::unique_ptr<Tokenizer> load_bpe_tokenizer_from_json(const std::string& text,
                                                        const std::string& origin);

// Chat-format tokens that end a turn: ChatML (Qwen), Llama 3's two, and GPT-style end of text.
const std::vector<std::string>& end_of_turn_token_names();

// A tokenizer whose BOS/EOS/end-of-turn ids come from elsewhere: a SentencePiece model's folder's
// config files (a chat fine-tune may end its turns with a token the tokenizer.model calls
// ordinary), or a GGUF file's metadata.
class ConfiguredTokenizer final : public Tokenizer {
 public:
  ConfiguredTokenizer(std::unique_ptr<Tokenizer> inner, detail::SpecialIds ids)
      : inner_(std::move(inner)), ids_(std::move(ids)) {}

  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out = inner_->encode(text, false);
    if (add_bos && ids_.bos >= 0) out.insert(out.begin(), ids_.bos);
    return out;
  }
  std::string decode(const std::vector<TokenId>& ids) const override { return inner_->decode(ids); }
  std::string decode_piece(TokenId id) const override { return inner_->decode_piece(id); }
  TokenId bos_id() const override { return ids_.bos; }
  TokenId eos_id() const override { return ids_.eos; }
  TokenId unk_id() const override { return ids_.unk; }
  TokenId pad_id() const override { return ids_.pad; }
  std::size_t vocab_size() const override { return inner_->vocab_size(); }
  TokenId piece_to_id(std::string_view piece) const override { return inner_->piece_to_id(piece); }
  std::string id_to_piece(TokenId id) const override { return inner_->id_to_piece(id); }
  bool prefixes_space() const override { return inner_->prefixes_space(); }
  bool adds_bos() const override { return ids_.adds_bos; }
  std::vector<TokenId> end_of_turn_ids() const override { return ids_.end_of_turn; }
  std::string kind() const override { return inner_->kind(); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  detail::SpecialIds ids_;
};

}  // namespace promptcache::detail
