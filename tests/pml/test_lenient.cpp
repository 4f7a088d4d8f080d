// Lenient input (pml/lenient.hpp): a '<' or '&' that starts no markup is read as text with a
// warning naming the file, line and column; everything that does look like markup stays strict,
// and error locations after repaired characters still point at the author's text.
#include "support/catch.hpp"

#include <string>
#include <vector>

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

namespace {

// A module of C++ and math as the reference's schemas hold it (lxml reads it in recovery mode).
const char* kCode = R"(<schema name="code">
  <module name="cpp">
#include <vector>
int f(std::vector<int> v) {
  if (v.size() < 3 && v[0] <= 1) return a<b;
  return x & 1;
}
template <typename T> T id(T t) { return t; }
std::map<K, V> m; <?php ?> <!x> </ x> <3
  </module>
  <module name="math">For all x &lt; y: a < b; R&D &nbsp; &#0; &#65; done.</module>
  <module name="p">Ask <parameter name="q" length="3" scaffold="a<b & c"/></module>
</schema>)";

const Node& module(const Schema& s, const std::string& name) {
  for (const Node& c : s.root.children) {
    if (c.kind == NodeKind::kModule && c.name == name) return c;
  }
  FAIL("no module " << name);
  return s.root;
}

Error error_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no error was thrown");
  return Error(ErrorKind::kIo, "unreachable");
}

}  // namespace

TEST_CASE("lenient: code and math in module text are read as text, as written", "[pml][lenient]") {
  const Schema s = parse_schema_string(kCode, "code.xml");
  const Node& cpp = module(s, "cpp");
  REQUIRE(cpp.children.size() == 1);
  CHECK(cpp.children[0].text == R"( #include <vector>
int f(std::vector<int> v) {
  if (v.size() < 3 && v[0] <= 1) return a<b;
  return x & 1;
}
template <typename T> T id(T t) { return t; }
std::map<K, V> m; <?php ?> <!x> </ x> <3 )");
  // "&lt;" and "&#65;" are entities; "&", "&nbsp;" and "&#0;" (no XML character) are text.
  CHECK(module(s, "math").children.at(0).text == "For all x < y: a < b; R&D &nbsp; &#0; A done.");
  const Node& q = module(s, "p").children.at(1);
  REQUIRE(q.kind == NodeKind::kParameter);
  CHECK(q.text == "a<b & c");  // in an attribute value

  // One warning per line, naming file, line, the first column and the element.
  std::vector<std::size_t> lines;
  for (const Warning& w : s.warnings) lines.push_back(w.where.line);
  CHECK(lines == std::vector<std::size_t>{3, 4, 5, 6, 8, 9, 11, 12});
  const Warning& first = s.warnings.front();
  CHECK(first.where.file == "code.xml");
  CHECK(first.where.column == 10);
  CHECK(first.where.element == "<module name=\"cpp\">");
  CHECK(first.render() ==
        "code.xml:3: read as text, not markup: '<' at column 10 (<vector> is not a PML element "
        "and is never closed); write &lt; to say it is text (in <module name=\"cpp\">)");
  const std::string line5 = s.warnings[2].render();
  INFO(line5);
  CHECK_THAT(line5, Catch::StartsWith("code.xml:5: "));
  CHECK_THAT(line5, Catch::Contains("'<' at column 16 (starts no tag)"));
  CHECK_THAT(line5, Catch::Contains("'&' at column 20 (starts no entity"));
  CHECK_THAT(line5, Catch::Contains("'&' at column 21"));
  CHECK_THAT(line5, Catch::Contains("'<' at column 42 (starts no well-formed tag, and <b> is not"));
  CHECK_THAT(line5, Catch::Contains("write &lt; and &amp;"));
  const std::string line9 = s.warnings[5].render();
  INFO(line9);
  CHECK_THAT(line9, Catch::Contains("'<?' inside an element"));
  CHECK_THAT(line9, Catch::Contains("'<!' starts no comment"));
  CHECK_THAT(line9, Catch::Contains("column 33 (starts no end tag)"));
  CHECK_THAT(line9, Catch::Contains("column 39 (starts no tag)"));
  CHECK(s.warnings.back().where.element == "<parameter name=\"q\">");

  // The layout tokenizes the text as written, and carries the warnings.
  FakeTokenizer tok;
  const Layout l = layout(s, tok, plain_template());
  CHECK(l.warnings.size() == s.warnings.size());
  const Span& math = l.spans[l.module("math").spans.at(0)];
  CHECK(math.tokens == tok.encode("For all x < y: a < b; R&D &nbsp; &#0; A done.", false));
}

