// Contract 3: for any prompt, "assembled cache + fresh tokens" equals ONE forward pass over the
// expanded sequence (each selected span preceded by its own copy of its encoding context), every
// token at its own position id, under the Prompt Cache block mask: a span token sees its
// encoding context and itself causally; a fresh token sees the selected spans and earlier fresh
// tokens only. Random schemas with unions, gaps, parameters, nesting and cache="false" spans.
#include "support/catch_torch.hpp"

#include <random>
#include <sstream>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "support/position_reference.hpp"
#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;
using promptcache::test::Case;
using promptcache::test::make_case;
using promptcache::test::reference_logits;
using promptcache::test::Sequence;

TEST_CASE("position-exact: assembled cache + fresh tokens equal one masked forward pass",
          "[contract][position]") {
  auto tokenizer = load_sentencepiece_tokenizer(test::tiny_tokenizer_path());
  const auto model = test::tiny_model(4);
  const auto tmpl = pml::chat_template("llama-2");
  int cases = 0, with_batched = 0, with_unions = 0, with_arguments = 0, with_uncached = 0,
      with_gaps = 0, with_in_place = 0;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    const Case c = make_case(seed);
    for (EncodingMode mode : {EncodingMode::kScaffold, EncodingMode::kIsolated}) {
      INFO("seed " << seed << " mode " << to_string(mode) << "\nschema: " << c.schema
                   << "\nprompt: " << c.prompt);
      const pml::Layout layout = pml::layout(pml::parse_schema_string(c.schema), *tokenizer, tmpl);
      pml::ResolvedPrompt resolved;
      try {
        resolved = pml::resolve(pml::parse_prompt_string(c.prompt), layout, *tokenizer);
      } catch (const Error& e) {
        // A random argument may not fit its slot; that is a (tested elsewhere) user error.
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);
        continue;
      }
      // Odd seeds: chunked passes, spans copied into the cache; even seeds: short passes
      // batched into shared forwards, spans left in the store where the attention reads them in
      // place (f32 on the CPU with the fused kernel).
      const auto run = test::cached_run(*model, layout, resolved, mode, seed % 2 ? 7 : 512,
                                        /*in_place=*/seed % 2 == 0);
      const auto& report = run.report;
      const auto& assembled = run.assembled;
      const auto& got = run.logits;
      with_batched += report.forwards < static_cast<int64_t>(report.passes);
      with_in_place += assembled.in_place_tokens > 0;
      Sequence fresh;
      const auto expected = reference_logits(*model, layout, resolved, mode, fresh);
      CHECK(std::vector<int64_t>(assembled.fresh_tokens.begin(), assembled.fresh_tokens.end()) ==
            fresh.tokens);
      CHECK(assembled.fresh_positions == fresh.positions);
      const double diff = (got - expected).abs().max().item<double>();
      INFO("max abs diff " << diff << (assembled.in_place_tokens > 0 ? " (in place)" : ""));
      CHECK(diff <= test::logit_tolerance(*model, expected, 1e-5));
      if (seed % 8 == 0) {  // the comparison is sharp: one position off is far outside tolerance
        Sequence ignored;
        const auto shifted = reference_logits(*model, layout, resolved, mode, ignored, 1);
        CHECK((got - shifted).abs().max().item<double>() > 1e-3);
      }
      ++cases;
      with_unions += !layout.unions.empty();
      with_arguments += std::any_of(resolved.arguments.begin(), resolved.arguments.end(),
                                    [](const pml::PlacedArgument& a) { return !a.from_scaffold; });
      with_uncached +=
          std::any_of(resolved.spans.begin(), resolved.spans.end(), [&](std::size_t s) {
            return !layout.spans[s].cacheable && layout.spans[s].kind != pml::SpanKind::kParameter;
          });
      with_gaps += resolved.text_begin < layout.total_length;
    }
  }
  WARN("cases " << cases << ", unions " << with_unions << ", arguments " << with_arguments
                << ", uncached " << with_uncached << ", gaps " << with_gaps << ", batched "
                << with_batched << ", read in place " << with_in_place);
  // The generator really covers the features the contract is about.
  CHECK(cases >= 60);
  CHECK(with_unions >= 10);
  CHECK(with_arguments >= 10);
  CHECK(with_uncached >= 5);
  CHECK(with_gaps >= 10);
  CHECK(with_batched >= 10);
  if (model->device().is_cpu() && cpu_attention_available(model->config().head_dim)) {
    CHECK(with_in_place >= 20);
  } else {
    CHECK(with_in_place == 0);  // nothing reads in place there: every span is copied
  }
}
