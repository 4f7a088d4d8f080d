// src/core/bpe_tokenizer.cpp — HuggingFace tokenizer.json reader and BPE encoder: byte-level BPE
// (Qwen2.5/Qwen3, Llama 3.x, GPT-2 style) and SentencePiece-style BPE written as tokenizer.json
// (Metaspace, byte fallback: Llama 2, Mistral).
//
// This unit puts the stages of bpe_pipeline.hpp together behind the Tokenizer interface and
// opens the file. Encoding follows the JS reference (transformers.js, as shipped by
// @lenml/tokenizers) step by step, and the test suite checks it id for id against that code on
// thousands of strings:
//   1. invalid UTF-8 becomes U+FFFD exactly as TextDecoder does (JS sees only such strings);
//   2. added tokens are cut out of the raw text first, longest match at the leftmost position
//      (bpe_added_tokens.cpp);
//   3. each text section between them is normalized (NFC, Replace, Prepend, ...), pre-tokenized
//      (Split regex, ByteLevel, Metaspace, Punctuation, Digits: bpe_pre_tokenize.cpp) and each
//      pre-token BPE-encoded:
//      adjacent pairs merged lowest rank first (leftmost on ties) through a priority queue,
//      repeated pre-tokens served from a bounded cache (bpe_model.cpp).
// Decoding runs the file's decoder chain (bpe_decode.cpp).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bpe_pipeline.hpp"
#include "byte_level.hpp"
#include "tokenizer_config.hpp"

namespace promptcache {
namespace {

using bpe::json;
using bpe::JsonReader;

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const json& root, const JsonReader& in) {
    if (!root.is_object()) in.fail("", "expected a JSON object at the top level");
    model_.read(in.require(root, "model", "model"), in);
    set_pieces_size(model_.max_id() + 1);
    for (const auto& [piece, id] : model_.model_vocab()) pieces_[id] = piece;
    added_.read(root, in, model_.model_vocab().size());
    for (const auto& a : added_.list()) {
      if (a.id >= static_cast<TokenId>(pieces_.size())) set_pieces_size(a.id + 1);
      pieces_[a.id] = a.content;
      is_added_[a.id] = 1;
      is_special_[a.id] = a.special ? 1 : 0;
      model_.add_token(a.content, a.id);
    }
    if (const json* n = in.find(root, "normalizer")) {
      bpe::read_normalizer(*n, "normalizer", in, pipeline_);
    }
    if (const json* p = in.find(root, "pre_tokenizer")) {
      bpe::read_pre_tokenizer(*p, "pre_tokenizer", in, pipeline_);
    }
    if (const json* d = in.find(root, "decoder")) bpe::read_decoder(*d, "decoder", in, pipeline_);
    const auto& pre = pipeline_.pre;
    if (std::count_if(pre.begin(), pre.end(), [](const bpe::PreTokenizer& p) {
          return p.kind == bpe::PreTokenizer::kByteLevel;
        }) > 1) {
      in.fail("pre_tokenizer", "more than one ByteLevel pre-tokenizer in the sequence");
    }
    // A ByteLevel step before others (Falcon) hands them byte characters; a last one hands raw
    // bytes, which the model maps itself (faster than looking characters up one by one). When
    // only cutting steps (Split, Punctuation, Digits) follow it, every pre-token is still a run of
    // whole byte characters, so it is mapped back to its bytes for the same fast path, with the
    // same lookups (the added tokens included, as for characters). Anything else after it
    // (Metaspace may add a character that stands for no byte) keeps the character path.
    const auto byte_level = std::find_if(pre.begin(), pre.end(), [](const bpe::PreTokenizer& p) {
      return p.kind == bpe::PreTokenizer::kByteLevel;
    });
    const bool last = byte_level != pre.end() && byte_level + 1 == pre.end();
    decode_byte_chars_ = byte_level != pre.end() && !last &&
                         std::all_of(byte_level + 1, pre.end(), [](const bpe::PreTokenizer& p) {
                           return p.kind == bpe::PreTokenizer::kSplit ||
                                  p.kind == bpe::PreTokenizer::kPunctuation ||
                                  p.kind == bpe::PreTokenizer::kDigits;
                         });
    model_.set_byte_level(last || decode_byte_chars_, decode_byte_chars_);
    special_ = bpe::guess_special_ids(root, in, added_, model_.unk());
  }

  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos && special_.bos >= 0) out.push_back(special_.bos);
    const std::string valid = unicode::to_valid_utf8(text);
    const auto sections = added_.split(valid);
    for (std::size_t i = 0; i < sections.size(); ++i) {
      if (sections[i].added) {
        out.push_back(sections[i].added->id);
      } else if (!sections[i].text.empty()) {
        encode_section(sections[i].text, i == 0, out);
      }
    }
    return out;
  }

  std::string decode(const std::vector<TokenId>& ids) const override {
    std::vector<std::string> tokens;
    std::vector<char> added;
    tokens.reserve(ids.size());
    for (TokenId id : ids) {
      if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) continue;
      tokens.push_back(pieces_[id]);
      added.push_back(is_added_[id]);
    }
    if (pipeline_.decoders.empty()) {
      // HuggingFace's default without a decoder.
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return unicode::to_valid_utf8(out);
    }
    bpe::run_decoders(pipeline_.decoders, tokens, added, /*mid_text=*/false);
    std::string out;
    for (const auto& t : tokens) out += t;
    return unicode::to_valid_utf8(out);
  }

  std::string decode_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    if (is_added_[id]) return is_special_[id] ? "" : pieces_[id];
    std::vector<std::string> tokens = {pieces_[id]};
    std::vector<char> added = {0};
    bpe::run_decoders(pipeline_.decoders, tokens, added, /*mid_text=*/true);
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  TokenId bos_id() const override { return special_.bos; }
  TokenId eos_id() const override { return special_.eos; }
  TokenId unk_id() const override { return special_.unk; }
  TokenId pad_id() const override { return special_.pad; }
  std::size_t vocab_size() const override { return pieces_.size(); }
  TokenId piece_to_id(std::string_view piece) const override {
    const auto& vocab = model_.vocab();
    auto it = vocab.find(std::string(piece));
    return it == vocab.end() ? -1 : it->second;
  }
  std::string id_to_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    return pieces_[id];
  }
  bool prefixes_space() const override { return pipeline_.prefixes_space; }
  bool adds_bos() const override { return special_.adds_bos; }
  std::vector<TokenId> end_of_turn_ids() const override { return special_.end_of_turn; }
  std::string kind() const override { return "bpe"; }

  void apply_folder_config(const detail::FolderTokenConfig& config) {
    special_ = detail::resolve_special_ids(
        config, special_, [this](const std::string& s) { return piece_to_id(s); }, {},
        pieces_.size());
  }

 private:
  void set_pieces_size(TokenId n) {
    pieces_.resize(n);
    is_added_.resize(n, 0);
    is_special_.resize(n, 0);
  }

  void encode_section(std::string_view text, bool first_section, std::vector<TokenId>& out) const {
    const std::string normalized = bpe::normalize(pipeline_.normalizers, text);
    if (normalized.empty()) return;
    if (!decode_byte_chars_) {
      bpe::pre_tokenize(pipeline_.pre, 0, normalized, first_section,
                        [&](std::string_view piece, bool) { model_.encode_word(piece, out); });
      return;
    }
    std::string bytes;
    bpe::pre_tokenize(pipeline_.pre, 0, normalized, first_section,
                      [&](std::string_view piece, bool) {
                        bytes.clear();
                        // Cutting steps keep whole characters, all of them byte characters.
                        if (!byte_level::decode(piece, bytes)) {
                          throw Error(ErrorKind::kTokenizer,
                                      "internal error: a pre-token after ByteLevel has a "
                                      "character that stands for no byte");
                        }
                        model_.encode_word(bytes, out);
                      });
  }

  bpe::BpeModel model_;
  bpe::AddedTokens added_;
  bpe::Pipeline pipeline_;
  std::vector<std::string> pieces_;  // id -> stored form ("" for holes)
  std::vector<char> is_added_, is_special_;
  detail::SpecialIds special_;
  bool decode_byte_chars_ = false;  // pre-tokens come as byte characters; the model takes bytes
};