TEST_CASE("lenient: well-formed XML gives no warnings", "[pml][lenient]") {
  const Schema s = parse_schema_string(R"(<?xml version="1.0"?>
<!DOCTYPE schema>
<!-- a < b && c in a comment -->
<schema name="ok">
  <module name="a">x &lt; y &amp;&amp; z &#x3C; &quot;q&quot; <![CDATA[a < b && c]]></module>
</schema>)");
  CHECK(s.warnings.empty());
  const Node& a = module(s, "a");
  std::string text;
  for (const Node& c : a.children) text += c.text;
  CHECK(text == "x < y && z < \"q\" a < b && c");
}

TEST_CASE("lenient: markup errors stay errors, at the author's line and column",
          "[pml][lenient][errors]") {
  struct Case {
    const char* what;
    std::string xml;
    ErrorKind kind;
    std::size_t line, column;
    std::string element;
  };
  const std::vector<Case> cases = {
      // Repaired characters before the error shift the parsed text, not the reported column.
      {"mismatched end tag after repairs",
       "<schema name=\"s\">\n a < b && c < d\n <module name=\"a\">x</modul>\n</schema>",
       ErrorKind::kXmlSyntax, 3, 22, "</modul>"},
      {"unclosed PML element", "<schema name=\"s\">\n x && y\n <module name=\"a\">text\n</schema>",
       ErrorKind::kXmlSyntax, 4, 3, "</schema>"},
      {"malformed PML start tag",
       "<schema name=\"s\">\n <module name=\"a\"\n a < b</module></schema>", ErrorKind::kXmlSyntax,
       3, 4, ""},
      {"unknown element that is closed", "<schema name=\"s\">\n a < b <b>x</b>\n</schema>",
       ErrorKind::kSchema, 2, 8, "<b>"},
      {"unknown self-closing element", "<schema name=\"s\">\n a & b <br/>\n</schema>",
       ErrorKind::kSchema, 2, 8, "<br>"},
      {"unterminated comment", "<schema name=\"s\">\n a < b\n <!-- never closed\n</schema>",
       ErrorKind::kXmlSyntax, 3, 2, ""},
      {"unterminated attribute value",
       "<schema name=\"s\">\n<module name=\"a>x</module>\n</schema>", ErrorKind::kXmlSyntax, 2, 0,
       ""},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const Error e = error_of([&] { parse_schema_string(c.xml, "bad.xml"); });
    INFO(e.what());
    CHECK(e.kind() == c.kind);
    CHECK(e.where().file == "bad.xml");
    CHECK(e.where().line == c.line);
    if (c.column > 0) CHECK(e.where().column == c.column);
    if (!c.element.empty()) CHECK_THAT(e.what(), Catch::Contains("(in " + c.element));
  }
  // An unterminated comment is reported where it opens, not at the end of the text.
  CHECK_THROWS_WITH(parse_schema_string("<schema name=\"s\">\n <!-- x\n <module name=\"a\">A"
                                        "</module>\n</schema>",
                                        "c.xml"),
                    Catch::StartsWith("c.xml:2:2: xml syntax error: malformed XML: the comment "
                                      "'<!--' has no '-->' (it is never closed)"));
}

TEST_CASE("lenient: prompts read a stray '<' and '&' as text, but every tag as markup",
          "[pml][lenient][prompt]") {
  const Prompt p = parse_prompt_string(
      "<prompt schema=\"s\">\n  <a/>\n  Is a < b && c? R&D says x<3.\n</prompt>", "p.xml");
  REQUIRE(p.turns.size() == 1);
  CHECK(p.turns[0].text == " Is a < b && c? R&D says x<3. ");
  REQUIRE(p.warnings.size() == 1);
  CHECK(p.warnings[0].where.line == 3);
  CHECK(p.warnings[0].where.column == 8);
  CHECK(p.warnings[0].where.element == "<prompt>");
  // Arguments may hold them too.
  const Prompt q = parse_prompt_string("<prompt schema=\"s\"><p q=\"a < b & c\"/></prompt>");
  CHECK(q.modules.at(0).arguments.at(0).value == "a < b & c");
  CHECK(q.warnings.size() == 1);
  // A tag named after a module is markup even when it is never closed (modules can have any
  // name): still a syntax error, at the end tag that mismatches.
  const Error e = error_of([] { parse_prompt_string("<prompt schema=\"s\">\n  <a>\n</prompt>"); });
  CHECK(e.kind() == ErrorKind::kXmlSyntax);
  CHECK(e.where().line == 3);
}

