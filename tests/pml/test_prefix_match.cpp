// pml::match_prefix: which stored spans a plain token sequence begins with, exactly (the runs
// the server reuses for `echo` on token ids; the log-probabilities themselves are checked in
// tests/contracts/test_sequence_logprobs.cpp).
#include "support/catch.hpp"

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prefix_match.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

namespace {

const char* kSchema = R"(<schema name="g">
  Root text here
  <module name="a">one two <module name="b">three</module> four</module>
  <union scaffold="y">
    <module name="x">x1 x2 x3</module>
    <module name="y">y1 y2 y3</module>
    <module name="z">z1</module>
  </union>
  <module name="c">see</module>
  <module name="p">ask <parameter name="q" length="2"/> done</module>
</schema>)";

std::vector<TokenId> words(FakeTokenizer& tok, std::initializer_list<const char*> ws) {
  std::vector<TokenId> out{1};  // BOS
  for (const char* w : ws) out.push_back(tok.word(w));
  return out;
}

}  // namespace

TEST_CASE("prefix match: the longest exact run of stored spans", "[pml][prefix]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(kSchema), tok, plain_template());
  // <s>=0, Root text here [1,4), a: one two [4,6) b: three [6,7) four [7,8), union [8,11),
  // c: see [11,12), p: ask [12,13) q [13,15) done [15,16).
  const auto all = words(tok, {"Root", "text", "here", "one", "two", "three", "four", "y1", "y2",
                               "y3", "see", "ask", "what", "now", "done", "Q"});

  SECTION("through the scaffold member, stopping at a parameter slot") {
    const PrefixMatch m = match_prefix(l, all, all.size());
    CHECK(m.tokens == 13);  // up to "ask": the slot's placeholder states are never stored
    const ResolvedPrompt r = matched_prompt(l, m, all, all.size());
    CHECK(r.text_begin == 13);
    CHECK(r.baseline == all);
    CHECK(r.text_tokens == std::vector<TokenId>(all.begin() + 13, all.end()));
    CHECK(r.union_choice[0] == std::optional<std::size_t>(1));  // y
    for (std::size_t s : r.spans) CHECK(l.spans[s].end() <= 13);
  }
  SECTION("max_tokens bounds the run at a span's edge") {
    CHECK(match_prefix(l, all, 12).tokens == 12);
    CHECK(match_prefix(l, all, 10).tokens == 8);  // the union's member does not fit whole
    CHECK(match_prefix(l, all, 0).tokens == 0);
  }
  SECTION("a non-scaffold member of the union's length ends the run after it") {
    auto ids = words(
        tok, {"Root", "text", "here", "one", "two", "three", "four", "x1", "x2", "x3", "see"});
    CHECK(match_prefix(l, ids, ids.size()).tokens == 11);  // c was stored after y, not x
  }
  SECTION("a shorter member leaves a gap") {
    auto ids = words(tok, {"Root", "text", "here", "one", "two", "three", "four", "z1", "see"});
    CHECK(match_prefix(l, ids, ids.size()).tokens == 9);
  }
  SECTION("a module left out leaves a gap") {
    auto ids = words(tok, {"Root", "text", "here", "y1", "y2", "y3"});
    CHECK(match_prefix(l, ids, ids.size()).tokens == 4);
  }
  SECTION("a different token ends the run before its span") {
    auto ids = all;
    ids[5] = tok.word("other");  // "two" in a's first span [4,6)
    CHECK(match_prefix(l, ids, ids.size()).tokens == 4);
    ids[0] = 2;  // no BOS: nothing matches
    CHECK(match_prefix(l, ids, ids.size()).tokens == 0);
    CHECK(match_prefix(l, {}, 5).tokens == 0);
  }
}

TEST_CASE("prefix match: cache=false and a union without scaffold end the run", "[pml][prefix]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(R"(<schema name="h">
  Intro
  <module name="live" cache="false">fresh words</module>
  <module name="later">after</module>
</schema>)"),
                          tok, plain_template());
  const auto ids = words(tok, {"Intro", "fresh", "words", "after"});
  CHECK(match_prefix(l, ids, ids.size()).tokens == 2);

  const Layout u = layout(parse_schema_string(R"(<schema name="u">
  Intro
  <union><module name="m1">m one</module><module name="m2">m two</module></union>
  <module name="next">after</module>
</schema>)"),
                          tok, plain_template());
  // m2's own pass stored it after "Intro": exact; `next` was stored with the union left out.
  const auto with_m2 = words(tok, {"Intro", "m", "two", "after"});
  CHECK(match_prefix(u, with_m2, with_m2.size()).tokens == 4);
}
