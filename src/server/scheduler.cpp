#include "scheduler.hpp"

#include <filesystem>
#include <utility>

#include "promptcache/cache/cache_file.hpp"
#include "views.hpp"

namespace promptcache::server {

using nlohmann::json;

namespace {

Event error_event(const Error& e) {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = error_status(e);
  ev.body = error_json(e);
  return ev;
}

Event shutting_down_event() {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = 503;
  ev.body = error_json("the server is shutting down", "server_error");
  return ev;
}

Event limit_event(const LimitError& e) {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = e.status;
  ev.body = error_json(e);
  return ev;
}

Event internal_error_event(const std::exception& e) {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = 500;
  ev.body = error_json(std::string("internal error: ") + e.what(), "server_error");
  return ev;
}

}  // namespace

void check_turns_fit(const std::vector<pml::Turn>& turns, int64_t limit) {
  for (const pml::Turn& turn : turns) {
    if (pml::cannot_fit(turn.text, static_cast<std::size_t>(limit))) {
      throw Error(ErrorKind::kContextOverflow,
                  "the prompt's text is longer than the model's context of " +
                      std::to_string(limit) + " tokens",
                  turn.where);
    }
  }
}

pml::ResolvedPrompt resolve_within_context(const Engine& engine, const pml::Prompt& prompt,
                                           bool use_cache) {
  const int64_t limit = engine.model().config().max_position_embeddings;
  check_turns_fit(prompt.turns, limit);
  pml::ResolvedPrompt resolved = engine.resolve(prompt);
  const std::size_t needed = use_cache ? resolved.next_position() : resolved.baseline.size();
  if (static_cast<int64_t>(needed) > limit) {
    throw Error(ErrorKind::kContextOverflow,
                "the prompt needs positions up to " + std::to_string(needed - 1) +
                    " but the model's context is " + std::to_string(limit),
                resolved.where);
  }
  return resolved;
}

Scheduler::Scheduler(Engine& engine, Metrics& metrics, SchedulerOptions options)
    : engine_(engine),
      metrics_(metrics),
      options_(std::move(options)),
      max_batch_(std::max(1, options_.max_batch)),
      batch_(std::make_unique<BatchSession>(engine, BatchSessionOptions{max_batch_, 0})) {}

Scheduler::~Scheduler() {
  stop();
}

std::string Scheduler::cache_file(const pml::Schema& schema) const {
  if (options_.cache_dir.empty()) return "";
  std::filesystem::create_directories(options_.cache_dir);
  // The name `promptcache compile --cache-dir` and the CLI's --cache-dir use (cache_file_name).
  return (std::filesystem::path(options_.cache_dir) /
          cache_file_name(engine_.layout_only(schema), engine_.model(), engine_.options().encoding))
      .string();
}

void Scheduler::add_schema(const pml::Schema& schema, const Engine::ProgressCallback& progress) {
  check_schema_budget(engine_.layout_only(schema));
  engine_.add_schema(schema, progress, cache_file(schema));
  publish(schema.name);
}

void Scheduler::check_schema_budget(const pml::Layout& layout) const {
  std::size_t count = 1;
  int64_t positions = static_cast<int64_t>(layout.total_length);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, view] : schemas_) {
      if (name == layout.schema_name) continue;  // replaced
      ++count;
      positions += view["total_length"].get<int64_t>();
    }
  }
  if (options_.max_schemas > 0 && count > options_.max_schemas) {
    throw LimitError(429, "max_schemas",
                     "the server holds " + std::to_string(count - 1) +
                         " schemas, its limit (--max-schemas " +
                         std::to_string(options_.max_schemas) +
                         "); delete one (DELETE /v1/schemas/NAME) or start the server with a "
                         "larger --max-schemas");
  }
  if (options_.max_schema_positions > 0 && positions > options_.max_schema_positions) {
    throw LimitError(429, "max_schema_positions",
                     "schema '" + layout.schema_name + "' reserves " +
                         std::to_string(layout.total_length) +
                         " positions, which would bring the server's schemas to " +
                         std::to_string(positions) + ", over its limit (--max-schema-positions " +
                         std::to_string(options_.max_schema_positions) +
                         "); delete a schema or start the server with a larger "
                         "--max-schema-positions");
  }
}

bool Scheduler::publish(const std::string& name, const Job* compile) {
  json view = layout_json(engine_.layout(name), engine_.compile_report(name));
  std::lock_guard<std::mutex> lock(mutex_);
  if (compile && compile->deleted) return false;  // run_delete sets it under this lock
  schemas_[name] = std::move(view);
  return true;
}

