#include "promptcache/engine.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>

#include "buffer_lease.hpp"
#include "decode_room.hpp"
#include "promptcache/batch_session.hpp"
#include "promptcache/error.hpp"
#include "promptcache/jinja/derive.hpp"

namespace promptcache {
namespace {

// A prompt's no-cache baseline: its whole token sequence as fresh tokens at positions 0..n-1.
AssembledPrompt baseline_prompt(const pml::ResolvedPrompt& resolved) {
  if (resolved.baseline.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  AssembledPrompt a;
  a.fresh_tokens = resolved.baseline;
  a.fresh_positions.resize(a.fresh_tokens.size());
  std::iota(a.fresh_positions.begin(), a.fresh_positions.end(), int64_t{0});
  a.max_position = static_cast<int64_t>(a.fresh_tokens.size()) - 1;
  return a;
}

// Error(kContextOverflow) when `what` needs positions up to `max_position`, past the model's
// context, at `where` (the prompt's file and element).
void check_context(int64_t max_position, int64_t limit, const std::string& what,
                   const SourceLocation& where) {
  if (max_position >= limit) {
    throw Error(ErrorKind::kContextOverflow,
                what + " needs positions up to " + std::to_string(max_position) +
                    " but the model's context is " + std::to_string(limit),
                where);
  }
}

// The largest position a prompt will use, known before it is assembled: checked first, so a
// prompt past the context never has a KV cache of its size reserved (with a large model, one
// that far past the context could need more memory than the machine has). Cached, the fresh
// text comes last and ends at next_position(); the baseline packs its tokens from 0.
int64_t max_position_of(const pml::ResolvedPrompt& resolved, bool use_cache) {
  return static_cast<int64_t>(use_cache ? resolved.next_position() : resolved.baseline.size()) - 1;
}

}  // namespace

Engine::Engine(std::unique_ptr<LlamaModel> model, std::unique_ptr<Tokenizer> tokenizer,
               EngineOptions options)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  spans_ = std::make_unique<SpanStore>(
      *model_, options_.encoding, options_.compile_chunk_tokens,
      TierBudgets{options_.max_host_bytes, options_.max_device_bytes},
      options_.redis_url.empty() ? nullptr
                                 : RedisTier::connect(options_.redis_url, options_.cache_secret,
                                                      options_.redis_ttl_seconds));
  // Evicted blocks leave the idle KV buffers too (give_back handles the busy ones).
  spans_->set_eviction_listener([this](uint64_t id) { release_evicted(id); });
  const ModelConfig& config = model_->config();
  auto chosen = jinja::model_chat_template(options_.chat_template_folder, options_.chat_template,
                                           config.chat_template, *tokenizer_,
                                           config.default_chat_template(), options_.jinja_template);
  template_ = std::move(chosen.chat);
  template_origin_ = std::move(chosen.origin);
  if (tokenizer_->vocab_size() > static_cast<std::size_t>(model_->config().vocab_size)) {
    throw Error(ErrorKind::kModel, "the tokenizer has " + std::to_string(tokenizer_->vocab_size()) +
                                       " pieces but the model only " +
                                       std::to_string(model_->config().vocab_size) + " embeddings");
  }
}

std::unique_ptr<Engine> Engine::open(const std::string& model_dir, EngineOptions options) {
  auto model = LlamaModel::load(model_dir, options.load);
  // tokenizer.json (byte-level BPE) when the folder has one, else tokenizer.model.
  auto tokenizer = load_tokenizer(model_dir);
  if (options.chat_template_folder.empty()) options.chat_template_folder = model_dir;
  try {
    return std::make_unique<Engine>(std::move(model), std::move(tokenizer), std::move(options));
  } catch (const Error& e) {
    // The constructor's check of the tokenizer against the model knows no folder: name it.
    if (!e.where().file.empty() || e.kind() != ErrorKind::kModel) throw;
    throw Error(e.kind(), e.message(), SourceLocation{model_dir, 0, 0, {}});
  }
}

pml::Layout Engine::layout_only(const pml::Schema& schema) const {
  // Held to the model's context: a schema that cannot fit is refused while it is laid out (a
  // 100 MB module before it is tokenized), and so are prompts resolved against it.
  pml::LayoutOptions options;
  options.max_positions = static_cast<std::size_t>(model_->config().max_position_embeddings);
  return pml::layout(schema, *tokenizer_, template_, options);
}

const pml::Layout& Engine::add_schema(const pml::Schema& schema, const ProgressCallback& progress,
                                      const std::string& cache_file, StatesPolicy policy,
                                      const std::function<bool()>& cancelled) {
  // One at a time; requests go on meanwhile. The new version is built beside the old one (which
  // requests in flight, and until it is published new ones, keep using) and replaces it at once.
  std::lock_guard<std::mutex> adding(add_mutex_);
  auto entry = std::make_shared<SchemaEntry>();
  entry->layout = layout_only(schema);
  std::string stale;
  // Its spans enter the tiers (a span another schema stored is shared); with a budget the entry
  // holds none itself: requests take theirs from the tiers.
  auto adopt = [&](bool compiled) {
    entry->spans = spans_->adopt(entry->layout, entry->states, cache_file, compiled);
  };
  auto let_go = [&] {
    if (spans_->budgeted()) entry->states = CacheStore();
  };
  const bool reuse = policy == StatesPolicy::kReuse;
  if (reuse && !cache_file.empty() && std::filesystem::exists(cache_file)) {
    const double start = now_ms();
    try {
      load_cache_file(cache_file, entry->layout, entry->states, *model_, options_.encoding);
      entry->report.source = "loaded from " + cache_file;
      entry->report.tokens_stored = entry->states.tokens(schema.name);
      entry->report.bytes = entry->states.bytes(schema.name);
      entry->report.ms = now_ms() - start;
      adopt(false);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kCacheFile) throw;  // corrupt: the user should look at it
      stale = e.message();
      entry->states = CacheStore();
      // Never silent: reported (with or without --stats) and counted, then compiled again.
      std::cerr << "promptcache: warning: states file " << cache_file
                << " failed its check: " << stale << "; compiling schema '" << schema.name
                << "' again\n";
      spans_->count_file_rejected();
    }
  }
  if (reuse && entry->report.source == "compiled" && spans_->remote() != nullptr) {
    // Another process may have compiled it into the shared store.
    const double start = now_ms();
    if (spans_->load_remote(entry->layout, entry->states)) {
      entry->report.source = "loaded from " + spans_->remote()->url();
      entry->report.tokens_stored = entry->states.tokens(schema.name);
      entry->report.bytes = entry->states.bytes(schema.name);
      entry->report.ms = now_ms() - start;
      adopt(false);
    }
  }
  if (entry->report.source == "compiled") {
    CompileOptions options;
    options.mode = options_.encoding;
    options.chunk_tokens = options_.compile_chunk_tokens;
    options.cancelled = cancelled;
    if (progress) {
      options.on_progress = [&](const CompileProgress& p) { progress(schema.name, p); };
    }
    // A schema that fails to compile leaves the engine as it was (the old version, if any,
    // stays): its states went into the new entry only.
    entry->report = ModuleCompiler(*model_).compile(entry->layout, entry->states, options);
    adopt(true);
    if (!cache_file.empty() && !entry->states.spans_of(schema.name).empty()) {
      try {
        save_cache_file(cache_file, entry->layout, entry->states, *model_, options_.encoding);
      } catch (...) {
        // The new schema is added (compiled, not saved) before the error goes to the caller.
        entry->report.source = "compiled; saving to " + cache_file + " failed";
        let_go();
        publish(schema.name, entry);
        throw;
      }
      entry->report.source = stale.empty()
                                 ? "compiled, saved to " + cache_file
                                 : cache_file + " was stale (" + stale + "); compiled and saved";
    }
  }
  let_go();
  const SchemaEntry& added = *entry;
  publish(schema.name, std::move(entry));
  return added.layout;
}

