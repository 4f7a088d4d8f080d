// Per-module recompute budgets (recompute="..." on a <module>, overridden on its reference in a
// prompt): each selected module with one recomputes exactly its count of its own cached slots,
// chosen by the request's criterion, beside the request's share of the other modules' slots;
// a prefix prompt stays exact with them.
#include "support/catch_torch.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "promptcache/fidelity.hpp"
#include "promptcache/recompute.hpp"
#include "support/recompute_criteria.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kSchema = R"(<schema name="budget">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park" recompute="5">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
  <module name="night" recompute="0.5">When the night came, the stars were bright and the moon was round.</module>
</schema>)";

const std::vector<RecomputeCriterion>& kAll = test::all_recompute_criteria();

// The chosen slots of a prompt, counted per module of the layout (by the reserved positions the
// slots held before the move); `other` counts the slots of modules without a budget.
struct Chosen {
  std::map<std::string, int64_t> per_module;
  std::map<std::string, int64_t> cached_per_module;
  int64_t total = 0;

  int64_t in(const std::string& module) const {
    const auto it = per_module.find(module);
    return it == per_module.end() ? 0 : it->second;
  }
};

Chosen choose(Engine& engine, const std::string& xml, int64_t shared,
              const RecomputeOptions& options) {
  const auto resolved = engine.resolve(pml::parse_prompt_string(xml));
  const pml::Layout& layout = engine.layout("budget");
  KVCache cache = engine.model().make_cache(0);
  const auto assembled = Assembler().assemble(resolved, layout, engine.store(), cache, 0,
                                              AssembleOptions{false, true});
  const std::vector<int64_t> reserved = cache.positions();
  auto module_of = [&](int64_t position) {
    for (const pml::Span& span : layout.spans) {
      if (static_cast<int64_t>(span.begin) <= position &&
          position < static_cast<int64_t>(span.end())) {
        return layout.modules[span.module].path;
      }
    }
    return std::string("?");
  };
  Chosen out;
  for (int64_t p : reserved) ++out.cached_per_module[module_of(p)];
  const auto slots =
      choose_recompute_slots(engine.model(), resolved, assembled, cache, shared, options);
  CHECK(std::is_sorted(slots.begin(), slots.end()));
  for (int64_t s : slots) ++out.per_module[module_of(reserved[s])];
  out.total = static_cast<int64_t>(slots.size());
  return out;
}

}  // namespace

TEST_CASE("a module's recompute budget recomputes its count of its own slots by any criterion",
          "[fidelity]") {
  auto engine = test::tiny_engine(4);
  engine->add_schema_string(kSchema);
  const std::string gap = R"(<prompt schema="budget"><park/><friend/><night/>What now?</prompt>)";
  for (auto criterion : kAll) {
    INFO(recompute_criterion_name(criterion));
    RecomputeOptions options{0, criterion};  // first_k 8: friend alone has 8 such slots
    // No shared share: the budgets alone. park: 5 tokens; night: half of its cached slots.
    const Chosen only = choose(*engine, gap, 0, options);
    const int64_t night = (only.cached_per_module.at("night") + 1) / 2;
    CHECK(only.in("park") == 5);
    CHECK(only.in("night") == night);
    CHECK(only.in("friend") == 0);
    CHECK(only.total == 5 + night);
    // A shared count of 4 comes from the slots outside the budgeted modules only (gradual's
    // first layer takes 1.5x the shared count, unless one layer follows its pass: the tiny
    // model's two layers).
    const Chosen shared = choose(*engine, gap, 4, options);
    CHECK(shared.in("park") == 5);
    CHECK(shared.in("night") == night);
    CHECK(shared.total == 5 + night + 4);
    // The prompt overrides: none of park, all of friend (one token here is "1", all is "1.0").
    const Chosen over = choose(
        *engine,
        R"(<prompt schema="budget"><park recompute="0"/><friend recompute="1.0"/><night recompute="1"/>What now?</prompt>)",
        0, options);
    CHECK(over.in("park") == 0);
    CHECK(over.in("friend") == over.cached_per_module.at("friend"));
    CHECK(over.in("night") == 1);
  }
}

TEST_CASE("module budgets are honoured by generate and keep a prefix prompt exact", "[fidelity]") {
  auto engine = test::tiny_engine(5);
  engine->add_schema_string(kSchema);
  const std::string gap = R"(<prompt schema="budget"><park/><friend/><night/>What now?</prompt>)";
  // The schema's budgets apply with no request share (and with 0: the share covers the rest).
  const auto plain = engine->generate_xml(gap, test::greedy_params(4));
  const auto resolved = engine->resolve(pml::parse_prompt_string(gap));
  const int64_t expected = recompute_capacity(RecomputeOptions{}, resolved);
  CHECK(expected > 5);
  CHECK(plain.recomputed_tokens == expected);
  RequestOptions zero;
  zero.recompute = 0;
  CHECK(engine->generate_xml(gap, test::greedy_params(4), {}, zero).recomputed_tokens == expected);
  const auto off = engine->generate_xml(
      R"(<prompt schema="budget"><park recompute="0"/><friend/><night recompute="0"/>What now?</prompt>)",
      test::greedy_params(4), {}, zero);
  CHECK(off.recomputed_tokens == 0);
  // Without the cache nothing is recomputed.
  RequestOptions no_cache;
  no_cache.use_cache = false;
  CHECK(engine->generate_xml(gap, test::greedy_params(4), {}, no_cache).recomputed_tokens == 0);

  // A prefix prompt (intro, park: no gap) stays exact with park's budget, under every criterion:
  // its states are the no-cache ones already, so nothing is recomputed.
  const auto prefix = pml::parse_prompt_string(
      R"(<prompt schema="budget"><intro/><park recompute="1.0"/>What did Lily see?</prompt>)");
  for (auto criterion : kAll) {
    INFO(recompute_criterion_name(criterion));
    FidelityOptions options;
    options.tokens = 12;
    options.recompute = {0, criterion};
    const auto f = measure_fidelity(*engine, prefix, options);
    CHECK(f.recomputed_tokens == 0);
    CHECK(f.first_token_kl < 1e-6);
    CHECK(f.first_token_agrees);
    CHECK(f.exact);
  }
  // Every selected module's tokens recomputed in full context: closer to the no-cache answer
  // than plain reuse of the same gap prompt.
  FidelityOptions options;
  options.tokens = 8;
  const auto r0 = measure_fidelity(
      *engine,
      pml::parse_prompt_string(
          R"(<prompt schema="budget"><park recompute="0"/><night recompute="0"/>What now?</prompt>)"),
      options);
  const auto full = measure_fidelity(
      *engine,
      pml::parse_prompt_string(
          R"(<prompt schema="budget"><park recompute="1.0"/><night recompute="1.0"/>What now?</prompt>)"),
      options);
  WARN("tiny model first-token KL: budgets 0 " << r0.first_token_kl << ", budgets 1.0 "
                                               << full.first_token_kl);
  CHECK(r0.recomputed_tokens == 0);
  CHECK(full.recomputed_tokens > 0);
  CHECK(full.first_token_kl < r0.first_token_kl);
}
