// The real stories260K model's recorded greedy reference (models/stories260K/reference.json),
// for the tests that check a precision option against it.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"
#include "support/catch_torch.hpp"
#include "support/test_support.hpp"

namespace promptcache::test {

struct Stories260kReference {
  nlohmann::json json;              // the whole file
  std::vector<TokenId> prompt_ids;  // the prompt as the model's tokenizer encodes it (BOS first)
  std::vector<TokenId> greedy_ids;  // the reference's greedy continuation
  int greedy_new_tokens = 0;
};

// The reference (std::runtime_error when the model's files are missing: checked_stories260k_dir).
inline Stories260kReference stories260k_reference() {
  const std::string dir = checked_stories260k_dir();
  std::ifstream in(dir + "/reference.json");
  Stories260kReference r;
  r.json = nlohmann::json::parse(in);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  r.prompt_ids = tok->encode(r.json["prompt"].get<std::string>(), /*add_bos=*/true);
  r.greedy_ids = r.json["greedy_ids"].get<std::vector<TokenId>>();
  r.greedy_new_tokens = r.json["greedy_new_tokens"].get<int>();
  return r;
}

// How many leading tokens of `got` equal the reference's greedy ids.
inline std::size_t greedy_tokens_matching(const Stories260kReference& ref,
                                          const std::vector<TokenId>& got) {
  std::size_t same = 0;
  while (same < ref.greedy_ids.size() && same < got.size() && got[same] == ref.greedy_ids[same]) {
    ++same;
  }
  return same;
}

}  // namespace promptcache::test
