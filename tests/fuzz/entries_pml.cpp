// Fuzz entries "schema" and "prompt": the header-only PML parsers, layout, resolution and prefix
// matching (the plain prompts the server reuses stored spans for), with
// the word-per-token fake tokenizer of the PML tests (no LibTorch, no model files).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "pml/fake_tokenizer.hpp"
#include "promptcache/error.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prefix_match.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/render.hpp"
#include "promptcache/pml/schema.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

// What the layout promises (pml/layout.hpp, docs/pml.md): spans inside their module's range,
// the schema's length is the root's end, spans of one pass in position order without overlap,
// every cacheable span stored by exactly one encoding pass.
void check_layout(const pml::Layout& layout) {
  check(!layout.modules.empty() && layout.root().is_root(), "layout without a root module");
  check(layout.total_length == layout.root().end, "total_length is not the root's end");
  for (const pml::Span& span : layout.spans) {
    check(span.module < layout.modules.size(), "span of an unknown module");
    const pml::ModuleLayout& m = layout.modules[span.module];
    check(m.begin <= span.begin && span.end() <= m.end, "span outside its module's range");
  }
  for (const pml::UnionLayout& u : layout.unions) {
    std::size_t longest = 0;
    for (std::size_t member : u.members) {
      check(layout.modules[member].begin == u.begin, "union member not at the union's offset");
      longest = std::max(longest, layout.modules[member].length());
    }
    check(longest == u.length, "union length is not its longest member");
  }
  const std::vector<pml::Pass> passes = layout.encoding_passes();
  std::vector<int> stored(layout.spans.size(), 0);
  for (const pml::Pass& pass : passes) {
    std::size_t end = 0;
    for (std::size_t s : layout.spans_in(pass)) {
      check(layout.spans[s].begin >= end, "spans of one pass overlap or are out of order");
      end = layout.spans[s].end();
    }
    for (std::size_t s : layout.spans_stored_by(pass)) ++stored[s];
  }
  for (std::size_t s = 0; s < layout.spans.size(); ++s) {
    check(stored[s] == (layout.spans[s].cacheable ? 1 : 0),
          "a cacheable span is not stored by exactly one pass");
  }
}

// What resolution promises (pml/prompt.hpp): arguments within their slots, fresh text after
// every selected position, selected spans at distinct positions, the baseline is exactly the
// selected tokens and the text.
void check_resolved(const pml::ResolvedPrompt& r, const pml::Layout& layout) {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::size_t baseline = r.text_tokens.size();
  for (std::size_t s : r.spans) {
    const pml::Span& span = layout.spans[s];
    if (span.kind == pml::SpanKind::kParameter) continue;
    ranges.emplace_back(span.begin, span.end());
    baseline += span.size();
  }
  for (const pml::PlacedArgument& a : r.arguments) {
    const pml::Span& slot = layout.spans.at(a.span);
    check(slot.kind == pml::SpanKind::kParameter, "argument placed in a span that is no slot");
    check(a.begin == slot.begin && a.tokens.size() <= slot.size(), "argument outside its slot");
    ranges.emplace_back(a.begin, a.end());
    baseline += a.tokens.size();
  }
  check(r.baseline.size() == baseline, "baseline is not the selected tokens plus the text");
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    check(ranges[i].second <= r.text_begin, "fresh text starts before a selected position");
    if (i > 0) check(ranges[i].first >= ranges[i - 1].second, "selected spans overlap");
  }
  for (std::size_t m : r.modules) {
    const pml::ModuleLayout& module = layout.modules.at(m);
    check(module.is_root() ||
              std::find(r.modules.begin(), r.modules.end(), module.parent) != r.modules.end(),
          "a module is selected without its parent");
  }
}

