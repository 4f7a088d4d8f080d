// PML role texts derived from real Jinja chat templates: where a template splits into fixed texts
// per role (a default system prompt or first-turn prefix included), a conversation rendered
// through the derived pieces (as PML renders chat tags) equals the template's own render of the
// same messages; where it cannot (a system prompt folded into the last user turn, a refused
// system role, an end text that depends on add_generation_prompt), the reason says so.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "promptcache/jinja/derive.hpp"

using namespace promptcache;
using namespace promptcache::jinja;
using ojson = nlohmann::ordered_json;

namespace {

ChatTemplateSource fixture(const std::string& name, std::optional<std::string> bos,
                           std::optional<std::string> eos) {
  const std::string path = test::source_dir() + "/tests/jinja/templates/" + name + ".jinja";
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream text;
  text << in.rdbuf();
  return from_string(text.str(), path, std::move(bos), std::move(eos));
}

ojson conversation(std::initializer_list<std::pair<const char*, const char*>> turns) {
  ojson out = ojson::array();
  for (const auto& [role, content] : turns) out.push_back({{"role", role}, {"content", content}});
  return out;
}

struct Case {
  const char* name;
  std::optional<std::string> bos, eos;
  bool derivable;
};

}  // namespace

TEST_CASE("jinja-derived role texts render conversations as the template does", "[jinja][derive]") {
  const Case cases[] = {
      {"qwen3", std::nullopt, "<|im_end|>", true},
      {"cz-llama-2-chat", "<s>", "</s>", true},
      // Its BOS comes after indentation the template prints once, before the first turn: that
      // text is the first turn's prefix (default_system) or the system turn's opening.
      {"cz-llama-3-instruct", "<|begin_of_text|>", "<|eot_id|>", true},
      {"cz-chatml", "", "<|im_end|>", true},
      {"cz-zephyr", "<s>", "</s>", true},
      {"cz-phi-3", "<s>", "<|endoftext|>", true},
      {"cz-mistral-instruct", "<s>", "</s>", true},
      // A system turn with the date even when the conversation has none: its default_system.
      {"llama-3.3-tools", "<|begin_of_text|>", "<|eot_id|>", true},
      // The first turn opens with the BOS the later ones lack.
      {"deepseek-r1-distill-qwen", "<bos>", "<eos>", true},
      // Refuses a system turn.
      {"gemma-2", "<bos>", "<eos>", false},
      // Folds the system prompt into the last user turn.
      {"mistral-nemo", "<s>", "</s>", false},
      // A default system prompt only when none is given.
      {"cz-qwen2.5-instruct", std::nullopt, "<|im_end|>", true},
      {"cz-llama-3.2-1b-instruct", "<|begin_of_text|>", "<|eot_id|>", true},
      {"cz-vicuna", "<s>", "</s>", true},
      {"cz-openchat", "<s>", "<|end_of_turn|>", true},
      {"cz-alpaca", "<s>", "</s>", true},
      {"cz-falcon", std::nullopt, "<|endoftext|>", true},
      // Iterates `tools` whenever it is defined, and HF passes None when there are none: the
      // template fails without tools.
      {"phi-4-mini", "<|endoftext|>", "<|endoftext|>", false},
      // A user turn opens differently after an assistant turn.
      {"command-r7b-tool-use", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", false},
      {"cz-gemma-it", "<bos>", "<eos>", true},
      {"cz-granite-3.0-instruct", "<|end_of_text|>", "<|end_of_text|>", true},
      // An eos_token ends the text only when there is no generation prompt.
      {"phi-3.5", "<s>", "<|endoftext|>", false},
  };
  const ojson conversations[] = {
      conversation({{"user", "Hello! What is 2+2?"}}),
      conversation({{"system", "You are terse."}, {"user", "Name three rivers."}}),
      conversation({{"user", "Hi there"}, {"assistant", "Hello!"}, {"user", "Tell me a joke."}}),
      conversation({{"system", "Answer in French."},
                    {"user", "Capital of Italy?"},
                    {"assistant", "Rome."},
                    {"user", "And of Spain?"}}),
  };
  int derived = 0;
  for (const Case& c : cases) {
    INFO("template " << c.name);
    const ChatTemplateSource source = fixture(c.name, c.bos, c.eos);
    const DerivedChatTemplate d = derive_chat_template(source);
    INFO("reason " << d.reason);
    CHECK(d.chat.has_value() == c.derivable);
    if (!d.chat) {
      CHECK_FALSE(d.reason.empty());
      continue;
    }
    ++derived;
    CHECK(d.chat->family == "jinja");
    for (const ojson& messages : conversations) {
      for (bool generation : {false, true}) {
        ChatInputs inputs;
        inputs.messages = messages;
        inputs.add_generation_prompt = generation;
        const std::string expected = render_chat(source, inputs);
        const std::string bos = source.bos_token.value_or("");
        const std::string got = (expected.rfind(bos, 0) == 0 ? bos : std::string()) +
                                render_with_pieces(*d.chat, messages, generation);
        INFO("messages " << messages.dump() << (generation ? " +gen" : ""));
        CHECK(got == expected);
      }
    }
  }
  CHECK(derived == 17);
}

TEST_CASE("jinja-derived Llama 2 pieces fold the system prompt into the first [INST]",
          "[jinja][derive]") {
  const DerivedChatTemplate d = derive_chat_template(fixture("cz-llama-2-chat", "<s>", "</s>"));
  REQUIRE(d.chat);
  // (This version of the template indents its output: the pieces keep that whitespace.)
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  CHECK(ends_with(d.chat->system.open, "<s>[INST] <<SYS>>\n"));
  CHECK(d.chat->system.close == "\n<</SYS>>\n\n");
  CHECK(d.chat->use_user_open_after_system);
  CHECK(d.chat->user_open_after_system.empty());
  CHECK(ends_with(d.chat->user.open, "<s>[INST] "));
  CHECK_THAT(d.chat->user.close, Catch::StartsWith(" [/INST]"));
  CHECK_THAT(d.chat->assistant.close, Catch::StartsWith(" </s>"));
  CHECK(std::find(d.chat->special_pieces.begin(), d.chat->special_pieces.end(), "[INST]") !=
        d.chat->special_pieces.end());
  const DerivedChatTemplate gemma = derive_chat_template(fixture("gemma-2", "<bos>", "<eos>"));
  CHECK_THAT(gemma.reason, Catch::Contains("System role not supported"));
}
