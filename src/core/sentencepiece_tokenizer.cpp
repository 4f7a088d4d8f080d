// SentencePiece implementation of the Tokenizer interface, plus a small trainer for tests and
// synthetic models.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <fstream>
#include <sstream>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> sp)
      : sp_(std::move(sp)) {}

  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<int> ids;
    const auto status = sp_->Encode(std::string(text), &ids);
    if (!status.ok()) throw Error(ErrorKind::kTokenizer, "encode failed: " + status.ToString());
    std::vector<TokenId> out;
    out.reserve(ids.size() + 1);
    if (add_bos && sp_->bos_id() >= 0) out.push_back(sp_->bos_id());
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }

  std::string decode(const std::vector<TokenId>& ids) const override {
    std::vector<int> valid;
    valid.reserve(ids.size());
    const int n = sp_->GetPieceSize();
    for (TokenId id : ids) {
      if (id >= 0 && id < n) valid.push_back(id);  // ids past the vocab (padded models) vanish
    }
    std::string text;
    const auto status = sp_->Decode(valid, &text);
    if (!status.ok()) throw Error(ErrorKind::kTokenizer, "decode failed: " + status.ToString());
    return text;
  }

  std::string decode_piece(TokenId id) const override {
    if (id < 0 || id >= sp_->GetPieceSize() || sp_->IsControl(id)) return "";
    const std::string& piece = sp_->IdToPiece(id);
    if (sp_->IsByte(id)) {
      // "<0x41>" -> the raw byte; a multi-byte character is completed by the following ids.
      return std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    }
    static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space marker
    std::string out;
    for (std::size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpace.size(), kSpace) == 0) {
        out += ' ';
        i += kSpace.size();
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

  TokenId bos_id() const override { return sp_->bos_id(); }
  TokenId eos_id() const override { return sp_->eos_id(); }
  TokenId unk_id() const override { return sp_->unk_id(); }
  TokenId pad_id() const override { return sp_->pad_id(); }
  std::size_t vocab_size() const override { return static_cast<std::size_t>(sp_->GetPieceSize()); }
  TokenId piece_to_id(std::string_view piece) const override {
    const int id = sp_->PieceToId(std::string(piece));
    // PieceToId answers unk for unknown pieces; only the literal unk piece may map to it.
    if (id == sp_->unk_id() && sp_->IdToPiece(id) != piece) return -1;
    return id;
  }
  std::string id_to_piece(TokenId id) const override {
    if (id < 0 || id >= sp_->GetPieceSize()) return "";
    return sp_->IdToPiece(id);
  }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::string& text) : in_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    do {
      done_ = !std::getline(in_, line_);
    } while (!done_ && line_.empty());
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::istringstream in_;
  std::string line_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer_from_bytes(const std::string& bytes,
                                                                   const std::string& origin) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    throw Error(ErrorKind::kTokenizer, "not a valid SentencePiece model: " + status.ToString(),
                {origin});
  }
  return std::make_unique<SentencePieceTokenizer>(std::move(sp));
}

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_path) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open tokenizer model", {model_path});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return load_sentencepiece_tokenizer_from_bytes(bytes.str(), model_path);
}

void train_sentencepiece_tokenizer(const std::string& corpus_text, int vocab_size,
                                   const std::string& out_model_path) {
  LineIterator lines(corpus_text);
  std::string serialized;
  const std::string args = "--model_type=bpe --vocab_size=" + std::to_string(vocab_size) +
                           " --byte_fallback=true --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1"
                           " --character_coverage=1.0 --split_digits=true --minloglevel=2"
                           " --hard_vocab_limit=false --num_threads=1";
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &serialized);
  if (!status.ok()) {
    throw Error(ErrorKind::kTokenizer, "training failed: " + status.ToString(), {out_model_path});
  }
  std::ofstream out(out_model_path, std::ios::binary);
  out.write(serialized.data(), static_cast<std::streamsize>(serialized.size()));
  if (!out) throw Error(ErrorKind::kIo, "cannot write tokenizer model", {out_model_path});
}

}  // namespace promptcache
