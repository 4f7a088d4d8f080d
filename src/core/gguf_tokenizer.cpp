// gguf_tokenizer.cpp — a GGUF file's tokenizer.ggml.* metadata to and from the project's two
// tokenizers: "llama" vocabularies become SentencePiece model data (sentencepiece_data.hpp),
// "gpt2" vocabularies a tokenizer.json document for the byte-level BPE encoder.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "byte_level.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/gguf_vocab.hpp"
#include "sentencepiece_data.hpp"
#include "tokenizer_config.hpp"

namespace promptcache::gguf {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5;

// llama.cpp's pre-tokenizer names this build runs, and the split regex each stands for.
struct PreTokenizer {
  const char* name;
  const char* regex;
  bool nfc;
};
const PreTokenizer kPreTokenizers[] = {{"qwen2", byte_level::qwen2_split_regex(), true}};

std::string pre_names() {
  std::string out;
  for (const auto& p : kPreTokenizers) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

[[noreturn]] void fail(const std::string& origin, const std::string& message,
                       const std::string& key) {
  throw Error(ErrorKind::kModel, message, {origin, 0, 0, "key '" + key + "'"});
}

const Value& array_of(const File& f, const std::string& key, ValueType item, bool required) {
  static const Value empty = [] {
    Value v;
    v.type = ValueType::kArray;
    return v;
  }();
  const Value* v = f.find(key);
  if (!v) {
    if (required) fail(f.path(), "is missing (the file has no usable tokenizer)", key);
    return empty;
  }
  if (v->type != ValueType::kArray || v->item_type != item) {
    fail(f.path(), "must be an array of " + std::string(value_type_name(item)), key);
  }
  return *v;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open file", {path.string()});
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// tokenizer.json's byte-level BPE as a Vocab ("gpt2").
void bpe_folder_vocab(const fs::path& file, Vocab& v) {
  const std::string origin = file.string();
  json root;
  try {
    root = json::parse(read_text(file));
  } catch (const json::exception& e) {
    throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(), {origin});
  }
  const json& model = root.value("model", json::object());
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object()) {
    throw Error(ErrorKind::kTokenizer, "GGUF conversion needs a BPE model with a vocab", {origin});
  }
  // The split regex names the pre-tokenizer.
  std::string regex;
  const json pre = root.value("pre_tokenizer", json());
  auto find_split = [&regex](const json& step) {
    if (step.is_object() && step.value("type", "") == "Split" && step.contains("pattern") &&
        step["pattern"].is_object() && step["pattern"].contains("Regex") &&
        step["pattern"]["Regex"].is_string()) {
      regex = step["pattern"]["Regex"].get<std::string>();
    }
  };
  find_split(pre);
  if (pre.is_object() && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const json& step : pre["pretokenizers"]) find_split(step);
  }
  for (const auto& p : kPreTokenizers) {
    if (regex == p.regex) v.pre = p.name;
  }
  if (v.pre.empty()) {
    throw Error(ErrorKind::kTokenizer,
                "the pre-tokenizer's split regex is not one llama.cpp names that this build "
                "converts (" +
                    pre_names() + ")",
                {origin});
  }
  std::map<int64_t, std::pair<std::string, int>> by_id;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0) {
      throw Error(ErrorKind::kTokenizer, "vocab id must be a non-negative integer",
                  {origin, 0, 0, "token '" + it.key() + "'"});
    }
    by_id[it.value().get<int64_t>()] = {it.key(), kNormal};
  }
  for (const json& a : root.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        !a.contains("content") || !a["content"].is_string()) {
      throw Error(ErrorKind::kTokenizer, "added_tokens entries need an id and a content", {origin});
    }
    by_id[a["id"].get<int64_t>()] = {a["content"].get<std::string>(),
                                     a.value("special", false) ? kControl : kUserDefined};
  }
  const int64_t n = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  if (n > (1 << 24)) throw Error(ErrorKind::kTokenizer, "vocabulary ids too large", {origin});
  for (int64_t id = 0; id < n; ++id) {
    auto it = by_id.find(id);
    // llama.cpp's converter fills holes in the ids the same way.
    v.tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(id) + "]" : it->second.first);
    v.token_types.push_back(it == by_id.end() ? kUnused : it->second.second);
  }
  for (const json& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      throw Error(ErrorKind::kTokenizer, "a merge must be \"a b\" or [\"a\", \"b\"]", {origin});
    }
  }
}