void Scheduler::start() {
  thread_ = std::thread([this] { loop(); });
  compile_thread_ = std::thread([this] { compile_loop(); });
}

void Scheduler::stop() {
  std::deque<JobPtr> refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    refused.swap(queue_);
    refused.insert(refused.end(), compiles_.begin(), compiles_.end());
    compiles_.clear();
  }
  wake_.notify_all();
  compile_wake_.notify_all();
  for (const JobPtr& job : refused) {
    job->channel.push(shutting_down_event());
  }
  if (thread_.joinable()) thread_.join();
  if (compile_thread_.joinable()) compile_thread_.join();
}

void Scheduler::submit(JobPtr job) {
  std::optional<Event> refusal;
  const bool compile = job->kind == Job::Kind::kCompile;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t compiles = compiles_.size() + (compiling_ ? 1 : 0);
    if (stopping_) {
      refusal = shutting_down_event();
    } else if (compile && options_.max_compiles > 0 && compiles >= options_.max_compiles) {
      refusal = limit_event(
          LimitError(429, "max_compiles",
                     std::to_string(compiles) +
                         " compiles are waiting or running, the server's limit "
                         "(--max-compiles " +
                         std::to_string(options_.max_compiles) +
                         "); try again when one has finished, or start the server with a larger "
                         "--max-compiles"));
    } else if (!compile && job->kind != Job::Kind::kDelete && options_.max_queue > 0 &&
               queue_.size() >= options_.max_queue) {
      refusal = limit_event(
          LimitError(429, "max_queue",
                     std::to_string(queue_.size()) +
                         " requests are waiting, the server's limit "
                         "(--max-queue " +
                         std::to_string(options_.max_queue) +
                         "); try again shortly, or start the server with a larger --max-queue"));
    } else {
      (compile ? compiles_ : queue_).push_back(job);
    }
  }
  if (refusal) {
    if (refusal->status == 429) metrics_.count_refused(refusal->body["error"]["limit"]);
    job->channel.push(std::move(*refusal));
    return;
  }
  (compile ? compile_wake_ : wake_).notify_one();
}

json Scheduler::schema_list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  json list = json::array();
  for (const auto& [name, view] : schemas_) {
    list.push_back({{"name", name},
                    {"total_length", view["total_length"]},
                    {"modules", view["modules"].size()},
                    {"compile", view["compile"]}});
  }
  return list;
}

std::optional<json> Scheduler::schema(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = schemas_.find(name);
  if (it == schemas_.end()) return std::nullopt;
  return it->second;
}

Gauges Scheduler::gauges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Gauges g;
  g.schemas = static_cast<int64_t>(schemas_.size());
  g.queued = static_cast<int64_t>(queue_.size());
  g.tiers = engine_.tier_stats();
  g.store_bytes = g.tiers.host_bytes + g.tiers.device_bytes;  // shared spans counted once
  return g;
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (batch_->empty()) wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && batch_->empty()) return;
    }
    // Every prompt at the front of the queue that the batch has room for joins it now (before the
    // next decode step).
    // A job stays in the queue until it is admitted (so --max-queue counts it while it waits).
    for (;;) {
      JobPtr job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_ || queue_.empty()) break;
        job = queue_.front();
      }
      bool admitted = true;
      try {
        // A delete is quick and safe beside running requests (they keep the schema's states).
        if (job->kind == Job::Kind::kDelete) {
          run_delete(*job);
        } else {
          admitted = admit(job);
        }
      } catch (const std::exception& e) {
        job->channel.push(internal_error_event(e));  // a bug or no memory
      }
      if (!admitted) break;  // no room until rows finish: it stays first in line
      std::lock_guard<std::mutex> lock(mutex_);
      // stop() may have taken the queue (and refused the job) meanwhile.
      if (!queue_.empty() && queue_.front() == job) queue_.pop_front();
    }
    if (!batch_->empty()) step();
  }
}

void Scheduler::compile_loop() {
  for (;;) {
    JobPtr job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      compile_wake_.wait(lock, [&] { return stopping_ || !compiles_.empty(); });
      if (stopping_) return;
      job = compiles_.front();
      compiles_.pop_front();
      compiling_ = job;
    }
    Event last;
    try {
      last = run_compile(*job);
    } catch (const std::exception& e) {
      // run_compile reports its own errors; this is what escaped it (a bug or no memory).
      last = internal_error_event(e);
    }
    {
      // Done before its client hears of it: a client that posts its next schema at once finds
      // no compile running.
      std::lock_guard<std::mutex> lock(mutex_);
      compiling_ = nullptr;
    }
    job->channel.push(std::move(last));
  }
}

