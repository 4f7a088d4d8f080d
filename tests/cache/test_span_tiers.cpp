// Content-addressed spans in tiers with byte budgets (promptcache/cache/span_store.hpp): shared
// spans stored once, tiny budgets that evict and bring spans back (from a cache file or compiled
// again) without changing any answer, concurrent requests under a tiny budget, and a pooled KV
// buffer letting go of the evicted spans it read in place.
#include "support/catch_torch.hpp"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "promptcache/cache/cache_file.hpp"
#include "promptcache/cache/span_store.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {

// Two schemas with the same preamble and first module; `b` differs after them.
const char* kSchemaA = R"(<schema name="a">
  Read the notes.
  <module name="shared">The river flows from the mountains to the sea.</module>
  <module name="own">Paris is the capital of France.</module>
</schema>)";
const char* kSchemaB = R"(<schema name="b">
  Read the notes.
  <module name="shared">The river flows from the mountains to the sea.</module>
  <module name="own">Tokyo is the capital of Japan and a big city.</module>
</schema>)";

const std::vector<std::string> kTripPrompts = {
    R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
    R"(<prompt schema="trip"><city/><sunny/><live/>And now?</prompt>)",
    R"(<prompt schema="trip"><sunny/>What is the weather?</prompt>)",
    R"(<prompt schema="trip"><city/><rainy/>Take what?</prompt>)",
};

SamplingParams greedy(int n = 5) {
  SamplingParams p;
  p.max_new_tokens = n;
  p.stop_at_eos = false;
  return p;
}

EngineOptions budget(int64_t host_bytes) {
  EngineOptions o;
  o.max_host_bytes = host_bytes;
  return o;
}

