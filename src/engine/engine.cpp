#include "promptcache/engine.hpp"

#include <filesystem>

#include "promptcache/error.hpp"

namespace promptcache {

Engine::Engine(std::unique_ptr<LlamaModel> model, std::unique_ptr<Tokenizer> tokenizer,
               EngineOptions options)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  template_ = pml::chat_template(options_.chat_template.empty() ? model_->config().chat_template
                                                                : options_.chat_template);
  if (tokenizer_->vocab_size() > static_cast<std::size_t>(model_->config().vocab_size)) {
    throw Error(ErrorKind::kModel, "the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                                       " pieces but the model only " +
                                       std::to_string(model_->config().vocab_size) + " embeddings");
  }
}

std::unique_ptr<Engine> Engine::open(const std::string& model_dir, EngineOptions options) {
  auto model = LlamaModel::load(model_dir, options.load);
  const std::string tok_path = (std::filesystem::path(model_dir) / "tokenizer.model").string();
  if (!std::filesystem::exists(tok_path)) {
    throw Error(ErrorKind::kModel, "tokenizer.model is missing (a SentencePiece model is needed)",
                {model_dir});
  }
  return std::make_unique<Engine>(std::move(model), load_sentencepiece_tokenizer(tok_path),
                                  std::move(options));
}

pml::Layout Engine::layout_only(const pml::Schema& schema) const {
  return pml::layout(schema, *tokenizer_, template_);
}

const pml::Layout& Engine::add_schema(const pml::Schema& schema, const ProgressCallback& progress,
                                      const std::string& cache_file) {
  SchemaEntry entry{layout_only(schema), {}};
  std::string stale;
  if (!cache_file.empty() && std::filesystem::exists(cache_file)) {
    const double start = now_ms();
    try {
      load_cache_file(cache_file, entry.layout, store_, *model_, options_.encoding);
      entry.report.source = "loaded from " + cache_file;
      entry.report.tokens_stored = store_.tokens(schema.name);
      entry.report.bytes = store_.bytes(schema.name);
      entry.report.ms = now_ms() - start;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kCacheFile) throw;  // corrupt: the user should look at it
      stale = e.message();
    }
  }
  if (entry.report.source == "compiled") {
    CompileOptions options;
    options.mode = options_.encoding;
    options.chunk_tokens = options_.compile_chunk_tokens;
    if (progress) {
      options.on_progress = [&](const CompileProgress& p) { progress(schema.name, p); };
    }
    entry.report = ModuleCompiler(*model_).compile(entry.layout, store_, options);
    if (!cache_file.empty() && !store_.spans_of(schema.name).empty()) {
      save_cache_file(cache_file, entry.layout, store_, *model_, options_.encoding);
      entry.report.source = stale.empty()
                                ? "compiled, saved to " + cache_file
                                : cache_file + " was stale (" + stale + "); compiled and saved";
    }
  }
  auto& slot = schemas_[schema.name];
  slot = std::move(entry);
  return slot.layout;
}

const pml::Layout& Engine::add_schema_file(const std::string& path,
                                           const ProgressCallback& progress,
                                           const std::string& cache_file) {
  return add_schema(pml::parse_schema_file(path), progress, cache_file);
}

const pml::Layout& Engine::add_schema_string(const std::string& xml, const std::string& origin,
                                             const std::string& base_dir,
                                             const ProgressCallback& progress) {
  return add_schema(pml::parse_schema_string(xml, origin, base_dir), progress);
}

const Engine::SchemaEntry& Engine::entry(const std::string& schema) const {
  auto it = schemas_.find(schema);
  if (it == schemas_.end()) {
    throw Error(ErrorKind::kUnknownSchema, "schema '" + schema + "' is not loaded");
  }
  return it->second;
}

const pml::Layout& Engine::layout(const std::string& schema) const {
  return entry(schema).layout;
}

const CompileReport& Engine::compile_report(const std::string& schema) const {
  return entry(schema).report;
}

