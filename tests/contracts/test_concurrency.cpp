// Concurrency (docs/reliability.md, "Concurrency"): one Engine serves many threads at once. Every
// answer a thread gets must be exactly what the same request gets alone on one thread (greedy
// tokens equal; the prefill logits within f32 rounding), while other threads run other module
// selections, batches and uncached requests, and one thread keeps adding and replacing schemas.
// Quick in the normal suite (a tiny random model); scripts/tsan.sh runs it under ThreadSanitizer.
#include "support/catch_torch.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "support/random_schema.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {

// Two versions of one schema: a thread swaps them while requests use it. A request resolves
// against one version or the other, never a mix, so its answer is one of the two references.
std::string swapped_schema(int version) {
  return std::string("<schema name=\"swap\">\n  Notes for today.\n") + "  <module name=\"note\">" +
         (version == 0 ? "The cat sat on the red mat by the door."
                       : "A dog ran to the big tree in the park.") +
         "</module>\n  <module name=\"end\">That is all.</module>\n</schema>";
}
const char* kSwapPrompt = R"(<prompt schema="swap"><note/><end/>What happened?</prompt>)";

SamplingParams greedy() {
  SamplingParams p;
  p.max_new_tokens = 5;
  p.stop_at_eos = false;
  return p;
}

struct Request {
  std::string xml;
  bool use_cache = true;
};

double max_diff(const torch::Tensor& x, const torch::Tensor& y) {
  return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
}

}  // namespace

TEST_CASE("concurrency: 8 threads get exactly their single-threaded answers while schemas change",
          "[contract][concurrency]") {
  auto engine = test::tiny_engine(7);
  engine->add_schema_string(test::kTripSchema);
  const auto a = test::make_case(11, "a", 4);
  const auto b = test::make_case(12, "b", 4);
  engine->add_schema_string(a.schema);
  engine->add_schema_string(b.schema);

  std::vector<Request> requests = {
      {R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)"},
      {R"(<prompt schema="trip"><sunny/><live/>And now?</prompt>)"},
      {R"(<prompt schema="trip"><city/><sunny/>What is there?</prompt>)"},
      {R"(<prompt schema="trip"><city/><rainy/></prompt>)"},
      {R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
       false},
  };
  for (const auto* c : {&a, &b}) {
    for (const auto& p : c->prompts) {
      try {
        engine->resolve(pml::parse_prompt_string(p));
        requests.push_back({p});
      } catch (const Error& e) {
        REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);  // a random argument may not fit
      }
    }
  }
  REQUIRE(requests.size() >= 8);

  // The single-threaded answers: tokens of every request and the prefill logits, and both
  // versions of the swapped schema.
  const SamplingParams params = greedy();
  std::vector<std::vector<TokenId>> want;
  std::vector<torch::Tensor> want_logits;
  for (const auto& r : requests) {
    RequestOptions options;
    options.use_cache = r.use_cache;
    const auto prompt = pml::parse_prompt_string(r.xml);
    want.push_back(engine->generate(prompt, params, {}, options).tokens);
    KVCache cache = engine->model().make_cache(0);
    want_logits.push_back(engine->prefill(engine->resolve(prompt), cache, r.use_cache).logits);
  }
  std::vector<TokenId> want_swap[2];
  for (int v : {0, 1}) {
    engine->add_schema_string(swapped_schema(v));
    want_swap[v] = engine->generate_xml(kSwapPrompt, params).tokens;
  }
  REQUIRE(want_swap[0] != want_swap[1]);  // otherwise the swap could not be told apart

  constexpr int kThreads = 8, kRounds = 12;
  std::atomic<bool> stop_swapping{false};
  std::atomic<int> swaps{0}, answers{0}, batches{0}, swapped_answers[2] = {{0}, {0}};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  auto fail = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(failures_mutex);
    failures.push_back(what);
  };

  // Replaces "swap" by its other version, and "trip" by itself (a new version whose answers must
  // not change), as fast as it can while the requests run.
  std::thread swapper([&] {
    try {
      for (int i = 0; !stop_swapping.load(); ++i) {
        engine->add_schema_string(swapped_schema(i % 2));
        if (i % 3 == 0) engine->add_schema_string(test::kTripSchema);
        ++swaps;
      }
    } catch (const std::exception& e) {
      fail(std::string("swapper: ") + e.what());
    }
  });

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int round = 0; round < kRounds; ++round) {
          const std::size_t i = (t * 5 + round * 3) % requests.size();
          const std::string where =
              "thread " + std::to_string(t) + " round " + std::to_string(round) + ": ";
          if (t % 4 == 3) {  // a batch of three selections, one of them the swapped schema
            const std::size_t j = (i + 1) % requests.size();
            if (!requests[i].use_cache || !requests[j].use_cache) continue;
            const auto got = engine->generate_batch(
                {pml::parse_prompt_string(requests[i].xml),
                 pml::parse_prompt_string(requests[j].xml), pml::parse_prompt_string(kSwapPrompt)},
                params);
            if (got[0].tokens != want[i]) fail(where + "batch row 0 differs: " + requests[i].xml);
            if (got[1].tokens != want[j]) fail(where + "batch row 1 differs: " + requests[j].xml);
            if (got[2].tokens != want_swap[0] && got[2].tokens != want_swap[1]) {
              fail(where + "batch row 2 (swapped schema) is neither version's answer");
            }
            ++batches;
          } else if (round % 4 == 1) {  // the swapped schema alone
            const auto got = engine->generate_xml(kSwapPrompt, params).tokens;
            if (got == want_swap[0]) {
              ++swapped_answers[0];
            } else if (got == want_swap[1]) {
              ++swapped_answers[1];
            } else {
              fail(where + "the swapped schema's answer is neither version's");
            }
          } else if (round % 4 == 2) {  // prefill logits on the caller's own cache
            const auto prompt = pml::parse_prompt_string(requests[i].xml);
            KVCache cache = engine->model().make_cache(0);
            const auto got = engine->prefill(engine->resolve(prompt), cache, requests[i].use_cache);
            const double diff = max_diff(got.logits, want_logits[i]);
            if (!(diff < 1e-5)) {
              fail(where + "logits differ by " + std::to_string(diff) + ": " + requests[i].xml);
            }
          } else {
            RequestOptions options;
            options.use_cache = requests[i].use_cache;
            const auto got =
                engine->generate(pml::parse_prompt_string(requests[i].xml), params, {}, options);
            if (got.tokens != want[i]) fail(where + "tokens differ: " + requests[i].xml);
          }
          ++answers;
        }
      } catch (const std::exception& e) {
        fail("thread " + std::to_string(t) + ": " + e.what());
      }
    });
  }
  for (auto& th : threads) th.join();
  stop_swapping = true;
  swapper.join();

  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
  CHECK(answers.load() >= kThreads * kRounds * 3 / 4);  // batch threads skip uncached rows
  CHECK(batches.load() > 0);
  CHECK(swaps.load() > 0);
  // Every version of "trip" answers as the first did; and the engine still serves alone.
  for (std::size_t i = 0; i < requests.size(); ++i) {
    RequestOptions options;
    options.use_cache = requests[i].use_cache;
    CHECK(engine->generate(pml::parse_prompt_string(requests[i].xml), params, {}, options).tokens ==
          want[i]);
  }
}

