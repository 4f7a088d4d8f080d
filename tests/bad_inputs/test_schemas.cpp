// Bad schemas given to a working Engine: each is refused with its kind, file, line and element,
// the engine keeps the schema it had under that name, and answers the good prompt as before.
#include "support/catch_torch.hpp"

#include <filesystem>

#include "bad_inputs/bad_input.hpp"

using namespace promptcache;
using bad::EngineUnderTest;
using bad::Expect;

namespace {

struct SchemaCase {
  const char* what;
  std::string xml;
  Expect expect;
};

// The start of a PNG file: NUL bytes, bytes that are no UTF-8, stray '<'.
const char kPngBytes[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe<<<";

std::string words(std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += "the cat sat on the mat. ";
  return out;
}

}  // namespace

TEST_CASE("bad schemas: refused with kind, file, line and element, and the engine carries on",
          "[bad][schema]") {
  EngineUnderTest engine;
  // Every case names its schema "good": a refused schema must not replace the loaded one.
  const std::vector<SchemaCase> cases = {
      {"malformed XML: an unclosed <module>",
       "<schema name=\"good\">\n  <module name=\"a\">text\n</schema>",
       {ErrorKind::kXmlSyntax, {"bad.xml:3:3:", "Start-end tags mismatch", "</schema>"}}},
      {"malformed XML: a mistyped end tag",
       "<schema name=\"good\">\n  <module name=\"a\">text</modul>\n</schema>",
       {ErrorKind::kXmlSyntax, {"bad.xml:2:", "</modul>"}}},
      {"malformed XML: an attribute without quotes",
       "<schema name=\"good\">\n  <module name=a>text</module>\n</schema>",
       {ErrorKind::kXmlSyntax, {"bad.xml:2:", "attribute"}}},
      {"malformed XML: a comment that is never closed",
       "<schema name=\"good\">\n  text\n  <!-- unfinished\n</schema>",
       {ErrorKind::kXmlSyntax, {"bad.xml:3:3:", "never closed"}}},
      {"an empty file", "", {ErrorKind::kXmlSyntax, {"bad.xml:1:1:", "No document element found"}}},
      {"binary garbage",
       std::string(kPngBytes, sizeof kPngBytes - 1),
       {ErrorKind::kXmlSyntax, {"bad.xml:"}}},
      {"duplicate module names",
       "<schema name=\"good\">\n  <module name=\"a\">1</module>\n  <module name=\"a\">2</module>\n"
       "</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "duplicate module name 'a'", "<module name=\"a\">"}}},
      {"duplicate parameter names",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\" length=\"2\"/>\n"
       "  <parameter name=\"p\" length=\"2\"/>\n</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:4:3:", "duplicate parameter name 'p'", "<parameter"}}},
      {"an unknown element",
       "<schema name=\"good\">\n  Text\n  <modul name=\"a\">A</modul>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "unknown element <modul>", "<modul name=\"a\">"}}},
      {"an unknown attribute",
       "<schema name=\"good\">\n  <module name=\"m\" cached=\"false\">M</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:3:", "unknown attribute 'cached'", "<module name=\"m\">"}}},
      {"cache=\"maybe\"",
       "<schema name=\"good\">\n  <module name=\"m\" cache=\"maybe\">M</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:3:", "cache must be", "<module name=\"m\">"}}},
      {"a module name that is no XML name",
       "<schema name=\"good\">\n  <module name=\"1st\">M</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:3:", "not an XML name", "<module name=\"1st\">"}}},
      {"parameter length=\"0\"",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\" length=\"0\"/>\n"
       "</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "positive integer", "<parameter name=\"p\">"}}},
      {"parameter length=\"-3\"",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\" length=\"-3\"/>\n"
       "</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "positive integer", "\"-3\""}}},
      {"parameter length=\"1000000000\"",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\" "
       "length=\"1000000000\"/>\n"
       "</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "length 1000000000 is more than the 1048576"}}},
      {"parameter length=\"99999999999999999999999\" (past 64 bits)",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\" "
       "length=\"99999999999999999999999\"/>\n</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "is more than the 1048576"}}},
      {"a parameter without length",
       "<schema name=\"good\">\n<module name=\"m\">\n  <parameter name=\"p\"/>\n</module>\n"
       "</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "needs a length", "<parameter name=\"p\">"}}},
      {"a parameter directly in <schema>",
       "<schema name=\"good\">\n  Text <parameter name=\"p\" length=\"2\"/>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:", "parameters must be inside a <module>"}}},
      {"text inside <union>",
       "<schema name=\"good\">\n  <union>\n    stray\n    <module name=\"a\">A</module>\n"
       "  </union>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:", "text inside <union>", "(in <union>)"}}},
      {"a parameter inside <union>",
       "<schema name=\"good\">\n<module name=\"m\"><union>\n  <parameter name=\"p\" "
       "length=\"1\"/>\n</union></module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "only <module> may go there"}}},
      {"an empty <union>",
       "<schema name=\"good\">\n  Text\n  <union>\n  </union>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:3:3:", "no member modules", "<union>"}}},
      {"a union scaffold that names no member",
       "<schema name=\"good\">\n  <union scaffold=\"zz\">\n    <module name=\"a\">A</module>\n"
       "  </union>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:3:", "scaffold 'zz' is not one of its member modules"}}},
      {"a union member named like a module of its scope",
       "<schema name=\"good\">\n  <module name=\"a\">1</module>\n  <union>\n"
       "    <module name=\"a\">2</module>\n  </union>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:4:5:", "duplicate module name 'a'"}}},
      {"the top element is not <schema>",
       "<prompt schema=\"good\">\n  x\n</prompt>",
       {ErrorKind::kSchema, {"bad.xml:1:1:", "must be <schema>, not <prompt>"}}},
      {"a module with src and content",
       "<schema name=\"good\">\n  <module name=\"m\" src=\"f.txt\">M</module>\n</schema>",
       {ErrorKind::kSchema, {"bad.xml:2:3:", "has a src file and content"}}},
      // A schema given as text reads no file (pml/src_files.hpp); a missing file of a schema file
      // is in tests/pml/test_errors.cpp.
      {"a src in a schema given as text",
       "<schema name=\"good\">\n  Text\n  <module name=\"doc\" "
       "src=\"no-such-file.txt\"/>\n</schema>",
       {ErrorKind::kSchema,
        {"bad.xml:3:3:", "no-such-file.txt", "is not read", "<module name=\"doc\">"}}},
      {"a schema longer than the model's context (2048)",
       "<schema name=\"good\">\n  Intro.\n  <module name=\"huge\">" + words(700) +
           "</module>\n</schema>",
       {ErrorKind::kContextOverflow,
        {"bad.xml:3:", "module 'huge'", "past the model's context (2048 positions)",
         "<module name=\"huge\">"}}},
      {"a parameter past the model's context",
       "<schema name=\"good\">\n  <module name=\"m\">\n    Ask <parameter name=\"p\" "
       "length=\"5000\"/>\n"
       "  </module>\n</schema>",
       {ErrorKind::kContextOverflow,
        {"bad.xml:3:9:", "parameter 'p' of module 'm'", "context (2048 positions)",
         "<parameter name=\"p\">"}}},
  };
  for (const SchemaCase& c : cases) {
    engine.expect(
        c.what, [&](Engine& e) { e.add_schema_string(c.xml, "bad.xml"); }, c.expect);
    // The good schema is still the one loaded under its name.
    CHECK(engine->layout("good").spans.size() > 5);
  }
  CHECK(cases.size() >= 25);

  // Elements nested past the depth limit (100,000 levels): an error, not a stack overflow.
  std::string deep = "<schema name=\"good\">\n";
  for (int i = 0; i < 100000; ++i) deep += "<module name=\"m" + std::to_string(i) + "\">";
  deep += "text";
  for (int i = 0; i < 100000; ++i) deep += "</module>";
  deep += "</schema>";
  engine.expect("modules nested 100,000 deep",
                [&](Engine& e) { e.add_schema_string(deep, "deep.xml"); },
                {ErrorKind::kXmlSyntax, {"deep.xml:2:", "nested deeper than 128"}});

  // A schema file that is not there.
  engine.expect("a schema file that does not exist",
                [](Engine& e) { e.add_schema_file("/nonexistent/schema.xml"); },
                {ErrorKind::kIo, {"/nonexistent/schema.xml"}});
}

