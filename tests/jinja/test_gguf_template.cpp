// A GGUF file's chat template: tokenizer.chat_template written by the project's GGUF writer reads
// back with the tokens at tokenizer.ggml.bos/eos_token_id as bos_token/eos_token, renders as the
// same template from a folder does, and becomes the chat tags' template.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "pml/fake_tokenizer.hpp"
#include "promptcache/jinja/derive.hpp"
#include "promptcache/model/gguf.hpp"

using namespace promptcache;
using namespace promptcache::jinja;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::string read_template(const std::string& name) {
  std::ifstream in(test::source_dir() + "/tests/jinja/templates/" + name + ".jinja",
                   std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A GGUF file with a vocabulary and, when `chat_template` is given, a template.
void write_gguf(const std::string& path, const std::optional<std::string>& chat_template) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.model", gguf::Value::string("llama"));
  w.set("tokenizer.ggml.tokens", gguf::Value::strings({"<unk>", "<s>", "</s>", "hello"}));
  w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(2));
  if (chat_template) w.set("tokenizer.chat_template", gguf::Value::string(*chat_template));
  w.write(path);
}

}  // namespace

TEST_CASE("a GGUF file's tokenizer.chat_template reads back with its bos and eos tokens",
          "[jinja][gguf]") {
  const fs::path dir = fs::temp_directory_path() / ("pc_gguf_template_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string text = read_template("cz-llama-2-chat");
  const std::string path = (dir / "model.gguf").string();
  write_gguf(path, text);

  const std::optional<ChatTemplateSource> source = gguf_chat_template(path);
  REQUIRE(source);
  CHECK(source->text == text);
  CHECK(source->bos_token == std::optional<std::string>("<s>"));
  CHECK(source->eos_token == std::optional<std::string>("</s>"));
  CHECK_THAT(source->origin, Catch::Contains("tokenizer.chat_template"));
  // The same through the model-agnostic look-up, and the same text as the template rendered with
  // the same tokens from a string.
  const std::optional<ChatTemplateSource> again = model_chat_template_source(path);
  REQUIRE(again);
  CHECK(again->text == text);
  ChatInputs inputs;
  inputs.messages = ojson::array(
      {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const std::string rendered = render_chat(*source, inputs);
  CHECK(rendered == render_chat(from_string(text, "x", "<s>", "</s>"), inputs));
  CHECK_THAT(rendered, Catch::Contains("<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>"));
  // A GGUF file has no named templates.
  CHECK_THROWS_WITH(model_chat_template_source(path, "tool_use"), Catch::Contains("GGUF"));
  // The chat tags' template is the file's (Llama 2 splits into role texts).
  pml_test::FakeTokenizer tok;
  const ModelChatTemplate chosen = model_chat_template(path, "", "", tok, "plain");
  CHECK(chosen.chat.family == "jinja");
  CHECK_THAT(chosen.origin, Catch::Contains("tokenizer.chat_template"));

  // No template in the file: none, and the family fallback says so.
  const std::string bare = (dir / "bare.gguf").string();
  write_gguf(bare, std::nullopt);
  CHECK_FALSE(gguf_chat_template(bare));
  CHECK(model_chat_template(bare, "", "", tok, "llama-2").chat.family == "llama-2");
  // A file the GGUF reader refuses: its error, naming the file.
  const std::string broken = (dir / "broken.gguf").string();
  {
    std::ofstream out(broken, std::ios::binary);
    out << "GGUF";
  }
  CHECK_THROWS_WITH(gguf_chat_template(broken), Catch::Contains("broken.gguf"));
  fs::remove_all(dir);
}
