// Scoring (Engine::score, score_batch; `promptcache eval`): continuations' log-probabilities
// after a prompt computed once with the cache obey the contracts generation does:
// - prefix-exact: equal to one no-cache forward of prompt + continuation (1e-4, f32);
// - position-exact: equal to contract 3's reference (the expanded sequence under the block mask)
//   with the continuation appended to the prompt's text, for any module selection;
// - batch-exact: a batch of prompts of different schemas, module sets and lengths gives each
//   prompt what it gets alone.
#include "support/catch_torch.hpp"

#include <optional>
#include <set>

#include "promptcache/engine.hpp"
#include "support/position_reference.hpp"
#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kSchema = R"(<schema name="quiz">
  <system>Answer with one word.</system>
  <module name="shots">Q: What colour is the sky? A: blue. Q: What do cats say? A: meow.</module>
  <module name="more">Q: What is ice made of? A: water.</module>
</schema>)";

// log p(continuation token j | baseline, continuation[0..j)) from one ordinary forward at
// positions 0..n-1 in a fresh cache: the no-cache truth.
std::vector<double> plain_logprobs(const LlamaModel& model, const std::vector<TokenId>& prompt,
                                   const std::vector<TokenId>& continuation) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), continuation.begin(), continuation.end());
  const auto n = static_cast<int64_t>(ids.size());
  KVCache cache = model.make_cache(n);
  ForwardOptions all;
  all.all_logits = true;
  const auto logits = model.forward(torch::tensor(ids).unsqueeze(0),
                                    torch::arange(n, torch::kInt64).unsqueeze(0), cache, all)[0];
  const auto lp = torch::log_softmax(logits.cpu().to(torch::kFloat32), -1);
  std::vector<double> out;
  const auto start = static_cast<int64_t>(prompt.size());
  for (std::size_t j = 0; j < continuation.size(); ++j) {
    out.push_back(lp[start - 1 + static_cast<int64_t>(j)][continuation[j]].item<double>());
  }
  return out;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

std::vector<std::vector<TokenId>> some_continuations(const Engine& engine) {
  return {engine.encode_continuation("blue"), engine.encode_continuation(" the little red ball"),
          engine.encode_continuation("water and ice, said the cat"),
          engine.encode_continuation("meow")};
}

}  // namespace

TEST_CASE("score: prefix-exact, every continuation equals a no-cache forward",
          "[contract][score]") {
  for (std::uint64_t seed : {1, 2}) {
    auto engine = test::tiny_engine(seed);
    engine->add_schema_string(kSchema);
    const auto continuations = some_continuations(*engine);
    for (const char* xml :
         {R"(<prompt schema="quiz"><shots/><more/> Q: What is the sun? A:</prompt>)",
          R"(<prompt schema="quiz"><shots/><user>What colour is grass?</user></prompt>)"}) {
      INFO(xml);
      const auto prompt = pml::parse_prompt_string(xml);
      const auto resolved = engine->resolve(prompt);
      for (bool use_cache : {true, false}) {
        INFO((use_cache ? "cached" : "no cache"));
        // Twice: the second request reuses the module states the buffer kept from the first.
        for (int round = 0; round < 2; ++round) {
          const auto r = engine->score(prompt, continuations, RequestOptions{use_cache});
          REQUIRE(r.continuations.size() == continuations.size());
          CHECK(r.prompt_tokens == static_cast<int64_t>(resolved.baseline.size()));
          CHECK((r.cached_tokens > 0) == use_cache);
          CHECK(r.cached_tokens + r.fresh_tokens == r.prompt_tokens);
          for (std::size_t k = 0; k < continuations.size(); ++k) {
            const auto& s = r.continuations[k];
            CHECK(s.tokens == continuations[k]);
            const auto expected = plain_logprobs(engine->model(), resolved.baseline, s.tokens);
            const double diff = max_diff(s.logprob_per_token, expected);
            INFO("continuation " << k << " max logprob diff " << diff);
            CHECK(diff <= test::logprob_tolerance(engine->model(), 1e-4));
            double sum = 0;
            for (double x : expected) sum += x;
            const double per_token = test::logprob_tolerance(engine->model(), 1e-4);
            CHECK(std::abs(s.logprob - sum) <=
                  std::max(1e-3, per_token * static_cast<double>(expected.size())));
          }
        }
      }
    }
  }
}