// Line and column of a byte offset, for JSON syntax errors.
std::pair<std::size_t, std::size_t> line_column(const std::string& text, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(tokenizer_json_path, ec)) {
    throw Error(ErrorKind::kIo, fs::exists(tokenizer_json_path, ec) ? "not a file" : "no such file",
                {tokenizer_json_path});
  }
  std::ifstream in(tokenizer_json_path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open tokenizer.json", {tokenizer_json_path});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string text = bytes.str();
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    const auto [line, column] = line_column(text, e.byte > 0 ? e.byte - 1 : 0);
    throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(),
                {tokenizer_json_path, line, column});
  } catch (const json::exception& e) {
    // Not only parse_error: a number too large for a double ("1e400") is out_of_range (found
    // by fuzzing; it escaped as a non-promptcache exception).
    throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(),
                {tokenizer_json_path});
  }
  auto tokenizer = std::make_unique<BpeTokenizer>(root, JsonReader(tokenizer_json_path));
  const fs::path folder = fs::path(tokenizer_json_path).parent_path();
  tokenizer->apply_folder_config(
      detail::read_folder_token_config(folder.empty() ? fs::path(".") : folder));
  return tokenizer;
}

std::unique_ptr<Tokenizer> detail::load_bpe_tokenizer_from_json(const std::string& text,
                                                                const std::string& origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(), {origin});
  }
  return std::make_unique<BpeTokenizer>(root, JsonReader(origin));
}

}  // namespace promptcache
