// Golden layout tests: small hand-written schemas with exact offsets, pass structure, templates.
#include "support/catch.hpp"

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/render.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

TEST_CASE("layout: golden offsets with nested modules, union and parameter", "[pml][layout]") {
  const std::string xml = R"(<schema name="g">
  Root text here
  <module name="a">one two <module name="b">three</module> four</module>
  <union scaffold="y">
    <module name="x">x1 x2 x3</module>
    <module name="y">y1</module>
  </union>
  <module name="p">ask <parameter name="q" length="4" scaffold="s1 s2"/> done</module>
</schema>)";
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(xml), tok, plain_template());
  // root: <s>=0, "Root text here"=[1,4); a = "one two" [4,6), b "three" [6,7), "four" [7,8)
  REQUIRE(l.has_bos);
  CHECK(l.spans[0].kind == SpanKind::kBos);
  CHECK(l.spans[0].begin == 0);
  CHECK(l.spans[0].tokens == std::vector<TokenId>{1});
  const auto& a = l.module("a");
  CHECK(a.begin == 4);
  CHECK(a.end == 8);
  const auto& b = l.module("a/b");
  CHECK(b.begin == 6);
  CHECK(b.end == 7);
  CHECK(l.module_tokens(l.module_index("a")) ==
        std::vector<TokenId>{tok.word("one"), tok.word("two"), tok.word("four")});
  // union at 8: x = [8,11), y = [8,9), reserves 3
  const auto& x = l.module("x");
  const auto& y = l.module("y");
  CHECK(x.begin == 8);
  CHECK(x.end == 11);
  CHECK(y.begin == 8);
  CHECK(y.end == 9);
  REQUIRE(l.unions.size() == 1);
  CHECK(l.unions[0].begin == 8);
  CHECK(l.unions[0].length == 3);
  CHECK(l.unions[0].scaffold == std::optional<std::size_t>(1));
  // p at 11: "ask"=[11,12), q=[12,16) holding s1 s2 unk unk, "done"=[16,17)
  const auto& p = l.module("p");
  CHECK(p.begin == 11);
  CHECK(p.end == 17);
  REQUIRE(p.parameters.size() == 1);
  const Span& q = l.spans[p.parameters[0]];
  CHECK(q.begin == 12);
  CHECK(q.tokens == std::vector<TokenId>{tok.word("s1"), tok.word("s2"), 0, 0});
  CHECK_FALSE(q.cacheable);
  CHECK(l.total_length == 17);
  CHECK(l.root().end == 17);
}

TEST_CASE("schema: recompute attribute is the schema's default share and its layout carries it",
          "[pml][layout]") {
  FakeTokenizer tok;
  const Schema with = parse_schema_string(R"(<schema name="r" recompute="0.25">R</schema>)");
  REQUIRE(with.recompute.has_value());
  CHECK(*with.recompute == 0.25);
  const Layout l = layout(with, tok, plain_template());
  REQUIRE(l.recompute.has_value());
  CHECK(*l.recompute == 0.25);
  CHECK(*parse_schema_string(R"(<schema name="r" recompute="0">R</schema>)").recompute == 0);
  CHECK(*parse_schema_string(R"(<schema name="r" recompute="1">R</schema>)").recompute == 1);
  const Schema without = parse_schema_string(R"(<schema name="r">R</schema>)");
  CHECK_FALSE(without.recompute.has_value());
  CHECK_FALSE(layout(without, tok, plain_template()).recompute.has_value());
}
