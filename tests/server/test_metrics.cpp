// /metrics counts stored states that failed their checks (Redis values, states files), beside
// the tier metrics that were there before.
#include "support/catch_torch.hpp"

#include <string>

#include "metrics.hpp"

using namespace promptcache;

TEST_CASE("metrics: stored states that failed their checks are counted by source", "[server]") {
  server::Metrics metrics;
  server::Gauges gauges;
  gauges.tiers.remote_rejected = 3;
  gauges.tiers.file_rejected = 2;
  gauges.tiers.recompiles = 7;
  const std::string text = metrics.render(gauges);
  CHECK(text.find("# TYPE promptcache_states_rejected_total counter\n") != std::string::npos);
  CHECK(text.find("promptcache_states_rejected_total{source=\"redis\"} 3\n") != std::string::npos);
  CHECK(text.find("promptcache_states_rejected_total{source=\"file\"} 2\n") != std::string::npos);
  CHECK(text.find("promptcache_span_recompiles_total 7\n") != std::string::npos);
  // Zero until something fails.
  const std::string none = metrics.render({});
  CHECK(none.find("promptcache_states_rejected_total{source=\"redis\"} 0\n") != std::string::npos);
  CHECK(none.find("promptcache_states_rejected_total{source=\"file\"} 0\n") != std::string::npos);
}
