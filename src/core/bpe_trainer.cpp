// A small byte-level BPE trainer that writes a HuggingFace tokenizer.json (GPT-2 byte mapping and
// a family's pipeline: Qwen2's NFC and split regex by default, or BLOOM's, GPT-NeoX's (MPT) or
// Falcon's). The corpus is pre-tokenized by the same code the encoder runs (bpe_pre_tokenize.cpp)
// over the family's sections, so merges never cross a boundary the encoder keeps. Used by tests,
// benchmarks and make-model.
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

#include "bpe_pipeline.hpp"
#include "byte_level.hpp"
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

using ojson = nlohmann::ordered_json;

// The sections of a family's tokenizer.json besides the vocabulary, as its published file has
// them (pre-tokenizer regexes and options, normalizer, post-processor, decoder), plus the plain
// (non-special) added tokens it defines.
struct FamilySections {
  ojson normalizer, pre_tokenizer, post_processor, decoder;
  std::vector<std::string> plain_added;
};

ojson byte_level_step(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

ojson split_step(const std::string& regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

FamilySections family_sections(BpeFamily family) {
  FamilySections f;
  switch (family) {
    case BpeFamily::kQwen2:
      f.normalizer = {{"type", "NFC"}};
      f.pre_tokenizer = {
          {"type", "Sequence"},
          {"pretokenizers", ojson::array({split_step(byte_level::qwen2_split_regex()),
                                          byte_level_step(false, false, false)})}};
      f.post_processor = nullptr;
      f.decoder = byte_level_step(false, false, false);
      break;
    case BpeFamily::kBloom:
      // bigscience/bloom: no normalizer; the split regex JS cannot parse (transformers.js
      // rewrites it, and so does JsRegex); ByteLevel without its regex.
      f.normalizer = nullptr;
      f.pre_tokenizer = {
          {"type", "Sequence"},
          {"pretokenizers",
           ojson::array({split_step(" ?[^(\\s|[.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C"
                                    "\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C])]+"),
                         byte_level_step(false, true, false)})}};
      f.post_processor = {
          {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}};
      f.decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}};
      break;
    case BpeFamily::kGptNeox:
      // EleutherAI/gpt-neox-20b (MPT's tokenizer): NFC, ByteLevel with GPT-2's regex, and runs
      // of 24 down to 2 spaces as plain added tokens.
      f.normalizer = {{"type", "NFC"}};
      f.pre_tokenizer = {
          {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
      f.post_processor = {
          {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
      f.decoder = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};
      for (int n = 24; n >= 2; --n) f.plain_added.push_back(std::string(n, ' '));
      break;
    case BpeFamily::kFalcon:
      // tiiuae/falcon-7b: punctuation runs, then ByteLevel with its regex, then digit runs cut
      // into groups of three, the last two on the byte characters.
      f.normalizer = nullptr;
      f.pre_tokenizer = {
          {"type", "Sequence"},
          {"pretokenizers", ojson::array({{{"type", "Punctuation"}, {"behavior", "Contiguous"}},
                                          byte_level_step(false, true, true),
                                          {{"type", "Digits"}, {"individual_digits", false}},
                                          split_step("[0-9][0-9][0-9]")})}};
      f.post_processor = nullptr;
      f.decoder = byte_level_step(true, true, true);
      break;
  }
  return f;
}

}  // namespace

BpeFamily bpe_family_from_name(const std::string& name) {
  if (name == "qwen2") return BpeFamily::kQwen2;
  if (name == "bloom") return BpeFamily::kBloom;
  if (name == "gpt-neox" || name == "mpt") return BpeFamily::kGptNeox;
  if (name == "falcon") return BpeFamily::kFalcon;
  throw Error(ErrorKind::kInvalidArgument, "unknown tokenizer family '" + name +
                                               "' (known: qwen2, bloom, gpt-neox or mpt, falcon)");
}

void train_bpe_tokenizer(const std::string& corpus_text, int vocab_size,
                         const std::vector<std::string>& special_tokens,
                         const std::string& out_json_path, BpeFamily family) {
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
    if (s.empty() || !seen_special.insert(s).second ||
        (family == BpeFamily::kGptNeox && s.find_first_not_of(' ') == std::string::npos)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "special tokens must be non-empty and distinct ('" + s + "')", {out_json_path});
    }
  }

  // The family's tokenizer.json sections; its pre-tokens are what training counts.
  const FamilySections sections = family_sections(family);
  bpe::Pipeline pipeline;
  const bpe::JsonReader reader(out_json_path);
  if (!sections.normalizer.is_null()) {
    bpe::read_normalizer(nlohmann::json::parse(sections.normalizer.dump()), "normalizer", reader,
                         pipeline);
  }
  bpe::read_pre_tokenizer(nlohmann::json::parse(sections.pre_tokenizer.dump()), "pre_tokenizer",
                          reader, pipeline);
  // A ByteLevel step that is not last hands the steps after it byte characters (Falcon).
  bool encoded = false;
  for (std::size_t i = 0; i + 1 < pipeline.pre.size(); ++i) {
    encoded = encoded || pipeline.pre[i].kind == bpe::PreTokenizer::kByteLevel;
  }

  // Pre-tokens of the corpus as the tokenizer will see them (raw bytes), with their counts.
  const std::string text =
      bpe::normalize(pipeline.normalizers, unicode::to_valid_utf8(corpus_text));
  std::unordered_map<std::string, int64_t> counts;
  bpe::pre_tokenize(pipeline.pre, 0, text, true, [&](std::string_view piece, bool) {
    if (!encoded) {
      ++counts[std::string(piece)];
      return;
    }
    std::string bytes;
    for (std::size_t i = 0; i < piece.size();) {
      const int b = byte_level::byte_of(unicode::next_code_point(piece, i));
      if (b >= 0) bytes += static_cast<char>(b);
    }
    if (!bytes.empty()) ++counts[bytes];
  });

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
  for (const auto& content : sections.plain_added) {
    added.push_back({{"id", tokens.size() + added.size()},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", true},
                     {"special", false}});
  }
  ojson root = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens", added},
                {"normalizer", sections.normalizer},
                {"pre_tokenizer", sections.pre_tokenizer},
                {"post_processor", sections.post_processor},
                {"decoder", sections.decoder},
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
