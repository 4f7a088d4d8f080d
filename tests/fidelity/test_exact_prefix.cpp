// The exact leading run of a prompt (exact_prefix_tokens, cache/compiler.hpp): the stored states
// a no-cache prefill would compute, which recompute never chooses. Checked against the states
// themselves: every slot of the run equals the no-cache prefill's, the first slot after it does
// not; a prefix prompt recomputes nothing at any share, and a gap prompt only what follows its
// run.
#include "support/catch_torch.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "promptcache/fidelity.hpp"
#include "promptcache/recompute.hpp"
#include "support/recompute_criteria.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

// A union whose scaffold member is the longer one (u2, shorter, leaves a gap after it when
// chosen), and a parameter in b.
const char* kSchema = R"(<schema name="run">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="a">Once upon a time, there was a little girl named Lily.</module>
  <union scaffold="u1">
    <module name="u1">She loved to play outside in the park with her big red ball.</module>
    <module name="u2">She loved the park.</module>
  </union>
  <module name="b">Her friend Tom came to help <parameter name="who" length="4"/> with a stick.</module>
  <module name="c">When the night came, the stars were bright and the moon was round.</module>
</schema>)";

const std::vector<RecomputeCriterion>& kAll = test::all_recompute_criteria();

// The largest difference between slot `s` of `cached` and slot `s` of `plain`, over all layers.
double slot_diff(const KVCache& cached, const KVCache& plain, int64_t s) {
  double diff = 0;
  for (int64_t l = 0; l < cached.layers(); ++l) {
    diff = std::max(diff, (cached.keys(l).narrow(2, s, 1) - plain.keys(l).narrow(2, s, 1))
                              .abs()
                              .max()
                              .item<double>());
    diff = std::max(diff, (cached.values(l).narrow(2, s, 1) - plain.values(l).narrow(2, s, 1))
                              .abs()
                              .max()
                              .item<double>());
  }
  return diff;
}

// exact_prefix_tokens for `xml`, checked against the states: the run's slots equal the no-cache
// prefill's, the next slot (when the prompt has one) differs.
int64_t checked_exact_run(Engine& engine, EncodingMode mode, const std::string& xml) {
  INFO(xml);
  const auto resolved = engine.resolve(pml::parse_prompt_string(xml));
  const auto exact =
      static_cast<int64_t>(exact_prefix_tokens(engine.layout("run"), resolved, mode));
  KVCache cached = engine.model().make_cache(0), plain = engine.model().make_cache(0);
  const auto assembled = engine.prefill(resolved, cached, true).assembled;
  engine.prefill(resolved, plain, false);
  REQUIRE(exact <= assembled.cached_tokens);
  for (int64_t s = 0; s < exact; ++s) {
    INFO("slot " << s);
    CHECK(cached.positions()[s] == s);
    CHECK(slot_diff(cached, plain, s) <= 1e-4);
  }
  if (exact < assembled.cached_tokens) {
    INFO("the first cached slot after the run, " << exact);
    CHECK(slot_diff(cached, plain, exact) > 1e-3);
  }
  return exact;
}

}  // namespace

TEST_CASE("the exact leading run is where the stored states equal the no-cache prefill's",
          "[fidelity]") {
  auto engine = test::tiny_engine(3);
  engine->add_schema_string(kSchema);
  const pml::Layout& layout = engine->layout("run");
  auto module = [&](const std::string& name) -> const pml::ModuleLayout& {
    for (const auto& m : layout.modules) {
      if (m.name == name) return m;
    }
    throw std::runtime_error("no module " + name);
  };
  auto end_of = [&](const std::string& name) { return static_cast<int64_t>(module(name).end); };
  const auto begin_of_a = static_cast<int64_t>(module("a").begin);
  const EncodingMode scaffold = EncodingMode::kScaffold;
  // A prefix: every cached token.
  CHECK(checked_exact_run(*engine, scaffold,
                          R"(<prompt schema="run"><a/><u1/>What did Lily see?</prompt>)") ==
        end_of("u1"));
  // The other member, stored by its own pass over the same context: exact; it is shorter than
  // the union, so c follows a gap and the run ends with u2.
  CHECK(checked_exact_run(*engine, scaffold,
                          R"(<prompt schema="run"><a/><u2/><c/>What then?</prompt>)") ==
        end_of("u2"));
  // b after u2 was stored by the scaffold pass, which saw u1: the run ends with u2 as well.
  CHECK(checked_exact_run(*engine, scaffold,
                          R"(<prompt schema="run"><a/><u2/><b who="Sam"/>Who came?</prompt>)") ==
        end_of("u2"));
  // After u1, b's text before its parameter belongs to the run; the argument is computed fresh,
  // so the run stops at its slot.
  const int64_t run_b = checked_exact_run(
      *engine, scaffold, R"(<prompt schema="run"><a/><u1/><b who="Sam"/>Who came?</prompt>)");
  CHECK(run_b > static_cast<int64_t>(module("b").begin));
  CHECK(run_b < end_of("b"));
  // Without a: the run is the root's text before it.
  CHECK(checked_exact_run(*engine, scaffold, R"(<prompt schema="run"><c/>What then?</prompt>)") ==
        begin_of_a);

  // Isolated encoding: a module saw only itself, so the run is the root's own leading text.
  EngineOptions options;
  options.encoding = EncodingMode::kIsolated;
  auto isolated = test::tiny_engine(3, options);
  isolated->add_schema_string(kSchema);
  CHECK(checked_exact_run(*isolated, EncodingMode::kIsolated,
                          R"(<prompt schema="run"><a/><u1/>What did Lily see?</prompt>)") ==
        begin_of_a);
}

