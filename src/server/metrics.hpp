// Counters and histograms of `promptcache serve`, rendered in the Prometheus text format.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "promptcache/cache/span_store.hpp"

namespace promptcache::server {

// A cumulative histogram with fixed upper bounds (Prometheus "le" buckets).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // "# TYPE" line, the buckets, _sum and _count.
  std::string render(const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Gauges the metrics endpoint reads at render time.
struct Gauges {
  int64_t store_bytes = 0;
  int64_t schemas = 0;
  int64_t queued = 0;
  TierStats tiers;  // the engine's span tiers
};

class Metrics {
 public:
  Metrics();
  void count_request(const std::string& endpoint, int status);
  void observe_ttft(double ms);
  void observe_batch(int size);
  void add_tokens(int64_t cached, int64_t fresh, int64_t generated);
  void count_cancelled();
  // A request (prompt or plain) admitted into a batch that was already decoding.
  void count_join();
  // A request refused by a budget or size limit ("max_queue", "max_body_bytes", ...).
  void count_refused(const std::string& limit);
  std::string render(const Gauges& gauges) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  Histogram ttft_seconds_;
  Histogram batch_size_;
  int64_t cached_tokens_ = 0, fresh_tokens_ = 0, generated_tokens_ = 0;
  uint64_t cancelled_ = 0;
  uint64_t joins_ = 0;
  std::map<std::string, uint64_t> refused_;  // by limit (a fixed set of names)
};

// The label a request path is counted under: /v1/schemas/NAME counts as /v1/schemas/{name}, and
// unknown paths as "other", so a client cannot make the label set grow.
std::string endpoint_label(const std::string& path);

}  // namespace promptcache::server
