// One memory tier (promptcache/cache/tier.hpp) on its own: its LRU order, its budget, the spans a
// request holds, the eviction policy and its metrics.
#include "support/catch_torch.hpp"

#include <set>
#include <vector>

#include "promptcache/cache/tier.hpp"

using namespace promptcache;

namespace {

// A span of `n` tokens: 2 x 1 layer x 1 head x n x 4 floats = 32 n bytes.
SpanStates span_of(int64_t n) {
  return SpanStates::from_block(torch::zeros({1, 2, 1, n, 4}), 0);
}

}  // namespace

TEST_CASE("a tier keeps its metrics as spans come and go", "[cache][tier]") {
  Tier tier(TierPolicy{"host", 0, nullptr});
  tier.put("a", span_of(1));
  tier.put("b", span_of(2));
  CHECK(tier.metrics().spans == 2);
  CHECK(tier.metrics().bytes == 32 * 3);
  tier.put("a", span_of(4));  // replaced, not added
  CHECK(tier.metrics().spans == 2);
  CHECK(tier.metrics().bytes == 32 * 6);
  REQUIRE(tier.find("a") != nullptr);
  CHECK(tier.find("a")->length() == 4);
  CHECK(tier.drop("b"));
  CHECK_FALSE(tier.drop("b"));
  CHECK(tier.find("b") == nullptr);
  CHECK(tier.metrics().spans == 1);
  CHECK(tier.metrics().bytes == 32 * 4);
  // No budget: nothing is ever evicted.
  for (int i = 0; i < 10; ++i) tier.put("k" + std::to_string(i), span_of(8));
  CHECK(tier.evict_over_budget(nullptr) == 0);
  CHECK(tier.metrics().evictions == 0);
  CHECK(tier.metrics().spans == 11);
}

TEST_CASE("a tier over budget evicts its least recently used spans that no one holds",
          "[cache][tier]") {
  std::vector<std::string> evicted;
  Tier tier(TierPolicy{"device", 32 * 2, [&](const std::string& key, const SpanStates& states) {
                         CHECK(states.length() == 1);  // seen before it is dropped
                         evicted.push_back(key);
                       }});
  tier.put("a", span_of(1));
  tier.put("b", span_of(1));
  tier.put("c", span_of(1));
  tier.put("d", span_of(1));
  tier.touch("a");  // order now, most recent first: a d c b
  const std::set<std::string> held = {"b"};
  const auto is_held = [&](const std::string& key) { return held.count(key) > 0; };
  CHECK(tier.evict_over_budget(is_held) == 2);
  CHECK(evicted == std::vector<std::string>{"c", "d"});  // b is held: stepped over
  CHECK(tier.find("a") != nullptr);
  CHECK(tier.find("b") != nullptr);
  CHECK(tier.metrics().bytes == 32 * 2);
  CHECK(tier.metrics().evictions == 2);
  // Only held spans left over budget: they stay until a later call finds them free.
  tier.put("e", span_of(1));
  tier.touch("b");
  CHECK(tier.evict_over_budget([](const std::string&) { return true; }) == 0);
  CHECK(tier.metrics().spans == 3);
  CHECK(tier.evict_over_budget(nullptr) == 1);
  CHECK(evicted.back() == "a");  // least recently used of b, e, a
  CHECK(tier.metrics().evictions == 3);
}

TEST_CASE("a tier refuses a negative budget", "[cache][tier]") {
  CHECK_THROWS_WITH(Tier(TierPolicy{"host", -1, nullptr}), Catch::Contains("host tier"));
}
