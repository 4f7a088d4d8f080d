// A model's chat template from its folder (chat_template.jinja, tokenizer_config.json) or from
// text (GGUF), and the variables HF renders it with.
#include "promptcache/jinja/chat_source.hpp"

#include <fstream>
#include <sstream>

#include "core/tokenizer_config.hpp"
#include "promptcache/model/gguf.hpp"

namespace promptcache::jinja {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// tokenizer_config.json can carry a whole vocabulary of added tokens; a template file is small.
constexpr std::uintmax_t kMaxConfigBytes = 64u << 20;
constexpr int kMaxJsonDepth = 128;

std::string read_file(const fs::path& path, std::uintmax_t max_bytes) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot read file: " + ec.message(), {path.string()});
  if (size > max_bytes) {
    throw Error(kTemplateError,
                "the file has " + std::to_string(size) + " bytes, more than the " +
                    std::to_string(max_bytes) + " allowed",
                {path.string()});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot open file", {path.string()});
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

Value convert(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth) throw Error(kTemplateError, "JSON nested deeper than 128 levels");
  switch (j.type()) {
    case json::value_t::null:
      return Value::none();
    case json::value_t::boolean:
      return Value(j.get<bool>());
    case json::value_t::number_integer:
      return Value(static_cast<int64_t>(j.get<json::number_integer_t>()));
    case json::value_t::number_unsigned: {
      const auto u = j.get<json::number_unsigned_t>();
      if (u > static_cast<json::number_unsigned_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case json::value_t::number_float:
      return Value(j.get<double>());
    case json::value_t::string:
      return Value(j.get<std::string>());
    case json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(convert(item, depth + 1));
      return Value(std::move(items));
    }
    case json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it)
        dict->set(Value(it.key()), convert(it.value(), depth + 1));
      return Value::dict(dict);
    }
    default:
      throw Error(kTemplateError, "unsupported JSON value");
  }
}

}  // namespace

Value value_from_json(const nlohmann::ordered_json& json) {
  return convert(json, 0);
}

ChatTemplateSource from_string(std::string text, std::string origin,
                               std::optional<std::string> bos_token,
                               std::optional<std::string> eos_token) {
  ChatTemplateSource s;
  s.text = std::move(text);
  s.origin = std::move(origin);
  s.bos_token = std::move(bos_token);
  s.eos_token = std::move(eos_token);
  return s;
}

std::optional<ChatTemplateSource> find_chat_template(const fs::path& folder,
                                                     const std::string& name) {
  const fs::path config_path = folder / "tokenizer_config.json";
  const std::string config_file = config_path.string();
  std::optional<json> config;
  std::error_code ec;
  if (fs::is_regular_file(config_path, ec)) {
    const std::string bytes = read_file(config_path, kMaxConfigBytes);
    try {
      // nlohmann/json keeps objects sorted; order does not matter for the fields read here.
      config = json::parse(bytes);
    } catch (const json::exception& e) {
      throw Error(ErrorKind::kTokenizer, std::string("invalid JSON: ") + e.what(), {config_file});
    }
    if (!config->is_object())
      throw Error(ErrorKind::kTokenizer, "expected a JSON object", {config_file});
  }
  ChatTemplateSource source;
  if (config) {
    const auto tokens = detail::read_folder_token_config(folder);
    if (tokens.bos_token && tokens.bos_token->has_value()) source.bos_token = **tokens.bos_token;
    if (tokens.eos_token && tokens.eos_token->has_value()) source.eos_token = **tokens.eos_token;
  }
  const bool wants_named = !name.empty() && name != "default";
  // transformers: chat_template.jinja beside the config takes precedence; named ones live in
  // additional_chat_templates/NAME.jinja.
  const fs::path jinja_file = wants_named ? folder / "additional_chat_templates" / (name + ".jinja")
                                          : folder / "chat_template.jinja";
  if (fs::is_regular_file(jinja_file, ec)) {
    source.text = read_file(jinja_file, Limits{}.max_template_bytes);
    source.origin = jinja_file.string();
    return source;
  }
  if (!config) return std::nullopt;
  auto field = config->find("chat_template");
  if (field == config->end() || field->is_null()) {
    if (wants_named) {
      throw Error(kTemplateError, "the model has no chat template named '" + name + "'",
                  {config_file, 0, 0, "chat_template"});
    }
    return std::nullopt;
  }
  if (field->is_string()) {
    if (wants_named) {
      throw Error(kTemplateError,
                  "the model has one unnamed chat template, not one named '" + name + "'",
                  {config_file, 0, 0, "chat_template"});
    }
    source.text = field->get<std::string>();
    source.origin = config_file + ": chat_template";
    return source;
  }
  if (!field->is_array()) {
    throw Error(kTemplateError, "expected a string or a list of {name, template}",
                {config_file, 0, 0, "chat_template"});
  }
  const std::string wanted = name.empty() ? "default" : name;
  const json* chosen = nullptr;
  for (const json& item : *field) {
    if (!item.is_object() || !item.contains("name") || !item.contains("template") ||
        !item["name"].is_string() || !item["template"].is_string()) {
      throw Error(kTemplateError, "expected a list of {\"name\": ..., \"template\": ...}",
                  {config_file, 0, 0, "chat_template"});
    }
    source.names.push_back(item["name"].get<std::string>());
    if (source.names.back() == wanted) chosen = &item;
  }
  if (chosen == nullptr && name.empty() && field->size() == 1) chosen = &(*field)[0];
  if (chosen == nullptr) {
    std::string known;
    for (const auto& n : source.names) known += (known.empty() ? "" : ", ") + n;
    throw Error(kTemplateError,
                "no chat template named '" + wanted + "' (the model has: " + known + ")",
                {config_file, 0, 0, "chat_template"});
  }
  source.text = (*chosen)["template"].get<std::string>();
  source.origin = config_file + ": chat_template '" + (*chosen)["name"].get<std::string>() + "'";
  return source;
}