TEST_CASE("a schema that fails to compile or save leaves the engine consistent",
          "[bad][schema][cache]") {
  EngineUnderTest engine;
  // Another version of "good" whose compiled states cannot be saved (the folder is missing):
  // the error names the file; the engine holds either the old schema or the new one with its
  // own states, never the old layout over new states.
  std::string edited = bad::kGoodSchema;
  edited.replace(edited.find("mountains"), 9, "hills");
  test::TempDir dir;
  const std::string unwritable = dir.file("no-such-folder/good.states");
  bad::expect_error("a cache file that cannot be written",
                    [&] { engine->add_schema(pml::parse_schema_string(edited), {}, unwritable); },
                    {ErrorKind::kIo, {unwritable + ": io error: cannot write the cache file"}});
  // It is the new schema (compiled, not saved): its answer is what a fresh engine gives.
  auto reference = test::tiny_engine(5);
  reference->add_schema_string(edited);
  const Response want = reference->generate_xml(bad::kGoodPrompt, bad::greedy());
  const Response got = engine->generate_xml(bad::kGoodPrompt, bad::greedy());
  CHECK(got.tokens == want.tokens);
  CHECK(got.cached_tokens == want.cached_tokens);
  CHECK_FALSE(std::filesystem::exists(unwritable));
}
