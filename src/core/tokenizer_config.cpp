// BOS/EOS/end-of-turn ids from tokenizer_config.json and generation_config.json.
#include "tokenizer_config.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "promptcache/error.hpp"

namespace promptcache::detail {
namespace {

using json = nlohmann::json;

std::optional<json> read_json_if_present(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open file", {path.string()});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  try {
    return json::parse(bytes.str());
  } catch (const json::exception& e) {
    // json::exception, not only parse_error: "1e400" throws out_of_range (found by fuzzing the
    // same parse in load_bpe_tokenizer).
    throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(), {path.string()});
  }
}

// "<s>", {"content": "<s>", ...} (an AddedToken dict) or null.
std::optional<std::optional<std::string>> token_field(const json& config, const char* key,
                                                      const std::string& file) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_null()) return std::optional<std::string>{};
  if (it->is_string()) return std::optional<std::string>{it->get<std::string>()};
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) {
      return std::optional<std::string>{content->get<std::string>()};
    }
  }
  throw Error(ErrorKind::kTokenizer,
              std::string("expected a token string, an object with \"content\" or null"),
              {file, 0, 0, key});
}

}  // namespace

FolderTokenConfig read_folder_token_config(const std::filesystem::path& folder) {
  FolderTokenConfig out;
  const auto tc_path = folder / "tokenizer_config.json";
  if (auto tc = read_json_if_present(tc_path)) {
    const std::string file = tc_path.string();
    if (!tc->is_object()) throw Error(ErrorKind::kTokenizer, "expected a JSON object", {file});
    out.bos_token = token_field(*tc, "bos_token", file);
    out.eos_token = token_field(*tc, "eos_token", file);
    out.pad_token = token_field(*tc, "pad_token", file);
    out.unk_token = token_field(*tc, "unk_token", file);
    auto add = tc->find("add_bos_token");
    if (add != tc->end() && !add->is_null()) {
      if (!add->is_boolean()) {
        throw Error(ErrorKind::kTokenizer, "expected true or false", {file, 0, 0, "add_bos_token"});
      }
      out.add_bos_token = add->get<bool>();
    }
  }
  const auto gc_path = folder / "generation_config.json";
  if (auto gc = read_json_if_present(gc_path)) {
    const std::string file = gc_path.string();
    if (!gc->is_object()) throw Error(ErrorKind::kTokenizer, "expected a JSON object", {file});
    out.generation_config_file = file;
    // An id must fit a TokenId: get<TokenId>() would wrap 4294967297 to 1.
    auto token_id = [&](const json& id, const char* field) {
      if (!id.is_number_integer() || id.get<long long>() < 0 ||
          id.get<long long>() > std::numeric_limits<TokenId>::max() ||
          (id.is_number_unsigned() &&
           id.get<unsigned long long>() >
               static_cast<unsigned long long>(std::numeric_limits<TokenId>::max()))) {
        throw Error(ErrorKind::kTokenizer, "expected a token id (a non-negative integer)",
                    {file, 0, 0, field});
      }
      return static_cast<TokenId>(id.get<long long>());
    };
    auto bos = gc->find("bos_token_id");
    if (bos != gc->end() && bos->is_number_integer()) {
      out.generation_bos_id = token_id(*bos, "bos_token_id");
    }
    auto eos = gc->find("eos_token_id");
    if (eos != gc->end() && !eos->is_null()) {
      if (eos->is_number_integer()) {
        out.generation_eos_ids.push_back(token_id(*eos, "eos_token_id"));
      } else if (eos->is_array()) {
        for (const auto& id : *eos) {
          if (!id.is_number_integer()) {
            throw Error(ErrorKind::kTokenizer, "expected an integer id or a list of them",
                        {file, 0, 0, "eos_token_id"});
          }
          out.generation_eos_ids.push_back(token_id(id, "eos_token_id"));
        }
      } else {
        throw Error(ErrorKind::kTokenizer, "expected an integer id or a list of them",
                    {file, 0, 0, "eos_token_id"});
      }
    }
  }
  return out;
}

SpecialIds resolve_special_ids(const FolderTokenConfig& config, SpecialIds guess,
                               const std::function<TokenId(const std::string&)>& lookup,
                               const std::vector<std::string>& end_of_turn_names,
                               std::size_t vocab_size) {
  // generation_config.json gives bare ids: one outside the vocabulary became the BOS put before
  // every prompt (or an EOS), an id the model's embedding cannot take (found with the fuzz
  // harness's invariant that special ids are vocabulary ids).
  auto check_id = [&](TokenId id, const char* field) {
    if (id >= 0 && static_cast<std::size_t>(id) < vocab_size) return;
    throw Error(ErrorKind::kTokenizer,
                "token id " + std::to_string(id) + " is outside the vocabulary (" +
                    std::to_string(vocab_size) + " tokens)",
                {config.generation_config_file, 0, 0, field});
  };
  if (config.generation_bos_id) check_id(*config.generation_bos_id, "bos_token_id");
  for (TokenId id : config.generation_eos_ids) check_id(id, "eos_token_id");
  SpecialIds ids = guess;
  // A named token the vocabulary lacks keeps the tokenizer's own id; an explicit null clears it.
  auto apply = [&](const std::optional<std::optional<std::string>>& field, TokenId& id) {
    if (!field) return false;
    if (!field->has_value()) {
      id = -1;
      return true;
    }
    const TokenId found = lookup(**field);
    if (found >= 0) id = found;
    return true;
  };
  if (!apply(config.bos_token, ids.bos) && config.generation_bos_id) {
    ids.bos = *config.generation_bos_id;
  }
  if (!apply(config.eos_token, ids.eos) && !config.generation_eos_ids.empty()) {
    ids.eos = config.generation_eos_ids.front();
  }
  apply(config.pad_token, ids.pad);
  apply(config.unk_token, ids.unk);
  ids.adds_bos = config.add_bos_token.value_or(guess.adds_bos) && ids.bos >= 0;

  std::vector<TokenId> turn;
  auto add = [&](TokenId id) {
    if (id >= 0 && std::find(turn.begin(), turn.end(), id) == turn.end()) turn.push_back(id);
  };
  add(ids.eos);
  for (TokenId id : config.generation_eos_ids) add(id);
  for (TokenId id : guess.end_of_turn) add(id);
  for (const auto& name : end_of_turn_names) add(lookup(name));
  ids.end_of_turn = std::move(turn);
  return ids;
}

const std::vector<std::string>& end_of_turn_token_names() {
  static const std::vector<std::string> names = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>",
                                                 "<|endoftext|>"};
  return names;
}

}  // namespace promptcache::detail
