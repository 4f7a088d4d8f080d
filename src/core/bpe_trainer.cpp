// A small byte-level BPE trainer that writes a HuggingFace tokenizer.json (Qwen2-style pipeline:
// NFC, the Qwen2 split regex, GPT-2 byte mapping). Used by tests, benchmarks and make-model.
//
// The alphabet is the 256 byte characters (ids 0..255 in byte order). Each step merges the most
// frequent adjacent pair over the pre-tokens of the corpus; ties go to the pair whose two token
// strings are smallest, so the result depends only on the corpus. Counts are updated only for the
// words that hold the merged pair, and the best pair comes from a lazily refreshed heap.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "byte_level.hpp"
#include "js_regex.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "unicode_text.hpp"

namespace promptcache {
namespace {

uint64_t pair_key(int a, int b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int left_of(uint64_t key) {
  return static_cast<int>(key >> 32);
}
int right_of(uint64_t key) {
  return static_cast<int>(key & 0xFFFFFFFFu);
}

}  // namespace

void train_bpe_tokenizer(const std::string& corpus_text, int vocab_size,
                         const std::vector<std::string>& special_tokens,
                         const std::string& out_json_path) {
  const int learned_size = vocab_size - static_cast<int>(special_tokens.size());
  if (learned_size < 256) {
    throw Error(ErrorKind::kInvalidArgument,
                "vocab_size " + std::to_string(vocab_size) +
                    " leaves no room for the 256 byte "
                    "tokens and " +
                    std::to_string(special_tokens.size()) + " special tokens",
                {out_json_path});
  }
  std::unordered_set<std::string> seen_special;
  for (const auto& s : special_tokens) {
    if (s.empty() || !seen_special.insert(s).second) {
      throw Error(ErrorKind::kInvalidArgument,
                  "special tokens must be non-empty and distinct ('" + s + "')", {out_json_path});
    }
  }

  // Pre-tokens of the corpus as the tokenizer will see them, with their counts.
  const std::string text =
      unicode::normalize(unicode::to_valid_utf8(corpus_text), unicode::NormalForm::kNfc);
  const JsRegex split(byte_level::qwen2_split_regex(), out_json_path, "pre_tokenizer");
  std::unordered_map<std::string, int64_t> counts;
  std::size_t previous = 0;
  auto count = [&](std::size_t b, std::size_t e) {
    if (e > b) ++counts[text.substr(b, e - b)];
  };
  split.for_each_match(text, [&](std::size_t b, std::size_t e) {
    count(previous, b);
    count(b, e);
    previous = e;
  });
  count(previous, text.size());

  struct Word {
    std::vector<int> symbols;
    int64_t count;
  };
  std::vector<std::string> sorted;
  sorted.reserve(counts.size());
  for (const auto& kv : counts) sorted.push_back(kv.first);
  std::sort(sorted.begin(), sorted.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& w : sorted) {
    Word word{{}, counts[w]};
    for (unsigned char b : w) word.symbols.push_back(b);
    words.push_back(std::move(word));
  }

  std::vector<std::string> tokens;  // id -> vocabulary form
  std::unordered_map<std::string, int> token_ids;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_level::utf8()[b]);
    token_ids.emplace(tokens.back(), b);
  }

  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<int>> where;  // may repeat a word; deduped on use
  for (int w = 0; w < static_cast<int>(words.size()); ++w) {
    const auto& s = words[w].symbols;
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_counts[k] += words[w].count;
      where[k].push_back(w);
    }
  }
  struct Entry {
    int64_t count;
    uint64_t pair;
  };
  auto worse = [&](const Entry& a, const Entry& b) {
    if (a.count != b.count) return a.count < b.count;
    const std::string& al = tokens[left_of(a.pair)];
    const std::string& bl = tokens[left_of(b.pair)];
    if (al != bl) return al > bl;
    return tokens[right_of(a.pair)] > tokens[right_of(b.pair)];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  for (const auto& [k, c] : pair_counts) heap.push({c, k});

  std::vector<std::pair<int, int>> merges;
  std::vector<int> stamp(words.size(), -1);
  while (static_cast<int>(tokens.size()) < learned_size && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    auto current = pair_counts.find(top.pair);
    if (current == pair_counts.end() || current->second != top.count) continue;  // stale
    if (top.count < 2) break;  // a pair seen once is not worth a token
    const int a = left_of(top.pair), b = right_of(top.pair);
    const std::string merged_text = tokens[a] + tokens[b];
    int merged;
    auto existing = token_ids.find(merged_text);
    if (existing != token_ids.end()) {
      merged = existing->second;  // another split of the same string was merged before
    } else {
      merged = static_cast<int>(tokens.size());
      tokens.push_back(merged_text);
      token_ids.emplace(merged_text, merged);
    }
    const int step = static_cast<int>(merges.size());
    merges.push_back({a, b});

    std::unordered_map<uint64_t, int64_t> delta;
    const std::vector<int> holders = std::move(where[top.pair]);
    where.erase(top.pair);
    for (int w : holders) {
      if (stamp[w] == step) continue;
      stamp[w] = step;
      auto& s = words[w].symbols;
      const int64_t c = words[w].count;
      bool found = false;
      for (std::size_t i = 0; i + 1 < s.size() && !found; ++i) found = s[i] == a && s[i + 1] == b;
      if (!found) continue;
      for (std::size_t i = 0; i + 1 < s.size(); ++i) delta[pair_key(s[i], s[i + 1])] -= c;
      std::vector<int> next;
      next.reserve(s.size());
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(s[i]);
        }
      }
      s = std::move(next);
      for (std::size_t i = 0; i + 1 < s.size(); ++i) {
        const uint64_t k = pair_key(s[i], s[i + 1]);
        delta[k] += c;
        if (s[i] == merged || s[i + 1] == merged) where[k].push_back(w);
      }
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& total = pair_counts[k];
      total += d;
      if (total > 0) {
        heap.push({total, k});
      } else {
        pair_counts.erase(k);
      }
    }
  }

  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object();
  for (std::size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  ojson merge_list = ojson::array();
  for (const auto& [a, b] : merges) merge_list.push_back(ojson::array({tokens[a], tokens[b]}));
  ojson added = ojson::array();
  for (std::size_t i = 0; i < special_tokens.size(); ++i) {
    added.push_back({{"id", tokens.size() + i},
                     {"content", special_tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const ojson byte_level_step = {{"type", "ByteLevel"},
                                 {"add_prefix_space", false},
                                 {"trim_offsets", false},
                                 {"use_regex", false}};
  ojson root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", ojson::array({{{"type", "Split"},
                                         {"pattern", {{"Regex", byte_level::qwen2_split_regex()}}},
                                         {"behavior", "Isolated"},
                                         {"invert", false}},
                                        byte_level_step})}}},
      {"post_processor", nullptr},
      {"decoder", byte_level_step},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merge_list}}}};
  std::ofstream out(out_json_path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(ErrorKind::kIo, "cannot write tokenizer.json", {out_json_path});
  out << root.dump(1) << "\n";
  if (!out) throw Error(ErrorKind::kIo, "cannot write tokenizer.json", {out_json_path});
}

}  // namespace promptcache
