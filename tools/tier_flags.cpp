#include "tier_flags.hpp"

#include <cctype>
#include <iostream>
#include <limits>

#include "cli_common.hpp"

namespace promptcache::cli {

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  if (text.empty()) return 0;
  auto bad = [&] {
    return UsageError(flag + ": expects a byte count such as 1048576, 512K, 64M or 2G, got '" +
                      text + "'");
  };
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18 || text.size() > digits + 1) throw bad();
  int shift = 0;
  if (text.size() == digits + 1) {
    switch (std::toupper(static_cast<unsigned char>(text.back()))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        throw bad();
    }
  }
  const auto value = std::stoll(text.substr(0, digits));
  if (value > (std::numeric_limits<int64_t>::max() >> shift)) throw bad();
  return static_cast<int64_t>(value) << shift;
}

nlohmann::json tier_stats_json(const TierStats& s) {
  return {
      {"hits", s.hits},
      {"misses", s.misses},
      {"promotions", s.promotions},
      {"file_loads", s.file_loads},
      {"remote_loads", s.remote_loads},
      {"remote_puts", s.remote_puts},
      {"compiled_spans", s.compiled_spans},
      {"remote", s.remote},
      {"recompiles", s.recompiles},
      {"evictions", s.evictions},
      {"shared", s.shared},
      {"keys", s.keys},
      {"host", {{"spans", s.host_spans}, {"bytes", s.host_bytes}, {"max_bytes", s.max_host_bytes}}},
      {"device",
       {{"spans", s.device_spans}, {"bytes", s.device_bytes}, {"max_bytes", s.max_device_bytes}}}};
}

void add_tier_stats(nlohmann::json& j, const Engine& engine, const std::string& schema) {
  j["schema_source"] = engine.compile_report(schema).source;
  j["tiers"] = tier_stats_json(engine.tier_stats());
}

void print_tier_stats(const Engine& engine) {
  std::cerr << nlohmann::json{{"tiers", tier_stats_json(engine.tier_stats())}}.dump() << "\n";
}

}  // namespace promptcache::cli
