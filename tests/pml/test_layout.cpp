// Golden layout tests: small hand-written schemas with exact offsets, pass structure, templates.
#include "support/catch.hpp"

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"
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

TEST_CASE("schema: a module's recompute attribute is a token count or a fraction",
          "[pml][layout]") {
  CHECK(parse_module_recompute("16")->tokens == std::optional<std::size_t>(16));
  CHECK(parse_module_recompute("0")->tokens == std::optional<std::size_t>(0));
  CHECK(parse_module_recompute("1")->tokens == std::optional<std::size_t>(1));  // one token
  CHECK_FALSE(parse_module_recompute("1.0")->tokens.has_value());               // all of them
  CHECK(parse_module_recompute("1.0")->fraction == 1.0);
  CHECK(parse_module_recompute("0.25")->fraction == 0.25);
  CHECK(parse_module_recompute("1e-1")->fraction == 0.1);
  for (const char* bad : {"", "-1", "1.5", "abc", "16 ", " 16", "0x10", "nan", "inf", "2%",
                          "10000001", "99999999999999999999999999"}) {
    INFO(bad);
    CHECK_FALSE(parse_module_recompute(bad).has_value());
  }
  CHECK(parse_module_recompute("10000000")->tokens == std::optional<std::size_t>(10'000'000));
  ModuleRecompute tokens;
  tokens.tokens = 3;
  CHECK(tokens.count(5) == 3);
  CHECK(tokens.count(2) == 2);  // at most the module's cached tokens
  ModuleRecompute half;
  half.fraction = 0.5;
  CHECK(half.count(5) == 3);  // rounded to nearest
  CHECK(half.count(4) == 2);
  CHECK(half.count(0) == 0);
  ModuleRecompute little;
  little.fraction = 0.01;
  CHECK(little.count(5) == 1);  // at least one
  CHECK(ModuleRecompute{}.count(5) == 0);
}

TEST_CASE("prompt: module recompute budgets come from the schema and a prompt overrides them",
          "[pml][layout]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(R"(<schema name="r">
  Root.
  <module name="a" recompute="3">one two <module name="n" recompute="0.5">n1 n2</module> three
    <parameter name="q" length="2"/> four</module>
  <module name="b" recompute="0.5">six seven eight nine</module>
  <module name="c">ten</module>
  <module name="off" cache="false" recompute="2">eleven</module>
</schema>)"),
                          tok, plain_template());
  REQUIRE(l.module("a").recompute.has_value());
  CHECK(l.module("a").recompute->tokens == std::optional<std::size_t>(3));
  CHECK(l.module("b").recompute->fraction == 0.5);
  CHECK_FALSE(l.module("c").recompute.has_value());
  CHECK_FALSE(l.root().recompute.has_value());

  auto budgets = [&](const char* xml) {
    return resolve(parse_prompt_string(xml), l, tok).recompute_budgets;
  };
  // a's own text spans only: not its nested module, not its parameter slot.
  const auto a = budgets(R"(<prompt schema="r"><a q="x"/><c/>Q</prompt>)");
  REQUIRE(a.size() == 1);
  CHECK(a[0].module == l.module_index("a"));
  CHECK(a[0].budget.tokens == std::optional<std::size_t>(3));
  std::size_t tokens = 0;
  for (const auto& [begin, end] : a[0].ranges) {
    CHECK(begin >= l.module("a").begin);
    CHECK(end <= l.module("a").end);
    CHECK((end <= l.module("a/n").begin || begin >= l.module("a/n").end));
    tokens += end - begin;
  }
  CHECK(tokens == 4);  // one two three four
  // Every selected module with a budget, in document order; c has none.
  const auto all = budgets(R"(<prompt schema="r"><a><n/></a><b/><c/>Q</prompt>)");
  REQUIRE(all.size() == 3);
  CHECK(all[0].module == l.module_index("a"));
  CHECK(all[1].module == l.module_index("a/n"));
  CHECK(all[2].module == l.module_index("b"));
  CHECK(all[1].ranges.size() == 1);
  // The prompt overrides the schema's, "0" included, and gives c one.
  const auto over = budgets(
      R"(<prompt schema="r"><a recompute="0"><n recompute="1.0"/></a><c recompute="2"/>Q</prompt>)");
  REQUIRE(over.size() == 3);
  CHECK(over[0].budget.tokens == std::optional<std::size_t>(0));
  CHECK(over[1].budget.fraction == 1.0);
  CHECK_FALSE(over[1].budget.tokens.has_value());
  CHECK(over[2].module == l.module_index("c"));
  CHECK(over[2].budget.tokens == std::optional<std::size_t>(2));
  // The override is not a parameter argument.
  CHECK(resolve(parse_prompt_string(R"(<prompt schema="r"><a recompute="1"/>Q</prompt>)"), l, tok)
            .arguments.front()
            .from_scaffold);
  // A module that is not cached has no cached tokens to recompute.
  const auto off = budgets(R"(<prompt schema="r"><off/>Q</prompt>)");
  REQUIRE(off.size() == 1);
  CHECK(off[0].ranges.empty());
  CHECK(budgets(R"(<prompt schema="r"><c/>Q</prompt>)").empty());
}