void Engine::publish(const std::string& name, EntryPtr entry) {
  EntryPtr old;  // released after the locks, so the old states are freed outside them
  {
    std::unique_lock<std::shared_mutex> lock(schemas_mutex_);
    store_.erase_schema(name);
    for (const auto& [span, states] : entry->states.spans_of(name)) store_.put(name, span, states);
    EntryPtr& slot = schemas_[name];
    old = std::move(slot);
    slot = std::move(entry);
  }
  forget_buffers_of(name);
}

bool Engine::remove_schema(const std::string& name) {
  EntryPtr old;  // released after the lock, as in publish
  {
    std::unique_lock<std::shared_mutex> lock(schemas_mutex_);
    auto it = schemas_.find(name);
    if (it == schemas_.end()) return false;
    old = std::move(it->second);
    schemas_.erase(it);
    store_.erase_schema(name);
  }
  forget_buffers_of(name);
  return true;
}

void Engine::forget_buffers_of(const std::string& name) {
  // A free KV buffer that still holds the old version's states could never reuse them (their
  // block ids are gone), and one that refers to them in place would keep them in memory: it is
  // emptied. Buffers in use now are emptied when they come back (give_back).
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (auto& b : free_buffers_) {
    if (b->schema == name) {
      b->cache.clear();
      b->schema.clear();
      b->entry = nullptr;
    }
  }
}