TEST_CASE("lenient: the pre-scan's rules and offset map", "[pml][lenient]") {
  const RepairOptions schema = schema_repair_options();
  // Entities: the five named ones and references to XML characters; all else is text.
  const RepairedText amp = repair_stray_markup(
      "&lt;&gt;&amp;&quot;&apos;&#9;&#x1F600;&#0;&#xD800;"
      "&#99999999;&nbsp;&&x;&#;&#x;& ");
  CHECK(amp.text ==
        "&lt;&gt;&amp;&quot;&apos;&#9;&#x1F600;&amp;#0;&amp;#xD800;&amp;#99999999;&amp;nbsp;"
        "&amp;&amp;x;&amp;#;&amp;#x;&amp; ");
  CHECK(amp.count() == 9);
  CHECK(amp.character_of(0) == '&');
  CHECK(amp.offset_of(0) == 38);
  // Offsets map back, including bytes inside an inserted "&lt;".
  const RepairedText lt = repair_stray_markup("a < b < c", schema);
  CHECK(lt.text == "a &lt; b &lt; c");
  CHECK(lt.original_offset(0) == 0);
  CHECK(lt.original_offset(2) == 2);
  CHECK(lt.original_offset(5) == 2);
  CHECK(lt.original_offset(6) == 3);
  CHECK(lt.original_offset(9) == 6);
  CHECK(lt.original_offset(14) == 8);
  // Unknown start tags: text unless self-closing or closed later (schemas only).
  CHECK(repair_stray_markup("<schema><x>1</x><y/><z>", schema).text ==
        "<schema><x>1</x><y/>&lt;z>");
  CHECK(repair_stray_markup("<prompt><x>1</x><y/><z>", {}).text == "<prompt><x>1</x><y/><z>");
  // Known elements are markup even when malformed; pugixml reports them.
  CHECK(repair_stray_markup("<module name=\"a\" x>", schema).text == "<module name=\"a\" x>");
  // Processing instructions only outside the top element.
  CHECK(repair_stray_markup("<?xml version=\"1.0\"?><schema><?x?></schema>", schema).text ==
        "<?xml version=\"1.0\"?><schema>&lt;?x?></schema>");
  // Comments and CDATA are copied untouched.
  CHECK(repair_stray_markup("<s><!-- a < & --><![CDATA[ < & ]]></s>", schema).count() == 0);
}

TEST_CASE("lenient: warnings are one per line, at most 100 listed", "[pml][lenient]") {
  std::string xml = "<schema name=\"many\">\n<module name=\"m\">\n";
  for (int i = 0; i < 150; ++i) xml += "a < b && c\n";
  xml += "</module>\n</schema>";
  const Schema s = parse_schema_string(xml, "many.xml");
  REQUIRE(s.warnings.size() == XmlSource::kMaxWarnings + 1);
  CHECK(s.warnings[0].where.line == 3);
  CHECK(s.warnings[99].where.line == 102);
  CHECK(s.warnings.back().where.line == 103);
  // 150 lines x 3 characters, 100 lines listed.
  CHECK_THAT(s.warnings.back().message, Catch::StartsWith("150 more '<' or '&' read as text"));
  // A line names at most 8 characters.
  const Schema one = parse_schema_string("<schema name=\"s\"><module name=\"m\">" +
                                         std::string(20, '<') + "</module></schema>");
  REQUIRE(one.warnings.size() == 1);
  CHECK_THAT(one.warnings[0].message, Catch::Contains("column 42 (starts no tag); and 12") &&
                                          Catch::Contains("and 12 more on this line"));
  // A million and one of them: not a PML document (the offset map stays small).
  const Error e = error_of([] {
    parse_schema_string(
        "<schema name=\"s\">\n" + std::string(RepairedText::kMaxRepairs + 1, '&') + "</schema>",
        "amp.xml");
  });
  CHECK(e.kind() == ErrorKind::kXmlSyntax);
  CHECK_THAT(e.what(), Catch::StartsWith("amp.xml:2:1000001:") &&
                           Catch::Contains("more than 1000000 '<' or '&'"));
}