// What match_prefix promises (pml/prefix_match.hpp): its spans are stored ones, contiguous from
// position 0, holding exactly ids' first tokens, within max_tokens; and matched_prompt reads
// them with the rest of ids fresh after them.
void check_prefix_match(const pml::Layout& layout, const std::vector<TokenId>& ids,
                        std::size_t max_tokens) {
  const pml::PrefixMatch m = pml::match_prefix(layout, ids, max_tokens);
  check(m.tokens <= max_tokens && m.tokens <= ids.size(), "a match longer than allowed");
  std::size_t at = 0;
  for (std::size_t s : m.spans) {
    const pml::Span& span = layout.spans.at(s);
    check(span.begin == at, "matched spans are not contiguous from position 0");
    check(span.cacheable && span.kind != pml::SpanKind::kParameter, "a matched span is not stored");
    check(std::equal(span.tokens.begin(), span.tokens.end(), ids.begin() + at),
          "a matched span holds other tokens");
    at = span.end();
  }
  check(at == m.tokens, "a match's token count is not its spans'");
  const pml::ResolvedPrompt r = pml::matched_prompt(layout, m, ids, ids.size());
  check(r.baseline == ids && r.text_begin == m.tokens, "matched_prompt changed the sequence");
  check_resolved(r, layout);
}

// The token sequence of the scaffold pass (what a client quoting the whole schema would send).
std::vector<TokenId> scaffold_tokens(const pml::Layout& layout) {
  std::vector<TokenId> out;
  for (std::size_t s : layout.spans_in(layout.scaffold_pass())) {
    out.insert(out.end(), layout.spans[s].tokens.begin(), layout.spans[s].tokens.end());
  }
  return out;
}

struct Variant {
  const char* family;
  std::vector<std::string> specials;
  pml::LayoutOptions options;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"llama-2", {}, {}},
      {"chatml", {"<|im_start|>", "<|im_end|>"}, pml::LayoutOptions{/*add_bos=*/false}},
  };
  return v;
}

// A folder with one text file, so that src="doc.txt" in a schema resolves.
const detail::ScratchDir& schema_dir() {
  static const detail::ScratchDir dir("schema");
  static const bool written = [] {
    const std::string text = "A document read from a file.\nIt has two lines.\n";
    detail::write_bytes(dir.file("doc.txt"), text.data(), text.size());
    return true;
  }();
  (void)written;
  return dir;
}

// The fixed schema prompts are resolved against: chat tags, a union with a scaffold and a
// cache="false" member holding a nested module, parameters, a union without a scaffold.
const char* const kPromptSchema = R"(<schema name="fz">
  <system>You are a careful assistant.</system>
  <module name="intro">Welcome to the library of old maps.</module>
  <union scaffold="short">
    <module name="short">Be brief.</module>
    <module name="long" cache="false">Explain every step
      <module name="detail">with care and detail</module> please.</module>
  </union>
  <module name="ask">Tell me about <parameter name="topic" length="4" scaffold="the sea"/>
    in <parameter name="words" length="2"/> words.
    <union><module name="a">first</module><module name="b">second choice here</module></union>
  </module>
  <user>Question follows.</user>
</schema>)";

}  // namespace

void schema_entry(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const pml::Schema schema =
        pml::parse_schema_string(text, "<fuzz>", pml::RootedSrcFiles(schema_dir().path().string()));
    for (const Variant& v : variants()) {
      pml_test::FakeTokenizer tokenizer(v.specials);
      const pml::Layout layout =
          pml::layout(schema, tokenizer, pml::chat_template(v.family), v.options);
      check_layout(layout);
      const std::vector<TokenId> quoted = scaffold_tokens(layout);
      check_prefix_match(layout, quoted, quoted.size());
      check_prefix_match(layout, quoted, quoted.size() / 2);
      pml::RenderOptions render;
      render.show_ids = true;
      (void)pml::render_layout(layout, render);
    }
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

void prompt_entry(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const pml::Schema schema = pml::parse_schema_string(kPromptSchema, "fz.xml");
  try {
    const pml::Prompt prompt = pml::parse_prompt_string(text, "<fuzz>");
    for (const Variant& v : variants()) {
      // A fresh tokenizer per input: the fake one hands out ids to new words as it meets them.
      pml_test::FakeTokenizer tokenizer(v.specials);
      const pml::Layout layout =
          pml::layout(schema, tokenizer, pml::chat_template(v.family), v.options);
      const pml::ResolvedPrompt resolved = pml::resolve(prompt, layout, tokenizer);
      check_resolved(resolved, layout);
      check_prefix_match(layout, resolved.baseline, resolved.baseline.size());
    }
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

}  // namespace promptcache::fuzz
