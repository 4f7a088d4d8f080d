// src/core/bpe_model.cpp — the "model" section of a tokenizer.json (type BPE) and the merge loop.
//
// It holds the vocabulary, the ranked merges and the options HuggingFace's BPE model has
// (byte_fallback, ignore_merges, fuse_unk, unk_token). One pre-token is encoded by starting from
// its characters (byte-level: its bytes, spelled as GPT-2's byte characters) and merging adjacent
// pairs lowest rank first, leftmost on ties, through a priority queue with stale entries skipped;
// pieces the vocabulary lacks fall back to <0xXX> byte tokens or the unk token. Pre-tokens repeat
// in real text, so their ids are kept in a bounded cache.
#include <algorithm>
#include <queue>

#include "bpe_pipeline.hpp"
#include "byte_level.hpp"

namespace promptcache::bpe {

void BpeModel::read(const json& model, const JsonReader& in) {
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
  max_id_ = max_id;
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

void BpeModel::set_byte_level(bool byte_level, bool full_vocab) {
  byte_level_ = byte_level;
  if (byte_level_) {
    const auto& lookup = full_vocab ? vocab_ : model_vocab_;
    for (int b = 0; b < 256; ++b) {
      auto it = lookup.find(byte_level::utf8()[b]);
      byte_symbol_[b] = it == lookup.end() ? -1 : it->second;
    }
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<TokenId>& out) const {
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

std::string BpeModel::vocab_form(std::string_view bytes) const {
  return byte_level_ ? byte_level::encode(bytes) : std::string(bytes);
}

void BpeModel::bpe(std::string_view word, std::vector<TokenId>& out) const {
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

}  // namespace promptcache::bpe
