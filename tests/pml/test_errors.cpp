// The bad-input catalogue: every case asserts the exact ErrorKind and that the message names
// the file, the line and the element.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

namespace {

struct BadInput {
  const char* what;
  std::string xml;
  ErrorKind kind;
  std::size_t line;
  std::string element;  // must appear in what()
};

void expect_error(const std::function<void()>& run, const BadInput& c, const std::string& file) {
  INFO(c.what);
  try {
    run();
    FAIL("no error was thrown");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == c.kind);
    CHECK(e.where().line == c.line);
    if (c.line > 0) {
      CHECK_THAT(e.what(), Catch::Contains(file + ":" + std::to_string(c.line) + ":"));
    } else {
      CHECK_THAT(e.what(), Catch::StartsWith(file + ": "));
    }
    CHECK_THAT(e.what(), Catch::Contains(c.element));
  }
}

// A schema the prompt cases resolve against.
const char* kPromptSchema = R"(<schema name="s">
  Root.
  <module name="a">A text <module name="b">B</module></module>
  <union>
    <module name="x">X</module>
    <module name="y">Y</module>
  </union>
  <module name="p">ask <parameter name="q" length="3"/></module>
</schema>)";

}  // namespace

TEST_CASE("errors: bad schemas", "[pml][errors]") {
  const std::vector<BadInput> cases = {
      {"unclosed tag", "<schema name=\"s\">\n  <module name=\"a\">text\n</schema>",
       ErrorKind::kXmlSyntax, 3, "</schema>"},
      {"two top elements", "<schema name=\"s\">x</schema>\n<schema name=\"t\">y</schema>",
       ErrorKind::kXmlSyntax, 2, "<schema name=\"t\">"},
      {"top element is not schema", "\n<prompt schema=\"s\">x</prompt>", ErrorKind::kSchema, 2,
       "<prompt>"},
      {"schema without name", "<schema>\n text</schema>", ErrorKind::kSchema, 1, "<schema>"},
      {"module without name", "<schema name=\"s\">\n  <module>text</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module>"},
      {"module name not an XML name",
       "<schema name=\"s\">\n  <module name=\"1st\">text</module>\n</schema>", ErrorKind::kSchema,
       2, "<module name=\"1st\">"},
      {"duplicate module name",
       "<schema name=\"s\">\n  <module name=\"a\">1</module>\n  <module name=\"a\">2</module>\n"
       "</schema>",
       ErrorKind::kSchema, 3, "<module name=\"a\">"},
      {"duplicate name across a union and its scope",
       "<schema name=\"s\">\n  <module name=\"a\">1</module>\n  <union>\n"
       "    <module name=\"a\">2</module>\n  </union>\n</schema>",
       ErrorKind::kSchema, 4, "<module name=\"a\">"},
      {"duplicate parameter name",
       "<schema name=\"s\">\n  <module name=\"m\">\n    <parameter name=\"p\" length=\"2\"/>\n"
       "    <parameter name=\"p\" length=\"2\"/>\n  </module>\n</schema>",
       ErrorKind::kSchema, 4, "<parameter name=\"p\">"},
      {"parameter directly under schema",
       "<schema name=\"s\">\n  Text\n  <parameter name=\"p\" length=\"2\"/>\n</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"parameter in a root-level chat tag",
       "<schema name=\"s\">\n  <user>\n    Hi <parameter name=\"p\" length=\"2\"/>\n  </user>\n"
       "</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"text inside union",
       "<schema name=\"s\">\n  <union>\n    stray\n    <module name=\"a\">A</module>\n  </union>\n"
       "</schema>",
       ErrorKind::kSchema, 2, "<union>"},
      {"non-module inside union",
       "<schema name=\"s\">\n  <module name=\"m\"><union>\n    <parameter name=\"p\" "
       "length=\"1\"/>\n  </union></module>\n</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"empty union", "<schema name=\"s\">\n  Text\n  <union>\n  </union>\n</schema>",
       ErrorKind::kSchema, 3, "<union>"},
      {"unknown scaffold member",
       "<schema name=\"s\">\n  <union scaffold=\"zz\">\n    <module name=\"a\">A</module>\n"
       "  </union>\n</schema>",
       ErrorKind::kSchema, 2, "<union>"},
      {"empty schema", "<schema name=\"e\">\n\n   \n</schema>", ErrorKind::kSchema, 1,
       "<schema name=\"e\">"},
      {"unknown element", "<schema name=\"s\">\n  Text\n  <modul name=\"a\">A</modul>\n</schema>",
       ErrorKind::kSchema, 3, "<modul name=\"a\">"},
      {"parameter without length",
       "<schema name=\"s\">\n  <module name=\"m\">\n    <parameter name=\"p\"/>\n  </module>\n"
       "</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"parameter length not a number",
       "<schema name=\"s\">\n  <module name=\"m\">\n    <parameter name=\"p\" length=\"five\"/>\n"
       "  </module>\n</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"parameter length zero",
       "<schema name=\"s\">\n  <module name=\"m\"><parameter name=\"p\" length=\"0\"/></module>\n"
       "</schema>",
       ErrorKind::kSchema, 2, "<parameter name=\"p\">"},
      {"parameter with content",
       "<schema name=\"s\">\n  <module name=\"m\">\n    <parameter name=\"p\" "
       "length=\"2\">x</parameter>\n  </module>\n</schema>",
       ErrorKind::kSchema, 3, "<parameter name=\"p\">"},
      {"bad cache value",
       "<schema name=\"s\">\n  <module name=\"m\" cache=\"maybe\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"m\">"},
      {"unknown attribute",
       "<schema name=\"s\">\n  <module name=\"m\" cached=\"false\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"m\">"},
      {"reserved module name", "<schema name=\"s\">\n  <module name=\"user\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"user\">"},
      {"nested chat tags",
       "<schema name=\"s\">\n  <system>\n    <user>hi</user>\n  </system>\n</schema>",
       ErrorKind::kSchema, 3, "<user>"},
      {"src and content",
       "<schema name=\"s\">\n  <module name=\"m\" src=\"f.txt\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"m\">"},
      // A schema given as text reads no file (src_files.hpp); a missing file of a schema file is
      // below.
      {"src in a schema given as text",
       "<schema name=\"s\">\n  Text\n  <module name=\"doc\" src=\"no-such-file.txt\"/>\n</schema>",
       ErrorKind::kSchema, 3, "<module name=\"doc\">"},
      {"schema nested in schema",
       "<schema name=\"s\">\n  <module name=\"m\">\n    <schema name=\"t\">x</schema>\n  "
       "</module>\n</schema>",
       ErrorKind::kSchema, 3, "<schema name=\"t\">"},
      {"recompute not a number", "<schema name=\"s\"\n recompute=\"some\">x</schema>",
       ErrorKind::kSchema, 1, "<schema name=\"s\">"},
      {"recompute above 1", "\n<schema name=\"s\" recompute=\"1.5\">x</schema>", ErrorKind::kSchema,
       2, "recompute=\"1.5\""},
      {"recompute below 0", "<schema name=\"s\" recompute=\"-0.1\">x</schema>", ErrorKind::kSchema,
       1, "must be a number in [0, 1]"},
      {"recompute with trailing text", "<schema name=\"s\" recompute=\"0.1x\">x</schema>",
       ErrorKind::kSchema, 1, "<schema name=\"s\">"},
      {"recompute NaN", "<schema name=\"s\" recompute=\"nan\">x</schema>", ErrorKind::kSchema, 1,
       "recompute=\"nan\""},
      {"recompute empty", "<schema name=\"s\" recompute=\"\">x</schema>", ErrorKind::kSchema, 1,
       "<schema name=\"s\">"},
      {"module recompute not a number",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"some\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"m\""},
      {"module recompute fraction above 1",
       "<schema name=\"s\">\n\n  <module name=\"m\" recompute=\"1.5\">M</module>\n</schema>",
       ErrorKind::kSchema, 3, "recompute=\"1.5\" on <module>"},
      {"module recompute negative",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"-3\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "a whole number of tokens"},
      {"module recompute with a unit",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"16t\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "recompute=\"16t\""},
      {"module recompute token count too large",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"99999999999\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "recompute=\"99999999999\""},
      {"module recompute empty",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "<module name=\"m\""},
      {"module recompute infinite",
       "<schema name=\"s\">\n  <module name=\"m\" recompute=\"inf\">M</module>\n</schema>",
       ErrorKind::kSchema, 2, "recompute=\"inf\""},
      {"recompute on a union",
       "<schema name=\"s\">\n  <union recompute=\"2\"><module "
       "name=\"m\">M</module></union>\n</schema>",
       ErrorKind::kSchema, 2, "unknown attribute 'recompute'"},
      {"parameter named recompute",
       "<schema name=\"s\">\n  <module name=\"m\">M\n    <parameter name=\"recompute\" "
       "length=\"2\"/>"
       "</module>\n</schema>",
       ErrorKind::kSchema, 3, "parameter name 'recompute' is reserved"},
  };
  CHECK(cases.size() >= 20);
  for (const BadInput& c : cases) {
    expect_error([&] { parse_schema_string(c.xml, "bad.xml"); }, c, "bad.xml");
  }
}

TEST_CASE("layout: a scaffold longer than its parameter is cut to the slot", "[pml][layout]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string("<schema name=\"s\"><module name=\"m\"><parameter "
                                              "name=\"p\" length=\"2\" scaffold=\"one two "
                                              "three\"/></module></schema>"),
                          tok, plain_template());
  const Span& slot = l.spans[l.module("m").parameters.at(0)];
  CHECK(slot.tokens == std::vector<TokenId>{tok.word("one"), tok.word("two")});
  const auto r = resolve(parse_prompt_string("<prompt schema=\"s\"><m/></prompt>"), l, tok);
  CHECK(r.arguments.at(0).tokens.size() == 2);
}

