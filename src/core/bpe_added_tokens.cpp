// src/core/bpe_added_tokens.cpp — the added tokens of a tokenizer.json ("added_tokens"):
// special tokens such as <|im_end|> and user-added words.
//
// transformers.js cuts them out of the raw text before anything else runs (normalizers and
// pre-tokenizers never see them): the longest added token at the leftmost position wins, found
// through a byte trie, and lstrip/rstrip trim the white space of the text beside them. The same
// list gives the first guess of the BOS/EOS/end-of-turn ids, which a model folder's
// tokenizer_config.json and generation_config.json may then override.
#include <algorithm>

#include "bpe_pipeline.hpp"

namespace promptcache::bpe {

void AddedTokens::read(const json& root, const JsonReader& in, std::size_t defined) {
  const json* list = in.find(root, "added_tokens");
  if (!list) return;
  in.array(*list, "added_tokens");
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& t = (*list)[i];
    if (!t.is_object()) in.fail(field, "expected an object");
    AddedToken a;
    const long long id = in.integer(in.require(t, "id", field + ".id"), field + ".id");
    if (id < 0 || id > max_dense_id(defined + list->size())) {
      in.fail(field + ".id", "id out of range: " + std::to_string(id) + " (the file defines " +
                                 std::to_string(defined + list->size()) +
                                 " tokens, numbered from 0)");
    }
    a.id = static_cast<TokenId>(id);
    a.content = in.string(in.require(t, "content", field + ".content"), field + ".content");
    if (a.content.empty()) in.fail(field + ".content", "an added token cannot be empty");
    a.special = in.flag(t, "special", field + ".special", false);
    a.lstrip = in.flag(t, "lstrip", field + ".lstrip", false);
    a.rstrip = in.flag(t, "rstrip", field + ".rstrip", false);
    added_.push_back(a);
  }
  // A byte trie of the added tokens for longest-match cutting.
  trie_.assign(1, TrieNode{});
  for (std::size_t k = 0; k < added_.size(); ++k) {
    int node = 0;
    for (unsigned char c : added_[k].content) {
      auto& kids = trie_[node].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& p) { return p.first == c; });
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

const AddedToken* AddedTokens::match(std::string_view text, std::size_t i) const {
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

std::vector<AddedTokens::Section> AddedTokens::split(std::string_view valid) const {
  std::vector<Section> sections;
  std::size_t start = 0;
  for (std::size_t i = 0; i < valid.size();) {
    const AddedToken* found = match(valid, i);
    if (!found) {
      ++i;
      continue;
    }
    if (i > start) sections.push_back({valid.substr(start, i - start), nullptr});
    sections.push_back({found->content, found});
    i += found->content.size();
    start = i;
  }
  if (start < valid.size()) sections.push_back({valid.substr(start), nullptr});
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
  return sections;
}

TokenId AddedTokens::find(const std::string& content) const {
  for (const auto& a : added_)
    if (a.content == content) return a.id;
  return -1;
}

detail::SpecialIds guess_special_ids(const json& root, const JsonReader& in,
                                     const AddedTokens& added, TokenId unk) {
  detail::SpecialIds ids;
  auto special = [&](const std::string& content) { return added.find(content); };
  auto first_of = [&](std::initializer_list<const char*> names) -> TokenId {
    for (const char* n : names) {
      const TokenId id = special(n);
      if (id >= 0) return id;
    }
    return -1;
  };
  ids.bos = first_of({"<|begin_of_text|>", "<s>", "<bos>"});
  ids.eos = first_of({"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", "<|im_end|>"});
  ids.unk = unk;
  // A TemplateProcessing post-processor (alone or in a Sequence: Llama 3.1) says whether BOS
  // goes first; a ByteLevel one adds nothing (BLOOM's <s>); without a post-processor a tokenizer
  // with a BOS token adds it (Llama 2).
  bool adds = ids.bos >= 0;
  if (const json* post = in.find(root, "post_processor")) {
    std::vector<const json*> processors = {post};
    if (in.string_or(*post, "type", "post_processor.type", "") == "Sequence") {
      processors.clear();
      if (const json* list = in.find(*post, "processors"); list && list->is_array()) {
        for (const auto& p : *list) processors.push_back(&p);  // one level: HuggingFace's shape
      }
    }
    bool template_found = false, byte_level = false;
    for (const json* p : processors) {
      const std::string type = in.string_or(*p, "type", "post_processor.type", "");
      byte_level = byte_level || type == "ByteLevel";
      if (type != "TemplateProcessing") continue;
      template_found = true;
      adds = false;
      if (const json* single = in.find(*p, "single"); single && single->is_array()) {
        for (const auto& item : *single) {
          const json* st = in.find(item, "SpecialToken");
          const json* id = st ? in.find(*st, "id") : nullptr;
          if (id && id->is_string() && special(id->get<std::string>()) == ids.bos) {
            adds = ids.bos >= 0;
          }
        }
      }
    }
    // Llama 3's first tokenizer.json had only the ByteLevel post-processor, yet Meta's code
    // always puts <|begin_of_text|> first; that BOS stays.
    if (!template_found && byte_level && ids.bos != added.find("<|begin_of_text|>")) adds = false;
  }
  ids.adds_bos = adds;
  ids.end_of_turn.clear();
  if (ids.eos >= 0) ids.end_of_turn.push_back(ids.eos);
  for (const auto& name : detail::end_of_turn_token_names()) {
    for (const auto& a : added.list()) {
      if (a.special && a.content == name &&
          std::find(ids.end_of_turn.begin(), ids.end_of_turn.end(), a.id) ==
              ids.end_of_turn.end()) {
        ids.end_of_turn.push_back(a.id);
      }
    }
  }
  return ids;
}

}  // namespace promptcache::bpe