namespace {

// Cuts `cache` short before the first run of slots copied or read from a stored block that
// `gone` says the span tiers no longer hold (evicted): a block read in place is let go with it,
// and no later request could keep those slots anyway (a span brought back is a new block).
template <typename Gone>
void cut_before_gone(KVCache& cache, const Gone& gone) {
  for (const SlotSource& s : cache.sources()) {
    if (gone(s.source)) {
      cache.truncate(s.slot);
      return;
    }
  }
}

}  // namespace

void Engine::release_evicted(uint64_t id) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  for (auto& b : free_buffers_) {
    cut_before_gone(b->cache, [id](uint64_t source) { return source == id; });
  }
}

const pml::Layout& Engine::add_schema_file(const std::string& path,
                                           const ProgressCallback& progress,
                                           const std::string& cache_file) {
  return add_schema(pml::parse_schema_file(path), progress, cache_file);
}

const pml::Layout& Engine::add_schema_string(const std::string& xml, const std::string& origin,
                                             const std::string& base_dir,
                                             const ProgressCallback& progress) {
  if (base_dir.empty()) return add_schema(pml::parse_schema_string(xml, origin), progress);
  return add_schema(pml::parse_schema_string(xml, origin, pml::RootedSrcFiles(base_dir)), progress);
}

bool Engine::has_schema(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(schemas_mutex_);
  return schemas_.count(name) > 0;
}

Engine::EntryPtr Engine::entry(const std::string& schema) const {
  {
    std::shared_lock<std::shared_mutex> lock(schemas_mutex_);
    auto it = schemas_.find(schema);
    if (it != schemas_.end()) return it->second;
  }
  throw Error(ErrorKind::kUnknownSchema, "schema '" + schema + "' is not loaded");
}

Engine::EntryPtr Engine::entry_for(const pml::Prompt& prompt) const {
  std::string loaded;
  {
    std::shared_lock<std::shared_mutex> lock(schemas_mutex_);
    auto it = schemas_.find(prompt.schema);
    if (it != schemas_.end()) return it->second;
    for (const auto& [name, _] : schemas_) loaded += (loaded.empty() ? "'" : ", '") + name + "'";
  }
  throw Error(ErrorKind::kUnknownSchema,
              "prompt uses schema '" + prompt.schema +
                  "' which is not loaded (loaded: " + (loaded.empty() ? "none" : loaded) + ")",
              prompt.where);
}

// The entry stays in schemas_ until the schema is added again: the reference lives that long.
const pml::Layout& Engine::layout(const std::string& schema) const {
  return entry(schema)->layout;
}

const CompileReport& Engine::compile_report(const std::string& schema) const {
  return entry(schema)->report;
}

pml::ResolvedPrompt Engine::resolve(const pml::Prompt& prompt) const {
  return pml::resolve(prompt, entry_for(prompt)->layout, *tokenizer_);
}

