// promptcache/jinja/chat_source.hpp — where a model's Jinja chat template comes from, and
// rendering it on a conversation the way HF's apply_chat_template does.
//
// A model folder carries its template as `chat_template.jinja` (current transformers; it takes
// precedence), or as tokenizer_config.json's `chat_template`: a string, or a list of
// {"name", "template"} of which "default" is used unless another is named (e.g. "tool_use").
// A GGUF file carries it as the metadata string `tokenizer.chat_template`: the GGUF reader passes
// that text to from_string(). bos_token/eos_token are the model's own (tokenizer_config.json's
// string or {"content": ...} form). No LibTorch.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "promptcache/jinja/template.hpp"

namespace promptcache::jinja {

struct ChatTemplateSource {
  std::string text;    // the Jinja source
  std::string origin;  // where it came from, for errors and `promptcache info`
  std::optional<std::string> bos_token, eos_token;
  std::vector<std::string> names;  // the named templates of a list-form chat_template
};

// A template given as text (GGUF's tokenizer.chat_template, a --template file). `origin` names
// it in errors, e.g. "model.gguf: tokenizer.chat_template".
ChatTemplateSource from_string(std::string text, std::string origin,
                               std::optional<std::string> bos_token = std::nullopt,
                               std::optional<std::string> eos_token = std::nullopt);

// The folder's template, or nullopt when it has none. `name` picks a named template (empty:
// "default", or the only one). Error(kTemplateError) naming the file when the field is malformed or
// `name` is not among the templates (the message lists them); Error(kTokenizer) for invalid JSON.
std::optional<ChatTemplateSource> find_chat_template(const std::filesystem::path& folder,
                                                     const std::string& name = {});

// A GGUF file's template: the metadata string tokenizer.chat_template, with the tokens at
// tokenizer.ggml.bos_token_id / eos_token_id of tokenizer.ggml.tokens as bos_token / eos_token
// (left undefined when absent); nullopt when the file has no template. Error(kModel) naming the
// file and key for a file the GGUF reader refuses or a key of another type.
std::optional<ChatTemplateSource> gguf_chat_template(const std::string& path);

// A model's template, wherever it keeps it: a GGUF file's (gguf_chat_template), else a
// folder's (find_chat_template; `name` picks a named template, which a GGUF file has none of:
// Error(kTemplateError)). nullopt when the model has none (or `model` is neither).
std::optional<ChatTemplateSource> model_chat_template_source(const std::filesystem::path& model,
                                                             const std::string& name = {});

// JSON as template values, objects in their order (ordered_json: tojson must write a tool's
// fields as the file has them). Error(kTemplateError) past 128 levels.
Value value_from_json(const nlohmann::ordered_json& json);

struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content}, ...]
  std::optional<nlohmann::ordered_json> tools;  // the tools list, when there is one
  bool add_generation_prompt = false;
  std::vector<std::pair<std::string, Value>> extra;  // enable_thinking, date_string, ...
};

// The variables HF passes: messages, tools (None when absent), documents (None),
// add_generation_prompt, bos_token and eos_token (when the model has them), then `extra`.
std::vector<std::pair<std::string, Value>> chat_variables(const ChatTemplateSource& source,
                                                          const ChatInputs& inputs);

// Parses the source and renders the conversation. RaisedError when the template raises.
std::string render_chat(const ChatTemplateSource& source, const ChatInputs& inputs,
                        const Limits& limits = {});

}  // namespace promptcache::jinja