TEST_CASE("errors: a missing src file in a schema file names the schema file", "[pml][errors]") {
  const std::string path = test::source_dir() + "/tests/pml/fixtures/missing_src.xml";
  expect_error([&] { parse_schema_file(path); },
               {"missing src", "", ErrorKind::kIo, 3, "<module name=\"doc\">"}, path);
  expect_error([&] { parse_schema_file(path + ".absent"); },
               {"missing schema file", "", ErrorKind::kIo, 0, ""}, path + ".absent");
}

TEST_CASE("errors: bad prompts", "[pml][errors]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(kPromptSchema, "s.xml"), tok, plain_template());
  const std::vector<BadInput> cases = {
      {"malformed prompt", "<prompt schema=\"s\">\n  <a>\n</prompt>", ErrorKind::kXmlSyntax, 3,
       "</prompt>"},
      {"no schema attribute", "<prompt>\n  text\n</prompt>", ErrorKind::kPrompt, 1, "<prompt>"},
      {"top element is not prompt", "<schema name=\"s\">x</schema>", ErrorKind::kPrompt, 1,
       "<schema name=\"s\">"},
      {"unknown schema", "<prompt schema=\"other\">\n  text\n</prompt>", ErrorKind::kUnknownSchema,
       1, "<prompt>"},
      {"unknown module", "<prompt schema=\"s\">\n  <a/>\n  <nope/>\n  Question\n</prompt>",
       ErrorKind::kUnknownModule, 3, "<nope>"},
      {"nested module referenced at the top level",
       "<prompt schema=\"s\">\n  <b/>\n  Question\n</prompt>", ErrorKind::kUnknownModule, 2, "<b>"},
      {"two members of one union", "<prompt schema=\"s\">\n  <x/>\n  <y/>\n  Question\n</prompt>",
       ErrorKind::kUnionConflict, 3, "<y>"},
      {"unknown parameter", "<prompt schema=\"s\">\n  <p z=\"1\"/>\n  Question\n</prompt>",
       ErrorKind::kUnknownParameter, 2, "<p>"},
      {"argument too long",
       "<prompt schema=\"s\">\n\n  <p q=\"one two three four\"/>\n  Question\n</prompt>",
       ErrorKind::kArgumentTooLong, 3, "<p>"},
      {"text between module references",
       "<prompt schema=\"s\">\n  <a/>\n  some text\n  <p/>\n</prompt>", ErrorKind::kPrompt, 4,
       "<p>"},
      {"text inside a module reference",
       "<prompt schema=\"s\">\n  <a>\n    words\n  </a>\n</prompt>", ErrorKind::kPrompt, 2, "<a>"},
      {"element inside a turn",
       "<prompt schema=\"s\">\n  <user>\n    hi <a/>\n  </user>\n</prompt>", ErrorKind::kPrompt, 3,
       "<a>"},
      {"module referenced twice", "<prompt schema=\"s\">\n  <a/>\n  <a/>\n</prompt>",
       ErrorKind::kPrompt, 3, "<a>"},
      {"recompute override not a number",
       "<prompt schema=\"s\">\n  <a/>\n  <p recompute=\"lots\"/>\n</prompt>", ErrorKind::kPrompt, 3,
       "recompute=\"lots\" on <p>"},
      {"recompute override fraction above 1",
       "<prompt schema=\"s\">\n  <a recompute=\"2.5\"/>\n</prompt>", ErrorKind::kPrompt, 2,
       "recompute=\"2.5\" on <a>"},
      {"recompute override on a nested reference",
       "<prompt schema=\"s\">\n  <a>\n    <b recompute=\"-1\"/>\n  </a>\n</prompt>",
       ErrorKind::kPrompt, 3, "recompute=\"-1\" on <b>"},
  };
  for (const BadInput& c : cases) {
    expect_error([&] { resolve(parse_prompt_string(c.xml, "p.xml"), l, tok); }, c, "p.xml");
  }
  // The too-long message gives both lengths, in tokens.
  try {
    resolve(parse_prompt_string("<prompt schema=\"s\"><p q=\"a b c d\"/></prompt>", "p.xml"), l,
            tok);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("4 tokens") && Catch::Contains("reserves 3 tokens"));
  }
}