TokenCallback Scheduler::stream_to(Job& job) {
  return [this, &job](TokenId id, const std::string& text) {
    if (job.cancelled.load()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return false;
    }
    Event ev;
    ev.type = Event::Type::kToken;
    ev.id = id;
    ev.text = text;
    if (const TokenLogprob* lp = batch_->current_logprob()) ev.logprob = *lp;
    job.channel.push(std::move(ev));
    return true;
  };
}

void Scheduler::finish(Job& job, Response r, int batch_size, double run_start,
                       std::vector<TokenLogprob> logprobs) {
  const double queue_ms = run_start - job.arrival_ms;
  if (job.cancelled.load()) metrics_.count_cancelled();
  if (!r.tokens.empty()) metrics_.observe_ttft(queue_ms + r.timings.ttft_ms);
  metrics_.add_tokens(r.cached_tokens, r.fresh_tokens, static_cast<int64_t>(r.tokens.size()));
  Event ev;
  ev.type = Event::Type::kDone;
  ev.batch_size = batch_size;
  ev.queue_ms = queue_ms;
  ev.response = std::move(r);
  ev.logprobs = std::move(logprobs);
  if (job.echo) {
    ev.prompt_ids = job.ids;
    ev.prompt_logprobs = std::move(job.prompt_logprobs);
  }
  job.channel.push(std::move(ev));
}

void Scheduler::accept(Job& job) {
  const int64_t limit = engine_.model().config().max_position_embeddings;
  Event ev;
  ev.type = Event::Type::kAccepted;
  if (job.kind == Job::Kind::kPlain) {
    // Tokenized in the request's own thread (http_server.cpp); checked again here for callers
    // that submit ids directly.
    if (job.ids.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
    if (static_cast<int64_t>(job.ids.size()) > limit) {
      throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(job.ids.size()) +
                                                   " tokens but the model's context is " +
                                                   std::to_string(limit));
    }
    ev.prompt_tokens = static_cast<int64_t>(job.ids.size());
  } else {
    const pml::ResolvedPrompt resolved = resolve_within_context(engine_, job.prompt, job.use_cache);
    ev.prompt_tokens = static_cast<int64_t>(resolved.baseline.size());
  }
  job.channel.push(std::move(ev));
  job.accepted = true;
}

bool Scheduler::admit(const JobPtr& job) {
  if (job->cancelled.load()) {
    metrics_.count_cancelled();
    return true;
  }
  try {
    // Checked before the first token can stream, so a bad request gets its error first.
    if (!job->accepted) accept(*job);
    const double run_start = now_ms();
    const bool echo = job->echo && job->kind == Job::Kind::kPlain;
    if (echo && job->logprobs >= 0 && job->prompt_logprobs.empty()) {
      // Every prompt token's log-probability, from a forward of its own (the batch's prefill
      // keeps the last token's logits only), reusing a registered schema's stored spans where
      // the prompt begins with them. Kept if the batch has no room now and the job waits.
      SequenceLogprobs scored = engine_.sequence_logprobs(job->ids, job->logprobs, job->use_cache);
      job->prompt_logprobs = std::move(scored.tokens);
      job->prompt_cached_tokens = scored.cached_tokens;
    }
    if (echo && job->params.max_new_tokens == 0) {
      // Scoring only (an evaluation harness's loglikelihood request): no row in the batch.
      Response r;
      r.cached_tokens = job->prompt_cached_tokens;
      r.fresh_tokens = static_cast<int64_t>(job->ids.size()) - r.cached_tokens;
      r.timings.fresh_prefill_ms = now_ms() - run_start;
      r.stop_reason = StopReason::kMaxTokens;
      finish(*job, std::move(r), 1, run_start, {});
      return true;
    }
    const int64_t before = batch_->active();
    RequestOptions request;
    request.use_cache = job->use_cache;
    request.recompute = job->recompute;
    const auto row =
        job->kind == Job::Kind::kPlain
            ? batch_->admit_tokens(job->ids, job->params, stream_to(*job), job->logprobs)
            : batch_->admit(job->prompt, job->params, stream_to(*job), request, job->logprobs);

    if (!row) return false;
    if (before > 0 && decoding_) metrics_.count_join();
    running_[*row] = {job, run_start, static_cast<int>(batch_->active())};
  } catch (const Error& e) {
    job->channel.push(error_event(e));
  }
  return true;
}

