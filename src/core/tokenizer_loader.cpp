// load_tokenizer: the tokenizer of a model folder (tokenizer.json first, else tokenizer.model) or
// of one file (a GGUF file: its metadata, gguf_vocab.hpp), with BOS/EOS/end-of-turn ids from the
// folder's tokenizer_config.json and
// generation_config.json.
#include <filesystem>

#include "promptcache/error.hpp"
#include "promptcache/model/gguf_vocab.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "tokenizer_config.hpp"

namespace promptcache {
namespace {

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
  return std::make_unique<detail::ConfiguredTokenizer>(std::move(inner), std::move(ids));
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
  if (gguf::is_gguf_file(folder_or_file)) return gguf::load_gguf_tokenizer(folder_or_file);
  if (ends_with(path.filename().string(), ".json")) return load_bpe_tokenizer(folder_or_file);
  return load_sentencepiece_with_config(path);
}

}  // namespace promptcache
