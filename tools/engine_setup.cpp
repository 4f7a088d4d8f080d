#include "engine_setup.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tier_flags.hpp"

namespace promptcache::cli {

void add_engine_flags(CLI::App& app, EngineFlags& flags) {
  app.add_option("--cache-dir", flags.cache_dir,
                 "folder of compiled states kept between runs: a schema's file there is loaded "
                 "when it matches the schema, model, dtypes and encoding, else compiled and saved");
  app.add_option("--max-host-bytes", flags.max_host_bytes,
                 "host-memory budget of the stored spans (e.g. 512M): least recently used spans "
                 "are evicted, re-read from --cache-dir or compiled again when needed");
  app.add_option("--max-device-bytes", flags.max_device_bytes,
                 "device-memory budget of the stored spans when the model is not on the CPU");
  app.add_option("--redis", flags.redis,
                 "a Redis server shared by many processes (redis://HOST:PORT): compiled spans are "
                 "stored there, and a schema it holds is served without compiling");
  app.add_option("--encoding", flags.encoding, "module encoding: scaffold or isolated")
      ->capture_default_str();
  app.add_option(
      "--template", flags.chat_template,
      "chat template: llama-2, llama-3, mistral, chatml, plain (default: from the model)");
}

LoadOptions load_options(const ModelOptions& model) {
  LoadOptions load;
  load.device = parse_device(model.device);
  load.dtype = parse_dtype(model.dtype);
  if (!model.weights.empty()) load.weights = parse_weight_dtype(model.weights);
  if (!model.kv_dtype.empty()) load.kv_dtype = parse_dtype(model.kv_dtype);
  return load;
}

std::unique_ptr<Engine> open_engine(const ModelOptions& model, const EngineFlags& flags) {
  require_model(model);
  apply_threads(model);
  EngineOptions options;
  options.load = load_options(model);
  options.encoding = parse_encoding_mode(flags.encoding);
  options.chat_template = flags.chat_template;
  options.max_host_bytes = parse_byte_size(flags.max_host_bytes, "--max-host-bytes");
  options.max_device_bytes = parse_byte_size(flags.max_device_bytes, "--max-device-bytes");
  options.redis_url = flags.redis;
  return Engine::open(model.model_dir, options);
}

std::string states_file(const Engine& engine, const pml::Schema& schema,
                        const std::string& cache_file, const EngineFlags& flags) {
  if (!cache_file.empty() || flags.cache_dir.empty()) return cache_file;
  std::error_code ec;
  std::filesystem::create_directories(flags.cache_dir, ec);
  if (ec || !std::filesystem::is_directory(flags.cache_dir)) {
    throw UsageError("--cache-dir " + flags.cache_dir + ": cannot create the folder" +
                     (ec ? " (" + ec.message() + ")" : ""));
  }
  return (std::filesystem::path(flags.cache_dir) /
          cache_file_name(engine.layout_only(schema), engine.model(), engine.options().encoding))
      .string();
}

Engine::ProgressCallback progress_bar() {
  const bool tty = ::isatty(2);
  return [tty](const std::string& schema, const CompileProgress& p) {
    const int width = 24;
    const int done =
        p.tokens_total ? static_cast<int>(width * p.tokens_done / p.tokens_total) : width;
    std::cerr << fmt::format("{}compiling {}: [{}{}] pass {}/{}, {} tokens{}", tty ? "\r" : "",
                             schema, std::string(done, '#'), std::string(width - done, '.'), p.pass,
                             p.passes, p.tokens_done, tty && p.pass < p.passes ? "" : "\n");
  };
}

void print_stats(const Response& r, bool cached) {
  std::cerr << fmt::format(
      "[{}: TTFT {:.1f} ms (assembly {:.2f} ms, prefill {:.1f} ms); {} cached{} + {} fresh "
      "prompt tokens; {} generated at {:.0f} tok/s]\n",
      cached ? "cached" : "no cache", r.timings.ttft_ms, r.timings.assembly_ms,
      r.timings.fresh_prefill_ms, r.cached_tokens, cached_detail(r, "request"), r.fresh_tokens,
      r.tokens.size(), r.timings.decode_tokens_per_s());
}

std::string cached_detail(const Response& r, const std::string& request) {
  std::vector<std::string> parts;
  if (r.reused_tokens > 0) {
    parts.push_back(fmt::format("{} kept from the last {}", r.reused_tokens, request));
  }
  if (r.in_place_tokens > 0) parts.push_back(fmt::format("{} read in place", r.in_place_tokens));
  if (r.recomputed_tokens > 0) parts.push_back(fmt::format("{} recomputed", r.recomputed_tokens));
  if (parts.empty()) return "";
  std::string out = " (" + parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) out += ", " + parts[i];
  return out + ")";
}

}  // namespace promptcache::cli
