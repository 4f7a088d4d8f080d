// Continuous batching (BatchSession): prompts admitted at different steps while others decode,
// with different module selections, cached and uncached, greedy and seeded sampling, finishing at
// different steps. Each must get exactly what Engine::generate gives it alone: the same tokens,
// text, streamed text and stop reason.
#include "support/catch_torch.hpp"

#include <map>

#include "promptcache/batch_session.hpp"
#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

struct Request {
  pml::Prompt prompt;
  std::string xml;
  SamplingParams params;
  RequestOptions options;
  int arrival = 0;  // the step before which it is admitted (or after, when the batch is full)
};

}  // namespace

TEST_CASE("session-exact: prompts joining a decoding batch get what they get alone",
          "[contract][batch]") {
  auto engine = test::tiny_engine(4);
  int cases = 0, joined = 0, reused_rows = 0, grown = 0, refused = 0, compared = 0;
  int64_t compactions = 0;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    const auto a = test::make_case(seed, "a" + std::to_string(seed), 4);
    const auto b = test::make_case(seed + 100, "b" + std::to_string(seed), 4);
    engine->add_schema_string(a.schema);
    engine->add_schema_string(b.schema);
    std::vector<std::string> xml = a.prompts;
    xml.insert(xml.end(), b.prompts.begin(), b.prompts.end());
    std::vector<Request> requests;
    for (const auto& p : xml) {
      try {
        auto prompt = pml::parse_prompt_string(p);
        engine->resolve(prompt);
        const int i = static_cast<int>(requests.size());
        Request r{std::move(prompt), p, {}, {}, 0};
        r.params.max_new_tokens = 2 + static_cast<int>((i * 5 + seed) % 9);
        r.params.stop_at_eos = false;
        if (i % 3 == 2) {  // sampled with a seed
          r.params.temperature = 0.9;
          r.params.seed = 11 + i;
        }
        r.options.use_cache = i % 4 != 3;
        // Two at the start, four together a little later (one more than the batch takes),
        // then one every few steps.
        r.arrival = i < 2 ? 0 : i < 6 ? 2 : 4 + 3 * (i - 6);
        requests.push_back(std::move(r));
      } catch (const Error& e) {
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);  // a random argument may not fit
      }
    }
    if (requests.size() < 5) continue;
    ++cases;
    INFO("seed " << seed << "\nschema a: " << a.schema << "\nschema b: " << b.schema);
    BatchSessionOptions options;
    // Five rows: one finished row is kept for the next prompt (a quarter free drops them).
    options.max_rows = 5;
    BatchSession session(*engine, options);
    std::map<BatchSession::RowId, std::size_t> of_row;
    std::vector<std::optional<Response>> together(requests.size());
    std::vector<std::string> streamed(requests.size());
    std::size_t next = 0;
    for (int step = 0; next < requests.size() || !session.empty(); ++step) {
      REQUIRE(step < 1000);
      while (next < requests.size() && requests[next].arrival <= step) {
        const Request& r = requests[next];
        const int64_t rows = session.rows(), active = session.active(), slots = session.slots();
        const auto id = session.admit(
            r.prompt, r.params,
            [&streamed, next](TokenId, const std::string& text) {
              streamed[next] += text;
              return true;
            },
            r.options);
        if (!id) {
          CHECK(active == options.max_rows);
          ++refused;
          break;
        }
        of_row[*id] = next;
        joined += active > 0;
        reused_rows += active > 0 && active < rows && session.rows() == rows;
        grown += active > 0 && session.slots() > slots;
        ++next;
      }
      CHECK(session.active() <= options.max_rows);
      for (auto& done : session.step()) {
        REQUIRE(of_row.count(done.id) == 1);
        const std::size_t i = of_row[done.id];
        REQUIRE_FALSE(together[i].has_value());
        together[i] = std::move(done.response);
      }
    }
    compactions += session.compactions();
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const Request& r = requests[i];
      INFO("prompt " << i << (r.options.use_cache ? " (cached)" : " (uncached)") << ": " << r.xml);
      REQUIRE(together[i].has_value());
      std::string alone_streamed;
      const auto alone = engine->generate(
          r.prompt, r.params,
          [&](TokenId, const std::string& text) {
            alone_streamed += text;
            return true;
          },
          r.options);
      const Response& t = *together[i];
      CHECK(t.tokens == alone.tokens);
      CHECK(t.text == alone.text);
      CHECK(streamed[i] == alone_streamed);
      CHECK(t.stop_reason == alone.stop_reason);
      CHECK(t.tokens.size() == static_cast<std::size_t>(r.params.max_new_tokens));
      CHECK(t.cached_tokens == alone.cached_tokens);
      CHECK(t.fresh_tokens == alone.fresh_tokens);
      CHECK(t.timings.decode_tokens == alone.timings.decode_tokens);
      CHECK(t.timings.ttft_ms > 0);
      ++compared;
    }
  }
  WARN("cases " << cases << ", prompts " << compared << ", joined a running batch " << joined
                << ", took a finished row " << reused_rows << ", grew the slots " << grown
                << ", refused (batch full) " << refused << ", compactions " << compactions);
  // The schedule really exercises joining, row reuse, slot growth, compaction and a full batch.
  CHECK(cases >= 6);
  CHECK(joined >= 3 * cases);
  CHECK(reused_rows >= 1);
  CHECK(grown >= 1);
  CHECK(refused >= 1);
  CHECK(compactions >= 1);
}

