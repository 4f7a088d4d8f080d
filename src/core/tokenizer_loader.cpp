// load_tokenizer: the tokenizer of a model folder (tokenizer.json first, else tokenizer.model) or
// of one file, with BOS/EOS/end-of-turn ids from the folder's tokenizer_config.json and
// generation_config.json.
#include <filesystem>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "tokenizer_config.hpp"

namespace promptcache {
namespace {

// A SentencePiece tokenizer whose BOS/EOS/end-of-turn ids come from the folder's config files
// (a chat fine-tune may end its turns with a token the tokenizer.model calls ordinary).
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

std::unique_ptr<Tokenizer> load_sentencepiece_with_config(const std::filesystem::path& model) {
  auto inner = load_sentencepiece_tokenizer(model.string());
  const std::filesystem::path folder =
      model.has_parent_path() ? model.parent_path() : std::filesystem::path(".");
  const auto config = detail::read_folder_token_config(folder);
  detail::SpecialIds guess;
  guess.bos = inner->bos_id();
  guess.eos = inner->eos_id();
  guess.pad = inner->pad_id();
  guess.unk = inner->unk_id();
  guess.adds_bos = inner->adds_bos();
  const Tokenizer& t = *inner;
  auto ids = detail::resolve_special_ids(
      config, guess, [&t](const std::string& piece) { return t.piece_to_id(piece); },
      detail::end_of_turn_token_names(), t.vocab_size());
  return std::make_unique<ConfiguredTokenizer>(std::move(inner), std::move(ids));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& folder_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path(folder_or_file);
  if (fs::is_directory(path, ec)) {
    // tokenizer.json describes the whole HuggingFace pipeline, so it wins over tokenizer.model.
    if (fs::is_regular_file(path / "tokenizer.json", ec)) {
      return load_bpe_tokenizer((path / "tokenizer.json").string());
    }
    if (fs::is_regular_file(path / "tokenizer.model", ec)) {
      return load_sentencepiece_with_config(path / "tokenizer.model");
    }
    throw Error(ErrorKind::kIo,
                "the folder has neither tokenizer.json (byte-level BPE) nor tokenizer.model "
                "(SentencePiece)",
                {folder_or_file});
  }
  if (!fs::exists(path, ec))
    throw Error(ErrorKind::kIo, "no such file or folder", {folder_or_file});
  if (ends_with(path.filename().string(), ".json")) return load_bpe_tokenizer(folder_or_file);
  return load_sentencepiece_with_config(path);
}

}  // namespace promptcache