// --- The KV buffer pool ----------------------------------------------------------------------
// A request takes a buffer no other request holds and gives it back when it returns; the pool
// keeps as many as requests ran at once. A single prompt's buffer keeps its contents, so the next
// prompt that selects the same leading modules reuses them (RequestOptions::reuse_buffer): a
// prompt gets the free buffer that holds the longest run of its leading stored blocks.

std::unique_ptr<Engine::PooledBuffer> Engine::take_buffer(const SchemaEntry& entry,
                                                          const pml::ResolvedPrompt& resolved) {
  // The ids of the stored blocks the prompt selects, in slot order (what KVCache::sources of a
  // buffer assembled for it would list).
  std::vector<uint64_t> wanted;
  for (std::size_t index : resolved.spans) {
    const auto key = entry.spans->keys.find(index);
    if (key == entry.spans->keys.end()) continue;
    if (const uint64_t id = spans_->resident_id(key->second)) wanted.push_back(id);
  }
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    std::size_t best = free_buffers_.size(), best_kept = 0;
    // From the most recently given back, so an idle engine hands its one buffer to each request.
    for (std::size_t i = free_buffers_.size(); i-- > 0;) {
      const auto& held = free_buffers_[i]->cache.sources();
      std::size_t kept = 0;
      while (kept < held.size() && kept < wanted.size() && held[kept].source == wanted[kept]) {
        ++kept;
      }
      if (best == free_buffers_.size() || kept > best_kept) {
        best = i;
        best_kept = kept;
      }
    }
    if (best < free_buffers_.size()) {
      auto buffer = std::move(free_buffers_[best]);
      free_buffers_.erase(free_buffers_.begin() + static_cast<std::ptrdiff_t>(best));
      return buffer;
    }
  }
  auto buffer = std::make_unique<PooledBuffer>();
  buffer->cache = model_->make_cache(0);
  return buffer;
}

std::unique_ptr<Engine::PooledBuffer> Engine::take_batch_buffer(int64_t rows) {
  std::unique_ptr<PooledBuffer> replaced;  // freed before the new buffer is made
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    for (auto it = free_batch_buffers_.rbegin(); it != free_batch_buffers_.rend(); ++it) {
      if ((*it)->cache.shape().batch == rows) {
        auto buffer = std::move(*it);
        free_batch_buffers_.erase(std::next(it).base());
        return buffer;
      }
    }
    // A buffer of another batch size is replaced by this one, so the pool never holds more
    // batch buffers than batches ran at once.
    if (!free_batch_buffers_.empty()) {
      replaced = std::move(free_batch_buffers_.front());
      free_batch_buffers_.erase(free_batch_buffers_.begin());
    }
  }
  replaced.reset();
  auto buffer = std::make_unique<PooledBuffer>();
  buffer->cache = model_->make_cache(0, rows);
  return buffer;
}

void Engine::give_back(std::unique_ptr<PooledBuffer> buffer, bool batch, bool finished) {
  if (!buffer) return;
  if (!finished) {
    buffer->cache.clear();
    buffer->schema.clear();
    buffer->entry = nullptr;
  }
  std::lock_guard<std::mutex> lock(pool_mutex_);
  if (batch) {
    free_batch_buffers_.push_back(std::move(buffer));
    return;
  }
  // States of a version of the schema replaced while the request ran: see publish. (The request
  // still holds its entry, so the address cannot belong to a newer one.)
  if (buffer->entry != nullptr) {
    std::shared_lock<std::shared_mutex> schemas(schemas_mutex_);
    auto it = schemas_.find(buffer->schema);
    if (it == schemas_.end() || it->second.get() != buffer->entry) {
      buffer->cache.clear();
      buffer->schema.clear();
      buffer->entry = nullptr;
    }
  }
  // Blocks evicted while the request ran (release_evicted sees only the free buffers). Checked
  // under pool_mutex_: an eviction after this check finds the buffer in free_buffers_.
  cut_before_gone(buffer->cache, [this](uint64_t source) { return !spans_->resident(source); });
  free_buffers_.push_back(std::move(buffer));
}