// The tokenizer.json document of a "gpt2" vocabulary.
std::string bpe_json(const Vocab& v, const PreTokenizer& pre) {
  using ojson = nlohmann::ordered_json;
  ojson vocab = ojson::object();
  ojson added = ojson::array();
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    const int type = v.token_types.empty() ? kNormal : v.token_types[id];
    if (type == kControl || type == kUserDefined) {
      added.push_back({{"id", id},
                       {"content", v.tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type == kControl}});
    } else {
      vocab[v.tokens[id]] = id;
    }
  }
  ojson merges = ojson::array();
  for (const std::string& m : v.merges) merges.push_back(m);
  const ojson byte_level_step = {{"type", "ByteLevel"},
                                 {"add_prefix_space", false},
                                 {"trim_offsets", false},
                                 {"use_regex", false}};
  ojson root = {{"version", "1.0"},
                {"added_tokens", added},
                {"normalizer", pre.nfc ? ojson{{"type", "NFC"}} : ojson()},
                {"pre_tokenizer",
                 {{"type", "Sequence"},
                  {"pretokenizers", ojson::array({{{"type", "Split"},
                                                   {"pattern", {{"Regex", pre.regex}}},
                                                   {"behavior", "Isolated"},
                                                   {"invert", false}},
                                                  byte_level_step})}}},
                {"post_processor", nullptr},
                {"decoder", byte_level_step},
                {"model",
                 {{"type", "BPE"},
                  {"byte_fallback", false},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merges}}}};
  return root.dump();
}

}  // namespace