TEST_CASE("session: a prompt waits while the slots are taken, and a callback stops its row",
          "[batch]") {
  auto engine = test::tiny_engine(4);
  const auto c = test::make_case(3, "s", 2);
  engine->add_schema_string(c.schema);
  const auto prompt = pml::parse_prompt_string(c.prompts.front());
  SamplingParams params;
  params.max_new_tokens = 8;
  params.stop_at_eos = false;
  const auto alone = engine->generate(prompt, params);
  // Fewer slots than one prompt and its decoding: the first is admitted (an empty session takes
  // any prompt within the context) and a second cannot join until it is done.
  const auto first_slots = static_cast<int64_t>(engine->resolve(prompt).next_position());
  BatchSessionOptions options;
  options.max_slots = first_slots + params.max_new_tokens / 2;
  BatchSession session(*engine, options);
  int calls = 0;
  const auto stopped = session.admit(prompt, params, [&](TokenId, const std::string&) {
    return ++calls < 3;  // the client goes away after 3 tokens
  });
  REQUIRE(stopped);
  CHECK_FALSE(session.admit(prompt, params));
  std::vector<BatchSession::Finished> done;
  for (int step = 0; done.empty(); ++step) {
    REQUIRE(step < 20);
    done = session.step();
  }
  REQUIRE(done.size() == 1);
  CHECK(done[0].id == *stopped);
  CHECK(done[0].response.stop_reason == StopReason::kCallback);
  CHECK(done[0].response.tokens ==
        std::vector<TokenId>(alone.tokens.begin(), alone.tokens.begin() + 3));
  CHECK(session.empty());
  CHECK(session.slots() == 0);  // empty: starts again from slot 0
  const auto again = session.admit(prompt, params);
  REQUIRE(again);
  std::vector<BatchSession::Finished> rest;
  while (!session.empty()) {
    for (auto& f : session.step()) rest.push_back(std::move(f));
  }
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].response.tokens == alone.tokens);
  // Bad requests are errors, as in generate.
  RequestOptions recompute;
  recompute.recompute = 0.5;
  CHECK_THROWS_AS(session.admit(prompt, params, {}, recompute), Error);
  CHECK_THROWS_AS(
      session.admit(pml::parse_prompt_string("<prompt schema=\"nope\">x</prompt>"), params), Error);
}