std::vector<std::pair<std::string, Value>> chat_variables(const ChatTemplateSource& source,
                                                          const ChatInputs& inputs) {
  std::vector<std::pair<std::string, Value>> vars;
  vars.emplace_back("messages", value_from_json(inputs.messages));
  vars.emplace_back("tools", inputs.tools ? value_from_json(*inputs.tools) : Value::none());
  vars.emplace_back("documents", Value::none());
  vars.emplace_back("add_generation_prompt", Value(inputs.add_generation_prompt));
  if (source.bos_token) vars.emplace_back("bos_token", Value(*source.bos_token));
  if (source.eos_token) vars.emplace_back("eos_token", Value(*source.eos_token));
  for (const auto& extra : inputs.extra) vars.push_back(extra);
  return vars;
}

std::string render_chat(const ChatTemplateSource& source, const ChatInputs& inputs,
                        const Limits& limits) {
  const Template t = Template::parse(source.text, source.origin, limits);
  return t.render(chat_variables(source, inputs));
}

std::optional<ChatTemplateSource> gguf_chat_template(const std::string& path) {
  const std::shared_ptr<gguf::File> file = gguf::File::open(path);
  std::optional<std::string> text = file->get_string("tokenizer.chat_template");
  if (!text) return std::nullopt;
  const gguf::Value* tokens = file->find("tokenizer.ggml.tokens");
  auto token = [&](const char* key) -> std::optional<std::string> {
    const std::optional<int64_t> id = file->get_int(key);
    if (!id || tokens == nullptr || tokens->type != gguf::ValueType::kArray ||
        tokens->item_type != gguf::ValueType::kString || *id < 0 ||
        static_cast<uint64_t>(*id) >= tokens->items.size()) {
      return std::nullopt;
    }
    return tokens->items[static_cast<std::size_t>(*id)].str;
  };
  return from_string(std::move(*text), path + ": tokenizer.chat_template",
                     token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"));
}

std::optional<ChatTemplateSource> model_chat_template_source(const fs::path& model,
                                                             const std::string& name) {
  if (gguf::is_gguf_file(model.string())) {
    if (!name.empty()) {
      throw Error(kTemplateError,
                  "a GGUF file holds one chat template (tokenizer.chat_template), no named ones: "
                  "'" +
                      name + "' was asked for",
                  {model.string()});
    }
    return gguf_chat_template(model.string());
  }
  std::error_code ec;
  if (!fs::is_directory(model, ec)) return std::nullopt;
  return find_chat_template(model, name);
}

}  // namespace promptcache::jinja