Engine::Prefill Engine::prefill(const pml::ResolvedPrompt& resolved, KVCache& cache, bool use_cache,
                                int64_t extra_capacity, const AssembleOptions& assembly,
                                const RecomputeOptions& recompute) const {
  const EntryPtr held = use_cache ? entry(resolved.schema) : nullptr;
  return prefill_with(held.get(), resolved, cache, use_cache, extra_capacity, assembly, recompute);
}

Engine::Prefill Engine::prefill_with(const SchemaEntry* schema, const pml::ResolvedPrompt& resolved,
                                     KVCache& cache, bool use_cache, int64_t extra_capacity,
                                     const AssembleOptions& assembly,
                                     const RecomputeOptions& recompute) const {
  Prefill out;
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t limit = model_->config().max_position_embeddings;
  check_context(max_position_of(resolved, use_cache), limit, "the prompt", resolved.where);
  if (use_cache) {
    // Room for the recomputed tokens, which run after the cached slots before they move back.
    const int64_t recomputed = recompute_capacity(recompute, resolved);
    // Held while they are assembled (then the KV cache's own references keep what it reads).
    const SpanStore::Pin pinned = spans_->pin(schema->layout, *schema->spans, resolved.spans);
    out.assembled = Assembler().assemble(resolved, schema->layout, pinned.states(), cache,
                                         extra_capacity + recomputed, assembly);
  } else {
    out.assembled = baseline_prompt(resolved);
    cache.clear();
    cache.reserve(static_cast<int64_t>(resolved.baseline.size()) + extra_capacity);
  }
  check_context(out.assembled.max_position, limit, "the prompt", resolved.where);
  const auto& fresh = out.assembled.fresh_tokens;
  const double start = now_ms();
  std::vector<int64_t> ids(fresh.begin(), fresh.end());
  if (use_cache && recompute_requested(recompute, resolved) && out.assembled.cached_tokens > 0) {
    RecomputeReport report;
    out.logits = recompute_prefill(*model_, resolved, out.assembled, cache, recompute, &report);
    out.recomputed_tokens = report.recomputed_tokens;
  } else {
    out.logits =
        model_
            ->forward(torch::tensor(ids, int64).unsqueeze(0),
                      torch::tensor(out.assembled.fresh_positions, int64).unsqueeze(0), cache)
            .reshape({-1});
  }
  synchronize(out.logits);
  out.prefill_ms = now_ms() - start;
  return out;
}

Response Engine::generate(const pml::Prompt& prompt, const SamplingParams& params,
                          const TokenCallback& on_token, const RequestOptions& request) {
  const double start = now_ms();
  // Held to the end: a schema replaced meanwhile changes nothing for this request.
  const EntryPtr schema = entry_for(prompt);
  const pml::ResolvedPrompt resolved = pml::resolve(prompt, schema->layout, *tokenizer_);
  params.validate();
  const int64_t extra =
      decode_room(params.max_new_tokens, model_->config().max_position_embeddings);
  BufferLease buffer(*this, take_buffer(*schema, resolved), false);
  KVCache& cache = buffer->cache;
  Prefill pre = prefill_with(
      schema.get(), resolved, cache, request.use_cache, extra,
      AssembleOptions{request.reuse_buffer, request.in_place},
      RecomputeOptions{request.recompute.value_or(schema->layout.recompute.value_or(0)),
                       request.recompute_criterion, request.recompute_select_layer,
                       request.recompute_first_k});
  buffer->schema = request.use_cache ? resolved.schema : "";
  buffer->entry = request.use_cache ? schema.get() : nullptr;
  GenerationTimings gt;
  gt.prefill_ms = pre.prefill_ms;
  gt.prefill_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
  std::vector<TokenId> history = resolved.baseline;
  auto result = continue_generation(*model_, *tokenizer_, cache, pre.logits,
                                    cache.max_position() + 1, history, params, on_token, start, gt);
  buffer.finished();
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
  r.in_place_tokens = pre.assembled.in_place_tokens;
  r.fresh_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
  r.recomputed_tokens = pre.recomputed_tokens;
  r.kv_bytes = pre.assembled.kv_bytes;
  return r;
}

