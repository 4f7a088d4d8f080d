// The scheduler: two threads that run jobs on the Engine. HTTP handlers submit Jobs and read
// their results from each job's Channel.
// - The batch thread runs prompt requests and plain completions (no modules;
//   BatchSession::admit_tokens, with exact prefix reuse), batched continuously (BatchSession):
//   one that arrives while others decode joins the batch before the next decode step (up to
//   max_batch rows, each with its own sampling parameters), and one that finishes leaves it at
//   once. A delete runs at once (requests running on the schema keep its states).
// - The compile thread runs compiles in arrival order, beside the batch (Engine::add_schema may
//   run beside requests), so a long compile never holds generation up. A compile stops at its
//   next forward when its client goes away, when its schema is deleted, or at shutdown.
// Budgets (SchedulerOptions) are checked before work is queued or started; a request over one
// gets a 429 naming the limit.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "job.hpp"
#include "metrics.hpp"
#include "promptcache/batch_session.hpp"

namespace promptcache::server {

// Error(kContextOverflow) for a turn whose text is too heavy to be `limit` tokens with any
// tokenizer (pml::cannot_fit): refused before it is tokenized.
void check_turns_fit(const std::vector<pml::Turn>& turns, int64_t limit);

// The prompt resolved against the engine's schemas now and held to the model's context
// (Error(kContextOverflow); a text too heavy to fit is refused before it is tokenized). The HTTP
// handler calls it before queueing, in the request's own thread; the scheduler again when the
// prompt joins the batch (the schema may have been replaced meanwhile).
pml::ResolvedPrompt resolve_within_context(const Engine& engine, const pml::Prompt& prompt,
                                           bool use_cache);

struct SchedulerOptions {
  int max_batch = 16;
  std::string cache_dir;  // when set, compiled states are kept there (cache_file_name)
  // Budgets (0: no limit). Each refusal names its flag (`promptcache serve --max-queue`, ...).
  std::size_t max_queue = 256;   // prompt and plain requests waiting for the batch
  std::size_t max_compiles = 2;  // compiles waiting or running
  std::size_t max_schemas = 64;  // registered schemas
  int64_t max_schema_positions = int64_t{1} << 20;  // their total_length, summed
};

class Scheduler {
 public:
  Scheduler(Engine& engine, Metrics& metrics, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Compiles a schema (from a file the server was started with) on the calling thread; only
  // before start().
  void add_schema(const pml::Schema& schema, const Engine::ProgressCallback& progress);
  void start();
  // Refuses what is still queued (503), stops the running generation at its next token and the
  // running compile at its next forward.
  void stop();
  // Queues a job; one over a budget gets its 429 error event at once.
  void submit(JobPtr job);

  // Snapshots for the handlers (never the engine itself).
  nlohmann::json schema_list() const;
  std::optional<nlohmann::json> schema(const std::string& name) const;
  Gauges gauges() const;

 private:
  // A prompt or plain job admitted into the batch.
  struct Running {
    JobPtr job;
    double run_start = 0;
    int batch_size = 1;  // most rows decoding together while it ran
  };
  void loop();
  // Checks the prompt (PML or plain ids) and admits it into the batch; false (the job waiting)
  // when the batch has no room for it now.
  bool admit(const JobPtr& job);
  // Sends kAccepted once the job's prompt is known to fit; throws its Error otherwise.
  void accept(Job& job);
  void step();
  void compile_loop();
  // Compiles; returns the job's last event (kDone or kError) for compile_loop to send.
  Event run_compile(Job& job);
  // Error(429 LimitError) when adding `layout` would pass max_schemas or max_schema_positions.
  void check_schema_budget(const pml::Layout& layout) const;
  void run_delete(Job& job);
  void finish(Job& job, Response r, int batch_size, double run_start,
              std::vector<TokenLogprob> logprobs);
  // The schema's layout into the snapshot; false (nothing published) when `compile` was deleted
  // meanwhile.
  bool publish(const std::string& name, const Job* compile = nullptr);
  std::string cache_file(const pml::Schema& schema) const;  // "" without a cache_dir
  TokenCallback stream_to(Job& job);

  Engine& engine_;
  Metrics& metrics_;
  const SchedulerOptions options_;
  const int max_batch_;
  std::unique_ptr<BatchSession> batch_;             // scheduler thread only
  std::map<BatchSession::RowId, Running> running_;  // its rows
  bool decoding_ = false;  // the batch has decoded a step since it was last empty

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::deque<JobPtr> queue_;  // prompts, plain completions and deletes, for the batch thread
  std::condition_variable compile_wake_;
  std::deque<JobPtr> compiles_;  // waiting compiles, for the compile thread
  JobPtr compiling_;             // the compile running now
  bool stopping_ = false;
  std::map<std::string, nlohmann::json> schemas_;  // name -> layout_json
  std::thread thread_;
  std::thread compile_thread_;
};

}  // namespace promptcache::server
