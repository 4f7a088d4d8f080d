// HuggingFace tokenizer.json reader and BPE encoder: byte-level BPE (Qwen2.5/Qwen3, Llama 3.x,
// GPT-2 style) and SentencePiece-style BPE written as tokenizer.json (Metaspace, byte fallback:
// Llama 2, Mistral).
//
// Encoding follows the JS reference (transformers.js, as shipped by @lenml/tokenizers) step by
// step, and the test suite checks it id for id against that code on thousands of strings:
//   1. invalid UTF-8 becomes U+FFFD exactly as TextDecoder does (JS sees only such strings);
//   2. added tokens are cut out of the raw text first, longest match at the leftmost position;
//   3. each text section between them is normalized (NFC, Replace, Prepend, ...), pre-tokenized
//      (Split regex, ByteLevel, Metaspace) and each pre-token BPE-encoded: adjacent pairs merged
//      lowest rank first (leftmost on ties) through a priority queue, repeated pre-tokens served
//      from a bounded cache.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "byte_level.hpp"
#include "js_regex.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "tokenizer_config.hpp"
#include "unicode_text.hpp"

namespace promptcache {
namespace {

using json = nlohmann::json;

// --- reading tokenizer.json with errors that name the file and the field ------------------------

class JsonReader {
 public:
  explicit JsonReader(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    throw Error(ErrorKind::kTokenizer, message, {file_, 0, 0, field});
  }
  // obj[key] when present and not null.
  const json* find(const json& obj, const char* key) const {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& require(const json& obj, const char* key, const std::string& field) const {
    const json* j = find(obj, key);
    if (!j) fail(field, std::string("missing field \"") + key + "\"");
    return *j;
  }
  std::string string(const json& j, const std::string& field) const {
    if (!j.is_string()) fail(field, "expected a string, got " + std::string(j.type_name()));
    return j.get<std::string>();
  }
  std::string string_or(const json& obj, const char* key, const std::string& field,
                        const std::string& fallback) const {
    const json* j = find(obj, key);
    return j ? string(*j, field) : fallback;
  }
  bool flag(const json& obj, const char* key, const std::string& field, bool fallback) const {
    const json* j = find(obj, key);
    if (!j) return fallback;
    if (!j->is_boolean()) fail(field, "expected true or false, got " + std::string(j->type_name()));
    return j->get<bool>();
  }
  long long integer(const json& j, const std::string& field) const {
    if (!j.is_number_integer())
      fail(field, "expected an integer, got " + std::string(j.type_name()));
    return j.get<long long>();
  }
  const json& array(const json& j, const std::string& field) const {
    if (!j.is_array()) fail(field, "expected an array, got " + std::string(j.type_name()));
    return j;
  }

 private:
  std::string file_;
};

// --- pipeline steps ------------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

enum class PrependScheme { kAlways, kFirst, kNever };

struct Normalizer {
  enum Kind { kUnicode, kReplace, kPrepend, kStrip } kind;
  unicode::NormalForm form = unicode::NormalForm::kNfc;
  std::string pattern, content;    // Replace (String pattern) / Prepend
  std::shared_ptr<JsRegex> regex;  // Replace (Regex pattern)
  bool strip_left = false, strip_right = false;
};

struct PreTokenizer {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<JsRegex> regex;  // Split; ByteLevel with use_regex
  std::string literal;             // Split on a String pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  std::string replacement;        // Metaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;  // Metaspace
};

struct Decoder {
  enum Kind { kByteLevel, kMetaspace, kByteFallback, kFuse, kStrip, kReplace } kind;
  std::string pattern, content;  // Replace; Strip content; Metaspace replacement
  std::shared_ptr<JsRegex> regex;
  int start = 0, stop = 0;  // Strip
  bool strip_first = true;  // Metaspace: drop the leading space of the first token
};

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool special = false, lstrip = false, rstrip = false;
};

// Replaces every occurrence of `from` in `text` with `to`.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit = text.find(from); hit != std::string_view::npos;
       hit = text.find(from, at)) {
    out.append(text, at, hit - at);
    out += to;
    at = hit + from.size();
  }
  out.append(text, at, std::string_view::npos);
  return out;
}

std::string regex_replace_all(const JsRegex& regex, std::string_view text, std::string_view to) {
  std::string out;
  std::size_t at = 0;
  regex.for_each_match(text, [&](std::size_t b, std::size_t e) {
    out.append(text, at, b - at);
    out += to;
    at = e;
  });
  out.append(text, at, std::string_view::npos);
  return out;
}

using Emit = std::function<void(std::string_view, bool /*at_start*/)>;

