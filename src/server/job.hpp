// A unit of work for the scheduler thread (the engine's only user) and the channel its HTTP
// handler reads the results from.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "promptcache/engine.hpp"
#include "promptcache/logprobs.hpp"

namespace promptcache::server {

// What the scheduler reports about a job, in order: kAccepted (or kError) once the request is
// known to be valid, then kToken / kProgress events, then kDone (or kError).
struct Event {
  enum class Type { kAccepted, kToken, kProgress, kDone, kError };
  Type type = Type::kDone;
  std::string text;           // kToken: the text the token adds
  TokenId id = -1;            // kToken
  nlohmann::json body;        // kProgress, kDone (schemas), kError: the JSON to send
  int status = 200;           // kError: the HTTP status
  Response response;          // kDone of a generation
  int batch_size = 1;         // kDone: how many requests ran together
  double queue_ms = 0;        // kDone: arrival to the start of its run
  int64_t prompt_tokens = 0;  // kAccepted
  // Jobs with logprobs >= 0: kToken, the token's entry; kDone, one per response.tokens.
  std::optional<TokenLogprob> logprob;
  std::vector<TokenLogprob> logprobs;
  // kDone of a job with echo: the prompt's ids and the log-probabilities of ids[1..] (empty
  // without logprobs).
  std::vector<TokenId> prompt_ids;
  std::vector<TokenLogprob> prompt_logprobs;
};

// One producer (the scheduler), one consumer (the handler).
class Channel {
 public:
  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      events_.push_back(std::move(e));
    }
    ready_.notify_one();
  }
  // The next event, or nothing after `timeout` without one.
  std::optional<Event> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Event> events_;
};

struct Job {
  enum class Kind { kPrompt, kPlain, kCompile, kDelete };
  Kind kind = Kind::kPrompt;
  pml::Prompt prompt;        // kPrompt
  std::vector<TokenId> ids;  // kPlain: the prompt's ids (tokenized by the request's thread)
  pml::Schema schema;        // kCompile
  std::string schema_name;   // kDelete
  SamplingParams params;
  bool use_cache = true;
  std::optional<double> recompute;  // kPrompt: RequestOptions::recompute (unset: the schema's)
  // Log-probabilities (0..kMaxTopLogprobs alternatives; -1: none) of the generated tokens, and
  // with echo (kPlain only) of the prompt's.
  int logprobs = -1;
  bool echo = false;
  std::vector<TokenLogprob> prompt_logprobs;  // echo with logprobs: computed before admission
  // ... and how many of the prompt's tokens it read from a registered schema's stored states
  // (Engine::sequence_logprobs).
  int64_t prompt_cached_tokens = 0;
  double arrival_ms = 0;
  bool accepted = false;  // kAccepted was sent (the scheduler thread's: a prompt may wait for room)
  // Set by the handler when its client is gone: the token callbacks then return false.
  std::atomic<bool> cancelled{false};
  // kCompile: its schema was deleted while it waited or ran (set under the scheduler's lock).
  std::atomic<bool> deleted{false};
  Channel channel;
};
using JobPtr = std::shared_ptr<Job>;

}  // namespace promptcache::server
