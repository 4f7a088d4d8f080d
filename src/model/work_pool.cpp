#include "promptcache/model/work_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PROMPTCACHE_PAUSE() _mm_pause()
#else
#define PROMPTCACHE_PAUSE() std::this_thread::yield()
#endif

namespace promptcache {
namespace {

// One call of parallel_chunks. Shared: a helper that wakes late may still hold it (and find no
// chunk left) after the caller has returned.
struct Job {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t chunks = 0;
  int helpers = 0;  // threads besides the caller that may join
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<int> joined{0};

  // Takes and runs chunks until none is left.
  void work() {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      (*fn)(c);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

class WorkPool {
 public:
  ~WorkPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void run(int64_t chunks, int threads, const std::function<void(int64_t)>& fn) {
    bool expected = false;
    if (threads <= 1 || chunks <= 1 || !busy_.compare_exchange_strong(expected, true)) {
      for (int64_t c = 0; c < chunks; ++c) fn(c);
      return;
    }
    const int helpers = static_cast<int>(std::min<int64_t>(threads, chunks)) - 1;
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->chunks = chunks;
    job->helpers = helpers;
    bool notify = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (static_cast<int>(threads_.size()) < helpers) {
        threads_.emplace_back([this] { helper_loop(); });
      }
      job_ = job;
      generation_.fetch_add(1, std::memory_order_release);
      notify = sleepers_ > 0;
    }
    if (notify) wake_.notify_all();
    job->work();
    // Only chunks a helper has taken and not finished are waited for.
    for (int spins = 0; job->done.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < 4096) {
        PROMPTCACHE_PAUSE();
      } else {
        std::this_thread::yield();
      }
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
  // Between calls a helper spins this long before it sleeps: a decode step's next kernel call
  // comes within tens of microseconds, a wake-up from sleep costs about as much again.
  static constexpr auto kSpin = std::chrono::microseconds(300);

  void helper_loop() {
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while (generation_.load(std::memory_order_acquire) == seen) {
        PROMPTCACHE_PAUSE();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() > until) break;
      }
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (generation_.load(std::memory_order_acquire) == seen && !stop_) {
          ++sleepers_;
          wake_.wait(lock,
                     [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
          --sleepers_;
        }
        if (stop_) return;
        seen = generation_.load(std::memory_order_acquire);
        job = job_;
      }
      if (job && job->joined.fetch_add(1, std::memory_order_relaxed) < job->helpers) job->work();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> threads_;
  std::shared_ptr<Job> job_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> busy_{false};
  int sleepers_ = 0;
  bool stop_ = false;
};

WorkPool& pool() {
  static WorkPool instance;
  return instance;
}

}  // namespace

void parallel_chunks(int64_t chunks, int threads, const std::function<void(int64_t)>& fn) {
  pool().run(chunks, threads, fn);
}

}  // namespace promptcache