// Cuts `text` at the matches of a pattern as HuggingFace's SplitDelimiterBehavior says and emits
// the non-empty pieces in order.
void split_with_behavior(std::string_view text, bool at_start,
                         const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                         SplitBehavior behavior, bool invert, const Emit& emit) {
  struct Segment {
    std::size_t begin, end;
    bool is_match;
  };
  std::vector<Segment> segments;
  std::size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (e == b) continue;  // empty matches split nothing (as in transformers.js's regexSplit)
    if (b > prev) segments.push_back({prev, b, invert});
    segments.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < text.size()) segments.push_back({prev, text.size(), invert});

  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : segments)
        if (!s.is_match) pieces.push_back({s.begin, s.end});
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : segments) pieces.push_back({s.begin, s.end});
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : segments) {
        if (s.is_match && !previous_match && !pieces.empty())
          pieces.back().second = s.end;
        else
          pieces.push_back({s.begin, s.end});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty())
          pieces.back().first = it->begin;
        else
          pieces.push_back({it->begin, it->end});
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : segments) {
        if (s.is_match && previous_match && !pieces.empty())
          pieces.back().second = s.end;
        else
          pieces.push_back({s.begin, s.end});
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& [b, e] : pieces) {
    if (e > b) emit(text.substr(b, e - b), at_start && b == 0);
  }
}

