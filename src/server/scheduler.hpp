// The scheduler thread: the only thread that touches the Engine (which is not thread-safe).
// HTTP handlers submit Jobs and read their results from each job's Channel. Prompt requests
// waiting together with equal sampling parameters run as one Engine::generate_batch call (up to
// max_batch rows); requests that arrive while a batch runs wait for the next one.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "job.hpp"
#include "metrics.hpp"
#include "prefix_session.hpp"

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
  void loop();
  void run_prompts(const std::vector<JobPtr>& jobs);
  void run_plain(Job& job);
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
  PrefixSession plain_;

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::deque<JobPtr> queue_;
  bool stopping_ = false;
  std::map<std::string, nlohmann::json> schemas_;  // name -> layout_json
  int64_t store_bytes_ = 0;
  std::thread thread_;
};

}  // namespace promptcache::server