std::vector<Response> Engine::generate_in_session(const std::vector<pml::Prompt>& prompts,
                                                  const SamplingParams& params,
                                                  const BatchTokenCallback& on_token,
                                                  const RequestOptions& request) {
  const auto rows = static_cast<int64_t>(prompts.size());
  BatchSession session(*this, BatchSessionOptions{rows, 0});
  std::map<BatchSession::RowId, std::size_t> index;  // row id -> prompt
  std::vector<Response> responses(prompts.size());
  auto collect = [&] {
    for (auto& done : session.step()) responses[index.at(done.id)] = std::move(done.response);
  };
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    TokenCallback row_callback;
    if (on_token) {
      row_callback = [&on_token, i](TokenId id, const std::string& text) {
        return on_token(i, id, text);
      };
    }
    // Waits for rows to finish while there is no room; an empty session admits any prompt
    // within the context (a refusal there would be a bug: an error, not an endless loop).
    std::optional<BatchSession::RowId> id;
    while (!(id = session.admit(prompts[i], params, row_callback, request))) {
      if (session.empty()) {
        throw Error(ErrorKind::kContextOverflow,
                    "prompt " + std::to_string(i) + " does not fit an empty batch session");
      }
      collect();
    }
    index[*id] = i;
  }
  while (!session.empty()) collect();
  return responses;
}

Engine::BatchPrefill Engine::prefill_batch(const std::vector<pml::ResolvedPrompt>& resolved,
                                           KVCache& cache, bool use_cache,
                                           int64_t extra_capacity) const {
  std::vector<EntryPtr> entries;
  if (use_cache) {
    for (const auto& r : resolved) entries.push_back(entry(r.schema));
  }
  return prefill_batch_with(entries, resolved, cache, use_cache, extra_capacity);
}

Engine::BatchPrefill Engine::prefill_batch_with(const std::vector<EntryPtr>& entries,
                                                const std::vector<pml::ResolvedPrompt>& resolved,
                                                KVCache& cache, bool use_cache,
                                                int64_t extra_capacity) const {
  BatchPrefill out;
  const auto rows = static_cast<int64_t>(resolved.size());
  if (rows == 0 || cache.shape().batch != rows) {
    throw Error(ErrorKind::kInvalidArgument, "prefill_batch: " + std::to_string(rows) +
                                                 " prompts for a KV cache of batch " +
                                                 std::to_string(cache.shape().batch));
  }
  const int64_t limit = model_->config().max_position_embeddings;
  for (int64_t i = 0; i < rows; ++i) {
    check_context(max_position_of(resolved[i], use_cache), limit,
                  "prompt " + std::to_string(i + 1) + " of the batch", resolved[i].where);
  }
  AssembledBatch& batch = out.assembled;
  if (use_cache) {
    std::vector<BatchPrompt> prompts;
    std::vector<SpanStore::Pin> pinned;  // each row's states, held while they are assembled
    pinned.reserve(resolved.size());
    for (std::size_t i = 0; i < resolved.size(); ++i) {
      pinned.push_back(spans_->pin(entries[i]->layout, *entries[i]->spans, resolved[i].spans));
      prompts.push_back({&resolved[i], &entries[i]->layout, &pinned[i].states()});
    }
    batch = Assembler().assemble_batch(prompts, CacheStore(), cache, extra_capacity);
  } else {
    for (const auto& r : resolved) {
      batch.rows.push_back(baseline_prompt(r));
      batch.fresh_slots = std::max(batch.fresh_slots, static_cast<int64_t>(r.baseline.size()));
    }
    cache.clear();
    cache.reserve(batch.fresh_slots + std::max<int64_t>(extra_capacity, 0));
  }
  for (int64_t i = 0; i < rows; ++i) {
    check_context(batch.rows[i].max_position, limit,
                  "prompt " + std::to_string(i + 1) + " of the batch", resolved[i].where);
  }
  // Row i's fresh tokens end at the same slot as every other row's (padding goes first), so the
  // last column of the batch holds every row's last token. A padding token sees only itself.
  const int64_t c = batch.cached_slots, f = batch.fresh_slots;
  out.visible = torch::zeros({rows, cache.capacity()}, torch::kBool);
  auto ids = torch::zeros({rows, f}, torch::kInt64);
  auto positions = torch::zeros({rows, f}, torch::kInt64);
  auto cols = torch::arange(c + f, torch::kInt64);
  auto causal =
      cols.unsqueeze(0) <= (torch::arange(f, torch::kInt64) + c).unsqueeze(1);  // [f, c+f]
  auto mask = causal.unsqueeze(0).repeat({rows, 1, 1});
  auto diagonal = mask.accessor<bool, 3>();
  for (int64_t i = 0; i < rows; ++i) {
    const AssembledPrompt& a = batch.rows[i];
    const auto n = static_cast<int64_t>(a.fresh_tokens.size());
    const int64_t pad = f - n;
    out.visible[i].narrow(0, 0, a.cached_tokens).fill_(true);
    out.visible[i].narrow(0, c + pad, cache.capacity() - c - pad).fill_(true);
    ids[i].narrow(0, pad, n).copy_(
        torch::tensor(std::vector<int64_t>(a.fresh_tokens.begin(), a.fresh_tokens.end())));
    positions[i].narrow(0, pad, n).copy_(torch::tensor(a.fresh_positions));
    mask[i].logical_and_(out.visible[i].narrow(0, 0, c + f).unsqueeze(0));
    mask[i].narrow(0, 0, pad).fill_(false);
    for (int64_t j = 0; j < pad; ++j) diagonal[i][j][c + j] = true;
  }
  const double start = now_ms();
  ForwardOptions options;
  options.attention_mask = mask;
  out.logits = model_->forward(ids, positions, cache, options).reshape({rows, -1});
  synchronize(out.logits);
  out.prefill_ms = now_ms() - start;
  return out;
}