// --- the tokenizer -------------------------------------------------------------------------------

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const json& root, const JsonReader& in) {
    if (!root.is_object()) in.fail("", "expected a JSON object at the top level");
    read_model(in.require(root, "model", "model"), in);
    read_added_tokens(root, in);
    if (const json* n = in.find(root, "normalizer")) read_normalizer(*n, "normalizer", in);
    if (const json* p = in.find(root, "pre_tokenizer")) read_pre_tokenizer(*p, "pre_tokenizer", in);
    if (const json* d = in.find(root, "decoder")) read_decoder(*d, "decoder", in);
    for (std::size_t i = 0; i < pre_.size(); ++i) {
      if (pre_[i].kind == PreTokenizer::kByteLevel && i + 1 != pre_.size()) {
        in.fail("pre_tokenizer", "a ByteLevel pre-tokenizer must come last in the sequence");
      }
    }
    byte_level_ = !pre_.empty() && pre_.back().kind == PreTokenizer::kByteLevel;
    if (byte_level_) {
      for (int b = 0; b < 256; ++b) {
        auto it = model_vocab_.find(byte_level::utf8()[b]);
        byte_symbol_[b] = it == model_vocab_.end() ? -1 : it->second;
      }
    }
    guess_special_ids(root, in);
  }

  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos && special_.bos >= 0) out.push_back(special_.bos);
    const std::string valid = unicode::to_valid_utf8(text);
    struct Section {
      std::string_view text;
      const AddedToken* added;
    };
    std::vector<Section> sections;
    std::size_t start = 0;
    for (std::size_t i = 0; i < valid.size();) {
      const AddedToken* match = match_added(valid, i);
      if (!match) {
        ++i;
        continue;
      }
      if (i > start)
        sections.push_back({std::string_view(valid).substr(start, i - start), nullptr});
      sections.push_back({match->content, match});
      i += match->content.size();
      start = i;
    }
    if (start < valid.size()) sections.push_back({std::string_view(valid).substr(start), nullptr});
    // lstrip/rstrip trim the white space of the neighbouring text (transformers.js).
    for (std::size_t i = 0; i < sections.size(); ++i) {
      const AddedToken* a = sections[i].added;
      if (!a) continue;
      if (a->lstrip && i > 0 && !sections[i - 1].added) {
        sections[i - 1].text = unicode::trim_js_end(sections[i - 1].text);
      }
      if (a->rstrip && i + 1 < sections.size() && !sections[i + 1].added) {
        sections[i + 1].text = unicode::trim_js_start(sections[i + 1].text);
      }
    }
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
    if (decoders_.empty()) {
      // HuggingFace's default without a decoder.
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return unicode::to_valid_utf8(out);
    }
    run_decoders(tokens, added, /*mid_text=*/false);
    std::string out;
    for (const auto& t : tokens) out += t;
    return unicode::to_valid_utf8(out);
  }

  std::string decode_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    if (is_added_[id]) return is_special_[id] ? "" : pieces_[id];
    std::vector<std::string> tokens = {pieces_[id]};
    std::vector<char> added = {0};
    run_decoders(tokens, added, /*mid_text=*/true);
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
    auto it = vocab_.find(std::string(piece));
    return it == vocab_.end() ? -1 : it->second;
  }
  std::string id_to_piece(TokenId id) const override {
    if (id < 0 || id >= static_cast<TokenId>(pieces_.size())) return "";
    return pieces_[id];
  }
  bool prefixes_space() const override { return prefixes_space_; }
  bool adds_bos() const override { return special_.adds_bos; }
  std::vector<TokenId> end_of_turn_ids() const override { return special_.end_of_turn; }
  std::string kind() const override { return "bpe"; }

  void apply_folder_config(const detail::FolderTokenConfig& config) {
    special_ = detail::resolve_special_ids(
        config, special_, [this](const std::string& s) { return piece_to_id(s); }, {},
        pieces_.size());
  }

 private:
  // --- loading ---

  void read_model(const json& model, const JsonReader& in) {
    if (!model.is_object()) in.fail("model", "expected an object");
    const std::string type = in.string_or(model, "type", "model.type", "BPE");
    if (type != "BPE") {
      in.fail("model.type", "model type '" + type +
                                "' is not supported (only BPE: byte-level BPE such as Qwen or "
                                "Llama 3, or SentencePiece-style BPE)");
    }
    const json& vocab = in.require(model, "vocab", "model.vocab");
    if (!vocab.is_object()) in.fail("model.vocab", "expected an object of token -> id");
    TokenId max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const std::string field = "model.vocab[\"" + it.key() + "\"]";
      const long long id = in.integer(it.value(), field);
      if (id < 0 || id > max_dense_id(vocab.size())) {
        in.fail(field, "id out of range: " + std::to_string(id) + " (the vocabulary has " +
                           std::to_string(vocab.size()) + " tokens, numbered from 0)");
      }
      model_vocab_.emplace(it.key(), static_cast<TokenId>(id));
      max_id = std::max(max_id, static_cast<TokenId>(id));
    }
    set_pieces_size(max_id + 1);
    for (const auto& [piece, id] : model_vocab_) pieces_[id] = piece;
    vocab_ = model_vocab_;

    const json& merges = in.array(in.require(model, "merges", "model.merges"), "model.merges");
    merges_.reserve(merges.size() * 2);
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const std::string field = "model.merges[" + std::to_string(i) + "]";
      std::string left, right;
      const json& m = merges[i];
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          in.fail(field, "merge '" + s + "' is not two tokens separated by one space");
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        in.fail(field, "expected \"a b\" or [\"a\", \"b\"]");
      }
      auto id_of = [&](const std::string& token) {
        auto it = model_vocab_.find(token);
        if (it == model_vocab_.end()) {
          in.fail(field, "merge '" + left + " " + right + "' names '" + token +
                             "', which is not in model.vocab");
        }
        return it->second;
      };
      const TokenId a = id_of(left), b = id_of(right), merged = id_of(left + right);
      // Later duplicates win, as in HuggingFace and transformers.js (both build a map).
      merges_[pair_key(a, b)] = {static_cast<int32_t>(i), merged};
    }

    byte_fallback_ = in.flag(model, "byte_fallback", "model.byte_fallback", false);
    ignore_merges_ = in.flag(model, "ignore_merges", "model.ignore_merges", false);
    fuse_unk_ = in.flag(model, "fuse_unk", "model.fuse_unk", false);
    if (const json* unk = in.find(model, "unk_token")) {
      const std::string token = in.string(*unk, "model.unk_token");
      auto it = model_vocab_.find(token);
      if (it == model_vocab_.end()) {
        in.fail("model.unk_token", "unk_token '" + token + "' is not in model.vocab");
      }
      unk_ = it->second;
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      const std::string field = std::string("model.") + key;
      if (!in.string_or(model, key, field, "").empty()) {
        in.fail(field, "a non-empty " + std::string(key) + " is not supported");
      }
    }
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        static const char hex[] = "0123456789ABCDEF";
        const std::string piece = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
        auto it = model_vocab_.find(piece);
        fallback_byte_[b] = it == model_vocab_.end() ? -1 : it->second;
      }
    }
  }

  void read_added_tokens(const json& root, const JsonReader& in) {
    const json* list = in.find(root, "added_tokens");
    if (!list) return;
    in.array(*list, "added_tokens");
    for (std::size_t i = 0; i < list->size(); ++i) {
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      const json& t = (*list)[i];
      if (!t.is_object()) in.fail(field, "expected an object");
      AddedToken a;
      const long long id = in.integer(in.require(t, "id", field + ".id"), field + ".id");
      if (id < 0 || id > max_dense_id(model_vocab_.size() + list->size())) {
        in.fail(field + ".id", "id out of range: " + std::to_string(id) + " (the file defines " +
                                   std::to_string(model_vocab_.size() + list->size()) +
                                   " tokens, numbered from 0)");
      }
      a.id = static_cast<TokenId>(id);
      a.content = in.string(in.require(t, "content", field + ".content"), field + ".content");
      if (a.content.empty()) in.fail(field + ".content", "an added token cannot be empty");
      a.special = in.flag(t, "special", field + ".special", false);
      a.lstrip = in.flag(t, "lstrip", field + ".lstrip", false);
      a.rstrip = in.flag(t, "rstrip", field + ".rstrip", false);
      if (a.id >= static_cast<TokenId>(pieces_.size())) set_pieces_size(a.id + 1);
      pieces_[a.id] = a.content;
      is_added_[a.id] = 1;
      is_special_[a.id] = a.special ? 1 : 0;
      vocab_[a.content] = a.id;
      added_.push_back(a);
    }
    // A byte trie of the added tokens for longest-match cutting.
    trie_.assign(1, TrieNode{});
    for (std::size_t k = 0; k < added_.size(); ++k) {
      int node = 0;
      for (unsigned char c : added_[k].content) {
        auto& kids = trie_[node].kids;
        auto it =
            std::find_if(kids.begin(), kids.end(), [&](const auto& p) { return p.first == c; });
        if (it == kids.end()) {
          trie_.push_back(TrieNode{});
          trie_[node].kids.push_back({c, static_cast<int>(trie_.size()) - 1});
          node = static_cast<int>(trie_.size()) - 1;
        } else {
          node = it->second;
        }
      }
      trie_[node].token = static_cast<int>(k);  // a later duplicate wins, as in transformers.js
      first_byte_[static_cast<unsigned char>(added_[k].content[0])] = true;
    }
  }

  static SplitBehavior behavior_of(const std::string& name, const std::string& field,
                                   const JsonReader& in) {
    if (name == "Removed") return SplitBehavior::kRemoved;
    if (name == "Isolated") return SplitBehavior::kIsolated;
    if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
    if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
    if (name == "Contiguous") return SplitBehavior::kContiguous;
    in.fail(field, "unknown split behavior '" + name + "'");
  }

  // {"String": "..."} or {"Regex": "..."}: the literal, or the compiled regex.
  static void read_pattern(const json& obj, const std::string& field, const JsonReader& in,
                           std::string& literal, std::shared_ptr<JsRegex>& regex) {
    const json& p = in.require(obj, "pattern", field + ".pattern");
    if (const json* s = in.find(p, "String")) {
      literal = in.string(*s, field + ".pattern.String");
      if (literal.empty()) in.fail(field + ".pattern.String", "empty pattern");
    } else if (const json* r = in.find(p, "Regex")) {
      regex = std::make_shared<JsRegex>(in.string(*r, field + ".pattern.Regex"), in.file(),
                                        field + ".pattern.Regex");
    } else {
      in.fail(field + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}");
    }
  }

  static PrependScheme prepend_scheme(const json& obj, const std::string& field,
                                      const JsonReader& in) {
    // Older files say add_prefix_space (true = always) instead of prepend_scheme.
    if (const json* s = in.find(obj, "prepend_scheme")) {
      const std::string v = in.string(*s, field + ".prepend_scheme");
      if (v == "always") return PrependScheme::kAlways;
      if (v == "first") return PrependScheme::kFirst;
      if (v == "never") return PrependScheme::kNever;
      in.fail(field + ".prepend_scheme", "unknown prepend_scheme '" + v + "'");
    }
    return in.flag(obj, "add_prefix_space", field + ".add_prefix_space", true)
               ? PrependScheme::kAlways
               : PrependScheme::kNever;
  }

  void read_normalizer(const json& n, const std::string& field, const JsonReader& in) {
    const std::string type = in.string(in.require(n, "type", field + ".type"), field + ".type");
    Normalizer step{Normalizer::kUnicode};
    if (type == "Sequence") {
      const json& list =
          in.array(in.require(n, "normalizers", field + ".normalizers"), field + ".normalizers");
      for (std::size_t i = 0; i < list.size(); ++i) {
        read_normalizer(list[i], field + ".normalizers[" + std::to_string(i) + "]", in);
      }
      return;
    } else if (type == "NFC") {
      step.form = unicode::NormalForm::kNfc;
    } else if (type == "NFD") {
      step.form = unicode::NormalForm::kNfd;
    } else if (type == "NFKC") {
      step.form = unicode::NormalForm::kNfkc;
    } else if (type == "NFKD") {
      step.form = unicode::NormalForm::kNfkd;
    } else if (type == "Replace") {
      step.kind = Normalizer::kReplace;
      read_pattern(n, field, in, step.pattern, step.regex);
      step.content = in.string(in.require(n, "content", field + ".content"), field + ".content");
    } else if (type == "Prepend") {
      step.kind = Normalizer::kPrepend;
      step.content = in.string(in.require(n, "prepend", field + ".prepend"), field + ".prepend");
      prefixes_space_ = true;
    } else if (type == "Strip") {
      step.kind = Normalizer::kStrip;
      step.strip_left = in.flag(n, "strip_left", field + ".strip_left", true);
      step.strip_right = in.flag(n, "strip_right", field + ".strip_right", true);
    } else {
      in.fail(field + ".type", "normalizer '" + type +
                                   "' is not supported (supported: NFC, NFD, NFKC, NFKD, "
                                   "Replace, Prepend, Strip, Sequence)");
    }
    normalizers_.push_back(std::move(step));
  }

  void read_pre_tokenizer(const json& p, const std::string& field, const JsonReader& in) {
    const std::string type = in.string(in.require(p, "type", field + ".type"), field + ".type");
    if (type == "Sequence") {
      const json& list = in.array(in.require(p, "pretokenizers", field + ".pretokenizers"),
                                  field + ".pretokenizers");
      for (std::size_t i = 0; i < list.size(); ++i) {
        read_pre_tokenizer(list[i], field + ".pretokenizers[" + std::to_string(i) + "]", in);
      }
      return;
    }
    PreTokenizer step{PreTokenizer::kSplit};
    if (type == "Split") {
      read_pattern(p, field, in, step.literal, step.regex);
      step.behavior = behavior_of(
          in.string(in.require(p, "behavior", field + ".behavior"), field + ".behavior"),
          field + ".behavior", in);
      step.invert = in.flag(p, "invert", field + ".invert", false);
    } else if (type == "ByteLevel") {
      step.kind = PreTokenizer::kByteLevel;
      step.add_prefix_space = in.flag(p, "add_prefix_space", field + ".add_prefix_space", true);
      if (in.flag(p, "use_regex", field + ".use_regex", true)) {
        // GPT-2's pattern, as transformers.js writes it.
        step.regex = std::make_shared<JsRegex>(
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
            in.file(), field);
      }
      if (step.add_prefix_space) prefixes_space_ = true;
    } else if (type == "Metaspace") {
      step.kind = PreTokenizer::kMetaspace;
      step.replacement = in.string_or(p, "replacement", field + ".replacement", "\xE2\x96\x81");
      if (step.replacement.empty()) in.fail(field + ".replacement", "empty replacement");
      step.prepend = prepend_scheme(p, field, in);
      step.split = in.flag(p, "split", field + ".split", true);
      if (step.prepend != PrependScheme::kNever) prefixes_space_ = true;
    } else {
      in.fail(field + ".type", "pre-tokenizer '" + type +
                                   "' is not supported (supported: Split, ByteLevel, Metaspace, "
                                   "Sequence)");
    }
    pre_.push_back(std::move(step));
  }

  void read_decoder(const json& d, const std::string& field, const JsonReader& in) {
    const std::string type = in.string(in.require(d, "type", field + ".type"), field + ".type");
    if (type == "Sequence") {
      const json& list =
          in.array(in.require(d, "decoders", field + ".decoders"), field + ".decoders");
      for (std::size_t i = 0; i < list.size(); ++i) {
        read_decoder(list[i], field + ".decoders[" + std::to_string(i) + "]", in);
      }
      return;
    }
    Decoder step{Decoder::kByteLevel};
    if (type == "ByteLevel") {
    } else if (type == "Metaspace") {
      step.kind = Decoder::kMetaspace;
      step.pattern = in.string_or(d, "replacement", field + ".replacement", "\xE2\x96\x81");
      step.strip_first = prepend_scheme(d, field, in) != PrependScheme::kNever;
    } else if (type == "ByteFallback") {
      step.kind = Decoder::kByteFallback;
    } else if (type == "Fuse") {
      step.kind = Decoder::kFuse;
    } else if (type == "Strip") {
      step.kind = Decoder::kStrip;
      step.content = in.string(in.require(d, "content", field + ".content"), field + ".content");
      step.start =
          static_cast<int>(in.integer(in.require(d, "start", field + ".start"), field + ".start"));
      step.stop =
          static_cast<int>(in.integer(in.require(d, "stop", field + ".stop"), field + ".stop"));
    } else if (type == "Replace") {
      step.kind = Decoder::kReplace;
      read_pattern(d, field, in, step.pattern, step.regex);
      step.content = in.string(in.require(d, "content", field + ".content"), field + ".content");
    } else {
      in.fail(field + ".type", "decoder '" + type +
                                   "' is not supported (supported: ByteLevel, Metaspace, "
                                   "ByteFallback, Fuse, Strip, Replace, Sequence)");
    }
    decoders_.push_back(std::move(step));
  }

  // BOS/EOS/end-of-turn ids from the special tokens alone; tokenizer_config.json and
  // generation_config.json, when present, override them (apply_folder_config).
  void guess_special_ids(const json& root, const JsonReader& in) {
    auto special = [&](const std::string& content) -> TokenId {
      for (const auto& a : added_)
        if (a.content == content) return a.id;
      return -1;
    };
    auto first_of = [&](std::initializer_list<const char*> names) -> TokenId {
      for (const char* n : names) {
        const TokenId id = special(n);
        if (id >= 0) return id;
      }
      return -1;
    };
    special_.bos = first_of({"<|begin_of_text|>", "<s>", "<bos>"});
    special_.eos = first_of({"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>"});
    special_.unk = unk_;
    // A TemplateProcessing post-processor says whether BOS goes first; without one a tokenizer
    // with a BOS token adds it (Llama 2/3).
    bool adds = special_.bos >= 0;
    if (const json* post = in.find(root, "post_processor")) {
      if (in.string_or(*post, "type", "post_processor.type", "") == "TemplateProcessing") {
        adds = false;
        if (const json* single = in.find(*post, "single"); single && single->is_array()) {
          for (const auto& item : *single) {
            const json* st = in.find(item, "SpecialToken");
            const json* id = st ? in.find(*st, "id") : nullptr;
            if (id && id->is_string() && special(id->get<std::string>()) == special_.bos) {
              adds = special_.bos >= 0;
            }
          }
        }
      }
    }
    special_.adds_bos = adds;
    special_.end_of_turn.clear();
    if (special_.eos >= 0) special_.end_of_turn.push_back(special_.eos);
    for (const auto& name : detail::end_of_turn_token_names()) {
      for (const auto& a : added_) {
        if (a.special && a.content == name &&
            std::find(special_.end_of_turn.begin(), special_.end_of_turn.end(), a.id) ==
                special_.end_of_turn.end()) {
          special_.end_of_turn.push_back(a.id);
        }
      }
    }
  }

  // Ids index dense tables (pieces_, is_added_), so an id far past the number of tokens the file
  // defines allocated for nothing: {"a": 1073741823} (the old limit was 2^30) asked for 34 GB of
  // empty strings (found by fuzzing). Holes stay allowed, up to twice the tokens plus 65,536.
  static long long max_dense_id(std::size_t tokens) {
    return 2LL * static_cast<long long>(tokens) + 65536;
  }

  void set_pieces_size(TokenId n) {
    pieces_.resize(n);
    is_added_.resize(n, 0);
    is_special_.resize(n, 0);
  }

  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // --- encoding ---

  // The longest added token that starts at text[i], or null.
  const AddedToken* match_added(std::string_view text, std::size_t i) const {
    if (added_.empty() || !first_byte_[static_cast<unsigned char>(text[i])]) return nullptr;
    int node = 0, found = -1;
    for (std::size_t j = i; j < text.size(); ++j) {
      const auto& kids = trie_[node].kids;
      const unsigned char c = static_cast<unsigned char>(text[j]);
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& p) { return p.first == c; });
      if (it == kids.end()) break;
      node = it->second;
      if (trie_[node].token >= 0) found = trie_[node].token;
    }
    return found >= 0 ? &added_[found] : nullptr;
  }

  std::string normalize(std::string_view text) const {
    std::string s(text);
    for (const auto& n : normalizers_) {
      switch (n.kind) {
        case Normalizer::kUnicode:
          s = unicode::normalize(s, n.form);
          break;
        case Normalizer::kReplace:
          s = n.regex ? regex_replace_all(*n.regex, s, n.content)
                      : replace_all(s, n.pattern, n.content);
          break;
        case Normalizer::kPrepend:
          if (!s.empty()) s = n.content + s;
          break;
        case Normalizer::kStrip: {
          std::string_view v = s;
          if (n.strip_left) v = unicode::trim_js_start(v);
          if (n.strip_right) v = unicode::trim_js_end(v);
          s = std::string(v);
          break;
        }
      }
    }
    return s;
  }

  void encode_section(std::string_view text, bool first_section, std::vector<TokenId>& out) const {
    const std::string normalized = normalize(text);
    if (normalized.empty()) return;
    pre_tokenize(0, normalized, first_section,
                 [&](std::string_view piece, bool) { encode_word(piece, out); });
  }

  // Runs pre-tokenizer steps [step, end) over `piece`; at_start: the piece begins the input
  // (Metaspace's prepend_scheme "first").
  void pre_tokenize(std::size_t step, std::string_view piece, bool at_start,
                    const Emit& emit) const {
    if (step == pre_.size()) {
      if (!piece.empty()) emit(piece, at_start);
      return;
    }
    const PreTokenizer& p = pre_[step];
    const Emit next = [&](std::string_view sub, bool sub_at_start) {
      pre_tokenize(step + 1, sub, sub_at_start, emit);
    };
    std::vector<std::pair<std::size_t, std::size_t>> matches;
    switch (p.kind) {
      case PreTokenizer::kSplit: {
        if (p.regex) {
          p.regex->for_each_match(piece, [&](std::size_t b, std::size_t e) {
            matches.push_back({b, e});
          });
        } else {
          for (std::size_t at = piece.find(p.literal); at != std::string_view::npos;
               at = piece.find(p.literal, at + p.literal.size())) {
            matches.push_back({at, at + p.literal.size()});
          }
        }
        split_with_behavior(piece, at_start, matches, p.behavior, p.invert, next);
        return;
      }
      case PreTokenizer::kByteLevel: {
        std::string prefixed;
        std::string_view text = piece;
        if (p.add_prefix_space && (text.empty() || text[0] != ' ')) {
          prefixed = " " + std::string(text);
          text = prefixed;
        }
        if (!p.regex) {
          next(text, at_start);
          return;
        }
        p.regex->for_each_match(text, [&](std::size_t b, std::size_t e) {
          matches.push_back({b, e});
        });
        split_with_behavior(text, at_start, matches, SplitBehavior::kIsolated, false, next);
        return;
      }
      case PreTokenizer::kMetaspace: {
        std::string m = replace_all(piece, " ", p.replacement);
        const bool starts = m.compare(0, p.replacement.size(), p.replacement) == 0;
        if (!starts && (p.prepend == PrependScheme::kAlways ||
                        (p.prepend == PrependScheme::kFirst && at_start))) {
          m = p.replacement + m;
        }
        if (!p.split) {
          next(m, at_start);
          return;
        }
        for (std::size_t at = m.find(p.replacement); at != std::string::npos;
             at = m.find(p.replacement, at + p.replacement.size())) {
          matches.push_back({at, at + p.replacement.size()});
        }
        split_with_behavior(m, at_start, matches, SplitBehavior::kMergedWithNext, false, next);
        return;
      }
    }
  }

  // The ids of one pre-token, from the cache when it has them.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const {
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto it = cache_.find(std::string(word));
      if (it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const std::size_t first = out.size();
    bpe(word, out);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() >= kCacheCapacity) cache_.clear();  // simple bound; refills with use
      cache_.emplace(std::string(word), std::vector<TokenId>(out.begin() + first, out.end()));
    }
  }

  // The vocabulary form of a span of the pre-token (byte-level: its bytes' characters).
  std::string vocab_form(std::string_view bytes) const {
    return byte_level_ ? byte_level::encode(bytes) : std::string(bytes);
  }

  void bpe(std::string_view word, std::vector<TokenId>& out) const {
    if (ignore_merges_) {
      // Llama 3: a pre-token that is itself in the vocabulary is one token.
      auto it = vocab_.find(vocab_form(word));
      if (it != vocab_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    struct Symbol {
      TokenId id;
      int prev, next;
      uint32_t begin, end;  // byte span in `word`
    };
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    if (byte_level_) {
      for (std::size_t i = 0; i < word.size(); ++i) {
        const int n = static_cast<int>(symbols.size());
        symbols.push_back({byte_symbol_[static_cast<unsigned char>(word[i])], n - 1, n + 1,
                           static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)});
      }
    } else {
      for (std::size_t i = 0; i < word.size();) {
        const std::size_t begin = i;
        unicode::next_code_point(word, i);
        auto it = vocab_.find(std::string(word.substr(begin, i - begin)));
        const int n = static_cast<int>(symbols.size());
        symbols.push_back({it == vocab_.end() ? -1 : it->second, n - 1, n + 1,
                           static_cast<uint32_t>(begin), static_cast<uint32_t>(i)});
      }
    }
    if (symbols.empty()) return;
    symbols.back().next = -1;

    struct Candidate {
      int32_t rank;
      int left, right;
      TokenId left_id, right_id, merged;
    };
    // Lowest rank first; on equal ranks the leftmost pair (transformers.js's positional bias).
    auto later = [](const Candidate& a, const Candidate& b) {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
    auto consider = [&](int left) {
      if (left < 0) return;
      const int right = symbols[left].next;
      if (right < 0 || symbols[left].id < 0 || symbols[right].id < 0) return;
      auto it = merges_.find(pair_key(symbols[left].id, symbols[right].id));
      if (it == merges_.end()) return;
      queue.push(
          {it->second.rank, left, right, symbols[left].id, symbols[right].id, it->second.merged});
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = symbols[c.left];
      // Stale when either side has been merged into something else since it was queued.
      if (left.id != c.left_id || left.next != c.right || symbols[c.right].id != c.right_id) {
        continue;
      }
      Symbol& right = symbols[c.right];
      left.id = c.merged;
      left.end = right.end;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      right.id = -2;  // dead
      right.next = right.prev = -1;
      consider(left.prev);
      consider(c.left);
    }
    bool last_unknown = false;
    for (int i = 0; i >= 0; i = symbols[i].next) {
      const Symbol& s = symbols[i];
      if (s.id >= 0) {
        out.push_back(s.id);
        last_unknown = false;
        continue;
      }
      const std::string text = vocab_form(word.substr(s.begin, s.end - s.begin));
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : text) all = all && fallback_byte_[b] >= 0;
        if (all) {
          for (unsigned char b : text) out.push_back(fallback_byte_[b]);
          last_unknown = false;
          continue;
        }
      }
      // Without an unk token HuggingFace drops the character; fuse_unk folds a run into one.
      if (unk_ >= 0 && !(fuse_unk_ && last_unknown)) out.push_back(unk_);
      last_unknown = true;
    }
  }

  // --- decoding ---

  // Runs the decoder chain over `tokens` in place. mid_text: one token in the middle of a text
  // (decode_piece): bytes stay raw, nothing is stripped at the start.
  void run_decoders(std::vector<std::string>& tokens, std::vector<char>& added,
                    bool mid_text) const {
    for (const Decoder& d : decoders_) {
      switch (d.kind) {
        case Decoder::kByteLevel: {
          // Added tokens are their text; other tokens' characters are bytes (transformers.js).
          std::string out, bytes;
          auto flush = [&] {
            out += mid_text ? bytes : unicode::to_valid_utf8(bytes);
            bytes.clear();
          };
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            if (added[i]) {
              flush();
              out += tokens[i];
              continue;
            }
            const std::string& t = tokens[i];
            for (std::size_t k = 0; k < t.size();) {
              const std::size_t begin = k;
              const int b = byte_level::byte_of(unicode::next_code_point(t, k));
              if (b >= 0)
                bytes += static_cast<char>(b);
              else
                bytes.append(t, begin, k - begin);
            }
          }
          flush();
          tokens.assign(1, out);
          added.assign(1, 0);
          break;
        }
        case Decoder::kMetaspace:
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            if (added[i]) continue;
            tokens[i] = replace_all(tokens[i], d.pattern, " ");
            if (!mid_text && i == 0 && d.strip_first && !tokens[i].empty() && tokens[i][0] == ' ') {
              tokens[i].erase(0, 1);
            }
          }
          break;
        case Decoder::kByteFallback: {
          std::vector<std::string> out;
          std::vector<char> out_added;
          std::string bytes;
          auto flush = [&] {
            if (bytes.empty()) return;
            out.push_back(mid_text ? bytes : unicode::to_valid_utf8(bytes));
            out_added.push_back(0);
            bytes.clear();
          };
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            const std::string& t = tokens[i];
            if (!added[i] && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                std::isxdigit(static_cast<unsigned char>(t[3])) &&
                std::isxdigit(static_cast<unsigned char>(t[4]))) {
              bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
              continue;
            }
            flush();
            out.push_back(t);
            out_added.push_back(added[i]);
          }
          flush();
          tokens = std::move(out);
          added = std::move(out_added);
          break;
        }
        case Decoder::kFuse: {
          std::string joined;
          for (const auto& t : tokens) joined += t;
          tokens.assign(1, joined);
          added.assign(1, 0);
          break;
        }
        case Decoder::kStrip:
          if (mid_text) break;  // it trims the text's ends, which one token in the middle is not
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            std::string& t = tokens[i];
            const std::string& c = d.content;
            for (int k = 0; k < d.start && !c.empty() && t.compare(0, c.size(), c) == 0; ++k) {
              t.erase(0, c.size());
            }
            for (int k = 0; k < d.stop && !c.empty() && t.size() >= c.size() &&
                            t.compare(t.size() - c.size(), c.size(), c) == 0;
                 ++k) {
              t.erase(t.size() - c.size());
            }
          }
          break;
        case Decoder::kReplace:
          for (std::size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = d.regex ? regex_replace_all(*d.regex, tokens[i], d.content)
                                : replace_all(tokens[i], d.pattern, d.content);
          }
          break;
      }
    }
  }

  static constexpr std::size_t kMaxCachedWord = 256;
  static constexpr std::size_t kCacheCapacity = 1 << 16;

  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  struct TrieNode {
    std::vector<std::pair<unsigned char, int>> kids;
    int token = -1;  // index into added_
  };

  std::unordered_map<std::string, TokenId> model_vocab_;  // model.vocab
  std::unordered_map<std::string, TokenId> vocab_;        // model.vocab and the added tokens
  std::vector<std::string> pieces_;                       // id -> stored form ("" for holes)
  std::vector<char> is_added_, is_special_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<AddedToken> added_;
  std::vector<TrieNode> trie_;
  bool first_byte_[256] = {};
  std::vector<Normalizer> normalizers_;
  std::vector<PreTokenizer> pre_;
  std::vector<Decoder> decoders_;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  bool prefixes_space_ = false;
  TokenId unk_ = -1;
  TokenId byte_symbol_[256] = {};
  TokenId fallback_byte_[256] = {};
  detail::SpecialIds special_;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
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
