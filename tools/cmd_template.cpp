// promptcache template: renders a model's Jinja chat template on a conversation, byte for byte as
// HF's apply_chat_template would (the tool a template or schema author checks a template with).
// No LibTorch in this unit.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_common.hpp"
#include "promptcache/jinja/chat_source.hpp"
#include "promptcache/model/gguf.hpp"

namespace promptcache::cli {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

constexpr std::uintmax_t kMaxInputBytes = 64u << 20;

ojson read_json_file(const std::string& path, const char* flag) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw UsageError(std::string(flag) + " " + path + ": cannot read the file");
  if (size > kMaxInputBytes)
    throw UsageError(std::string(flag) + " " + path + ": larger than 64 MiB");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  try {
    return ojson::parse(bytes.str());
  } catch (const ojson::exception& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("invalid JSON: ") + e.what(), {path});
  }
}

std::string read_text_file(const std::string& path, const char* flag) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) throw UsageError(std::string(flag) + " " + path + ": cannot read the file");
  if (size > jinja::Limits{}.max_template_bytes) {
    throw UsageError(std::string(flag) + " " + path + ": larger than the template limit (1 MiB)");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace

Command register_template(CLI::App& root) {
  struct Options {
    std::string model;
    std::string messages;
    std::string template_file;
    std::string template_name;
    std::string tools;
    std::vector<std::string> vars;
    bool add_generation_prompt = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "template",
      "Render a model's Jinja chat template on a conversation, exactly as HF's "
      "apply_chat_template does (no newline added).\n"
      "Examples: promptcache template --model qwen3/ --messages chat.json --add-generation-prompt\n"
      "          promptcache template --model m/ --messages chat.json --template my.jinja "
      "--var enable_thinking=false");
  app->add_option("--model,-m", o->model,
                  "model folder (chat_template.jinja, else tokenizer_config.json's chat_template; "
                  "bos_token/eos_token from tokenizer_config.json) or FILE.gguf "
                  "(tokenizer.chat_template, the tokens at tokenizer.ggml.bos/eos_token_id)");
  app->add_option("--messages", o->messages,
                  "JSON file: a list of {\"role\", \"content\", ...} messages, passed as they are")
      ->required();
  app->add_flag("--add-generation-prompt", o->add_generation_prompt,
                "end with the opening of an assistant turn (add_generation_prompt=True)");
  app->add_option("--template", o->template_file,
                  "a Jinja file to render instead of the model's own template");
  app->add_option("--template-name", o->template_name,
                  "which of the model's named templates (e.g. tool_use; default: \"default\")");
  app->add_option("--tools", o->tools, "JSON file: the tools list (the template's `tools`)");
  app->add_option("--var", o->vars,
                  "an extra variable NAME=VALUE (VALUE read as JSON when it parses, else as a "
                  "string), e.g. enable_thinking=false; repeatable");
  return {
      app, [o]() {
        if (o->model.empty() && o->template_file.empty()) {
          throw UsageError("template: give --model DIR (or FILE.gguf), or --template FILE.jinja");
        }
        std::optional<jinja::ChatTemplateSource> source;
        if (!o->model.empty()) {
          std::error_code ec;
          const bool file = fs::is_regular_file(o->model, ec);
          if (!file && !fs::is_directory(o->model, ec)) {
            throw UsageError("template: --model " + o->model + ": no such folder or file");
          }
          if (file && !gguf::is_gguf_file(o->model)) {
            throw UsageError("template: --model " + o->model +
                             ": neither a model folder nor a GGUF file (no GGUF magic)");
          }
          // A GGUF file's tokenizer.chat_template, else the folder's.
          source = jinja::model_chat_template_source(o->model, o->template_name);
          if (!source && o->template_file.empty()) {
            throw Error(jinja::kTemplateError,
                        "the model has no chat template (no chat_template.jinja, no "
                        "chat_template in tokenizer_config.json, no tokenizer.chat_template in "
                        "a GGUF file): give --template FILE.jinja",
                        {o->model});
          }
        }
        if (!o->template_file.empty()) {
          jinja::ChatTemplateSource given =
              jinja::from_string(read_text_file(o->template_file, "--template"), o->template_file);
          if (source) {
            given.bos_token = source->bos_token;
            given.eos_token = source->eos_token;
          }
          source = std::move(given);
        }
        jinja::ChatInputs inputs;
        inputs.messages = read_json_file(o->messages, "--messages");
        if (!inputs.messages.is_array()) {
          throw Error(ErrorKind::kInvalidArgument, "expected a JSON list of messages",
                      {o->messages});
        }
        if (!o->tools.empty()) inputs.tools = read_json_file(o->tools, "--tools");
        inputs.add_generation_prompt = o->add_generation_prompt;
        for (const std::string& var : o->vars) {
          const std::size_t eq = var.find('=');
          if (eq == std::string::npos || eq == 0) {
            throw UsageError("template: --var " + var + ": expected NAME=VALUE");
          }
          const std::string value = var.substr(eq + 1);
          ojson parsed = ojson::parse(value, nullptr, /*allow_exceptions=*/false);
          inputs.extra.emplace_back(var.substr(0, eq), parsed.is_discarded()
                                                           ? jinja::Value(value)
                                                           : jinja::value_from_json(parsed));
        }
        try {
          const std::string text = jinja::render_chat(*source, inputs);
          std::cout << text << std::flush;
        } catch (const jinja::RaisedError& e) {
          std::cerr << "promptcache: " << e.where().file << ":" << e.where().line
                    << ": the template raised an exception: " << e.message() << "\n";
          return 1;
        }
        return 0;
      }};
}

}  // namespace promptcache::cli
