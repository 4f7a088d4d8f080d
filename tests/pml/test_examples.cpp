// Every schema in ../shared/pml-examples parses and lays out consistently, with the fake
// tokenizer and (when present) the real stories260K SentencePiece tokenizer; plus the pass
// structure the cache compiler relies on, whitespace compaction, templates, src files, render.
#include "support/catch.hpp"
#include "support/test_support.hpp"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>

#include "pml/fake_tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/render.hpp"

using namespace promptcache;
using namespace promptcache::pml;
using pml_test::FakeTokenizer;

namespace {

const std::string kExamples = test::shared_dir() + "/pml-examples";
const std::string kRealTokenizer = test::stories260k_dir() + "/tokenizer.model";

std::vector<std::string> example_files() {
  std::vector<std::string> out;
  if (DIR* dir = opendir(kExamples.c_str())) {
    while (dirent* e = readdir(dir)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.substr(name.size() - 4) == ".xml")
        out.push_back(kExamples + "/" + name);
    }
    closedir(dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

std::vector<TokenId> cat_ids(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The invariants every layout must satisfy.
void check_consistent(const Layout& l) {
  // Module length = own spans + nested modules outside unions + the unions it holds.
  for (std::size_t m = 0; m < l.modules.size(); ++m) {
    std::size_t reserved = 0;
    for (std::size_t s : l.modules[m].spans) reserved += l.spans[s].size();
    for (std::size_t c : l.modules[m].children) {
      if (l.modules[c].unions.size() == l.modules[m].unions.size())
        reserved += l.modules[c].length();
    }
    for (const UnionLayout& u : l.unions) {
      if (u.module == m) reserved += u.length;
    }
    INFO("module '" << l.modules[m].path << "'");
    CHECK(reserved == l.modules[m].length());
  }
  CHECK(l.total_length == l.root().length());
  CHECK(l.root().begin == 0);
  // Union members share the union's offset; the union reserves the longest.
  for (const UnionLayout& u : l.unions) {
    std::size_t longest = 0;
    for (std::size_t m : u.members) {
      CHECK(l.modules[m].begin == u.begin);
      longest = std::max(longest, l.modules[m].length());
    }
    CHECK(u.length == longest);
  }
  // Parameter slots hold exactly `length` tokens; spans lie inside their module.
  for (const Span& s : l.spans) {
    CHECK(s.begin >= l.modules[s.module].begin);
    CHECK(s.end() <= l.modules[s.module].end);
    CHECK_FALSE(s.tokens.empty());
  }
  // Within one pass spans never overlap and come in position order; each cacheable span is
  // stored by exactly one pass, and is present in it.
  std::map<std::size_t, int> stored;
  for (const Pass& pass : l.encoding_passes()) {
    const auto spans = l.spans_in(pass);
    for (std::size_t i = 1; i < spans.size(); ++i) {
      CHECK(l.spans[spans[i - 1]].end() <= l.spans[spans[i]].begin);
    }
    for (std::size_t s : l.spans_stored_by(pass)) {
      ++stored[s];
      CHECK(std::find(spans.begin(), spans.end(), s) != spans.end());
    }
  }
  for (std::size_t s = 0; s < l.spans.size(); ++s) {
    CHECK(stored[s] == (l.spans[s].cacheable ? 1 : 0));
  }
}

}  // namespace

TEST_CASE("examples: every shared schema parses and lays out consistently", "[pml][examples]") {
  const auto files = example_files();
  if (files.empty()) {
    WARN("no schemas in " << kExamples << "; skipping");
    return;
  }
  CHECK(files.size() >= 4);
  std::unique_ptr<Tokenizer> real;
  if (file_exists(kRealTokenizer))
    real = load_sentencepiece_tokenizer(kRealTokenizer);
  else
    WARN("no tokenizer at " << kRealTokenizer << "; checking with the fake tokenizer only");
  for (const std::string& file : files) {
    INFO(file);
    const Schema schema = parse_schema_file(file);
    CHECK_FALSE(schema.name.empty());
    for (const std::string& family : chat_template_families()) {
      INFO("template " << family);
      FakeTokenizer fake;
      check_consistent(layout(schema, fake, chat_template(family)));
      if (real) {
        const Layout l = layout(schema, *real, chat_template(family));
        check_consistent(l);
        // The span rule: a text span is exactly encode(trimmed text), and starts with "▁".
        for (const Span& s : l.spans) {
          if (s.kind != SpanKind::kText) continue;
          CHECK(s.tokens == real->encode(std::string(trim(s.text)), false));
          CHECK(real->id_to_piece(s.tokens[0]).rfind("\xE2\x96\x81", 0) == 0);
        }
      }
    }
  }
}

TEST_CASE("examples: pass structure of the nested-union travel schema", "[pml][examples][passes]") {
  const std::string file = kExamples + "/parameterized_prompts.xml";
  if (!file_exists(file)) {
    WARN("no " << file << "; skipping");
    return;
  }
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_file(file), tok, chat_template("llama-2"));
  REQUIRE(l.unions.size() == 2);  // (domestic | overseas), and the 8 places inside overseas
  CHECK_FALSE(l.unions[0].scaffold);
  CHECK_FALSE(l.unions[1].scaffold);
  CHECK(l.unions[1].unions == std::vector<UnionMembership>{{0, 1}});
  const auto passes = l.encoding_passes();
  CHECK(passes.size() == 1 + 2 + 8);
  // The scaffold pass leaves both unions out.
  for (std::size_t s : l.spans_in(passes[0])) CHECK(l.spans[s].unions.empty());
  // The pass for "maldives" has overseas swapped in around it, and stores maldives' spans only.
  const std::size_t maldives = l.module_index("travel-plan/overseas/maldives");
  const Pass p = l.member_pass(l.modules[maldives].unions.back());
  CHECK(p.choice[0] == std::optional<std::size_t>(1));
  CHECK(p.choice[1] == std::optional<std::size_t>(0));
  for (std::size_t s : l.spans_stored_by(p)) CHECK(l.spans[s].module == maldives);
  CHECK_FALSE(l.spans_stored_by(p).empty());
  // Parameters: "duration" reserves 5, "city" (inside domestic) 10, both unk-filled.
  const ModuleLayout& plan = l.module("travel-plan");
  REQUIRE(plan.parameters.size() == 1);
  CHECK(l.spans[plan.parameters[0]].tokens == std::vector<TokenId>(5, tok.unk_id()));
  const ModuleLayout& domestic = l.module("travel-plan/domestic");
  REQUIRE(domestic.parameters.size() == 1);
  CHECK(l.spans[domestic.parameters[0]].size() == 10);
  // A prompt choosing the places resolves; fresh text follows the chosen member.
  const auto r = resolve(parse_prompt_string(R"(<prompt schema="travel">
  <travel-plan duration="two weeks"><overseas><maldives/></overseas></travel-plan>
  <user>Plan it.</user></prompt>)"),
                         l, tok);
  // The root's own text after the module (</user>'s [/INST], the <assistant> turn) is always
  // selected, so here the fresh text starts at the schema's end.
  CHECK(r.text_begin == l.total_length);
  for (std::size_t i = 1; i < r.spans.size(); ++i) {
    CHECK(l.spans[r.spans[i - 1]].end() <= l.spans[r.spans[i]].begin);
  }
  CHECK(r.union_choice[0] == std::optional<std::size_t>(1));
  CHECK(r.union_choice[1] == std::optional<std::size_t>(0));
}

TEST_CASE("examples: union scaffolds in the mbti schema", "[pml][examples][passes]") {
  const std::string file = kExamples + "/schema_mbti_short.xml";
  if (!file_exists(file)) {
    WARN("no " << file << "; skipping");
    return;
  }
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_file(file), tok, plain_template());
  REQUIRE(l.unions.size() == 4);
  for (const UnionLayout& u : l.unions) {
    REQUIRE(u.scaffold);
    CHECK(*u.scaffold == 0);
    CHECK(l.modules[u.members[0]].length() == 0);  // the scaffold member is blank: no tokens
  }
  // Scaffold pass + 2 swapped-in members per union.
  CHECK(l.encoding_passes().size() == 1 + 4 * 2);
  const ModuleLayout& e = l.module("E");
  const ModuleLayout& i = l.module("I");
  CHECK(e.begin == i.begin);
  CHECK(l.unions[1].begin == l.unions[0].begin + std::max(e.length(), i.length()));
}

TEST_CASE("whitespace: edges compact to one space, the inside is untouched", "[pml][whitespace]") {
  CHECK(compact_whitespace("\n   Hello  world \n\t") == " Hello  world ");
  CHECK(compact_whitespace("Hello\n\nworld") == "Hello\n\nworld");
  CHECK(compact_whitespace("  x") == " x");
  CHECK(compact_whitespace("x\n") == "x ");
  CHECK(compact_whitespace(" \n\t ") == " ");
  CHECK(compact_whitespace("") == "");
  const Schema s = parse_schema_string(
      "<schema name=\"w\">\n\n   First   line\n  second line.   \n<module name=\"m\">  M  "
      "</module></schema>");
  REQUIRE(s.root.children.size() == 2);
  CHECK(s.root.children[0].text == " First   line\n  second line. ");
  CHECK(s.root.children[1].children[0].text == " M ");
  // Edge whitespace never changes tokens: a span is tokenized trimmed.
  FakeTokenizer tok;
  CHECK(encode_span(tok, " a b ") == encode_span(tok, "a b"));
  CHECK(encode_span(tok, "  \n ").empty());
}

TEST_CASE("src: module text comes from a file next to the schema", "[pml][src]") {
  const Schema s = parse_schema_file(test::source_dir() + "/tests/pml/fixtures/with_src.xml");
  FakeTokenizer tok;
  const Layout l = layout(s, tok, plain_template());
  const ModuleLayout& doc = l.module("doc");
  REQUIRE(doc.spans.size() == 1);
  CHECK(l.spans[doc.spans[0]].text == " The document text,\nread from a file. ");
  CHECK(doc.begin == 2);  // <s> Intro.
  CHECK(doc.length() == 7);
  CHECK(l.module("after").begin == 9);
}

TEST_CASE("chat template: llama-2 text and special pieces become ids", "[pml][chat]") {
  const char* xml = R"(<schema name="c">
  <system>Be nice.</system>
  <user>Hello <module name="m">M</module></user>
  <assistant>Ok.</assistant>
</schema>)";
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(xml), tok, chat_template("llama-2"));
  std::vector<TokenId> all;
  for (const Span& s : l.spans) all.insert(all.end(), s.tokens.begin(), s.tokens.end());
  const auto w = [&](const char* x) { return tok.word(x); };
  CHECK(all == std::vector<TokenId>{1, w("[INST]"), w("<<SYS>>"), w("Be"), w("nice."),
                                    w("<</SYS>>"), w("Hello"), w("M"), w("[/INST]"), w("Ok."), 2,
                                    1});
  // Template spans belong to the enclosing module and carry their role.
  CHECK(l.spans[1].kind == SpanKind::kTemplate);
  CHECK(l.spans[1].role == ChatRole::kSystem);
  CHECK(l.module("m").begin == 7);

  // With the real tokenizer "</s><s>" is [eos, bos], not split text; a missing special piece
  // (chatml's <|im_start|>) falls back to ordinary text.
  if (!file_exists(kRealTokenizer)) {
    WARN("no tokenizer at " << kRealTokenizer << "; skipping the real-tokenizer part");
    return;
  }
  const auto real = load_sentencepiece_tokenizer(kRealTokenizer);
  const ChatTemplate llama = chat_template("llama-2");
  CHECK(llama.encode(*real, "</s><s>") == std::vector<TokenId>{real->eos_id(), real->bos_id()});
  CHECK(llama.encode(*real, "x</s>") ==
        cat_ids(real->encode("x", false), std::vector<TokenId>{real->eos_id()}));
  const ChatTemplate chatml = chat_template("chatml");
  CHECK(chatml.encode(*real, "<|im_start|>user") == real->encode("<|im_start|>user", false));
  CHECK_THROWS_AS(chat_template("nope"), Error);
}

TEST_CASE("render: the layout table lists every span with positions and cache flag",
          "[pml][render]") {
  FakeTokenizer tok;
  const Layout l = layout(parse_schema_string(R"(<schema name="demo">
  You are helpful.
  <union scaffold="a">
    <module name="a">First doc.</module>
    <module name="b" cache="false">Second, longer doc.</module>
  </union>
  <module name="q">Topic: <parameter name="t" length="3"/></module>
</schema>)"),
                          tok, chat_template("llama-2"));
  const std::string table = render_layout(l);
  INFO(table);
  CHECK_THAT(table, Catch::Contains("schema \"demo\": 11 positions"));
  CHECK_THAT(table, Catch::Contains("[1,4)"));
  CHECK_THAT(table, Catch::Contains("u0 member 0*"));
  CHECK_THAT(table, Catch::Contains("\"Second, longer doc.\""));
  CHECK_THAT(table, Catch::Contains("t = \"\""));
  CHECK_THAT(table, Catch::Contains("b  [4,7)  cache=false"));
  CHECK(l.spans[l.module("b").spans[0]].cacheable == false);
}
