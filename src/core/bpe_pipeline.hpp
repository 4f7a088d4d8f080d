// src/core/bpe_pipeline.hpp — the pieces of the tokenizer.json reader (private to
// promptcache_core).
//
// load_bpe_tokenizer (bpe_tokenizer.cpp) is split along the stages of a HuggingFace tokenizer:
//   bpe_json.cpp        reading the normalizer, pre-tokenizer and decoder sections into the step
//                       lists declared here, with errors that name the file and the field;
//   bpe_pre_tokenize.cpp running normalizers and pre-tokenizers over a text section;
//   bpe_added_tokens.cpp the added (special) tokens: cutting them out of the raw text, and the
//                       BOS/EOS/end-of-turn guess from them;
//   bpe_model.cpp       the vocabulary, the merges and the merge loop that encodes one pre-token;
//   bpe_decode.cpp      the decoder chain that turns tokens back into text.
// Every stage follows the JS reference (transformers.js) step by step; see bpe_tokenizer.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "js_regex.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "tokenizer_config.hpp"
#include "unicode_text.hpp"

namespace promptcache::bpe {

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
  enum Kind { kSplit, kByteLevel, kMetaspace, kPunctuation, kDigits } kind;
  // Split; ByteLevel with use_regex; Punctuation: one punctuation character (Digits has none)
  std::shared_ptr<JsRegex> regex;
  std::string literal;                                // Split on a String pattern
  SplitBehavior behavior = SplitBehavior::kIsolated;  // Split, Punctuation, Digits
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

// The normalizer, pre-tokenizer and decoder sections of a tokenizer.json.
struct Pipeline {
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre;
  std::vector<Decoder> decoders;
  bool prefixes_space = false;  // a step puts a space (or its replacement) before the text
};

// At most this many steps in each of the three sections (Sequences flattened).
constexpr std::size_t kMaxSteps = 64;

// bpe_json.cpp: each appends its steps (a Sequence flattened) to `pipeline`; `field` names the
// section in errors ("pre_tokenizer.pretokenizers[1]"); depth: the Sequence nesting so far.
void read_normalizer(const json& n, const std::string& field, const JsonReader& in,
                     Pipeline& pipeline, int depth = 0);
void read_pre_tokenizer(const json& p, const std::string& field, const JsonReader& in,
                        Pipeline& pipeline, int depth = 0);
void read_decoder(const json& d, const std::string& field, const JsonReader& in, Pipeline& pipeline,
                  int depth = 0);

// --- bpe_pre_tokenize.cpp ------------------------------------------------------------------------

// Replaces every occurrence of `from` in `text` with `to`.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to);
// Replaces every match of `regex` in `text` with `to`.
std::string regex_replace_all(const JsRegex& regex, std::string_view text, std::string_view to);

// Where a step sends its pieces: a reference to a callable (piece, at_start), not a copy, so
// passing one down the steps allocates nothing. It must not outlive the callable; every Emit here
// is called only before the function it was passed to returns.
class Emit {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Emit>>>
  Emit(F&& f)  // NOLINT(google-explicit-constructor): lambdas convert where an Emit is taken
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, std::string_view piece, bool at_start) {
          (*static_cast<std::remove_reference_t<F>*>(object))(piece, at_start);
        }) {}
  void operator()(std::string_view piece, bool at_start) const { call_(object_, piece, at_start); }

 private:
  void* object_;
  void (*call_)(void*, std::string_view, bool);
};

// Cuts `text` at the matches of a pattern as HuggingFace's SplitDelimiterBehavior says and emits
// the non-empty pieces in order.
void split_with_behavior(std::string_view text, bool at_start,
                         const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                         SplitBehavior behavior, bool invert, const Emit& emit);

// `text` after the normalizers, in order.
std::string normalize(const std::vector<Normalizer>& normalizers, std::string_view text);

// Runs pre-tokenizer steps [step, end) over `piece` and emits the pre-tokens; at_start: the piece
// begins the input (Metaspace's prepend_scheme "first").
void pre_tokenize(const std::vector<PreTokenizer>& steps, std::size_t step, std::string_view piece,
                  bool at_start, const Emit& emit);

// --- bpe_added_tokens.cpp ------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool special = false, lstrip = false, rstrip = false;
};

