#include "scheduler.hpp"

#include <filesystem>
#include <utility>

#include "promptcache/cache/cache_file.hpp"
#include "views.hpp"

namespace promptcache::server {

using nlohmann::json;

namespace {

bool same_sampling(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
         a.repetition_penalty == b.repetition_penalty && a.seed == b.seed &&
         a.max_new_tokens == b.max_new_tokens && a.stop_token_ids == b.stop_token_ids &&
         a.stop_strings == b.stop_strings && a.stop_at_eos == b.stop_at_eos;
}

Event error_event(const Error& e) {
  Event ev;
  ev.type = Event::Type::kError;
  ev.status = error_status(e);
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

Scheduler::Scheduler(Engine& engine, Metrics& metrics, int max_batch, std::string cache_dir)
    : engine_(engine),
      metrics_(metrics),
      max_batch_(std::max(1, max_batch)),
      cache_dir_(std::move(cache_dir)),
      plain_(engine) {}

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
  store_bytes_ = engine_.store().bytes();
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
    Event ev;
    ev.type = Event::Type::kError;
    ev.status = 503;
    ev.body = error_json("the server is shutting down", "server_error");
    job->channel.push(std::move(ev));
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
    Event ev;
    ev.type = Event::Type::kError;
    ev.status = 503;
    ev.body = error_json("the server is shutting down", "server_error");
    job->channel.push(std::move(ev));
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
  Gauges g{store_bytes_, static_cast<int64_t>(schemas_.size()),
           static_cast<int64_t>(queue_.size())};
  g.tiers = engine_.tier_stats();
  g.store_bytes = g.tiers.host_bytes + g.tiers.device_bytes;  // shared spans counted once
  return g;
}

void Scheduler::loop() {
  for (;;) {
    std::vector<JobPtr> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      batch.push_back(queue_.front());
      queue_.pop_front();
      const Job& first = *batch.front();
      // Every prompt request already waiting with the same sampling joins this run.
      if (first.kind == Job::Kind::kPrompt) {
        for (auto it = queue_.begin();
             it != queue_.end() && static_cast<int>(batch.size()) < max_batch_;) {
          const Job& j = **it;
          if (j.kind == Job::Kind::kPrompt && j.use_cache == first.use_cache &&
              same_sampling(j.params, first.params)) {
            batch.push_back(*it);
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    Job& first = *batch.front();
    try {
      switch (first.kind) {
        case Job::Kind::kPrompt:
          run_prompts(batch);
          break;
        case Job::Kind::kPlain:
          run_plain(first);
          break;
        case Job::Kind::kCompile:
          run_compile(first);
          break;
        case Job::Kind::kDelete:
          run_delete(first);
          break;
      }
    } catch (const std::exception& e) {
      // run_* report their own errors; this is what escaped them (a bug or no memory).
      for (const JobPtr& job : batch) job->channel.push(internal_error_event(e));
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

void Scheduler::run_prompts(const std::vector<JobPtr>& jobs) {
  const double run_start = now_ms();
  const int64_t limit = engine_.model().config().max_position_embeddings;
  // Each prompt is checked on its own first, so one bad request does not fail the others.
  std::vector<JobPtr> valid;
  for (const JobPtr& job : jobs) {
    if (job->cancelled.load()) {
      metrics_.count_cancelled();
      continue;
    }
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!schemas_.count(job->prompt.schema)) {
          std::string loaded;
          for (const auto& [name, _] : schemas_)
            loaded += (loaded.empty() ? "'" : ", '") + name + "'";
          throw Error(ErrorKind::kUnknownSchema,
                      "prompt uses schema '" + job->prompt.schema +
                          "' which is not loaded (loaded: " + (loaded.empty() ? "none" : loaded) +
                          ")",
                      job->prompt.where);
        }
      }
      const pml::ResolvedPrompt resolved = engine_.resolve(job->prompt);
      const std::size_t needed =
          job->use_cache ? resolved.next_position() : resolved.baseline.size();
      if (static_cast<int64_t>(needed) > limit) {
        throw Error(ErrorKind::kContextOverflow,
                    "the prompt needs positions up to " + std::to_string(needed - 1) +
                        " but the model's context is " + std::to_string(limit),
                    resolved.where);
      }
      Event ev;
      ev.type = Event::Type::kAccepted;
      ev.prompt_tokens = static_cast<int64_t>(resolved.baseline.size());
      job->channel.push(std::move(ev));
      valid.push_back(job);
    } catch (const Error& e) {
      job->channel.push(error_event(e));
    }
  }
  if (valid.empty()) return;
  const SamplingParams& params = valid.front()->params;
  const RequestOptions request{valid.front()->use_cache};
  const auto one = [&](Job& job) {
    try {
      metrics_.observe_batch(1);
      finish(job, engine_.generate(job.prompt, job.params, stream_to(job), request), 1, run_start);
    } catch (const Error& e) {
      job.channel.push(error_event(e));
    }
  };
  if (valid.size() == 1) {
    one(*valid.front());
    return;
  }
  std::vector<pml::Prompt> prompts;
  std::vector<TokenCallback> streams;
  for (const JobPtr& job : valid) {
    prompts.push_back(job->prompt);
    streams.push_back(stream_to(*job));
  }
  std::vector<Response> responses;
  try {
    responses = engine_.generate_batch(
        prompts, params,
        [&](std::size_t i, TokenId id, const std::string& text) { return streams[i](id, text); },
        request);
  } catch (const Error&) {
    // Checked above, so this is rare (a batch-wide limit): each prompt runs alone and gets its
    // own answer or error. Nothing was streamed: the engine fails before the first token.
    for (const JobPtr& job : valid) one(*job);
    return;
  }
  metrics_.observe_batch(static_cast<int>(valid.size()));
  for (std::size_t i = 0; i < valid.size(); ++i) {
    finish(*valid[i], std::move(responses[i]), static_cast<int>(valid.size()), run_start);
  }
}

void Scheduler::run_plain(Job& job) {
  const double run_start = now_ms();
  if (job.cancelled.load()) {
    metrics_.count_cancelled();
    return;
  }
  try {
    const std::vector<TokenId> ids = job.tokenize(engine_);
    const int64_t limit = engine_.model().config().max_position_embeddings;
    if (ids.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
    if (static_cast<int64_t>(ids.size()) > limit) {
      throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(ids.size()) +
                                                   " tokens but the model's context is " +
                                                   std::to_string(limit));
    }
    Event accepted;
    accepted.type = Event::Type::kAccepted;
    accepted.prompt_tokens = static_cast<int64_t>(ids.size());
    job.channel.push(std::move(accepted));
    metrics_.observe_batch(1);
    finish(job, plain_.generate(ids, job.params, stream_to(job)), 1, run_start);
  } catch (const Error& e) {
    job.channel.push(error_event(e));
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
    // A schema that failed to compile is gone from the engine; its old view goes too.
    if (!engine_.has_schema(name)) {
      std::lock_guard<std::mutex> lock(mutex_);
      schemas_.erase(name);
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
  // The Engine has no call that removes a schema: its states are replaced by those of a
  // one-word placeholder of the same name (freeing them), and the server forgets the name, so
  // prompts naming it are refused as unknown.
  engine_.add_schema(pml::parse_schema_string("<schema name=\"" + name + "\">deleted</schema>",
                                              "<deleted schema>"));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    store_bytes_ = engine_.store().bytes();
  }
  Event done;
  done.type = Event::Type::kDone;
  done.body = {{"deleted", name}};
  job.channel.push(std::move(done));
}

}  // namespace promptcache::server