TEST_CASE("concurrency: each pooled buffer keeps its leading modules for the prompt that matches",
          "[contract][concurrency]") {
  auto engine = test::tiny_engine(7);
  engine->add_schema_string(test::kTripSchema);
  const auto first = pml::parse_prompt_string(
      R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where?</prompt>)");
  const auto second = pml::parse_prompt_string(R"(<prompt schema="trip"><sunny/>Now?</prompt>)");
  const SamplingParams params = greedy();
  // Two requests at once: the first, once it holds its buffer (in its token callback), waits
  // until the second has finished, so the pool ends up with two buffers, one holding each
  // prompt's modules.
  std::mutex m;
  std::condition_variable cv;
  bool first_running = false, second_done = false;
  std::thread other([&] {
    engine->generate(first, params, [&](TokenId, const std::string&) {
      std::unique_lock<std::mutex> lock(m);
      first_running = true;
      cv.notify_all();
      cv.wait(lock, [&] { return second_done; });
      return true;
    });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return first_running; });
  }
  engine->generate(second, params);
  {
    std::lock_guard<std::mutex> lock(m);
    second_done = true;
  }
  cv.notify_all();
  other.join();
  // Alternating between the two prompts, each finds the buffer that holds its modules: nothing
  // is copied again. (One shared buffer would keep only the preamble they share.)
  for (int i = 0; i < 2; ++i) {
    for (const auto* p : {&first, &second}) {
      const Response r = engine->generate(*p, params);
      INFO("round " << i << ", prompt " << (p == &first ? "first" : "second"));
      CHECK(r.cached_tokens > 0);
      CHECK(r.reused_tokens == r.cached_tokens);
    }
  }
}
