// Every schema of the reference implementation in ../shared/pml-examples loads unchanged: it
// parses (leniently, as lxml's recovery mode takes it), lays out, compiles on a tiny random model
// and answers a prompt that selects a module of every scope, cached and uncached.
#include "support/catch_torch.hpp"
#include "support/test_support.hpp"

#include <algorithm>
#include <filesystem>

#include "bad_inputs/bad_input.hpp"

using namespace promptcache;
namespace fs = std::filesystem;

namespace {

const std::string kExamples = test::shared_dir() + "/pml-examples";

std::vector<std::string> example_schemas() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kExamples, ec)) {
    if (e.path().extension() == ".xml") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// References to module m's children: the first member of each union, every other module, each
// with an argument for each parameter; nested the way the schema nests them.
std::string references(const pml::Layout& l, std::size_t m) {
  std::string out;
  for (std::size_t c : l.modules[m].children) {
    const pml::ModuleLayout& child = l.modules[c];
    if (child.unions.size() > l.modules[m].unions.size() && child.unions.back().member != 0) {
      continue;  // another member of a union whose first member is taken
    }
    out += "<" + child.name;
    for (std::size_t s : child.parameters) out += " " + l.spans[s].parameter + "=\"x\"";
    const std::string inner = references(l, c);
    out += inner.empty() ? "/>" : ">" + inner + "</" + child.name + ">";
  }
  return out;
}

// A tiny model with room for the longest example (the 400-piece test tokenizer needs about
// one token per 2-3 bytes of code).
std::unique_ptr<Engine> roomy_tiny_engine() {
  ModelConfig c = test::tiny_config();
  c.max_position_embeddings = 16384;
  EngineOptions options;
  options.chat_template = "llama-2";
  return std::make_unique<Engine>(
      LlamaModel::from_tensors(c, random_llama_weights(c, 11, 0.15), test::test_load_options()),
      load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
}

}  // namespace

TEST_CASE("reference schemas: each loads unchanged and answers a prompt", "[bad][reference]") {
  const auto files = example_schemas();
  if (files.empty()) {
    WARN("SKIPPED: no schemas in " << kExamples << " (a fresh clone without ../shared)");
    SUCCEED("nothing to check");
    return;
  }
  CHECK(files.size() >= 4);
  auto engine = roomy_tiny_engine();
  for (const std::string& file : files) {
    INFO(file);
    const pml::Schema schema = pml::parse_schema_file(file);
    for (const auto& w : schema.warnings) INFO("warning: " << w.render());
    const pml::Layout& layout = engine->add_schema(schema);
    CHECK(layout.total_length > 10);
    CHECK(engine->store().tokens(schema.name) > 0);
    const std::string prompt = "<prompt schema=\"" + schema.name + "\">" + references(layout, 0) +
                               "<user>Tell me more.</user></prompt>";
    INFO(prompt);
    const Response cached = engine->generate_xml(prompt, bad::greedy(3));
    CHECK(cached.tokens.size() == 3);
    CHECK(cached.cached_tokens > 0);
    const Response fresh = engine->generate_xml(prompt, bad::greedy(3), {}, RequestOptions{false});
    CHECK(fresh.tokens.size() == 3);
    CHECK(fresh.cached_tokens == 0);
    // Both runs see the same tokens: the baseline is every selected span plus the text.
    CHECK(fresh.fresh_tokens == cached.cached_tokens + cached.fresh_tokens);
  }
}

TEST_CASE("reference schemas: code samples in module text, as the reference's users write them",
          "[bad][reference][lenient]") {
  // In the style of the reference's code-generation examples, with the characters strict XML
  // refuses: comparisons, logical and, templates and includes.
  const std::string xml = R"(<schema name="cpp-review">
  <system>You review C++ code.</system>
  <user>
    <module name="vec.cpp">
#include <vector>
#include <algorithm>
int count_small(const std::vector<int>& v, int limit) {
  int n = 0;
  for (std::size_t i = 0; i < v.size(); ++i) if (v[i] < limit && v[i] >= 0) ++n;
  return n;
}
    </module>
    <module name="map.cpp">
std::map<std::string, int> index; // keys -> counts
bool ok = a < b || (c & 1);
    </module>
  </user>
</schema>)";
  const pml::Schema schema = pml::parse_schema_string(xml, "review.xml");
  REQUIRE(schema.warnings.size() == 6);  // lines 5, 6, 7, 9, 14 and 15
  CHECK(schema.warnings[0].render() ==
        "review.xml:5: read as text, not markup: '<' at column 10 (<vector> is not a PML "
        "element and is never closed); write &lt; to say it is text (in <module "
        "name=\"vec.cpp\">)");
  CHECK(schema.warnings[5].where.line == 15);
  auto engine = test::tiny_engine(5);
  const pml::Layout& layout = engine->add_schema(schema);
  const auto& span = layout.spans[layout.module("vec.cpp").spans.at(0)];
  CHECK_THAT(span.text, Catch::Contains("for (std::size_t i = 0; i < v.size(); ++i) if (v[i] < "
                                        "limit && v[i] >= 0) ++n;"));
  CHECK(span.tokens == engine->tokenizer().encode(std::string(pml::trim(span.text)), false));
  const Response r = engine->generate_xml(
      "<prompt schema=\"cpp-review\"><vec.cpp/><map.cpp/><user>Is a < b && c safe?</user>"
      "</prompt>",
      bad::greedy(3));
  CHECK(r.tokens.size() == 3);
  CHECK(r.cached_tokens > 0);
}