pml::ResolvedPrompt Engine::resolve(const pml::Prompt& prompt) const {
  auto it = schemas_.find(prompt.schema);
  if (it == schemas_.end()) {
    std::string loaded;
    for (const auto& [name, _] : schemas_) loaded += (loaded.empty() ? "'" : ", '") + name + "'";
    throw Error(ErrorKind::kUnknownSchema,
                "prompt uses schema '" + prompt.schema +
                    "' which is not loaded (loaded: " + (loaded.empty() ? "none" : loaded) + ")",
                prompt.where);
  }
  return pml::resolve(prompt, it->second.layout, *tokenizer_);
}

Engine::Prefill Engine::prefill(const pml::ResolvedPrompt& resolved, KVCache& cache, bool use_cache,
                                int64_t extra_capacity, bool reuse) const {
  Prefill out;
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  if (use_cache) {
    const pml::Layout& lay = layout(resolved.schema);
    out.assembled = Assembler().assemble(resolved, lay, store_, cache, extra_capacity, reuse);
  } else {
    // The baseline: the same tokens as one ordinary prefill at positions 0..n-1.
    cache.clear();
    cache.reserve(static_cast<int64_t>(resolved.baseline.size()) + extra_capacity);
    out.assembled.fresh_tokens = resolved.baseline;
    for (std::size_t i = 0; i < resolved.baseline.size(); ++i) {
      out.assembled.fresh_positions.push_back(static_cast<int64_t>(i));
    }
  }
  const auto& fresh = out.assembled.fresh_tokens;
  if (fresh.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  const int64_t limit = model_->config().max_position_embeddings;
  const int64_t last =
      *std::max_element(out.assembled.fresh_positions.begin(), out.assembled.fresh_positions.end());
  if (std::max(last, cache.max_position()) >= limit) {
    throw Error(ErrorKind::kContextOverflow,
                "the prompt needs positions up to " +
                    std::to_string(std::max(last, cache.max_position())) +
                    " but the model's context is " + std::to_string(limit));
  }
  const double start = now_ms();
  std::vector<int64_t> ids(fresh.begin(), fresh.end());
  auto logits =
      model_->forward(torch::tensor(ids, int64).unsqueeze(0),
                      torch::tensor(out.assembled.fresh_positions, int64).unsqueeze(0), cache);
  out.logits = logits.reshape({-1});
  synchronize(out.logits);
  out.prefill_ms = now_ms() - start;
  return out;
}

Response Engine::generate(const pml::Prompt& prompt, const SamplingParams& params,
                          const TokenCallback& on_token, const RequestOptions& request) {
  const double start = now_ms();
  const pml::ResolvedPrompt resolved = resolve(prompt);
  const int64_t extra = params.max_new_tokens;
  if (buffer_.layers() == 0) buffer_ = model_->make_cache(0);
  Prefill pre = prefill(resolved, buffer_, request.use_cache, extra, request.reuse_buffer);
  GenerationTimings gt;
  gt.prefill_ms = pre.prefill_ms;
  gt.prefill_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
  std::vector<TokenId> history = resolved.baseline;
  auto result =
      continue_generation(*model_, *tokenizer_, buffer_, pre.logits, buffer_.max_position() + 1,
                          history, params, on_token, start, gt);
  Response r;
  r.text = std::move(result.text);
  r.tokens = std::move(result.tokens);
  r.stop_reason = result.stop_reason;
  r.timings.assembly_ms = pre.assembled.ms;
  r.timings.fresh_prefill_ms = pre.prefill_ms;
  r.timings.ttft_ms = result.timings.ttft_ms;
  r.timings.decode_ms = result.timings.decode_ms;
  r.timings.decode_tokens = result.timings.decode_tokens;
  r.cached_tokens = pre.assembled.cached_tokens;
  r.reused_tokens = pre.assembled.reused_tokens;
  r.fresh_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
  r.kv_bytes = pre.assembled.kv_bytes;
  return r;
}

Response Engine::generate_xml(const std::string& prompt_xml, const SamplingParams& params,
                              const TokenCallback& on_token, const RequestOptions& request,
                              const std::string& origin) {
  return generate(pml::parse_prompt_string(prompt_xml, origin), params, on_token, request);
}

}  // namespace promptcache