std::vector<Response> Engine::generate_batch(const std::vector<pml::Prompt>& prompts,
                                             const SamplingParams& params,
                                             const BatchTokenCallback& on_token,
                                             const RequestOptions& request) {
  const double start = now_ms();
  if (prompts.empty()) return {};
  params.validate();
  const auto rows = static_cast<int64_t>(prompts.size());
  // Each prompt's schema is held to the end, as in generate.
  std::vector<EntryPtr> entries;
  std::vector<pml::ResolvedPrompt> resolved;
  bool recomputing = false;
  for (const auto& p : prompts) {
    entries.push_back(entry_for(p));
    resolved.push_back(pml::resolve(p, entries.back()->layout, *tokenizer_));
    const double share = request.recompute.value_or(entries.back()->layout.recompute.value_or(0));
    recomputing = recomputing ||
                  (request.use_cache && (share != 0 || !resolved.back().recompute_budgets.empty()));
  }
  if (recomputing) return generate_in_session(prompts, params, on_token, request);
  BufferLease buffer(*this, take_batch_buffer(rows), true);
  BatchPrefill pre = prefill_batch_with(
      entries, resolved, buffer->cache, request.use_cache,
      decode_room(params.max_new_tokens, model_->config().max_position_embeddings));

  std::vector<TokenStream> streams;
  std::vector<int64_t> next_position(rows);
  std::vector<Response> responses(rows);
  std::vector<double> first_token_ms(rows, 0), last_token_ms(rows, 0);
  streams.reserve(rows);
  for (int64_t i = 0; i < rows; ++i) {
    TokenCallback row_callback;
    if (on_token) {
      row_callback = [&on_token, i](TokenId id, const std::string& text) {
        return on_token(static_cast<std::size_t>(i), id, text);
      };
    }
    streams.emplace_back(*model_, *tokenizer_, params, resolved[i].baseline, row_callback);
    next_position[i] = pre.assembled.rows[i].max_position + 1;
  }
  const int64_t limit = model_->config().max_position_embeddings;
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  // Cache row r holds prompt active[r]. Finished rows run along (their last token again,
  // harmlessly) until enough of them are done to be worth dropping: a decode step costs each row
  // its share of the work, dropping costs one copy of the remaining rows' states.
  std::vector<int64_t> active(rows);
  std::iota(active.begin(), active.end(), 0);
  // A shallow copy (the same storage): dropping rows narrows it, while the buffer keeps its full
  // batch for the next call.
  KVCache cache = buffer->cache;
  torch::Tensor visible = pre.visible;
  torch::Tensor logits = pre.logits;
  auto ids = torch::zeros({rows, 1}, int64);
  auto positions = torch::zeros({rows, 1}, int64);
  for (int step = 0;; ++step) {
    auto host = logits.to(torch::kCPU, torch::kFloat32).contiguous();
    const auto vocab = static_cast<std::size_t>(host.size(1));
    int64_t* next_ids = ids.data_ptr<int64_t>();
    int64_t* next_positions = positions.data_ptr<int64_t>();
    int64_t running = 0;
    for (std::size_t r = 0; r < active.size(); ++r) {
      const int64_t i = active[r];
      TokenStream& stream = streams[i];
      if (stream.done()) continue;
      TokenId id = stream.sample(host[static_cast<int64_t>(r)].data_ptr<float>(), vocab);
      const double now = now_ms();
      if (step == 0) first_token_ms[i] = now;
      last_token_ms[i] = now;
      if ((id = stream.accept(id)) < 0) continue;
      if (next_position[i] >= limit || cache.length() >= cache.capacity()) {
        stream.stop(StopReason::kContextFull);
        continue;
      }
      next_ids[r] = static_cast<int64_t>(id);
      next_positions[r] = next_position[i]++;
      ++running;
    }
    if (running == 0) break;
    const auto finished = static_cast<int64_t>(active.size()) - running;
    const int steps_left = params.max_new_tokens - step - 1;
    if (request.drop_finished_rows && finished > 0 &&
        finished * 4 >= static_cast<int64_t>(active.size()) && steps_left >= 4) {
      std::vector<int64_t> keep, kept_prompts;
      for (std::size_t r = 0; r < active.size(); ++r) {
        if (!streams[active[r]].done()) {
          keep.push_back(static_cast<int64_t>(r));
          kept_prompts.push_back(active[r]);
        }
      }
      cache.keep_rows(keep);
      const auto index = torch::tensor(keep, int64);
      visible = visible.index_select(0, index);
      ids = ids.index_select(0, index);
      positions = positions.index_select(0, index);
      active = std::move(kept_prompts);
    }
    ForwardOptions options;
    options.attention_mask = visible.narrow(1, 0, cache.length() + 1).unsqueeze(1);
    logits = model_->forward(ids, positions, cache, options)
                 .reshape({static_cast<int64_t>(active.size()), -1});
    for (int64_t i : active) {
      if (!streams[i].done()) ++responses[i].timings.decode_tokens;
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    GenerationResult result = streams[i].take_result();
    Response& r = responses[i];
    const AssembledPrompt& a = pre.assembled.rows[i];
    r.text = std::move(result.text);
    r.tokens = std::move(result.tokens);
    r.stop_reason = result.stop_reason;
    r.timings.assembly_ms = pre.assembled.ms;
    r.timings.fresh_prefill_ms = pre.prefill_ms;
    r.timings.ttft_ms = first_token_ms[i] > 0 ? first_token_ms[i] - start : 0;
    r.timings.decode_ms = last_token_ms[i] - first_token_ms[i];
    r.cached_tokens = a.cached_tokens;
    r.fresh_tokens = static_cast<int64_t>(a.fresh_tokens.size());
    r.kv_bytes = a.kv_bytes;
  }
  buffer.finished();
  return responses;
}

Response Engine::generate_xml(const std::string& prompt_xml, const SamplingParams& params,
                              const TokenCallback& on_token, const RequestOptions& request,
                              const std::string& origin) {
  return generate(pml::parse_prompt_string(prompt_xml, origin), params, on_token, request);
}

}  // namespace promptcache