TEST_CASE("nesting deeper than the limit is an error, not a stack overflow", "[errors]") {
  auto nested = [](std::size_t depth, const char* root, const char* tag) {
    std::string xml = std::string("<") + root + " schema=\"s\" name=\"s\">\n";
    for (std::size_t i = 0; i < depth; ++i) xml += "<" + std::string(tag) + std::to_string(i) + ">";
    xml += "text";
    for (std::size_t i = depth; i-- > 0;) xml += "</" + std::string(tag) + std::to_string(i) + ">";
    return xml + "</" + root + ">";
  };
  // 100,000 levels: refused at the first element past the limit, with its line.
  try {
    parse_schema_string(nested(100000, "schema", "m"), "deep.xml");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kXmlSyntax);
    CHECK_THAT(e.what(),
               Catch::Contains("deep.xml:2") && Catch::Contains("nested deeper than 128"));
  }
  CHECK_THROWS_WITH(parse_prompt_string(nested(5000, "prompt", "a"), "p.xml"),
                    Catch::Contains("p.xml:2") && Catch::Contains("nested deeper than 128"));
  // Within the limit the depth is fine (these fail later, for their own reasons, or not at all).
  std::string ok = "<schema name=\"s\">";
  for (int i = 0; i < 100; ++i) ok += "<module name=\"m" + std::to_string(i) + "\">";
  ok += "deep text";
  for (int i = 0; i < 100; ++i) ok += "</module>";
  ok += "</schema>";
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(ok, "ok.xml"), tok, chat_template("plain"));
  CHECK(l.modules.size() == 101);
}