Vocab read_vocab(const File& f) {
  Vocab v;
  const std::string model_key = "tokenizer.ggml.model";
  const auto model = f.get_string(model_key);
  if (!model) fail(f.path(), "is missing (the file has no tokenizer)", model_key);
  v.model = *model;
  if (v.model != "llama" && v.model != "gpt2") {
    throw Error(ErrorKind::kTokenizer,
                "tokenizer.ggml.model '" + v.model +
                    "' is not supported (this build runs 'llama' and 'gpt2')",
                {f.path(), 0, 0, "key '" + model_key + "'"});
  }
  const Value& tokens = array_of(f, "tokenizer.ggml.tokens", ValueType::kString, true);
  const std::size_t n = tokens.items.size();
  if (n == 0) fail(f.path(), "is empty", "tokenizer.ggml.tokens");
  v.tokens.reserve(n);
  for (const Value& t : tokens.items) v.tokens.push_back(t.str);
  const Value& types = array_of(f, "tokenizer.ggml.token_type", ValueType::kInt32, false);
  if (!types.items.empty() && types.items.size() != n) {
    fail(f.path(),
         "has " + std::to_string(types.items.size()) + " entries for " + std::to_string(n) +
             " tokens",
         "tokenizer.ggml.token_type");
  }
  for (const Value& t : types.items) {
    if (t.i < 1 || t.i > 6)
      fail(f.path(), "holds an unknown token type", "tokenizer.ggml.token_type");
    v.token_types.push_back(static_cast<int32_t>(t.i));
  }
  if (v.model == "llama") {
    const Value& scores = array_of(f, "tokenizer.ggml.scores", ValueType::kFloat32, true);
    if (scores.items.size() != n) {
      fail(f.path(),
           "has " + std::to_string(scores.items.size()) + " entries for " + std::to_string(n) +
               " tokens",
           "tokenizer.ggml.scores");
    }
    for (const Value& s : scores.items) v.scores.push_back(static_cast<float>(s.f));
  } else {
    const auto pre = f.get_string("tokenizer.ggml.pre");
    v.pre = pre.value_or("default");
    bool known = false;
    for (const auto& p : kPreTokenizers) known = known || v.pre == p.name;
    if (!known) {
      throw Error(
          ErrorKind::kTokenizer,
          "pre-tokenizer '" + v.pre + "' is not supported (this build runs " + pre_names() + ")",
          {f.path(), 0, 0, "key 'tokenizer.ggml.pre'"});
    }
    const Value& merges = array_of(f, "tokenizer.ggml.merges", ValueType::kString, true);
    for (const Value& m : merges.items) v.merges.push_back(m.str);
  }
  auto id = [&](const std::string& key) -> int64_t {
    const auto i = f.get_int(key);
    if (!i) return -1;
    if (*i >= static_cast<int64_t>(n)) {
      fail(f.path(),
           "id " + std::to_string(*i) + " is not below the " + std::to_string(n) + " tokens", key);
    }
    return *i;
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  v.remove_extra_whitespaces = f.get_bool("tokenizer.ggml.remove_extra_whitespaces");
  v.chat_template = f.get_string("tokenizer.chat_template").value_or("");
  return v;
}

void put_vocab(Writer& w, const Vocab& v) {
  w.set("tokenizer.ggml.model", Value::string(v.model));
  if (!v.pre.empty()) w.set("tokenizer.ggml.pre", Value::string(v.pre));
  w.set("tokenizer.ggml.tokens", Value::strings(v.tokens));
  if (!v.scores.empty()) w.set("tokenizer.ggml.scores", Value::f32s(v.scores));
  if (!v.token_types.empty()) w.set("tokenizer.ggml.token_type", Value::i32s(v.token_types));
  if (!v.merges.empty()) w.set("tokenizer.ggml.merges", Value::strings(v.merges));
  const std::pair<const char*, int64_t> ids[] = {{"tokenizer.ggml.bos_token_id", v.bos},
                                                 {"tokenizer.ggml.eos_token_id", v.eos},
                                                 {"tokenizer.ggml.unknown_token_id", v.unk},
                                                 {"tokenizer.ggml.padding_token_id", v.pad}};
  for (const auto& [key, id] : ids) {
    if (id >= 0) w.set(key, Value::u32(static_cast<uint32_t>(id)));
  }
  if (v.add_bos) w.set("tokenizer.ggml.add_bos_token", Value::boolean(*v.add_bos));
  if (v.add_eos) w.set("tokenizer.ggml.add_eos_token", Value::boolean(*v.add_eos));
  if (v.add_space_prefix)
    w.set("tokenizer.ggml.add_space_prefix", Value::boolean(*v.add_space_prefix));
  if (v.remove_extra_whitespaces) {
    w.set("tokenizer.ggml.remove_extra_whitespaces", Value::boolean(*v.remove_extra_whitespaces));
  }
  if (!v.chat_template.empty()) w.set("tokenizer.chat_template", Value::string(v.chat_template));
}

Vocab vocab_from_folder(const std::string& dir) {
  Vocab v;
  const fs::path folder(dir);
  std::error_code ec;
  if (fs::is_regular_file(folder / "tokenizer.json", ec)) {
    v.model = "gpt2";
    bpe_folder_vocab(folder / "tokenizer.json", v);
  } else if (fs::is_regular_file(folder / "tokenizer.model", ec)) {
    const fs::path file = folder / "tokenizer.model";
    const auto data = detail::parse_sentencepiece_model(read_text(file), file.string());
    if (data.model_type != 2 || !data.charmap.empty()) {
      throw Error(ErrorKind::kTokenizer,
                  "only BPE SentencePiece models with the identity normalizer convert to GGUF",
                  {file.string()});
    }
    v.model = "llama";
    for (const auto& p : data.pieces) {
      v.tokens.push_back(p.text);
      v.scores.push_back(p.score);
      v.token_types.push_back(p.type);
    }
    v.add_space_prefix = data.add_dummy_prefix;
    v.remove_extra_whitespaces = data.remove_extra_whitespaces;
  } else {
    throw Error(ErrorKind::kIo, "the folder has neither tokenizer.json nor tokenizer.model", {dir});
  }
  // The ids and add_bos as the folder's own loader resolves them.
  const auto tok = load_tokenizer(dir);
  v.bos = tok->bos_id();
  v.eos = tok->eos_id();
  v.unk = tok->unk_id();
  v.pad = tok->pad_id();
  v.add_bos = tok->adds_bos();
  v.add_eos = false;
  const fs::path config = folder / "tokenizer_config.json";
  if (fs::is_regular_file(config, ec)) {
    try {
      const json j = json::parse(read_text(config));
      if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string()) {
        v.chat_template = j["chat_template"].get<std::string>();
      }
    } catch (const json::exception& e) {
      throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(),
                  {config.string()});
    }
  }
  return v;
}

