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
  recompute.recompute = 1.5;
  CHECK_THROWS_AS(session.admit(prompt, params, {}, recompute), Error);
  CHECK_THROWS_AS(
      session.admit(pml::parse_prompt_string("<prompt schema=\"nope\">x</prompt>"), params), Error);
}

TEST_CASE(
    "session-exact: plain prompts join beside module prompts, reuse the stored prefix and "
    "get what generate gives them alone",
    "[contract][batch]") {
  auto engine = test::tiny_engine(4);
  const auto c = test::make_case(5, "m", 2);
  engine->add_schema_string(c.schema);
  const Tokenizer& tok = engine->tokenizer();
  const auto ids = [&](const std::string& text) { return tok.encode(text, tok.adds_bos()); };
  const auto params = [](int n) {
    SamplingParams p;
    p.max_new_tokens = n;
    p.stop_at_eos = false;
    return p;
  };
  const std::vector<TokenId> p0 = ids("Once upon a time there was a little cat who liked fish.");
  const std::vector<TokenId> p1 = ids("Once upon a time there was a big dog in the park.");
  std::size_t shared = 0;
  while (shared < std::min(p0.size(), p1.size()) && p0[shared] == p1[shared]) ++shared;
  REQUIRE(shared >= 4);
  REQUIRE(shared < p1.size() - 1);

  BatchSessionOptions options;
  options.max_rows = 4;
  BatchSession session(*engine, options);
  struct Plain {
    std::vector<TokenId> prompt;
    SamplingParams params;
    int64_t reused = 0;  // the prefix it must take from the store
    std::optional<Response> together;
    std::string streamed;
  };
  std::vector<Plain> plain;
  std::map<BatchSession::RowId, std::size_t> of_row;  // plain rows
  std::map<BatchSession::RowId, std::optional<Response>> module_rows;
  const auto admit_plain = [&](std::vector<TokenId> prompt, SamplingParams p, int64_t reused) {
    const std::size_t i = plain.size();
    plain.push_back({std::move(prompt), p, reused, std::nullopt, ""});
    const auto id =
        session.admit_tokens(plain[i].prompt, p, [&plain, i](TokenId, const std::string& t) {
          plain[i].streamed += t;
          return true;
        });
    REQUIRE(id);
    of_row[*id] = i;
  };
  const auto admit_module = [&](int which, int n) {
    const auto id = session.admit(pml::parse_prompt_string(c.prompts[which]), params(n));
    REQUIRE(id);
    module_rows[*id];
  };
  const auto step = [&] {
    for (auto& done : session.step()) {
      if (of_row.count(done.id)) {
        plain[of_row[done.id]].together = std::move(done.response);
      } else {
        REQUIRE(module_rows.count(done.id) == 1);
        module_rows[done.id] = std::move(done.response);
      }
    }
  };

  // A module prompt decodes; the first plain prompt joins it (nothing stored yet), a second
  // joins later and takes the prefix the two share; the same prompt again takes all but its last
  // token. One of them samples with a seed.
  admit_module(0, 12);
  step();
  admit_plain(p0, params(7), 0);
  step();
  step();
  SamplingParams seeded = params(9);
  seeded.temperature = 0.9;
  seeded.seed = 17;
  admit_plain(p1, seeded, static_cast<int64_t>(shared));
  admit_module(1, 5);
  CHECK(session.active() == 4);
  // The batch is full: refused without touching the store.
  CHECK_FALSE(session.admit_tokens(p0, params(3)));
  CHECK(session.prefix_tokens() == p1);
  step();
  step();
  while (session.active() == 4) step();
  admit_plain(p1, params(6), static_cast<int64_t>(p1.size()) - 1);
  CHECK(session.prefix_tokens() == p1);
  while (!plain[2].together) step();
  // Once it has finished, the store holds its prompt and the tokens fed back while it decoded
  // (all but the last): a follow-up repeating the answer takes all of them.
  std::vector<TokenId> follow = p1;
  const auto& answer = plain[2].together->tokens;
  REQUIRE(answer.size() == 6);
  follow.insert(follow.end(), answer.begin(), answer.end() - 1);
  CHECK(session.prefix_tokens() == follow);
  const auto more = ids(" And then the dog went home.");
  follow.insert(follow.end(), more.begin() + (tok.adds_bos() ? 1 : 0), more.end());
  admit_plain(follow, params(8), static_cast<int64_t>(p1.size() + answer.size() - 1));
  while (!session.empty()) step();

  for (std::size_t i = 0; i < plain.size(); ++i) {
    INFO("plain prompt " << i);
    const Plain& p = plain[i];
    REQUIRE(p.together.has_value());
    std::string alone_streamed;
    const GenerationResult alone =
        generate(engine->model(), tok, p.prompt, p.params, [&](TokenId, const std::string& t) {
          alone_streamed += t;
          return true;
        });
    const Response& t = *p.together;
    CHECK(t.tokens == alone.tokens);
    CHECK(t.text == alone.text);
    CHECK(p.streamed == alone_streamed);
    CHECK(t.stop_reason == alone.stop_reason);
    CHECK(t.tokens.size() == static_cast<std::size_t>(p.params.max_new_tokens));
    CHECK(t.cached_tokens == p.reused);
    CHECK(t.reused_tokens == p.reused);
    CHECK(t.fresh_tokens == static_cast<int64_t>(p.prompt.size()) - p.reused);
  }
  for (const auto& [id, r] : module_rows) {
    REQUIRE(r.has_value());
    const std::size_t which = r->tokens.size() == 12 ? 0 : 1;
    CHECK(r->tokens ==
          engine->generate(pml::parse_prompt_string(c.prompts[which]), params(which ? 5 : 12))
              .tokens);
  }

  // Bad plain prompts are errors, as in generate; the store is left as it was.
  const auto held = session.prefix_tokens();
  CHECK_THROWS_WITH(session.admit_tokens({}, params(2)), Catch::Contains("no tokens"));
  const std::vector<TokenId> too_long(
      static_cast<std::size_t>(engine->model().config().max_position_embeddings) + 1, p0[0]);
  CHECK_THROWS_WITH(session.admit_tokens(too_long, params(2)), Catch::Contains("context"));
  SamplingParams bad = params(2);
  bad.temperature = -1;
  CHECK_THROWS_AS(session.admit_tokens(p0, bad), Error);
  CHECK(session.prefix_tokens() == held);
  CHECK(session.empty());
}
