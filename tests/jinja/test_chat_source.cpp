// Where a model folder's chat template comes from: chat_template.jinja (first),
// tokenizer_config.json's chat_template as a string or a list of named templates, bos/eos tokens
// in their string and AddedToken forms; and the variables a render gets.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include <fstream>

#include "promptcache/jinja/chat_source.hpp"

using namespace promptcache;
using namespace promptcache::jinja;

namespace {

void write(const test::TempDir& dir, const std::string& name, const std::string& text) {
  std::filesystem::create_directories((dir.path() / name).parent_path());
  std::ofstream(dir.file(name), std::ios::binary) << text;
}

std::string render_user(const ChatTemplateSource& source) {
  ChatInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  inputs.add_generation_prompt = true;
  return render_chat(source, inputs);
}

}  // namespace

TEST_CASE("jinja finds tokenizer_config.json's chat_template and the model's tokens",
          "[jinja][source]") {
  test::TempDir dir("jinja-source");
  write(dir, "tokenizer_config.json",
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token if add_generation_prompt }}{{ tools }}"})");
  const auto source = find_chat_template(dir.path());
  REQUIRE(source);
  CHECK(source->bos_token == std::optional<std::string>("<s>"));
  CHECK(source->eos_token == std::optional<std::string>("</s>"));
  CHECK_THAT(source->origin, Catch::Contains("tokenizer_config.json: chat_template"));
  CHECK(render_user(*source) == "<s>[hi]</s>None");

  // chat_template.jinja beside it takes precedence.
  write(dir, "chat_template.jinja", "J{{ messages[0].content }}\n");
  const auto file = find_chat_template(dir.path());
  REQUIRE(file);
  CHECK_THAT(file->origin, Catch::Contains("chat_template.jinja"));
  CHECK(render_user(*file) == "Jhi");
}

TEST_CASE("jinja picks a named template from the list form", "[jinja][source]") {
  test::TempDir dir("jinja-named");
  write(dir, "tokenizer_config.json",
        R"({"eos_token": null, "chat_template": [
              {"name": "default", "template": "D{{ eos_token is defined }}"},
              {"name": "tool_use", "template": "T"}]})");
  const auto source = find_chat_template(dir.path());
  REQUIRE(source);
  CHECK(source->names == std::vector<std::string>{"default", "tool_use"});
  CHECK_FALSE(source->eos_token.has_value());
  CHECK(render_user(*source) == "DFalse");
  CHECK(render_user(*find_chat_template(dir.path(), "tool_use")) == "T");
  try {
    find_chat_template(dir.path(), "rag");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("no chat template named 'rag'"));
    CHECK_THAT(e.message(), Catch::Contains("default, tool_use"));
  }
}

TEST_CASE("jinja reports folders without a template and malformed fields", "[jinja][source]") {
  test::TempDir dir("jinja-none");
  CHECK_FALSE(find_chat_template(dir.path()).has_value());
  write(dir, "tokenizer_config.json", R"({"bos_token": "<s>"})");
  CHECK_FALSE(find_chat_template(dir.path()).has_value());
  write(dir, "tokenizer_config.json", R"({"chat_template": 42})");
  try {
    find_chat_template(dir.path());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.where().element == "chat_template");
    CHECK_THAT(e.where().file, Catch::Contains("tokenizer_config.json"));
  }
  write(dir, "tokenizer_config.json", "{not json");
  CHECK_THROWS_AS(find_chat_template(dir.path()), Error);
}

TEST_CASE("jinja from_string is the entry for GGUF's tokenizer.chat_template", "[jinja][source]") {
  const ChatTemplateSource source = from_string(
      "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
      "{{ bos_token }}{{ messages[0].content }}",
      "model.gguf: tokenizer.chat_template", "<|bos|>", std::nullopt);
  CHECK(render_user(source) == "<|bos|>hi");
  ChatInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(R"([{"role": "system", "content": "x"}])");
  try {
    render_chat(source, inputs);
    FAIL("no error");
  } catch (const RaisedError& e) {
    CHECK(e.message() == "user first");
    CHECK(e.where().file == "model.gguf: tokenizer.chat_template");
    CHECK(e.where().line == 1);
  }
}
