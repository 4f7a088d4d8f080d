// Opening an Engine from CLI options, with a compile progress bar on stderr.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "promptcache/engine.hpp"

namespace promptcache::cli {

struct EngineFlags {
  std::string encoding = "scaffold";
  std::string chat_template;
  std::string cache_dir;  // --cache-dir: where compiled states are kept between runs
  std::string max_host_bytes, max_device_bytes;  // span tier budgets ("64M"; "" no limit)
  std::string redis;                             // --redis redis://HOST:PORT ("" none)
  std::string redis_ttl;                         // --redis-ttl SECONDS ("" never expire)
  // The secret Redis values are sealed with: --cache-secret S or --cache-secret-file FILE, else
  // $PROMPTCACHE_CACHE_SECRET (cache_secret()). Required with --redis.
  std::string cache_secret, cache_secret_file;
};
void add_engine_flags(CLI::App& app, EngineFlags& flags);
// The LoadOptions that --device, --dtype, --weights and --kv-dtype select (unset when not given:
// the model then follows its checkpoint, choose_dtypes).
LoadOptions load_options(const ModelOptions& model);
// The model's dtypes and why (DtypeChoice), and its weights' resident bytes, as JSON fields:
// dtype, weights_dtype, kv_dtype, checkpoint_dtype, checkpoint_mixed, dtype_reasons{compute,
// weights, kv}, weight_bytes. For `generate --json` and `info --json`.
nlohmann::json dtype_json(const LlamaModel& model);
// The secret for the Redis tier: --cache-secret-file's first line (trailing whitespace
// trimmed), else --cache-secret, else $PROMPTCACHE_CACHE_SECRET, else "". UsageError when both
// flags are given or the file cannot be read or holds no secret.
std::string cache_secret(const EngineFlags& flags);
// UsageError for --redis without a secret (cache_secret).
std::unique_ptr<Engine> open_engine(const ModelOptions& model, const EngineFlags& flags);
// The states file for `schema`: `cache_file` when given, else the schema's own file under
// flags.cache_dir (created when missing; cache_file_name), else "" (compile in memory only).
std::string states_file(const Engine& engine, const pml::Schema& schema,
                        const std::string& cache_file, const EngineFlags& flags);
// A one-line progress bar on stderr ("compiling docs: [#####.....] 3/6 passes").
Engine::ProgressCallback progress_bar();
// Prints TTFT and the assembly/prefill split on stderr.
void print_stats(const Response& r, bool cached);
// How the cached tokens were served, for a stats line: " (12 kept from the last <request>,
// 300 read in place)", or "" when all were copied anew.
std::string cached_detail(const Response& r, const std::string& request);

}  // namespace promptcache::cli
