// The span tiers on the command line: byte sizes (--max-host-bytes, --max-device-bytes),
// --redis-ttl and the stats `--stats` prints (promptcache/cache/span_store.hpp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "promptcache/engine.hpp"

namespace promptcache::cli {

// "1048576", "512K", "64M", "2G" (powers of 1024); "" is 0 (no limit). UsageError naming `flag`
// otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

// --redis-ttl: whole seconds from 1 to RedisTier::kMaxTtlSeconds; "" is 0 (never expire).
// UsageError otherwise.
int64_t parse_redis_ttl(const std::string& text);

// A secret kept in a file: its first line, trailing whitespace trimmed (at most 64 KiB read).
// UsageError naming `flag` and the file when it cannot be read or the line is empty.
std::string read_secret_file(const std::string& path, const std::string& flag);

nlohmann::json tier_stats_json(const TierStats& s);
// `j`'s "schema_source" (how the schema's states came to be: compile_report().source) and
// "tiers" (tier_stats_json).
void add_tier_stats(nlohmann::json& j, const Engine& engine, const std::string& schema);
// {"tiers": {...}} as one line on stderr.
void print_tier_stats(const Engine& engine);

}  // namespace promptcache::cli
