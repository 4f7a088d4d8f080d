#include "engine_setup.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
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
                 "stored there, and a schema it holds is served without compiling; needs "
                 "--cache-secret-file, --cache-secret or $PROMPTCACHE_CACHE_SECRET");
  app.add_option("--redis-ttl", flags.redis_ttl,
                 "seconds a span stays in --redis unused (each use refreshes it; e.g. 86400): "
                 "spans no process uses leave the server on their own (default: never expire)");
  app.add_option("--cache-secret-file", flags.cache_secret_file,
                 "file whose first line (trailing whitespace trimmed) is the secret that seals "
                 "the values stored in --redis (HMAC-SHA256): the same in every process sharing "
                 "the server; values sealed with another secret are refused and compiled again");
  app.add_option("--cache-secret", flags.cache_secret,
                 "the --redis secret itself (visible in `ps`: prefer --cache-secret-file or "
                 "$PROMPTCACHE_CACHE_SECRET)");
  app.add_option("--encoding", flags.encoding, "module encoding: scaffold or isolated")
      ->capture_default_str();
  app.add_option(
      "--template", flags.chat_template,
      "chat template: llama-2, llama-3, mistral, chatml, plain, or jinja (the model's own "
      "template) (default: from the model's config.json, else its Jinja template when it "
      "splits into role texts, else its tokenizer)");
}

LoadOptions load_options(const ModelOptions& model) {
  LoadOptions load;
  load.device = parse_device(model.device);
  if (!model.dtype.empty()) load.dtype = parse_dtype(model.dtype);
  if (!model.weights.empty()) load.weights = parse_weight_dtype(model.weights);
  if (!model.kv_dtype.empty()) load.kv_dtype = parse_dtype(model.kv_dtype);
  return load;
}

nlohmann::json dtype_json(const LlamaModel& model) {
  const DtypeChoice& c = model.dtype_choice();
  return {{"dtype", dtype_name(model.dtype())},
          {"weights_dtype", dtype_name(model.weight_dtype())},
          {"kv_dtype", dtype_name(model.kv_dtype())},
          // kUInt8: a GGUF file of GGML block-quantized matrices (ggml_quant.hpp).
          {"checkpoint_dtype",
           c.checkpoint == torch::kUInt8 ? "ggml-blocks" : dtype_name(c.checkpoint)},
          {"checkpoint_mixed", c.mixed},
          {"dtype_reasons",
           {{"compute", c.compute_reason}, {"weights", c.weights_reason}, {"kv", c.kv_reason}}},
          {"weight_bytes", model.weight_bytes()}};
}

std::string cache_secret(const EngineFlags& flags) {
  if (!flags.cache_secret.empty() && !flags.cache_secret_file.empty()) {
    throw UsageError("--cache-secret and --cache-secret-file: give one of them, not both");
  }
  if (!flags.cache_secret_file.empty()) {
    return read_secret_file(flags.cache_secret_file, "--cache-secret-file");
  }
  if (!flags.cache_secret.empty()) return flags.cache_secret;
  const char* env = std::getenv("PROMPTCACHE_CACHE_SECRET");
  return env != nullptr ? env : "";
}

std::unique_ptr<Engine> open_engine(const ModelOptions& model, const EngineFlags& flags) {
  std::string secret = cache_secret(flags);
  if (!flags.redis.empty() && secret.empty()) {
    // Refused rather than unsealed: whoever can write to the server could inject states.
    throw UsageError(
        "--redis needs a secret to seal the values it stores, the same in every process sharing "
        "the server: --cache-secret-file FILE, --cache-secret S or $PROMPTCACHE_CACHE_SECRET "
        "(make one with `openssl rand -hex 32 > FILE`)");
  }
  const int64_t ttl = parse_redis_ttl(flags.redis_ttl);
  if (ttl > 0 && flags.redis.empty()) throw UsageError("--redis-ttl: give --redis URL as well");
  require_model(model);
  apply_threads(model);
  EngineOptions options;
  options.load = load_options(model);
  options.encoding = parse_encoding_mode(flags.encoding);
  options.chat_template = flags.chat_template;
  options.max_host_bytes = parse_byte_size(flags.max_host_bytes, "--max-host-bytes");
  options.max_device_bytes = parse_byte_size(flags.max_device_bytes, "--max-device-bytes");
  options.redis_url = flags.redis;
  if (!flags.redis.empty()) options.cache_secret = std::move(secret);
  options.redis_ttl_seconds = ttl;
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
