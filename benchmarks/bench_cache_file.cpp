// bench_cache_file — compiling a schema against loading its states from a cache file.
//
// For each schema size (a document-QA schema of 128-token modules, as bench_ttft's), one JSON
// line: the compile time, the time to save the cache file, the time to load it back (the file is
// memory-mapped on the CPU, every checksum verified; the states stay views of the mapping), the
// ratio compile / load, and the first cached request's TTFT after each, with the same answer.
// The file is read from the page cache (just written), as a server restarting on the same
// machine finds it.
//
//   build/benchmarks/bench_cache_file [--schema 1024,4096] [--repeats 3] [--shape bench-small]
//                                     [--weights f32|bf16|f16|q8] [--kv-dtype f32|bf16|f16]
//                                     [--dir DIR (default: a temporary folder)]
#include <torch/types.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

int main(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_cache_file",
                           {"schema", "repeats", "shape", "weights", "kv-dtype", "dir"});
  const auto schema_sizes = flags.list("schema", {1024, 4096});
  const int repeats = std::max(1, flags.integer("repeats", 3));
  const auto applied = configure_threads(0);
  auto engine_owner =
      bench::synthetic_engine("bench_cache_file", flags.text("shape", "bench-small"), "cpu", "",
                              flags.text("weights", ""), flags.text("kv-dtype", ""));
  Engine& engine = *engine_owner;
  namespace fs = std::filesystem;
  const fs::path dir = flags.text("dir", "").empty()
                           ? fs::temp_directory_path() / "promptcache-bench-cache-file"
                           : fs::path(flags.text("dir", ""));
  fs::create_directories(dir);
  const auto words = bench::corpus_words();
  SamplingParams one;
  one.max_new_tokens = 1;
  for (int tokens : schema_sizes) {
    const std::string name = "docs" + std::to_string(tokens);
    const auto [xml, refs] = bench::document_schema(engine.tokenizer(), words, name, tokens, 0);
    const auto schema = pml::parse_schema_string(xml);
    std::size_t qfrom = 7;
    const std::string prompt = "<prompt schema=\"" + name + "\">" + refs +
                               bench::text_of_tokens(engine.tokenizer(), words, qfrom, 16) +
                               "</prompt>";
    const std::string file = (dir / (name + ".states")).string();
    std::vector<double> compile_ms, save_ms, load_ms, ttft_compiled, ttft_loaded;
    bool same = true;
    for (int r = 0; r < repeats; ++r) {
      fs::remove(file);
      engine.add_schema(schema);  // compiled only: no file given
      compile_ms.push_back(engine.compile_report(name).ms);
      RequestOptions cold;
      cold.reuse_buffer = false;
      const auto compiled = engine.generate_xml(prompt, one, {}, cold);
      ttft_compiled.push_back(compiled.timings.ttft_ms);
      const double t0 = now_ms();
      save_cache_file(file, engine.layout(name), engine.store(), engine.model(),
                      engine.options().encoding);
      save_ms.push_back(now_ms() - t0);
      engine.add_schema(schema, {}, file);  // found and loaded (mapped)
      if (engine.compile_report(name).source.rfind("loaded from", 0) != 0) {
        std::cerr << "bench_cache_file: the file was not loaded: "
                  << engine.compile_report(name).source << "\n";
        return 1;
      }
      load_ms.push_back(engine.compile_report(name).ms);
      const auto loaded = engine.generate_xml(prompt, one, {}, cold);
      ttft_loaded.push_back(loaded.timings.ttft_ms);
      same = same && loaded.tokens == compiled.tokens;
    }
    nlohmann::ordered_json j;
    j["bench"] = "cache_file";
    j["schema_tokens"] = tokens;
    j["stored_tokens"] = engine.store().tokens(name);
    j["file_bytes"] = static_cast<int64_t>(fs::file_size(file));
    j["compile_ms"] = bench::best_time(compile_ms);
    j["save_ms"] = bench::best_time(save_ms);
    j["load_ms"] = bench::best_time(load_ms);
    j["load_ms_median"] = bench::median_time(load_ms);
    j["compile_over_load"] = bench::best_time(compile_ms) / bench::best_time(load_ms);
    j["load_gbps"] = static_cast<double>(fs::file_size(file)) / (bench::best_time(load_ms) * 1e6);
    j["ttft_after_compile_ms"] = bench::best_time(ttft_compiled);
    j["ttft_after_load_ms"] = bench::best_time(ttft_loaded);
    j["same_first_token"] = same;
    j["statistic"] = "best_of_" + std::to_string(repeats);
    const auto facts = bench::run_facts(engine, "cpu", "f32", applied);
    for (const auto& [k, v] : facts.items()) j[k] = v;
    std::cout << j.dump() << std::endl;
    fs::remove(file);
  }
  return 0;
}