std::unique_ptr<Tokenizer> tokenizer_from_vocab(const Vocab& v, const std::string& origin) {
  std::unique_ptr<Tokenizer> inner;
  detail::SpecialIds guess;
  if (v.model == "llama") {
    detail::SentencePieceData data;
    data.model_type = 2;
    for (std::size_t i = 0; i < v.tokens.size(); ++i) {
      detail::SentencePieceData::Piece p;
      p.text = v.tokens[i];
      p.score = i < v.scores.size() ? v.scores[i] : 0.0f;
      p.type = i < v.token_types.size() ? v.token_types[i] : kNormal;
      if (p.type == 6) data.byte_fallback = true;
      data.pieces.push_back(std::move(p));
    }
    auto id32 = [](int64_t id) { return static_cast<int32_t>(id); };
    data.unk_id = id32(v.unk);
    data.bos_id = id32(v.bos);
    data.eos_id = id32(v.eos);
    data.pad_id = id32(v.pad);
    data.normalizer_name = "identity";
    data.add_dummy_prefix = v.add_space_prefix.value_or(true);
    data.remove_extra_whitespaces = v.remove_extra_whitespaces.value_or(false);
    inner = detail::sentencepiece_tokenizer_from_data(std::move(data), origin);
    guess.adds_bos = v.add_bos.value_or(true);
  } else {
    const PreTokenizer* pre = nullptr;
    for (const auto& p : kPreTokenizers) {
      if (v.pre == p.name) pre = &p;
    }
    if (!pre) {
      throw Error(ErrorKind::kTokenizer, "pre-tokenizer '" + v.pre + "' is not supported",
                  {origin});
    }
    inner = detail::load_bpe_tokenizer_from_json(bpe_json(v, *pre), origin);
    guess.adds_bos = v.add_bos.value_or(false);
  }
  guess.bos = static_cast<TokenId>(v.bos);
  guess.eos = static_cast<TokenId>(v.eos);
  guess.unk = v.unk >= 0 ? static_cast<TokenId>(v.unk) : inner->unk_id();
  guess.pad = static_cast<TokenId>(v.pad);
  const Tokenizer& t = *inner;
  auto ids = detail::resolve_special_ids(
      detail::FolderTokenConfig{}, guess,
      [&t](const std::string& piece) { return t.piece_to_id(piece); },
      detail::end_of_turn_token_names(), t.vocab_size());
  return std::make_unique<detail::ConfiguredTokenizer>(std::move(inner), std::move(ids));
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  const auto file = File::open(path);
  return tokenizer_from_vocab(read_vocab(*file), path);
}

}  // namespace promptcache::gguf
