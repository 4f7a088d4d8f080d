// A deterministic stand-in for SentencePiece used by the PML golden tests: one token per
// whitespace-separated word ("▁word", ids handed out in first-seen order from 3), with
// <unk>=0, <s>=1, </s>=2 and optional extra special pieces. Token counts are then easy to
// compute by hand: a span has as many tokens as words.
#pragma once

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"

namespace pml_test {

class FakeTokenizer final : public promptcache::Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> specials = {}) {
    for (const char* p : {"<unk>", "<s>", "</s>"}) intern(p);
    for (const auto& p : specials) intern(p);
  }

  std::vector<promptcache::TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<promptcache::TokenId> out;
    if (add_bos) out.push_back(1);
    std::istringstream in{std::string(text)};
    std::string word;
    while (in >> word) out.push_back(intern("\xE2\x96\x81" + word));
    return out;
  }
  std::string decode(const std::vector<promptcache::TokenId>& ids) const override {
    std::string out;
    for (auto id : ids) out += decode_piece(id);
    return out.size() && out[0] == ' ' ? out.substr(1) : out;
  }
  std::string decode_piece(promptcache::TokenId id) const override {
    const std::string p = id_to_piece(id);
    return p.rfind("\xE2\x96\x81", 0) == 0 ? " " + p.substr(3) : p;
  }
  promptcache::TokenId bos_id() const override { return 1; }
  promptcache::TokenId eos_id() const override { return 2; }
  promptcache::TokenId unk_id() const override { return 0; }
  promptcache::TokenId pad_id() const override { return -1; }
  std::size_t vocab_size() const override { return pieces_.size(); }
  promptcache::TokenId piece_to_id(std::string_view piece) const override {
    auto it = ids_.find(std::string(piece));
    return it == ids_.end() ? -1 : it->second;
  }
  std::string id_to_piece(promptcache::TokenId id) const override {
    return id >= 0 && static_cast<std::size_t>(id) < pieces_.size() ? pieces_[id] : "";
  }
  // The id of a word as encode() gives it.
  promptcache::TokenId word(const std::string& w) const { return intern("\xE2\x96\x81" + w); }

 private:
  promptcache::TokenId intern(const std::string& piece) const {
    auto it = ids_.find(piece);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<promptcache::TokenId>(pieces_.size());
    ids_.emplace(piece, id);
    pieces_.push_back(piece);
    return id;
  }
  mutable std::map<std::string, promptcache::TokenId> ids_;
  mutable std::vector<std::string> pieces_;
};

}  // namespace pml_test