void Scheduler::step() {
  std::vector<BatchSession::Finished> done;
  const int rows = static_cast<int>(batch_->active());
  try {
    done = batch_->step();
  } catch (const std::exception& e) {
    // A bug or no memory: every running request fails, and the batch starts afresh.
    for (auto& [id, r] : running_) r.job->channel.push(internal_error_event(e));
    running_.clear();
    decoding_ = false;
    batch_ = std::make_unique<BatchSession>(engine_, BatchSessionOptions{max_batch_, 0});
    return;
  }
  decoding_ = !batch_->empty();
  for (auto& [id, r] : running_) r.batch_size = std::max(r.batch_size, rows);
  for (auto& f : done) {
    auto it = running_.find(f.id);
    if (it == running_.end()) continue;
    Running r = std::move(it->second);
    running_.erase(it);
    metrics_.observe_batch(r.batch_size);
    finish(*r.job, std::move(f.response), r.batch_size, r.run_start, std::move(f.logprobs));
  }
}

Event Scheduler::run_compile(Job& job) {
  const std::string& name = job.schema.name;
  // The compile stops at its next forward once its client is gone, its schema was deleted
  // (run_delete sets `cancelled`) or the server stops.
  const auto cancelled = [this, &job] {
    if (job.cancelled.load()) return true;
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  };
  try {
    const pml::Layout layout = engine_.layout_only(job.schema);
    check_schema_budget(layout);
    Event accepted;
    accepted.type = Event::Type::kAccepted;
    accepted.body = {{"type", "accepted"},
                     {"schema", name},
                     {"total_length", layout.total_length},
                     {"modules", layout.modules.size()}};
    job.channel.push(std::move(accepted));
    const auto progress = [&job](const std::string& schema, const CompileProgress& p) {
      Event ev;
      ev.type = Event::Type::kProgress;
      ev.body = {{"type", "progress"},
                 {"schema", schema},
                 {"pass", p.pass},
                 {"passes", p.passes},
                 {"tokens_done", p.tokens_done},
                 {"tokens_total", p.tokens_total}};
      job.channel.push(std::move(ev));
    };
    engine_.add_schema(job.schema, progress, cache_file(job.schema), Engine::StatesPolicy::kReuse,
                       cancelled);
    if (!publish(name, &job)) {
      // Deleted after its last forward: what the DELETE answered holds.
      engine_.remove_schema(name);
      throw Error(ErrorKind::kCancelled, "schema '" + name + "' was deleted while it compiled");
    }
    Event done;
    done.type = Event::Type::kDone;
    done.body = *schema(name);
    return done;
  } catch (const LimitError& e) {
    metrics_.count_refused(e.limit);
    return limit_event(e);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kCancelled) metrics_.count_cancelled();
    // A schema that failed to compile is gone from the engine; its old view goes too. One the
    // engine holds (added but not saved: a full disk; or the old version, kept) is listed as the
    // engine serves it: never served but unlisted.
    if (!engine_.has_schema(name) || job.deleted) {
      std::lock_guard<std::mutex> lock(mutex_);
      schemas_.erase(name);
    } else {
      try {
        publish(name);
      } catch (const Error&) {  // removed meanwhile
      }
    }
    return error_event(e);
  }
}

void Scheduler::run_delete(Job& job) {
  const std::string& name = job.schema_name;
  std::vector<JobPtr> waiting;  // compiles of this schema that have not started
  bool running = false;         // one is compiling now
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = compiles_.begin(); it != compiles_.end();) {
      if ((*it)->schema.name == name) {
        waiting.push_back(*it);
        it = compiles_.erase(it);
      } else {
        ++it;
      }
    }
    if (compiling_ && compiling_->schema.name == name) {
      compiling_->deleted = true;    // never published (publish checks it under this lock)
      compiling_->cancelled = true;  // stops at its next forward and reports it
      running = true;
    }
  }
  for (const JobPtr& c : waiting) {
    metrics_.count_cancelled();
    c->channel.push(error_event(
        Error(ErrorKind::kCancelled, "schema '" + name + "' was deleted before it compiled")));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!schemas_.erase(name) && waiting.empty() && !running) {
      job.channel.push(
          error_event(Error(ErrorKind::kUnknownSchema, "schema '" + name + "' is not loaded")));
      return;
    }
  }
  // Requests running on it keep its states until they finish; new prompts naming it are refused.
  engine_.remove_schema(name);
  Event done;
  done.type = Event::Type::kDone;
  done.body = {{"deleted", name}, {"cancelled_compiles", waiting.size() + (running ? 1 : 0)}};
  job.channel.push(std::move(done));
}

}  // namespace promptcache::server
