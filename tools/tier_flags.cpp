#include "tier_flags.hpp"

#include <cctype>
#include <fstream>
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

int64_t parse_redis_ttl(const std::string& text) {
  if (text.empty()) return 0;
  const bool digits =
      text.size() <= 12 && text.find_first_not_of("0123456789") == std::string::npos;
  const int64_t seconds = digits ? std::stoll(text) : -1;
  if (seconds <= 0 || seconds > RedisTier::kMaxTtlSeconds) {
    throw UsageError("--redis-ttl: expects whole seconds from 1 to " +
                     std::to_string(RedisTier::kMaxTtlSeconds) + " (ten years), got '" + text +
                     "'");
  }
  return seconds;
}

std::string read_secret_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(flag + " " + path + ": cannot read the file");
  constexpr std::size_t kMaxBytes = 64 * 1024;
  std::string text(kMaxBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  const auto eol = text.find('\n');
  if (eol != std::string::npos) {
    text.resize(eol);
  } else if (text.size() == kMaxBytes) {
    throw UsageError(flag + " " + path + ": its first line is longer than 64 KiB");
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty()) throw UsageError(flag + " " + path + ": its first line holds no secret");
  return text;
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
      {"remote_rejected", s.remote_rejected},
      {"file_rejected", s.file_rejected},
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
