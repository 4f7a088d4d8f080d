// The Redis span tier against a real redis-server started on a free port: a second engine
// serves a schema the first compiled without compiling it, damaged values are never served, and
// a server killed while requests run leaves every answer right (the local tiers take over).
#include "support/catch_torch.hpp"

#include <atomic>
#include <map>
#include <thread>

#include "promptcache/cache/cache_file.hpp"
#include "promptcache/cache/redis_tier.hpp"
#include "support/redis_server.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {

const std::vector<std::string> kPrompts = {
    R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
    R"(<prompt schema="trip"><city/><sunny/><live/>And now?</prompt>)",
    R"(<prompt schema="trip"><sunny/>What is the weather?</prompt>)",
};

SamplingParams greedy() {
  SamplingParams p;
  p.max_new_tokens = 5;
  p.stop_at_eos = false;
  return p;
}

const std::string kSecret = "test-secret";

EngineOptions with_redis(const std::string& url, int64_t host_bytes = 0) {
  EngineOptions o;
  o.redis_url = url;
  o.cache_secret = kSecret;
  o.max_host_bytes = host_bytes;
  return o;
}

// The remote store's key of each stored span of schema "trip" (span index -> key).
std::map<std::size_t, std::string> remote_keys(const Engine& engine) {
  const auto& layout = engine.layout("trip");
  const auto model_fp = model_fingerprint(engine.model());
  std::map<std::size_t, std::string> out;
  for (const auto& [span, key] : span_keys(layout, model_fp, engine.model().dtype(),
                                           engine.model().kv_dtype(), EncodingMode::kScaffold)) {
    out.emplace(span, remote_key(model_fp, layout_fingerprint(layout), span, key));
  }
  return out;
}

torch::Tensor logits_of(Engine& engine, const std::string& xml) {
  const auto resolved = engine.resolve(pml::parse_prompt_string(xml));
  KVCache cache = engine.model().make_cache(0);
  return engine.prefill(resolved, cache, true).logits;
}

}  // namespace

TEST_CASE("a redis URL is checked", "[cache][redis]") {
  CHECK_THROWS_WITH(RedisTier::connect("redis://host:port", kSecret), Catch::Contains("port"));
  CHECK_THROWS_WITH(RedisTier::connect("redis://:6379", kSecret),
                    Catch::Contains("redis://HOST:PORT"));
  CHECK_THROWS_WITH(RedisTier::connect("redis://u:p@host:1/0", kSecret),
                    Catch::Contains("redis URL"));
}

TEST_CASE("a second engine serves a schema the first compiled into redis, without compiling",
          "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  auto first = test::tiny_engine(1, with_redis(server.url()));
  first->add_schema_string(test::kTripSchema);
  const TierStats wrote = first->tier_stats();
  CHECK(wrote.compiled_spans > 0);
  CHECK(wrote.remote_puts == wrote.compiled_spans);
  CHECK(wrote.remote == server.url());

  auto second = test::tiny_engine(1, with_redis(server.url()));
  bool compiled = false;
  second->add_schema(pml::parse_schema_string(test::kTripSchema),
                     [&](const std::string&, const CompileProgress&) { compiled = true; });
  CHECK_FALSE(compiled);
  CHECK(second->compile_report("trip").source == "loaded from " + server.url());
  const TierStats read = second->tier_stats();
  CHECK(read.compiled_spans == 0);
  CHECK(read.recompiles == 0);
  CHECK(read.remote_loads == wrote.compiled_spans);
  CHECK(read.remote_puts == 0);  // already there
  for (const auto& prompt : kPrompts) {
    INFO(prompt);
    CHECK(second->generate_xml(prompt, greedy()).tokens ==
          first->generate_xml(prompt, greedy()).tokens);
    CHECK(torch::equal(logits_of(*second, prompt), logits_of(*first, prompt)));
  }
  CHECK(second->tier_stats().recompiles == 0);
}

TEST_CASE("a damaged value in redis is a miss, never served", "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  auto first = test::tiny_engine(1, with_redis(server.url()));
  first->add_schema_string(test::kTripSchema);
  // Every span's value with one byte of its states flipped.
  auto redis = RedisTier::connect(server.url(), kSecret);
  for (const auto& [span, remote] : remote_keys(*first)) {
    std::string value = RedisTier::encode(remote, first->store().find("trip", span)->kv, kSecret);
    value[value.size() - 1] ^= 0x20;
    REQUIRE(redis->put_value(remote, value));
  }
  auto second = test::tiny_engine(1, with_redis(server.url()));
  second->add_schema_string(test::kTripSchema);
  CHECK(second->compile_report("trip").source == "compiled");
  CHECK(second->tier_stats().compiled_spans > 0);
  CHECK(second->tier_stats().remote_loads == 0);
  CHECK(second->tier_stats().remote_rejected == 1);
  for (const auto& prompt : kPrompts) {
    CHECK(second->generate_xml(prompt, greedy()).tokens ==
          first->generate_xml(prompt, greedy()).tokens);
  }
}

TEST_CASE("spans evicted from host memory come back from redis", "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  auto reference = test::tiny_engine();
  reference->add_schema_string(test::kTripSchema);
  auto engine = test::tiny_engine(1, with_redis(server.url(), 1));
  engine->add_schema_string(test::kTripSchema);
  for (const auto& prompt : kPrompts) {
    CHECK(engine->generate_xml(prompt, greedy()).tokens ==
          reference->generate_xml(prompt, greedy()).tokens);
  }
  const TierStats s = engine->tier_stats();
  CHECK(s.evictions > 0);
  CHECK(s.remote_loads == s.misses);
  CHECK(s.recompiles == 0);
}

