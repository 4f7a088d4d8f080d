// src/engine/engine.cpp — running requests: an Engine is made from a model and a tokenizer
// (choosing the chat template), and generate / generate_batch / generate_in_session turn prompts
// into responses: they hold the prompt's schema version to the end, take a KV buffer from the pool
// (engine_buffers.cpp), prefill it (engine_prefill.cpp: where every token goes) and decode. What a
// schema is and how it is added or replaced lives in engine_schemas.cpp.
#include "promptcache/engine.hpp"

#include <iostream>
#include <map>
#include <numeric>

#include "buffer_lease.hpp"
#include "decode_room.hpp"
#include "promptcache/batch_session.hpp"
#include "promptcache/error.hpp"
#include "promptcache/jinja/derive.hpp"

namespace promptcache {

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
  r.exact_tokens = pre.assembled.exact_tokens;
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

bool Engine::recomputes(const SchemaEntry& schema, const pml::ResolvedPrompt& resolved,
                        const RequestOptions& request) const {
  const double share = request.recompute.value_or(schema.layout.recompute.value_or(0));
  return request.use_cache && (share != 0 || !resolved.recompute_budgets.empty()) &&
         !exact_without_recompute(schema.layout, resolved, options_.encoding);
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
    recomputing = recomputing || recomputes(*entries.back(), resolved.back(), request);
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