TEST_CASE("recompute never chooses an exact slot, and a prefix prompt recomputes nothing",
          "[fidelity]") {
  auto engine = test::tiny_engine(4);
  engine->add_schema_string(kSchema);
  const auto prefix = engine->resolve(
      pml::parse_prompt_string(R"(<prompt schema="run"><a/><u1/>What did Lily see?</prompt>)"));
  const auto gap = engine->resolve(
      pml::parse_prompt_string(R"(<prompt schema="run"><a/><u1/><c/>What then?</prompt>)"));
  KVCache plain = engine->model().make_cache(0);
  const auto prefix_base = engine->prefill(prefix, plain, false);
  const auto gap_base = engine->prefill(gap, plain, false);
  for (auto criterion : kAll) {
    INFO(recompute_criterion_name(criterion));
    for (double r : {0.3, 1.0}) {
      INFO("r " << r);
      KVCache cache = engine->model().make_cache(0);
      const auto out = engine->prefill(prefix, cache, true, 0, {}, RecomputeOptions{r, criterion});
      CHECK(out.assembled.exact_tokens == out.assembled.cached_tokens);
      CHECK(out.recomputed_tokens == 0);
      CHECK((out.logits - prefix_base.logits).abs().max().item<double>() <= 1e-4);
    }
    // The gap prompt: its run is exact already, so r = 1 recomputes only the slots after it and
    // still gives the no-cache logits (gradual shrinks its set on later layers: not all).
    KVCache cache = engine->model().make_cache(0);
    const auto all = engine->prefill(gap, cache, true, 0, {}, RecomputeOptions{1.0, criterion});
    const int64_t exact = all.assembled.exact_tokens, cached = all.assembled.cached_tokens;
    REQUIRE(exact > 0);
    REQUIRE(exact < cached);
    if (criterion != RecomputeCriterion::kGradual) {
      CHECK(all.recomputed_tokens == cached - exact);
      CHECK((all.logits - gap_base.logits).abs().max().item<double>() <= 1e-4);
    }
    // Any count is spent on the slots after the run only, up to all of them.
    for (int64_t count : {int64_t{3}, cached}) {
      INFO("count " << count);
      KVCache assembled_only = engine->model().make_cache(0);
      AssembledPrompt assembled =
          Assembler().assemble(gap, engine->layout("run"), engine->store(), assembled_only, 0,
                               AssembleOptions{false, true});
      assembled.exact_tokens = exact;
      const auto chosen = choose_recompute_slots(engine->model(), gap, assembled, assembled_only,
                                                 count, RecomputeOptions{0.5, criterion});
      CHECK(static_cast<int64_t>(chosen.size()) == std::min(count, cached - exact));
      for (int64_t s : chosen) CHECK(s >= exact);
    }
  }
}

TEST_CASE("prefix prompts asking for recompute batch together and recompute nothing",
          "[fidelity]") {
  auto engine = test::tiny_engine(5);
  engine->add_schema_string(kSchema);
  const std::vector<pml::Prompt> prompts = {
      pml::parse_prompt_string(R"(<prompt schema="run"><a/><u1/>What did Lily see?</prompt>)"),
      pml::parse_prompt_string(R"(<prompt schema="run"><a/>Who is she?</prompt>)")};
  SamplingParams params = test::greedy_params(6);
  RequestOptions share;
  share.recompute = 0.3;
  const auto batch = engine->generate_batch(prompts, params, {}, share);
  const auto plain = engine->generate_batch(prompts, params, {}, RequestOptions{});
  REQUIRE(batch.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    INFO("prompt " << i);
    const auto alone = engine->generate(prompts[i], params, {}, share);
    CHECK(alone.recomputed_tokens == 0);
    CHECK(batch[i].recomputed_tokens == 0);
    CHECK(batch[i].tokens == alone.tokens);
    CHECK(batch[i].tokens == plain[i].tokens);
  }
}
