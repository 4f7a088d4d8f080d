// Prompt parsing and resolution: selected spans, argument placement, fresh-text positions, the
// no-cache baseline and chat turns.
#include "support/catch.hpp"

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/prompt.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

namespace {

// Positions (fake tokenizer: one token per word):
//   <s> 0 | "Root." 1 | a: "A text" [2,4), b: "B" [4,5) | union@5: x "X1 X2" [5,7), y "Y" [5,6)
//   | p: "ask" [7,8), q [8,11) | z: "Z" [11,12)          total 12
const char* kSchema = R"(<schema name="s">
  Root.
  <module name="a">A text <module name="b">B</module></module>
  <union>
    <module name="x">X1 X2</module>
    <module name="y">Y</module>
  </union>
  <module name="p">ask <parameter name="q" length="3"/></module>
  <module name="z">Z</module>
</schema>)";

std::vector<TokenId> words(const FakeTokenizer& tok, std::initializer_list<const char*> ws) {
  std::vector<TokenId> out;
  for (const char* w : ws) out.push_back(tok.word(w));
  return out;
}

std::vector<TokenId> cat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("prompt: parse module refs, arguments and turns", "[pml][prompt]") {
  const Prompt p = parse_prompt_string(R"(<prompt schema="s">
  <a><b/></a>
  <p q="hello world"/>
  <user>  First   question </user>
  <assistant>Answer.</assistant>
  <user>Second</user>
</prompt>)");
  CHECK(p.schema == "s");
  REQUIRE(p.modules.size() == 2);
  CHECK(p.modules[0].name == "a");
  REQUIRE(p.modules[0].children.size() == 1);
  CHECK(p.modules[0].children[0].name == "b");
  REQUIRE(p.modules[1].arguments.size() == 1);
  CHECK(p.modules[1].arguments[0].name == "q");
  CHECK(p.modules[1].arguments[0].value == "hello world");
  REQUIRE(p.turns.size() == 3);
  CHECK(p.turns[0].role == ChatRole::kUser);
  CHECK(p.turns[0].text == " First   question ");
  CHECK(p.turns[1].role == ChatRole::kAssistant);
}

TEST_CASE("prompt: fresh text starts after the largest selected position", "[pml][prompt]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(kSchema), tok, plain_template());
  REQUIRE(l.total_length == 12);

  SECTION("a and the short union member: text right after y, not at the schema's end") {
    const auto r = resolve(
        parse_prompt_string(R"(<prompt schema="s"><a/><y/> Question here </prompt>)"), l, tok);
    CHECK(r.modules == std::vector<std::size_t>{0, l.module_index("a"), l.module_index("y")});
    REQUIRE(r.spans.size() == 4);  // <s>, Root., "A text", "Y"
    CHECK(r.text_begin == 6);
    CHECK(r.text_tokens == words(tok, {"Question", "here"}));
    CHECK(r.next_position() == 8);
    CHECK(r.baseline ==
          cat(cat({1}, words(tok, {"Root.", "A", "text", "Y"})), words(tok, {"Question", "here"})));
    CHECK(r.union_choice[0] == std::optional<std::size_t>(1));
    CHECK(r.arguments.empty());
  }
  SECTION("nothing selected: only the root") {
    const auto r = resolve(parse_prompt_string(R"(<prompt schema="s">Hi</prompt>)"), l, tok);
    CHECK(r.spans.size() == 2);
    CHECK(r.text_begin == 2);
    CHECK(r.baseline == cat({1}, words(tok, {"Root.", "Hi"})));
  }
  SECTION("nested selection and the last module") {
    const auto r =
        resolve(parse_prompt_string(R"(<prompt schema="s"><a><b/></a><z/>Go</prompt>)"), l, tok);
    CHECK(r.text_begin == 12);
    CHECK(r.baseline == cat({1}, words(tok, {"Root.", "A", "text", "B", "Z", "Go"})));
  }
  SECTION("argument at the first positions of its slot; text right after the argument") {
    const auto r = resolve(
        parse_prompt_string(R"(<prompt schema="s"><p q=" one  two "/>Why?</prompt>)"), l, tok);
    REQUIRE(r.arguments.size() == 1);
    const PlacedArgument& arg = r.arguments[0];
    CHECK(arg.parameter == "q");
    CHECK(arg.begin == 8);
    CHECK(arg.tokens == words(tok, {"one", "two"}));
    CHECK_FALSE(arg.from_scaffold);
    CHECK(r.text_begin == 10);  // after the argument, not after the slot's 11
    CHECK(r.baseline == cat({1}, words(tok, {"Root.", "ask", "one", "two", "Why?"})));
  }
  SECTION("argument filling the slot exactly") {
    const auto r =
        resolve(parse_prompt_string(R"(<prompt schema="s"><p q="a b c"/>W</prompt>)"), l, tok);
    CHECK(r.arguments[0].end() == 11);
    CHECK(r.text_begin == 11);
  }
  SECTION("a slot without argument and without scaffold stays empty") {
    const auto r = resolve(parse_prompt_string(R"(<prompt schema="s"><p/>W</prompt>)"), l, tok);
    REQUIRE(r.arguments.size() == 1);
    CHECK(r.arguments[0].tokens.empty());
    CHECK(r.arguments[0].from_scaffold);
    CHECK(r.text_begin == 8);
    CHECK(r.baseline == cat({1}, words(tok, {"Root.", "ask", "W"})));
  }
  SECTION("later module after a parameter: text after the later module") {
    const auto r =
        resolve(parse_prompt_string(R"(<prompt schema="s"><p q="a"/><z/>W</prompt>)"), l, tok);
    CHECK(r.text_begin == 12);
    CHECK(r.baseline == cat({1}, words(tok, {"Root.", "ask", "a", "Z", "W"})));
  }
}

