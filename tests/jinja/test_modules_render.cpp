// Modules and a model's own chat template together: a PML schema whose modules hold chat turns
// (cached parts) and a prompt with the fresh turn, laid out with the role texts derived from a
// real Jinja template, give exactly the text the template renders for the whole conversation at
// once — the cached parts' span texts, then the prompt's fresh text, byte for byte. Includes
// templates with a default system prompt (Qwen2.5) and ones that put the system text inside the
// first user turn (Llama 2) or before it (Mistral instruct), where rendering the cached system
// part and the new turn separately and concatenating them goes wrong.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "pml/fake_tokenizer.hpp"
#include "promptcache/jinja/derive.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/schema.hpp"

using namespace promptcache;
using namespace promptcache::jinja;
using ojson = nlohmann::ordered_json;

namespace {

ChatTemplateSource real_template(const std::string& name, std::optional<std::string> bos,
                                 std::optional<std::string> eos) {
  const std::string path = test::source_dir() + "/tests/jinja/templates/" + name + ".jinja";
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return from_string(text.str(), path, std::move(bos), std::move(eos));
}

// A byte-level stand-in (prefixes_space() false, as for Qwen and Llama 3): one token per byte,
// so every template text, whitespace included, becomes tokens and a span; <s> and </s> are
// single pieces. The text is then kept exactly, which is what the comparison needs (a
// SentencePiece layout reads a span boundary as one space: docs/pml.md).
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<TokenId> encode(std::string_view text, bool add_bos) const override {
    std::vector<TokenId> out;
    if (add_bos) out.push_back(kBos);
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string decode(const std::vector<TokenId>& ids) const override {
    std::string out;
    for (TokenId id : ids) out += decode_piece(id);
    return out;
  }
  std::string decode_piece(TokenId id) const override { return id_to_piece(id); }
  TokenId bos_id() const override { return kBos; }
  TokenId eos_id() const override { return kBos + 1; }
  TokenId unk_id() const override { return -1; }
  TokenId pad_id() const override { return -1; }
  std::size_t vocab_size() const override { return 258; }
  TokenId piece_to_id(std::string_view piece) const override {
    return piece == "<s>" ? kBos : piece == "</s>" ? kBos + 1 : -1;
  }
  std::string id_to_piece(TokenId id) const override {
    if (id == kBos) return "<s>";
    if (id == kBos + 1) return "</s>";
    return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
  bool prefixes_space() const override { return false; }
  std::string kind() const override { return "bytes"; }

 private:
  static constexpr TokenId kBos = 256;
};

ojson turn(const char* role, const char* content) {
  return ojson{{"role", role}, {"content", content}};
}

struct Split {
  const char* what;
  const char* schema;  // the cached parts
  const char* prompt;  // the modules it selects and the fresh turns
  ojson messages;      // the whole conversation
};

// The text a resolved prompt stands for: the selected spans' texts in position order (the BOS
// span is the template's leading bos_token, which the derived texts leave to the layout), then
// the prompt's fresh text. Also how many characters the cached parts hold.
std::string laid_out_text(const pml::Layout& layout, const pml::ResolvedPrompt& resolved,
                          const std::string& bos, std::size_t* cached_chars) {
  std::string out;
  std::size_t last_end = 0;
  for (std::size_t s : resolved.spans) {
    const pml::Span& span = layout.spans[s];
    REQUIRE(span.begin >= last_end);  // position order
    last_end = span.end();
    out += span.kind == pml::SpanKind::kBos ? bos : span.text;
  }
  *cached_chars = out.size();
  REQUIRE(resolved.text_begin >= last_end);  // the fresh text comes after the cached parts
  return out + resolved.text;
}

}  // namespace

TEST_CASE("cached chat modules plus fresh turns render as the whole conversation",
          "[jinja][derive][modules]") {
  struct Model {
    const char* name;
    std::optional<std::string> bos, eos;
  };
  const Model models[] = {
      {"cz-qwen2.5-instruct", std::nullopt, "<|im_end|>"},  // default system prompt
      {"cz-llama-2-chat", "<s>", "</s>"},                   // system inside the first [INST]
      {"cz-mistral-instruct", "<s>", "</s>"},               // system before the first [INST]
      {"qwen3", std::nullopt, "<|im_end|>"},
      {"cz-chatml", "", "<|im_end|>"},
      {"cz-zephyr", "<s>", "</s>"},
      {"cz-phi-3", "<s>", "<|endoftext|>"},
      {"cz-llama-3.2-1b-instruct", "<|begin_of_text|>", "<|eot_id|>"},
      {"cz-vicuna", "<s>", "</s>"},
      {"cz-alpaca", "<s>", "</s>"},
  };
  const Split splits[] = {
      {"a cached system module, a cached exchange, a fresh user turn",
       R"(<schema name="chat"><module name="sys"><system>You are terse.</system></module>)"
       R"(<module name="history"><user>Name three rivers.</user>)"
       R"(<assistant>Nile, Amazon, Yangtze.</assistant></module></schema>)",
       R"(<prompt schema="chat"><sys/><history/><user>And three lakes?</user></prompt>)",
       ojson::array({turn("system", "You are terse."), turn("user", "Name three rivers."),
                     turn("assistant", "Nile, Amazon, Yangtze."),
                     turn("user", "And three lakes?")})},
      {"the system turn in the schema's root, the first user turn fresh",
       R"(<schema name="chat"><system>Answer in French.</system></schema>)",
       R"(<prompt schema="chat"><user>Capital of Italy?</user></prompt>)",
       ojson::array({turn("system", "Answer in French."), turn("user", "Capital of Italy?")})},
      {"no system turn: a cached exchange, a fresh user turn",
       R"(<schema name="chat"><module name="history"><user>Hi there</user>)"
       R"(<assistant>Hello!</assistant></module></schema>)",
       R"(<prompt schema="chat"><history/><user>Tell me a joke.</user></prompt>)",
       ojson::array({turn("user", "Hi there"), turn("assistant", "Hello!"),
                     turn("user", "Tell me a joke.")})},
      {"a cached system module and a cached user turn, the fresh assistant prefix",
       R"(<schema name="chat"><module name="sys"><system>Be brief.</system></module>)"
       R"(<module name="q"><user>Why is the sky blue?</user></module></schema>)",
       R"(<prompt schema="chat"><sys/><q/><assistant>Rayleigh scattering.</assistant>)"
       R"(<user>And sunsets?</user></prompt>)",
       ojson::array({turn("system", "Be brief."), turn("user", "Why is the sky blue?"),
                     turn("assistant", "Rayleigh scattering."), turn("user", "And sunsets?")})},
  };
  ByteTokenizer tok;
  int checked = 0;
  for (const Model& m : models) {
    INFO("template " << m.name);
    const ChatTemplateSource source = real_template(m.name, m.bos, m.eos);
    const DerivedChatTemplate derived = derive_chat_template(source);
    INFO("reason " << derived.reason);
    REQUIRE(derived.chat);
    for (const Split& split : splits) {
      INFO(split.what);
      ChatInputs whole;
      whole.messages = split.messages;
      whole.add_generation_prompt = true;
      const std::string expected = render_chat(source, whole);
      const std::string bos = source.bos_token.value_or("");
      const std::string layout_bos = !bos.empty() && expected.rfind(bos, 0) == 0 ? bos : "";
      const pml::Layout layout =
          pml::layout(pml::parse_schema_string(split.schema), tok, *derived.chat);
      const pml::ResolvedPrompt resolved =
          pml::resolve(pml::parse_prompt_string(split.prompt), layout, tok);
      std::size_t cached = 0;
      const std::string got = laid_out_text(layout, resolved, layout_bos, &cached);
      CHECK(got == expected);
      // The cached parts are a real share of the text, and the fresh text is what follows them.
      CHECK(cached > 0);
      CHECK(resolved.text.size() > 0);
      CHECK(expected.compare(cached, std::string::npos, resolved.text) == 0);
      ++checked;
    }
  }
  CHECK(checked == 40);
}

TEST_CASE("rendering the cached part and the new turn separately is not the whole conversation",
          "[jinja][derive][modules]") {
  // The pitfall the derived texts avoid: a template rendered on the system turn alone, then on
  // the new turn alone, and the two texts concatenated.
  struct Model {
    const char* name;
    std::optional<std::string> bos, eos;
  };
  for (const Model& m : {Model{"cz-qwen2.5-instruct", std::nullopt, "<|im_end|>"},
                         Model{"cz-llama-2-chat", "<s>", "</s>"}}) {
    INFO("template " << m.name);
    const ChatTemplateSource source = real_template(m.name, m.bos, m.eos);
    ChatInputs system, user, whole;
    system.messages = ojson::array({turn("system", "You are terse.")});
    user.messages = ojson::array({turn("user", "Name three rivers.")});
    user.add_generation_prompt = whole.add_generation_prompt = true;
    whole.messages =
        ojson::array({turn("system", "You are terse."), turn("user", "Name three rivers.")});
    const std::string expected = render_chat(source, whole);
    CHECK(render_chat(source, system) + render_chat(source, user) != expected);
    // Through the derived texts and a layout it is the same text.
    const DerivedChatTemplate derived = derive_chat_template(source);
    REQUIRE(derived.chat);
    ByteTokenizer tok;
    const pml::Layout layout = pml::layout(
        pml::parse_schema_string(
            R"(<schema name="c"><module name="s"><system>You are terse.</system></module></schema>)"),
        tok, *derived.chat);
    const auto resolved =
        pml::resolve(pml::parse_prompt_string(
                         R"(<prompt schema="c"><s/><user>Name three rivers.</user></prompt>)"),
                     layout, tok);
    const std::string bos = source.bos_token.value_or("");
    std::size_t cached = 0;
    CHECK(laid_out_text(layout, resolved, expected.rfind(bos, 0) == 0 ? bos : "", &cached) ==
          expected);
  }
}

TEST_CASE("a model's Jinja template is the chat tags' template unless a family is named",
          "[jinja][derive][modules]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("pc_model_template_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ifstream in(test::source_dir() + "/tests/jinja/templates/cz-qwen2.5-instruct.jinja",
                     std::ios::binary);
    std::ofstream out(dir / "chat_template.jinja", std::ios::binary);
    out << in.rdbuf();
    std::ofstream config(dir / "tokenizer_config.json");
    config << R"({"eos_token": "<|im_end|>", "bos_token": null})";
  }
  pml_test::FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  const ModelChatTemplate own = model_chat_template(dir, "", "", tok, "llama-2");
  CHECK(own.chat.family == "jinja");
  CHECK_THAT(own.origin, Catch::Contains("chat_template.jinja"));
  CHECK_THAT(own.chat.default_system, Catch::Contains("You are Qwen"));
  CHECK(model_chat_template(dir, "jinja", "llama-2", tok, "llama-2").chat.family == "jinja");
  CHECK(model_chat_template(dir, "", "llama-2", tok, "llama-2").chat.family == "llama-2");
  CHECK(model_chat_template(dir, "mistral", "", tok, "llama-2").chat.family == "mistral");
  // No template: the family the tokenizer suggests, and why.
  const fs::path empty = dir / "empty";
  fs::create_directories(empty);
  const ModelChatTemplate fallback = model_chat_template(empty, "", "", tok, "llama-2");
  CHECK(fallback.chat.family == "chatml");  // <|im_start|> is in the vocabulary
  CHECK_THAT(fallback.origin, Catch::Contains("no Jinja chat template"));
  CHECK_THROWS_WITH(model_chat_template(empty, "jinja", "", tok, "llama-2"),
                    Catch::Contains("--template jinja"));
  // A template that does not split: the fallback family, and the reason.
  {
    std::ifstream in(test::source_dir() + "/tests/jinja/templates/gemma-2.jinja", std::ios::binary);
    std::ofstream out(dir / "chat_template.jinja", std::ios::binary);
    out << in.rdbuf();
  }
  const ModelChatTemplate gemma = model_chat_template(dir, "", "", tok, "llama-2");
  CHECK(gemma.chat.family == "chatml");
  CHECK_THAT(gemma.origin, Catch::Contains("System role not supported"));
  // A malformed template field: the family, and why; required, the error.
  const fs::path bad = dir / "bad";
  fs::create_directories(bad);
  {
    std::ofstream config(bad / "tokenizer_config.json");
    config << R"({"chat_template": 5})";
  }
  const ModelChatTemplate unread = model_chat_template(bad, "", "", tok, "llama-2");
  CHECK(unread.chat.family == "chatml");
  CHECK_THAT(unread.origin, Catch::Contains("could not be read"));
  CHECK_THROWS(model_chat_template(bad, "jinja", "", tok, "llama-2"));
  fs::remove_all(dir);
}

TEST_CASE("a folder without tokenizer_config.json renders its template with the tokenizer's BOS",
          "[jinja][derive][modules]") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("pc_template_bos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ifstream in(test::source_dir() + "/tests/jinja/templates/cz-llama-2-chat.jinja",
                     std::ios::binary);
    std::ofstream out(dir / "chat_template.jinja", std::ios::binary);
    out << in.rdbuf();
  }
  // Without a bos_token the template fails (`bos_token + ...`); the tokenizer's <s> is used.
  pml_test::FakeTokenizer tok;
  const ModelChatTemplate chosen = model_chat_template(dir, "", "", tok, "plain");
  INFO(chosen.origin);
  CHECK(chosen.chat.family == "jinja");
  CHECK_THAT(chosen.chat.assistant.close, Catch::Contains("</s>"));
  CHECK_THAT(chosen.chat.user.open, Catch::Contains("<s>[INST]"));
  fs::remove_all(dir);
}