TEST_CASE("score: position-exact for any module selection", "[contract][score][position]") {
  auto engine = test::tiny_engine(4);
  int cases = 0, gaps = 0;
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const test::Case c = test::make_case(seed, "p" + std::to_string(seed));
    INFO("seed " << seed << "\nschema: " << c.schema << "\nprompt: " << c.prompt);
    const auto& layout = engine->add_schema_string(c.schema);
    pml::Prompt prompt;
    pml::ResolvedPrompt resolved;
    try {
      prompt = pml::parse_prompt_string(c.prompt);
      resolved = engine->resolve(prompt);
    } catch (const Error& e) {
      REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);  // a random argument may not fit
      continue;
    }
    const std::vector<std::vector<TokenId>> continuations = {
        engine->encode_continuation("the cat sat"), engine->encode_continuation("on the mat"),
        engine->encode_continuation("yes")};
    const auto got = engine->score(prompt, continuations);
    test::Sequence fresh;
    const auto base =
        test::reference_logits(engine->model(), layout, resolved, EncodingMode::kScaffold, fresh);
    const auto before = static_cast<int64_t>(fresh.tokens.size());
    if (before == 0) continue;  // no fresh token: nothing to continue from in the reference
    for (std::size_t k = 0; k < continuations.size(); ++k) {
      // The reference with the continuation as more text of the prompt.
      pml::ResolvedPrompt extended = resolved;
      const auto& cont = continuations[k];
      extended.text_tokens.insert(extended.text_tokens.end(), cont.begin(), cont.end());
      test::Sequence ignored;
      const auto logits = test::reference_logits(engine->model(), layout, extended,
                                                 EncodingMode::kScaffold, ignored);
      const auto lp = torch::log_softmax(logits.cpu().to(torch::kFloat32), -1);
      std::vector<double> expected;
      for (std::size_t j = 0; j < cont.size(); ++j) {
        expected.push_back(lp[before - 1 + static_cast<int64_t>(j)][cont[j]].item<double>());
      }
      const double diff = max_diff(got.continuations[k].logprob_per_token, expected);
      INFO("continuation " << k << " max logprob diff " << diff);
      CHECK(diff <= test::logprob_tolerance(engine->model(), 1e-4));
    }
    ++cases;
    gaps += resolved.text_begin < layout.total_length;
  }
  WARN("cases " << cases << ", with gaps " << gaps);
  CHECK(cases >= 12);
  CHECK(gaps >= 3);
}

TEST_CASE("score_batch: each prompt of a batch gets what it gets alone",
          "[contract][score][batch]") {
  auto engine = test::tiny_engine(4);
  int batches = 0, uneven = 0;
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    const auto a = test::make_case(seed, "a" + std::to_string(seed), 3);
    const auto b = test::make_case(seed + 100, "b" + std::to_string(seed), 2);
    engine->add_schema_string(a.schema);
    engine->add_schema_string(b.schema);
    std::vector<std::string> xml = a.prompts;
    xml.insert(xml.end(), b.prompts.begin(), b.prompts.end());
    std::vector<pml::Prompt> prompts;
    std::vector<std::vector<std::vector<TokenId>>> continuations;
    const std::vector<std::string> texts = {"the cat", "sat on the mat today", "yes", "no, never",
                                            "a b c d e f"};
    for (std::size_t i = 0; i < xml.size(); ++i) {
      try {
        auto prompt = pml::parse_prompt_string(xml[i]);
        engine->resolve(prompt);
        prompts.push_back(std::move(prompt));
      } catch (const Error& e) {
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);
        continue;
      }
      // Rows with different numbers of continuations of different lengths.
      std::vector<std::vector<TokenId>> row;
      for (std::size_t k = 0; k <= i % 3; ++k) {
        row.push_back(engine->encode_continuation(texts[(i + k) % texts.size()]));
      }
      continuations.push_back(std::move(row));
    }
    if (prompts.size() < 2) continue;
    INFO("seed " << seed << "\nschema a: " << a.schema << "\nschema b: " << b.schema);
    for (bool use_cache : {true, false}) {
      INFO((use_cache ? "cached" : "no cache"));
      const auto together = engine->score_batch(prompts, continuations, RequestOptions{use_cache});
      REQUIRE(together.size() == prompts.size());
      std::set<int64_t> cached;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        INFO("prompt " << i << ": " << xml[i]);
        const auto alone = engine->score(prompts[i], continuations[i], RequestOptions{use_cache});
        CHECK(together[i].cached_tokens == alone.cached_tokens);
        CHECK(together[i].fresh_tokens == alone.fresh_tokens);
        CHECK(together[i].prompt_tokens == alone.prompt_tokens);
        REQUIRE(together[i].continuations.size() == alone.continuations.size());
        for (std::size_t k = 0; k < alone.continuations.size(); ++k) {
          CHECK(max_diff(together[i].continuations[k].logprob_per_token,
                         alone.continuations[k].logprob_per_token) <=
                test::logprob_tolerance(engine->model(), 1e-5));
          CHECK(together[i].continuations[k].greedy == alone.continuations[k].greedy);
        }
        cached.insert(alone.cached_tokens);
      }
      if (use_cache) uneven += cached.size() > 1;
    }
    ++batches;
  }
  CHECK(batches >= 4);
  CHECK(uneven >= 3);
}

TEST_CASE("score: bad continuations are refused before any work", "[score][errors]") {
  auto engine = test::tiny_engine(1);
  engine->add_schema_string(kSchema);
  const auto prompt = pml::parse_prompt_string(R"(<prompt schema="quiz"><shots/> Q: A:</prompt>)");
  auto kind_of = [&](const std::vector<std::vector<TokenId>>& continuations) {
    std::optional<ErrorKind> kind;
    try {
      engine->score(prompt, continuations);
    } catch (const Error& e) {
      kind = e.kind();
    }
    return kind;
  };
  CHECK(kind_of({{}}) == ErrorKind::kInvalidArgument);
  CHECK(kind_of({{-1}}) == ErrorKind::kInvalidArgument);
  CHECK(kind_of({{static_cast<TokenId>(engine->model().config().vocab_size)}}) ==
        ErrorKind::kInvalidArgument);
  const auto context = engine->model().config().max_position_embeddings;
  CHECK(kind_of({std::vector<TokenId>(static_cast<std::size_t>(context), 5)}) ==
        ErrorKind::kContextOverflow);
  CHECK_THROWS_AS(engine->score_batch({prompt}, {}), Error);
  // Single-token continuations need no forward after the prompt.
  const auto r = engine->score(prompt, {{5}, {6}});
  CHECK(r.scored_tokens == 0);
  CHECK(r.continuations.size() == 2);
  CHECK(r.continuations[0].logprob < 0);
}
