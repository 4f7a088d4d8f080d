#include "metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace promptcache::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto at = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[static_cast<std::size_t>(at)];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
  return out;
}

Metrics::Metrics()
    : ttft_seconds_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}),
      batch_size_({1, 2, 4, 8, 16, 32, 64}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::observe_ttft(double ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_seconds_.observe(ms / 1e3);
}

void Metrics::observe_batch(int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  batch_size_.observe(size);
}

void Metrics::add_tokens(int64_t cached, int64_t fresh, int64_t generated) {
  std::lock_guard<std::mutex> lock(mutex_);
  cached_tokens_ += cached;
  fresh_tokens_ += fresh;
  generated_tokens_ += generated;
}

void Metrics::count_cancelled() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++cancelled_;
}

void Metrics::count_refused(const std::string& limit) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++refused_[limit];
}

void Metrics::count_join() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++joins_;
}

std::string Metrics::render(const Gauges& gauges) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out =
      "# HELP promptcache_requests_total HTTP requests by endpoint and status code.\n"
      "# TYPE promptcache_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out += fmt::format("promptcache_requests_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first,
                       key.second, n);
  }
  out += ttft_seconds_.render("promptcache_ttft_seconds",
                              "Arrival of a generation request to its first token.");
  out += batch_size_.render("promptcache_batch_size",
                            "Most requests decoding together while a request ran.");
  out += fmt::format(
      "# HELP promptcache_batch_joins_total Requests (prompt and plain) admitted into a batch "
      "that was already decoding.\n"
      "# TYPE promptcache_batch_joins_total counter\n"
      "promptcache_batch_joins_total {}\n",
      joins_);
  out += fmt::format(
      "# HELP promptcache_prompt_tokens_total Prompt tokens served from stored states (cached) "
      "or run through the model (fresh).\n"
      "# TYPE promptcache_prompt_tokens_total counter\n"
      "promptcache_prompt_tokens_total{{source=\"cached\"}} {}\n"
      "promptcache_prompt_tokens_total{{source=\"fresh\"}} {}\n"
      "# HELP promptcache_generated_tokens_total Tokens generated.\n"
      "# TYPE promptcache_generated_tokens_total counter\n"
      "promptcache_generated_tokens_total {}\n"
      "# HELP promptcache_cancelled_total Generations and compiles stopped because their client "
      "went away or their schema was deleted.\n"
      "# TYPE promptcache_cancelled_total counter\n"
      "promptcache_cancelled_total {}\n"
      "# HELP promptcache_store_bytes Bytes of module states in the store.\n"
      "# TYPE promptcache_store_bytes gauge\n"
      "promptcache_store_bytes {}\n"
      "# HELP promptcache_schemas Schemas loaded.\n"
      "# TYPE promptcache_schemas gauge\n"
      "promptcache_schemas {}\n"
      "# HELP promptcache_queued_requests Requests waiting for the scheduler.\n"
      "# TYPE promptcache_queued_requests gauge\n"
      "promptcache_queued_requests {}\n",
      cached_tokens_, fresh_tokens_, generated_tokens_, cancelled_, gauges.store_bytes,
      gauges.schemas, gauges.queued);
  const TierStats& t = gauges.tiers;
  out += fmt::format(
      "# HELP promptcache_span_lookups_total Stored spans requests looked up, by where they were "
      "found: the top tier (hit), a lower tier (promoted, file among them) or none (recompiled).\n"
      "# TYPE promptcache_span_lookups_total counter\n"
      "promptcache_span_lookups_total{{result=\"hit\"}} {}\n"
      "promptcache_span_lookups_total{{result=\"miss\"}} {}\n"
      "# HELP promptcache_span_promotions_total Missed spans brought up from a lower tier.\n"
      "# TYPE promptcache_span_promotions_total counter\n"
      "promptcache_span_promotions_total{{from=\"any\"}} {}\n"
      "promptcache_span_promotions_total{{from=\"file\"}} {}\n"
      "# HELP promptcache_span_recompiles_total Missed spans found in no tier and compiled again.\n"
      "# TYPE promptcache_span_recompiles_total counter\n"
      "promptcache_span_recompiles_total {}\n"
      "# HELP promptcache_span_evictions_total Spans dropped from a tier over its byte budget.\n"
      "# TYPE promptcache_span_evictions_total counter\n"
      "promptcache_span_evictions_total {}\n"
      "# HELP promptcache_span_shared_total Spans a schema added found already stored.\n"
      "# TYPE promptcache_span_shared_total counter\n"
      "promptcache_span_shared_total {}\n"
      "# HELP promptcache_tier_bytes Bytes of span states held per tier.\n"
      "# TYPE promptcache_tier_bytes gauge\n"
      "promptcache_tier_bytes{{tier=\"host\"}} {}\n"
      "promptcache_tier_bytes{{tier=\"device\"}} {}\n"
      "# HELP promptcache_tier_spans Spans held per tier.\n"
      "# TYPE promptcache_tier_spans gauge\n"
      "promptcache_tier_spans{{tier=\"host\"}} {}\n"
      "promptcache_tier_spans{{tier=\"device\"}} {}\n"
      "# HELP promptcache_tier_max_bytes Byte budget per tier (0: no limit).\n"
      "# TYPE promptcache_tier_max_bytes gauge\n"
      "promptcache_tier_max_bytes{{tier=\"host\"}} {}\n"
      "promptcache_tier_max_bytes{{tier=\"device\"}} {}\n",
      t.hits, t.misses, t.promotions, t.file_loads, t.recompiles, t.evictions, t.shared,
      t.host_bytes, t.device_bytes, t.host_spans, t.device_spans, t.max_host_bytes,
      t.max_device_bytes);
  out += fmt::format(
      "# HELP promptcache_states_rejected_total Stored states that failed their checks and were "
      "compiled again instead of served: Redis values (MAC, format, dtype or shape) and states "
      "files (checksums, or made for another schema version, model or setting).\n"
      "# TYPE promptcache_states_rejected_total counter\n"
      "promptcache_states_rejected_total{{source=\"redis\"}} {}\n"
      "promptcache_states_rejected_total{{source=\"file\"}} {}\n",
      t.remote_rejected, t.file_rejected);
  out +=
      "# HELP promptcache_refused_total Requests refused by a size or budget limit, by limit.\n"
      "# TYPE promptcache_refused_total counter\n";
  for (const auto& [limit, n] : refused_) {
    out += fmt::format("promptcache_refused_total{{limit=\"{}\"}} {}\n", limit, n);
  }
  return out;
}

std::string endpoint_label(const std::string& path) {
  static const std::array<const char*, 9> known = {
      "/",           "/health",         "/metrics",
      "/v1/schemas", "/v1/prompt",      "/v1/chat/completions",
      "/v1/models",  "/v1/completions", "/favicon.ico"};
  for (const char* k : known) {
    if (path == k) return path;
  }
  if (path.rfind("/v1/schemas/", 0) == 0) return "/v1/schemas/{name}";
  return "other";
}

}  // namespace promptcache::server