class AddedTokens {
 public:
  // Reads root["added_tokens"]; `defined` is the number of tokens model.vocab holds (for the id
  // range check).
  void read(const json& root, const JsonReader& in, std::size_t defined);
  const std::vector<AddedToken>& list() const { return added_; }

  // A section of the input: plain text, or one added token (`added` set).
  struct Section {
    std::string_view text;
    const AddedToken* added;
  };
  // `text` (valid UTF-8) cut at the added tokens (longest match at the leftmost position), with
  // lstrip/rstrip trimming the white space of the neighbouring text as transformers.js does.
  std::vector<Section> split(std::string_view text) const;

  // The id of the added token whose content is `content`, or -1.
  TokenId find(const std::string& content) const;

 private:
  // The longest added token that starts at text[i], or null.
  const AddedToken* match(std::string_view text, std::size_t i) const;

  struct TrieNode {
    std::vector<std::pair<unsigned char, int>> kids;
    int token = -1;  // index into added_
  };
  std::vector<AddedToken> added_;
  std::vector<TrieNode> trie_;
  bool first_byte_[256] = {};
};

// BOS/EOS/end-of-turn ids from the added tokens alone (and whether a BOS goes first, from the
// post-processor); tokenizer_config.json and generation_config.json override them later.
detail::SpecialIds guess_special_ids(const json& root, const JsonReader& in,
                                     const AddedTokens& added, TokenId unk);

// --- bpe_model.cpp -------------------------------------------------------------------------------

// The "model" section: vocabulary, merges and the merge loop, with a bounded cache of the ids of
// repeated pre-tokens.
class BpeModel {
 public:
  void read(const json& model, const JsonReader& in);
  // Byte-level: a pre-token's bytes are looked up as GPT-2's byte characters, in model.vocab
  // alone (`full_vocab` false: what the merge loop has always done after a last ByteLevel step) or
  // with the added tokens (true: exactly as the character-by-character lookup of the same
  // pre-token written in byte characters, for pre-tokens mapped back from them).
  void set_byte_level(bool byte_level, bool full_vocab = false);

  // An added token joins the lookup vocabulary (as in transformers.js, whose model maps them too).
  void add_token(const std::string& content, TokenId id) { vocab_[content] = id; }

  // Appends the ids of one pre-token (raw bytes), from the cache when it has them.
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;

  // model.vocab alone, and model.vocab with the added tokens.
  const std::unordered_map<std::string, TokenId>& model_vocab() const { return model_vocab_; }
  const std::unordered_map<std::string, TokenId>& vocab() const { return vocab_; }
  TokenId max_id() const { return max_id_; }
  TokenId unk() const { return unk_; }

 private:
  void bpe(std::string_view word, std::vector<TokenId>& out) const;
  // The vocabulary form of a span of the pre-token (byte-level: its bytes' characters).
  std::string vocab_form(std::string_view bytes) const;
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  static constexpr std::size_t kMaxCachedWord = 256;
  static constexpr std::size_t kCacheCapacity = 1 << 16;

  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  std::unordered_map<std::string, TokenId> model_vocab_;  // model.vocab
  std::unordered_map<std::string, TokenId> vocab_;        // model.vocab and the added tokens
  std::unordered_map<uint64_t, Merge> merges_;
  TokenId max_id_ = -1;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  TokenId unk_ = -1;
  TokenId byte_symbol_[256] = {};
  TokenId fallback_byte_[256] = {};

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache_;
};

// Ids index dense tables, so an id far past the number of tokens the file defines allocated for
// nothing: {"a": 1073741823} (the old limit was 2^30) asked for 34 GB of empty strings (found by
// fuzzing). Holes stay allowed, up to twice the tokens plus 65,536.
inline long long max_dense_id(std::size_t tokens) {
  return 2LL * static_cast<long long>(tokens) + 65536;
}

// --- bpe_decode.cpp ------------------------------------------------------------------------------

// Runs the decoder chain over `tokens` in place; added[i]: tokens[i] is an added token (its text
// is kept as is). mid_text: one token in the middle of a text (decode_piece): bytes stay raw,
// nothing is stripped at the start.
void run_decoders(const std::vector<Decoder>& decoders, std::vector<std::string>& tokens,
                  std::vector<char>& added, bool mid_text);

}  // namespace promptcache::bpe
