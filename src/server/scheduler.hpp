// The scheduler thread: the only thread that runs requests on the Engine. HTTP handlers submit
// Jobs and read their results from each job's Channel. Prompt requests and plain completions
// (no modules; BatchSession::admit_tokens, with exact prefix reuse) are batched continuously
// (BatchSession): one that arrives while others decode joins the batch before the next decode
// step (up to max_batch rows, each with its own sampling parameters), and one that finishes
// leaves it at once. A delete runs at once (requests running on the schema keep its states).
// Compiles run in arrival order: requests queued behind one wait until the batch has drained and
// it has run.
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

class Scheduler {
 public:
  Scheduler(Engine& engine, Metrics& metrics, int max_batch, std::string cache_dir);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Compiles a schema file on the calling thread; only before start().
  void add_schema_file(const std::string& path, const Engine::ProgressCallback& progress);
  void start();
  // Refuses what is still queued (503) and stops the running generation at its next token.
  void stop();
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
  void run_compile(Job& job);
  void run_delete(Job& job);
  void finish(Job& job, Response r, int batch_size, double run_start);
  void publish(const std::string& name);                    // the schema's layout into the snapshot
  std::string cache_file(const pml::Schema& schema) const;  // "" without a cache_dir
  TokenCallback stream_to(Job& job);

  Engine& engine_;
  Metrics& metrics_;
  const int max_batch_;
  const std::string cache_dir_;
  std::unique_ptr<BatchSession> batch_;             // scheduler thread only
  std::map<BatchSession::RowId, Running> running_;  // its rows
  bool decoding_ = false;  // the batch has decoded a step since it was last empty

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::deque<JobPtr> queue_;
  bool stopping_ = false;
  std::map<std::string, nlohmann::json> schemas_;  // name -> layout_json
  std::thread thread_;
};

}  // namespace promptcache::server