TEST_CASE("a redis server killed while requests run leaves every answer right", "[cache][redis]") {
  auto server = std::make_unique<test::RedisServer>();
  REQUIRE_REDIS(*server);
  auto reference = test::tiny_engine();
  reference->add_schema_string(test::kTripSchema);
  std::vector<std::vector<TokenId>> expected;
  for (const auto& prompt : kPrompts) {
    expected.push_back(reference->generate_xml(prompt, greedy()).tokens);
  }
  // A budget of one byte: every request takes its spans from a lower tier (redis, then the
  // model).
  auto engine = test::tiny_engine(1, with_redis(server->url(), 1));
  engine->add_schema_string(test::kTripSchema);
  std::atomic<int> wrong{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        const std::size_t p = static_cast<std::size_t>(t + i) % kPrompts.size();
        if (engine->generate_xml(kPrompts[p], greedy()).tokens != expected[p]) ++wrong;
        ++done;
      }
    });
  }
  while (done < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server->kill();  // mid-run: requests are looking spans up in it now
  for (auto& t : threads) t.join();
  CHECK(wrong == 0);
  const TierStats s = engine->tier_stats();
  CHECK(s.remote_loads > 0);  // before the kill
  CHECK(s.recompiles > 0);    // after it
  // And the engine keeps answering with redis gone.
  CHECK(engine->generate_xml(kPrompts[0], greedy()).tokens == expected[0]);
}

TEST_CASE("a redis TTL is checked", "[cache][redis]") {
  CHECK_THROWS_WITH(RedisTier::connect("redis://127.0.0.1:1", kSecret, -1), Catch::Contains("TTL"));
  CHECK_THROWS_WITH(
      RedisTier::connect("redis://127.0.0.1:1", kSecret, RedisTier::kMaxTtlSeconds + 1),
      Catch::Contains("TTL"));
  CHECK(RedisTier::connect("redis://127.0.0.1:1", kSecret, 60)->ttl_seconds() == 60);
}

TEST_CASE("with a TTL, redis values expire unless used, and each use refreshes them",
          "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  const auto block = torch::arange(2 * 2 * 3 * 4, torch::kFloat32).reshape({2, 2, 1, 3, 4});
  const std::vector<int64_t> shape = block.sizes().vec();
  // Without one (the default), a value never expires.
  auto forever = RedisTier::connect(server.url(), kSecret);
  REQUIRE(forever->put("forever", block));
  CHECK(forever->expires_in_ms("forever") == -1);
  CHECK_FALSE(forever->expires_in_ms("absent").has_value());

  auto tier = RedisTier::connect(server.url(), kSecret, 2);
  REQUIRE(tier->put("used", block));
  REQUIRE(tier->put("unused", block));
  REQUIRE(tier->put("checked", block));
  const auto left = tier->expires_in_ms("used");
  REQUIRE(left.has_value());
  CHECK(*left > 1000);
  CHECK(*left <= 2000);
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  // A read and a check that finds the key both start its two seconds again.
  CHECK(tier->expires_in_ms("used").value_or(0) <= 700);
  const auto got = tier->get("used", torch::kFloat32, shape);
  REQUIRE(got.has_value());
  CHECK(torch::equal(*got, block));
  CHECK(tier->contains("checked"));
  CHECK(tier->expires_in_ms("used").value_or(0) > 1300);
  CHECK(tier->expires_in_ms("checked").value_or(0) > 1300);
  CHECK(tier->expires_in_ms("unused").value_or(0) <= 700);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  // "unused" is gone (2.3 s after it was written); the used ones are still there.
  CHECK_FALSE(tier->get("unused", torch::kFloat32, shape).has_value());
  CHECK_FALSE(tier->contains("unused"));
  CHECK(tier->get("used", torch::kFloat32, shape).has_value());
  CHECK(tier->contains("checked"));
  CHECK(tier->rejected() == 0);  // expired is absent, not refused
  CHECK(forever->expires_in_ms("forever") == -1);
}

TEST_CASE("an engine's spans expire from redis with its TTL, and are compiled again then",
          "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  EngineOptions options = with_redis(server.url());
  options.redis_ttl_seconds = 2;
  auto first = test::tiny_engine(1, options);
  first->add_schema_string(test::kTripSchema);
  REQUIRE(first->tier_stats().remote_puts > 0);
  // Every value the engine wrote carries the TTL.
  auto redis = RedisTier::connect(server.url(), kSecret);
  for (const auto& [span, remote] : remote_keys(*first)) {
    const auto left = redis->expires_in_ms(remote);
    REQUIRE(left.has_value());
    CHECK(*left > 0);
    CHECK(*left <= 2000);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2300));
  auto second = test::tiny_engine(1, options);
  second->add_schema_string(test::kTripSchema);
  CHECK(second->compile_report("trip").source == "compiled");  // nothing left to load
  CHECK(second->tier_stats().remote_loads == 0);
  CHECK(second->tier_stats().remote_rejected == 0);
  for (const auto& prompt : kPrompts) {
    CHECK(second->generate_xml(prompt, greedy()).tokens ==
          first->generate_xml(prompt, greedy()).tokens);
  }
}