TEST_CASE("prompt: an unfilled parameter uses its scaffold text as the argument", "[pml][prompt]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(R"(<schema name="s">
  <module name="m">Say <parameter name="w" length="4" scaffold="a default"/> now</module>
</schema>)"),
                          tok, plain_template());
  const auto r = resolve(parse_prompt_string(R"(<prompt schema="s"><m/>Go</prompt>)"), l, tok);
  REQUIRE(r.arguments.size() == 1);
  CHECK(r.arguments[0].from_scaffold);
  CHECK(r.arguments[0].begin == 2);
  CHECK(r.arguments[0].tokens == words(tok, {"a", "default"}));  // no unk padding
  CHECK(r.text_begin == 7);                                      // "now" ends at 7
  CHECK(r.baseline == cat({1}, words(tok, {"Say", "a", "default", "now", "Go"})));
}

TEST_CASE("prompt: chat turns use the layout's template", "[pml][prompt][chat]") {
  const char* schema = R"(<schema name="c">
  <system>Be nice.</system>
  <module name="m">Doc.</module>
</schema>)";
  SECTION("llama-2: the first user turn after the system tag continues its [INST]") {
    FakeTokenizer tok;
    const Layout l = layout(parse_schema_string(schema), tok, chat_template("llama-2"));
    const auto r = resolve(parse_prompt_string(R"(<prompt schema="c">
  <m/>
  <user>Hi?</user>
  <assistant>Hello.</assistant>
  <user>Bye?</user>
</prompt>)"),
                           l, tok);
    std::vector<TokenId> expected = words(tok, {"Hi?", "[/INST]", "Hello."});
    expected.push_back(2);  // </s>
    expected.push_back(1);  // <s>
    expected = cat(expected, words(tok, {"[INST]", "Bye?", "[/INST]"}));
    CHECK(r.text_tokens == expected);
  }
  SECTION("chatml: turns wrapped, generation prompt after the last user turn") {
    FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
    const TokenId start = tok.piece_to_id("<|im_start|>"), end = tok.piece_to_id("<|im_end|>");
    const Layout l = layout(parse_schema_string(schema), tok, chat_template("chatml"));
    const auto r =
        resolve(parse_prompt_string(R"(<prompt schema="c"><user>Hi?</user></prompt>)"), l, tok);
    CHECK(r.text_tokens == std::vector<TokenId>{start, tok.word("user"), tok.word("Hi?"), end,
                                                start, tok.word("assistant")});
  }
  SECTION("plain: turns are just their text") {
    FakeTokenizer tok;
    const Layout l = layout(parse_schema_string(schema), tok, plain_template());
    const auto r = resolve(
        parse_prompt_string(R"(<prompt schema="c">Intro <user>Hi?</user></prompt>)"), l, tok);
    CHECK(r.text_tokens == words(tok, {"Intro", "Hi?"}));
  }
}
