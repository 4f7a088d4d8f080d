// src/engine/engine_schemas.cpp — the engine's schemas: laying a schema out against the model's
// context and tokenizer, compiling its modules (or loading them from a states file or the shared
// Redis store), publishing the new version beside the old one so requests in flight keep theirs,
// removing it, and looking a prompt's schema up. Requests hold a SchemaEntry (a shared pointer) to
// the end, so replacing a schema never changes a request that already started.
#include <filesystem>
#include <iostream>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"

namespace promptcache {

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
}  // namespace promptcache
