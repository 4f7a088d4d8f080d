// Engine::sequence_logprobs (the server's `echo` with `logprobs` on plain token ids): reusing a
// registered schema's stored spans where the sequence begins with them changes no
// log-probability beyond rounding (contract 2), whatever the schema holds — unions with and
// without scaffolds, nesting, parameters, cache="false" — and the run it reuses is the one
// pml::match_prefix promises.
#include "support/catch_torch.hpp"

#include <cmath>

#include "promptcache/engine.hpp"
#include "promptcache/pml/prefix_match.hpp"
#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

// Every entry of `got` equals `want`'s: the token, its log-probability and its alternatives.
void check_same(const SequenceLogprobs& got, const std::vector<TokenLogprob>& want, double tol) {
  REQUIRE(got.tokens.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("token " << i + 1);
    CHECK(got.tokens[i].token == want[i].token);
    CHECK(std::abs(got.tokens[i].logprob - want[i].logprob) < tol);
    REQUIRE(got.tokens[i].top.size() == want[i].top.size());
    for (std::size_t t = 0; t < want[i].top.size(); ++t) {
      CHECK(std::abs(got.tokens[i].top[t].second - want[i].top[t].second) < tol);
    }
  }
}

const char* kQuiz = R"(<schema name="quiz">
  <system>Answer with one word.</system>
  <module name="shots">Q: What colour is the sky? A: blue. Q: What do cats say? A: meow.</module>
  <union scaffold="short">
    <module name="short">Q: Is ice cold? A: yes.</module>
    <module name="long">Q: Is the sun a star that shines by day? A: yes, it is.</module>
  </union>
  <module name="tail">Q: And now:</module>
</schema>)";

}  // namespace

TEST_CASE("sequence_logprobs: a prompt that begins with a schema's modules reuses them exactly",
          "[contract][prefix][score]") {
  auto engine = test::tiny_engine(3);
  const pml::Layout& layout = engine->add_schema_string(kQuiz);
  const double tol = test::logprob_tolerance(engine->model(), 1e-4);
  const auto question = engine->encode_continuation("What is water? A: wet");
  const auto ids_of = [&](const char* xml) {
    std::vector<TokenId> ids = engine->resolve(pml::parse_prompt_string(xml)).baseline;
    ids.insert(ids.end(), question.begin(), question.end());
    return ids;
  };
  const auto end_of = [&](const char* module) { return layout.module(module).end; };

  SECTION("the modules up to the question are reused, and the second call runs the question only") {
    const auto ids = ids_of(R"(<prompt schema="quiz"><shots/></prompt>)");
    const auto want = prompt_logprobs(engine->model(), ids, 3);
    const auto first = engine->sequence_logprobs(ids, 3);
    CHECK(first.schema == "quiz");
    CHECK(first.cached_tokens == static_cast<int64_t>(end_of("shots")));
    check_same(first, want, tol);
    // The prefix's own log-probabilities are kept: the second call runs the question only.
    const auto second = engine->sequence_logprobs(ids, 3);
    CHECK(second.fresh_tokens == static_cast<int64_t>(question.size()) - 1);
    CHECK(first.fresh_tokens == second.fresh_tokens + first.cached_tokens);
    check_same(second, want, tol);
    const auto none = engine->sequence_logprobs(ids, 3, /*use_cache=*/false);
    CHECK(none.cached_tokens == 0);
    CHECK(none.schema.empty());
    check_same(none, want, tol);
  }
  SECTION("a member shorter than its union leaves a gap: the run ends after it") {
    REQUIRE(layout.module("short").length() < layout.module("long").length());
    const auto ids = ids_of(R"(<prompt schema="quiz"><shots/><short/><tail/></prompt>)");
    const auto got = engine->sequence_logprobs(ids, 2);
    CHECK(got.cached_tokens == static_cast<int64_t>(end_of("short")));
    check_same(got, prompt_logprobs(engine->model(), ids, 2), tol);
  }
  SECTION("a non-scaffold member is reused, and the run ends after it") {
    // `tail` was stored after `short` (the scaffold), so after `long` it is not exact.
    const auto ids = ids_of(R"(<prompt schema="quiz"><shots/><long/><tail/></prompt>)");
    const auto got = engine->sequence_logprobs(ids, 2);
    CHECK(got.cached_tokens == static_cast<int64_t>(end_of("long")));
    check_same(got, prompt_logprobs(engine->model(), ids, 2), tol);
  }
  SECTION("a token that differs inside a module ends the run before that span") {
    auto ids = ids_of(R"(<prompt schema="quiz"><shots/></prompt>)");
    const std::size_t in_shots = layout.module("shots").begin + 3;
    ids[in_shots] = ids[in_shots] == 7 ? 8 : 7;
    const auto got = engine->sequence_logprobs(ids, 0);
    CHECK(got.cached_tokens == static_cast<int64_t>(layout.module("shots").begin));
    check_same(got, prompt_logprobs(engine->model(), ids, 0), tol);
  }
  SECTION("a sequence that is only the schema's text keeps its last token fresh") {
    const auto ids =
        engine->resolve(pml::parse_prompt_string(R"(<prompt schema="quiz"><shots/></prompt>)"))
            .baseline;
    const auto got = engine->sequence_logprobs(ids, 1);
    CHECK(got.cached_tokens < static_cast<int64_t>(ids.size()));
    CHECK(got.cached_tokens > 0);
    check_same(got, prompt_logprobs(engine->model(), ids, 1), tol);
  }
  SECTION("a replaced schema's kept prefix is not used for the new one") {
    const auto ids = ids_of(R"(<prompt schema="quiz"><shots/></prompt>)");
    engine->sequence_logprobs(ids, 1);
    engine->add_schema_string(kQuiz);  // a new version: its prefix runs again
    const auto again = engine->sequence_logprobs(ids, 1);
    CHECK(again.fresh_tokens == static_cast<int64_t>(ids.size()) - 1);
    check_same(again, prompt_logprobs(engine->model(), ids, 1), tol);
  }
  CHECK_THROWS_AS(engine->sequence_logprobs({1, 2, -4}, 1), Error);
  CHECK_THROWS_AS(engine->sequence_logprobs({1, 2, 3}, 21), Error);
}

TEST_CASE("sequence_logprobs: random schemas, every reused run is exact", "[contract][prefix]") {
  auto engine = test::tiny_engine(5);
  const double tol = test::logprob_tolerance(engine->model(), 1e-4);
  int64_t reused = 0;
  int matched_past_bos = 0;
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    const std::string name = "r" + std::to_string(seed);
    const test::Case c = test::make_case(seed, name);
    INFO("seed " << seed << "\nschema: " << c.schema << "\nprompt: " << c.prompt);
    engine->add_schema_string(c.schema);
    pml::ResolvedPrompt resolved;
    try {
      resolved = engine->resolve(pml::parse_prompt_string(c.prompt));
    } catch (const Error& e) {
      REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);  // a random argument may not fit
      continue;
    }
    const std::vector<TokenId>& ids = resolved.baseline;
    const auto got = engine->sequence_logprobs(ids, 2);
    check_same(got, prompt_logprobs(engine->model(), ids, 2), tol);
    reused += got.cached_tokens;
    if (got.cached_tokens > 1) ++matched_past_bos;
    engine->remove_schema(name);
  }
  // The cases exercise reuse at all (most random prompts begin with the root's first text).
  CHECK(matched_past_bos >= 10);
  CHECK(reused > 0);
}
