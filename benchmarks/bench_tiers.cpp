// bench_tiers — where a schema's states come from (promptcache/cache/span_store.hpp), and what a
// host-memory budget saves.
//
// --mode load (default): one JSON line for a document schema of --schema tokens: the time to
// compile it (ModuleCompiler), to load it from its memory-mapped cache file (every checksum
// verified) and, with --redis, from a Redis server (every value checked), best of --repeats, and
// compile / load ratios. All three are measured in the same run, so the ratios hold even on a
// busy machine; the absolute times do not.
// --mode serve: one JSON line for serving --documents documents (one 128-token module each, one
// question per document, each question on its own document) with --max-host-bytes (0: no
// budget): the process's resident memory (VmRSS) after adding the schema and at the end, the
// peak (VmHWM), and the span tiers' stats. Run it once per budget, each in its own process.
//
//   build/benchmarks/bench_tiers [--mode load|serve] [--schema 4096] [--repeats 3]
//                                [--redis redis://127.0.0.1:6379] [--shape bench-small]
//                                [--documents 20] [--max-host-bytes 0] [--dir DIR]
#include <malloc.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

namespace {

// A /proc/self/status field in bytes ("VmRSS", "VmHWM"). glibc keeps freed blocks of the
// sizes states have in its heap (its mmap threshold grows as such blocks are freed): the heap is
// trimmed first, so the resident size follows what is held, not what was once allocated.
int64_t status_bytes(const std::string& field) {
  ::malloc_trim(0);
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

nlohmann::ordered_json stats_json(const TierStats& s) {
  return {{"hits", s.hits},
          {"misses", s.misses},
          {"file_loads", s.file_loads},
          {"remote_loads", s.remote_loads},
          {"recompiles", s.recompiles},
          {"evictions", s.evictions},
          {"host_bytes", s.host_bytes},
          {"max_host_bytes", s.max_host_bytes}};
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags(
      argc, argv, "bench_tiers",
      {"mode", "schema", "repeats", "redis", "shape", "documents", "max-host-bytes", "dir"});
  const std::string mode = flags.text("mode", "load");
  const int repeats = std::max(1, flags.integer("repeats", 3));
  const auto applied = configure_threads(0);
  const std::string redis = flags.text("redis", "");
  const int64_t budget = flags.integer("max-host-bytes", 0);
  EngineOptions options;
  options.max_host_bytes = budget;
  options.redis_url = mode == "load" ? redis : "";
  // The values are sealed with a secret (redis_tier.hpp): $PROMPTCACHE_CACHE_SECRET, else a
  // fixed one (this process reads back only what it wrote).
  const char* secret = std::getenv("PROMPTCACHE_CACHE_SECRET");
  options.cache_secret = secret != nullptr && *secret != '\0' ? secret : "bench_tiers";
  auto engine_owner = bench::synthetic_engine("bench_tiers", flags.text("shape", "bench-small"),
                                              "cpu", "", "", "", "bf16", options);
  Engine& engine = *engine_owner;
  namespace fs = std::filesystem;
  const fs::path dir = flags.text("dir", "").empty()
                           ? fs::temp_directory_path() / "promptcache-bench-tiers"
                           : fs::path(flags.text("dir", ""));
  fs::create_directories(dir);
  const auto words = bench::corpus_words();
  nlohmann::ordered_json j;
  j["bench"] = "tiers";
  j["mode"] = mode;

  if (mode == "load") {
    const int tokens = flags.integer("schema", 4096);
    const std::string name = "docs" + std::to_string(tokens);
    const auto schema = pml::parse_schema_string(
        bench::document_schema(engine.tokenizer(), words, name, tokens, 0).first);
    const std::string file = (dir / (name + ".states")).string();
    fs::remove(file);
    engine.add_schema(schema, {}, file);  // compiled, saved, written to Redis
    std::vector<double> compile_ms, file_ms, redis_ms;
    for (int r = 0; r < repeats; ++r) {
      CacheStore scratch;
      compile_ms.push_back(
          ModuleCompiler(engine.model()).compile(engine.layout(name), scratch, {}).ms);
      engine.add_schema(schema, {}, file);
      if (engine.compile_report(name).source.rfind("loaded from " + file, 0) != 0) {
        std::cerr << "bench_tiers: the file was not loaded: " << engine.compile_report(name).source
                  << "\n";
        return 1;
      }
      file_ms.push_back(engine.compile_report(name).ms);
      if (!redis.empty()) {
        engine.add_schema(schema);  // no file: from Redis
        if (engine.compile_report(name).source != "loaded from " + redis) {
          std::cerr << "bench_tiers: not loaded from Redis: " << engine.compile_report(name).source
                    << "\n";
          return 1;
        }
        redis_ms.push_back(engine.compile_report(name).ms);
      }
    }
    j["schema_tokens"] = tokens;
    j["stored_bytes"] = engine.compile_report(name).bytes;
    j["compile_ms"] = bench::best_time(compile_ms);
    j["mapped_file_ms"] = bench::best_time(file_ms);
    j["compile_over_mapped_file"] = bench::best_time(compile_ms) / bench::best_time(file_ms);
    if (!redis.empty()) {
      j["redis_ms"] = bench::best_time(redis_ms);
      j["compile_over_redis"] = bench::best_time(compile_ms) / bench::best_time(redis_ms);
    }
    j["statistic"] = "best_of_" + std::to_string(repeats);
    fs::remove(file);
  } else if (mode == "serve") {
    const int documents = flags.integer("documents", 20);
    const std::string name = "serve" + std::to_string(documents);
    const auto schema = pml::parse_schema_string(
        bench::document_schema(engine.tokenizer(), words, name, documents * 128 + 1, 0).first);
    const std::string file = (dir / (name + ".states")).string();
    fs::remove(file);
    const int64_t rss_start = status_bytes("VmRSS");
    engine.add_schema(schema, {}, file);
    const int64_t rss_added = status_bytes("VmRSS");
    SamplingParams params;
    params.max_new_tokens = 8;
    params.stop_at_eos = false;
    std::size_t qfrom = 11;
    for (int d = 0; d < documents; ++d) {
      const std::string prompt = "<prompt schema=\"" + name + "\"><d" + std::to_string(d) + "/>" +
                                 bench::text_of_tokens(engine.tokenizer(), words, qfrom, 16) +
                                 "</prompt>";
      engine.generate_xml(prompt, params);
    }
    j["documents"] = documents;
    j["stored_bytes"] = engine.compile_report(name).bytes;
    j["rss_before_schema"] = rss_start;
    j["rss_after_schema"] = rss_added;
    j["rss_end"] = status_bytes("VmRSS");
    j["rss_peak"] = status_bytes("VmHWM");
    j["tiers"] = stats_json(engine.tier_stats());
    fs::remove(file);
  } else {
    std::cerr << "bench_tiers: --mode is load or serve, not '" << mode << "'\n";
    return 2;
  }
  const auto facts = bench::run_facts(engine, "cpu", "f32", applied);
  for (const auto& [k, v] : facts.items()) j[k] = v;
  std::cout << j.dump() << std::endl;
  return 0;
}
