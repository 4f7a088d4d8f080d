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

Event internal_error_event(const std::exception& e) {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = 500;
  ev.body = error_json(std::string("internal error: ") + e.what(), "server_error");
  return ev;
}

}  // namespace

Scheduler::Scheduler(Engine& engine, Metrics& metrics, int max_batch, std::string cache_dir)
    : engine_(engine),
      metrics_(metrics),
      max_batch_(std::max(1, max_batch)),
      cache_dir_(std::move(cache_dir)),
      batch_(std::make_unique<BatchSession>(engine, BatchSessionOptions{max_batch_, 0})) {}

Scheduler::~Scheduler() {
  stop();
}

std::string Scheduler::cache_file(const pml::Schema& schema) const {
  if (cache_dir_.empty()) return "";
  std::filesystem::create_directories(cache_dir_);
  // The name `promptcache compile --cache-dir` and the CLI's --cache-dir use (cache_file_name).
  return (std::filesystem::path(cache_dir_) /
          cache_file_name(engine_.layout_only(schema), engine_.model(), engine_.options().encoding))
      .string();
}

void Scheduler::add_schema_file(const std::string& path, const Engine::ProgressCallback& progress) {
  const pml::Schema schema = pml::parse_schema_file(path);
  engine_.add_schema(schema, progress, cache_file(schema));
  publish(schema.name);
}

void Scheduler::publish(const std::string& name) {
  json view = layout_json(engine_.layout(name), engine_.compile_report(name));
  std::lock_guard<std::mutex> lock(mutex_);
  schemas_[name] = std::move(view);
}

void Scheduler::start() {
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  std::deque<JobPtr> refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    refused.swap(queue_);
  }
  wake_.notify_all();
  for (const JobPtr& job : refused) {
    job->channel.push(shutting_down_event());
  }
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(JobPtr job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      queue_.push_back(std::move(job));
      job = nullptr;
    }
  }
  if (job) {
    job->channel.push(shutting_down_event());
    return;
  }
  wake_.notify_one();
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
    for (;;) {
      JobPtr job;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_ || queue_.empty()) break;
        const Job::Kind kind = queue_.front()->kind;
        if (kind == Job::Kind::kCompile) break;
        job = queue_.front();
        queue_.pop_front();
      }
      bool admitted = true;
      try {
        // A delete is quick and safe beside running requests (they keep the schema's states).
        if (job->kind == Job::Kind::kDelete) {
          run_delete(*job);
          continue;
        }
        admitted = admit(job);
      } catch (const std::exception& e) {
        job->channel.push(internal_error_event(e));  // a bug or no memory
      }
      if (!admitted) {  // no room until rows finish: it stays first in line
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!stopping_) {
            queue_.push_front(std::move(job));
            break;
          }
        }
        job->channel.push(shutting_down_event());
        break;
      }
    }
    if (!batch_->empty()) {
      step();
      continue;
    }
    // The batch has drained: the job at the front (a compile) runs alone.
    JobPtr job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      if (queue_.empty() || queue_.front()->kind != Job::Kind::kCompile) continue;
      job = queue_.front();
      queue_.pop_front();
    }
    try {
      run_compile(*job);
    } catch (const std::exception& e) {
      // run_compile reports its own errors; this is what escaped it (a bug or no memory).
      job->channel.push(internal_error_event(e));
    }
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
    job.channel.push(std::move(ev));
    return true;
  };
}

void Scheduler::finish(Job& job, Response r, int batch_size, double run_start) {
  const double queue_ms = run_start - job.arrival_ms;
  if (job.cancelled.load()) metrics_.count_cancelled();
  if (!r.tokens.empty()) metrics_.observe_ttft(queue_ms + r.timings.ttft_ms);
  metrics_.add_tokens(r.cached_tokens, r.fresh_tokens, static_cast<int64_t>(r.tokens.size()));
  Event ev;
  ev.type = Event::Type::kDone;
  ev.batch_size = batch_size;
  ev.queue_ms = queue_ms;
  ev.response = std::move(r);
  job.channel.push(std::move(ev));
}

void Scheduler::accept(Job& job) {
  const int64_t limit = engine_.model().config().max_position_embeddings;
  Event ev;
  ev.type = Event::Type::kAccepted;
  if (job.kind == Job::Kind::kPlain) {
    job.ids = job.tokenize(engine_);
    if (job.ids.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
    if (static_cast<int64_t>(job.ids.size()) > limit) {
      throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(job.ids.size()) +
                                                   " tokens but the model's context is " +
                                                   std::to_string(limit));
    }
    ev.prompt_tokens = static_cast<int64_t>(job.ids.size());
  } else {
    const pml::ResolvedPrompt resolved = engine_.resolve(job.prompt);
    const std::size_t needed = job.use_cache ? resolved.next_position() : resolved.baseline.size();
    if (static_cast<int64_t>(needed) > limit) {
      throw Error(ErrorKind::kContextOverflow,
                  "the prompt needs positions up to " + std::to_string(needed - 1) +
                      " but the model's context is " + std::to_string(limit),
                  resolved.where);
    }
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
    const int64_t before = batch_->active();
    RequestOptions request;
    request.use_cache = job->use_cache;
    request.recompute = job->recompute;
    const auto row = job->kind == Job::Kind::kPlain
                         ? batch_->admit_tokens(job->ids, job->params, stream_to(*job))
                         : batch_->admit(job->prompt, job->params, stream_to(*job), request);
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
    finish(*r.job, std::move(f.response), r.batch_size, r.run_start);
  }
}

void Scheduler::run_compile(Job& job) {
  const std::string& name = job.schema.name;
  try {
    const pml::Layout layout = engine_.layout_only(job.schema);
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
    engine_.add_schema(job.schema, progress, cache_file(job.schema));
    publish(name);
    Event done;
    done.type = Event::Type::kDone;
    done.body = *schema(name);
    job.channel.push(std::move(done));
  } catch (const Error& e) {
    // A schema that failed to compile is gone from the engine; its old view goes too. One the
    // engine holds (added but not saved: a full disk; or the old version, kept) is listed as the
    // engine serves it: never served but unlisted.
    if (!engine_.has_schema(name)) {
      std::lock_guard<std::mutex> lock(mutex_);
      schemas_.erase(name);
    } else {
      try {
        publish(name);
      } catch (const Error&) {  // removed meanwhile
      }
    }
    job.channel.push(error_event(e));
  }
}

void Scheduler::run_delete(Job& job) {
  const std::string& name = job.schema_name;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!schemas_.erase(name)) {
      job.channel.push(
          error_event(Error(ErrorKind::kUnknownSchema, "schema '" + name + "' is not loaded")));
      return;
    }
  }
  // Requests running on it keep its states until they finish; new prompts naming it are refused.
  engine_.remove_schema(name);
  Event done;
  done.type = Event::Type::kDone;
  done.body = {{"deleted", name}};
  job.channel.push(std::move(done));
}

}  // namespace promptcache::server