// The prompt's last-position logits, assembled into a fresh KV cache.
torch::Tensor logits_of(Engine& engine, const std::string& xml) {
  const auto resolved = engine.resolve(pml::parse_prompt_string(xml));
  KVCache cache = engine.model().make_cache(0);
  return engine.prefill(resolved, cache, true).logits;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

TEST_CASE("span keys follow the tokens, positions and encoding context of a span",
          "[cache][tiers]") {
  auto engine = test::tiny_engine();
  const auto a = engine->layout_only(pml::parse_schema_string(kSchemaA));
  const auto b = engine->layout_only(pml::parse_schema_string(kSchemaB));
  const std::string fp = model_fingerprint(engine->model());
  const auto dtype = engine->model().dtype(), kv = engine->model().kv_dtype();
  const auto ka = span_keys(a, fp, dtype, kv, EncodingMode::kScaffold);
  const auto kb = span_keys(b, fp, dtype, kv, EncodingMode::kScaffold);
  const std::size_t shared_a = a.module("shared").spans[0], shared_b = b.module("shared").spans[0];
  const std::size_t own_a = a.module("own").spans[0], own_b = b.module("own").spans[0];
  REQUIRE(ka.count(shared_a) == 1);
  REQUIRE(kb.count(shared_b) == 1);
  CHECK(ka.at(shared_a) == kb.at(shared_b));  // same text, positions and scaffold before it
  CHECK(ka.at(own_a) != kb.at(own_b));
  // Every stored span has one, and they are distinct within a schema.
  std::set<std::string> distinct;
  for (const auto& [_, key] : ka) distinct.insert(key);
  CHECK(distinct.size() == ka.size());
  // Another encoding mode, KV dtype or model gives other keys.
  CHECK(span_keys(a, fp, dtype, kv, EncodingMode::kIsolated).at(shared_a) != ka.at(shared_a));
  CHECK(span_keys(a, fp, dtype, torch::kBFloat16, EncodingMode::kScaffold).at(shared_a) !=
        ka.at(shared_a));
  CHECK(span_keys(a, fp + "x", dtype, kv, EncodingMode::kScaffold).at(shared_a) != ka.at(shared_a));
}

TEST_CASE("two schemas with the same module text at the same positions share one stored span",
          "[cache][tiers]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchemaA);
  const TierStats one = engine->tier_stats();
  engine->add_schema_string(kSchemaB);
  const TierStats two = engine->tier_stats();
  CHECK(one.shared == 0);
  CHECK(two.shared >= 1);  // the preamble's and "shared"'s states are stored once
  const auto& la = engine->layout("a");
  const auto& lb = engine->layout("b");
  // The very same block serves both schemas.
  const auto* in_a = engine->store().find("a", la.module("shared").spans[0]);
  const auto* in_b = engine->store().find("b", lb.module("shared").spans[0]);
  REQUIRE(in_a != nullptr);
  REQUIRE(in_b != nullptr);
  CHECK(in_a->kv.data_ptr() == in_b->kv.data_ptr());
  CHECK(in_a->id == in_b->id);
  // The host tier holds each distinct span once: fewer bytes than the two schemas' states.
  CHECK(two.host_spans == two.keys);
  CHECK(two.host_bytes < engine->store().bytes("a") + engine->store().bytes("b"));
  int64_t shared_bytes = 0;
  for (const auto& [_, in_b_states] : engine->store().spans_of("b")) {
    for (const auto& [__, in_a_states] : engine->store().spans_of("a")) {
      if (in_a_states.id == in_b_states.id) shared_bytes += in_b_states.bytes();
    }
  }
  CHECK(shared_bytes > 0);
  CHECK(two.host_bytes - one.host_bytes == engine->store().bytes("b") - shared_bytes);

  // Answers on "b" are those of an engine that compiled "b" alone.
  auto alone = test::tiny_engine();
  alone->add_schema_string(kSchemaB);
  const std::string prompt = R"(<prompt schema="b"><shared/><own/>Which city?</prompt>)";
  CHECK(engine->generate_xml(prompt, greedy()).tokens ==
        alone->generate_xml(prompt, greedy()).tokens);
  CHECK(max_diff(logits_of(*engine, prompt), logits_of(*alone, prompt)) <= 1e-5);
}

TEST_CASE("replacing a schema frees the spans only it stored", "[cache][tiers]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchemaA);
  engine->add_schema_string(kSchemaB);
  const int64_t both = engine->tier_stats().host_spans;
  // "b" again with another text for its own module: its old "own" span is dropped.
  engine->add_schema_string(
      std::string(kSchemaB).replace(std::string(kSchemaB).find("Tokyo"), 5, "Osaka"));
  CHECK(engine->tier_stats().host_spans == both);
  CHECK(engine->tier_stats().keys == both);
}

TEST_CASE("tiny host budgets evict spans and compile them again without changing an answer",
          "[cache][tiers]") {
  auto reference = test::tiny_engine();
  reference->add_schema_string(test::kTripSchema);
  for (const int64_t host_bytes : {int64_t{1}, int64_t{4096}}) {
    INFO("max_host_bytes " << host_bytes);
    auto engine = test::tiny_engine(1, budget(host_bytes));
    engine->add_schema_string(test::kTripSchema);
    CHECK(engine->store().bytes("trip") == 0);  // the schema holds none: the tier does
    for (int round = 0; round < 2; ++round) {
      for (const auto& prompt : kTripPrompts) {
        INFO(prompt);
        CHECK(engine->generate_xml(prompt, greedy()).tokens ==
              reference->generate_xml(prompt, greedy()).tokens);
        CHECK(max_diff(logits_of(*engine, prompt), logits_of(*reference, prompt)) <= 1e-5);
      }
    }
    const TierStats s = engine->tier_stats();
    CHECK(s.evictions > 0);
    CHECK(s.misses > 0);
    CHECK(s.recompiles == s.misses);  // no cache file: every miss was compiled again
    CHECK(s.file_loads == 0);
    CHECK(s.max_host_bytes == host_bytes);
    // Between requests nothing is held, so the tier is within its budget.
    CHECK(s.host_bytes <= host_bytes);
    if (host_bytes == 1) CHECK(s.host_spans == 0);
  }
}

TEST_CASE("a roomy budget keeps every span: hits only", "[cache][tiers]") {
  auto engine = test::tiny_engine(1, budget(int64_t{1} << 30));
  engine->add_schema_string(test::kTripSchema);
  for (const auto& prompt : kTripPrompts) engine->generate_xml(prompt, greedy(2));
  const TierStats s = engine->tier_stats();
  CHECK(s.hits > 0);
  CHECK(s.misses == 0);
  CHECK(s.evictions == 0);
  CHECK(s.recompiles == 0);
}

TEST_CASE("an evicted span comes back from the cache file, bit for bit", "[cache][tiers]") {
  test::TempDir dir;
  const std::string file = dir.file("trip.states");
  auto reference = test::tiny_engine();
  reference->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  auto engine = test::tiny_engine(1, budget(1));
  engine->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  CHECK_THAT(engine->compile_report("trip").source, Catch::StartsWith("loaded from"));
  for (const auto& prompt : kTripPrompts) {
    INFO(prompt);
    CHECK(engine->generate_xml(prompt, greedy()).tokens ==
          reference->generate_xml(prompt, greedy()).tokens);
    CHECK(torch::equal(logits_of(*engine, prompt), logits_of(*reference, prompt)));
  }
  TierStats s = engine->tier_stats();
  CHECK(s.evictions > 0);
  CHECK(s.file_loads > 0);
  CHECK(s.file_loads == s.misses);
  CHECK(s.recompiles == 0);

  // A file damaged since is never served: a warning, and the span is compiled again.
  {
    auto bytes = [&] {
      std::ifstream in(file, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    bytes[bytes.size() - 3] ^= 0x5a;  // inside the last tensor's bytes
    std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  }
  for (const auto& prompt : kTripPrompts) {
    CHECK(engine->generate_xml(prompt, greedy()).tokens ==
          reference->generate_xml(prompt, greedy()).tokens);
    CHECK(max_diff(logits_of(*engine, prompt), logits_of(*reference, prompt)) <= 1e-5);
  }
  s = engine->tier_stats();
  CHECK(s.recompiles > 0);
}

TEST_CASE("states loaded from a mapped cache file give bit-identical logits", "[cache][tiers]") {
  test::TempDir dir;
  const std::string file = dir.file("trip.states");
  auto compiled = test::tiny_engine();
  compiled->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  auto mapped = test::tiny_engine();
  mapped->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  CHECK_THAT(mapped->compile_report("trip").source, Catch::StartsWith("loaded from"));
  for (const auto& prompt : kTripPrompts) {
    INFO(prompt);
    CHECK(torch::equal(logits_of(*mapped, prompt), logits_of(*compiled, prompt)));
  }
}

TEST_CASE("concurrent requests under a tiny budget stay correct", "[cache][tiers]") {
  auto reference = test::tiny_engine();
  reference->add_schema_string(test::kTripSchema);
  std::vector<std::vector<TokenId>> expected;
  for (const auto& prompt : kTripPrompts) {
    expected.push_back(reference->generate_xml(prompt, greedy()).tokens);
  }
  auto engine = test::tiny_engine(1, budget(2048));
  engine->add_schema_string(test::kTripSchema);
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i) {
        const std::size_t p = static_cast<std::size_t>(t + i) % kTripPrompts.size();
        if (engine->generate_xml(kTripPrompts[p], greedy()).tokens != expected[p]) ++wrong;
        ++done;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(done == 24);
  CHECK(wrong == 0);
  const TierStats s = engine->tier_stats();
  CHECK(s.evictions > 0);
  CHECK(s.host_bytes <= 2048);
}

TEST_CASE("a pooled KV buffer lets go of the spans it read in place once they are evicted",
          "[cache][tiers]") {
  const std::string schema = R"(<schema name="s">
  <module name="a">The river flows from the mountains to the sea, and the fish swim in it.</module>
  <module name="b">Paris is the capital of France, a big city with many old houses.</module>
</schema>)";
  const std::string p1 = R"(<prompt schema="s"><a/>Where?</prompt>)";
  const std::string p2 = R"(<prompt schema="s"><b/>Where?</prompt>)";
  // A host budget for either prompt's spans, not for both: every span but the smaller module's.
  int64_t budget_bytes = 0;
  {
    auto sizing = test::tiny_engine();
    sizing->add_schema_string(schema);
    const auto& layout = sizing->layout("s");
    int64_t smaller = -1;
    for (const char* m : {"a", "b"}) {
      int64_t bytes = 0;
      for (std::size_t span : layout.module(m).spans) {
        if (const auto* s = sizing->store().find("s", span)) bytes += s->bytes();
      }
      REQUIRE(bytes > 0);
      smaller = smaller < 0 ? bytes : std::min(smaller, bytes);
    }
    budget_bytes = sizing->store().bytes("s") - smaller;
  }
  auto engine = test::tiny_engine(1, budget(budget_bytes));
  engine->add_schema_string(schema);
  // The stored blocks a prompt reads in place, seen through a KV cache of the test's own (not
  // the pool's): weak references, which expire when the last holder lets go.
  using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;
  struct Blocks {
    int64_t in_place = 0;
    std::vector<const c10::StorageImpl*> at;  // where each block lies
    std::vector<Weak> weak;                   // the same blocks
  };
  const auto blocks_of = [&](const std::string& xml) {
    const auto resolved = engine->resolve(pml::parse_prompt_string(xml));
    KVCache cache = engine->model().make_cache(0);
    Blocks out;
    out.in_place = engine->prefill(resolved, cache, true).assembled.in_place_tokens;
    const auto segments = cache.segments(0, cache.length());
    // The fresh tokens come last, in the cache's own buffer; the other runs are stored blocks.
    const auto* own = segments.back().keys.storage().unsafeGetStorageImpl();
    for (const auto& s : segments) {
      const auto* at = s.keys.storage().unsafeGetStorageImpl();
      if (at == own || std::find(out.at.begin(), out.at.end(), at) != out.at.end()) continue;
      out.at.push_back(at);
      out.weak.push_back(s.keys.storage().getWeakStorageImpl());
    }
    return out;
  };
  // Each of a's blocks is released, or still stored because b uses it too.
  const auto released_unless_in = [](const Blocks& a, const Blocks& b) {
    int64_t released = 0;
    for (std::size_t i = 0; i < a.weak.size(); ++i) {
      if (std::find(b.at.begin(), b.at.end(), a.at[i]) != b.at.end()) continue;
      CHECK(a.weak[i].expired());
      released += a.weak[i].expired() ? 1 : 0;
    }
    return released;
  };
  SamplingParams one;
  one.max_new_tokens = 2;
  one.stop_at_eos = false;

  const Blocks a = blocks_of(p1);
  if (a.in_place == 0) {
    WARN("SKIPPED: the fused CPU attention does not read this model's states in place here");
    return;
  }
  REQUIRE_FALSE(a.weak.empty());
  REQUIRE(engine->generate_xml(p1, one).in_place_tokens > 0);  // the pool's buffer reads a
  for (const Weak& w : a.weak) CHECK_FALSE(w.expired());       // the tier, the pooled buffer
  // While the buffer sits in the pool: b's spans come in (outside the pool), a's are evicted.
  int64_t evictions = engine->tier_stats().evictions;
  const Blocks b = blocks_of(p2);
  CHECK(engine->tier_stats().evictions > evictions);
  CHECK(released_unless_in(a, b) > 0);

  // While the request runs: a's spans (promoted again) are evicted as it decodes, and let go
  // when it gives its buffer back.
  const Blocks a2 = blocks_of(p1);
  Blocks b2;
  evictions = engine->tier_stats().evictions;
  const auto during = engine->generate_xml(p1, one, [&](TokenId, const std::string&) {
    if (b2.weak.empty()) b2 = blocks_of(p2);
    return true;
  });
  REQUIRE(during.in_place_tokens > 0);
  CHECK(engine->tier_stats().evictions > evictions);
  CHECK(released_unless_in(a2, b2) > 0);
  // And the answers are those of an engine without a budget.
  auto reference = test::tiny_engine();
  reference->add_schema_string(schema);
  for (const auto& prompt : {p1, p2}) {
    CHECK(engine->generate_xml(prompt, one).tokens == reference->generate_xml(prompt, one).tokens);
  }
}
