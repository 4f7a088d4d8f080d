#include "promptcache/model/work_pool.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <dirent.h>

#include "promptcache/model/threads.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PROMPTCACHE_PAUSE() _mm_pause()
#else
#define PROMPTCACHE_PAUSE() std::this_thread::yield()
#endif

namespace promptcache {
namespace {

std::atomic<int>& policy_setting() {
  static std::atomic<int> policy{[] {
    const char* env = std::getenv("PROMPTCACHE_WAIT_POLICY");
    WaitPolicy p = WaitPolicy::kAuto;
    if (env != nullptr && !parse_wait_policy(env, p)) p = WaitPolicy::kAuto;
    return static_cast<int>(p);
  }()};
  return policy;
}

// This process's threads that are running or runnable now (state R in /proc/self/task/*/stat);
// -1 when /proc cannot be read.
int own_running_threads() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int running = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream stat(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string text;
    if (!std::getline(stat, text)) continue;
    // "tid (comm) S ...": the command may hold spaces and parentheses, the state follows the
    // last ')'.
    const auto close = text.rfind(')');
    if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'R') ++running;
  }
  closedir(dir);
  return running;
}

// Whether the pool waits passively now. Under kAuto, sampled at most every 50 ms by a caller
// of parallel_chunks: reading /proc costs tens of microseconds, a decode step's ~100 calls come
// within a few milliseconds. Passive after kContendedSamples samples in a row saw too few free
// cores, active again at the first that did not: a busy process stays runnable, while a kernel
// worker's or a shell's moment on a core (which a single sample also counts) must not put an
// idle machine's pool to sleep (measured: that cost 4% of bench-small's idle decode).
class ContentionProbe {
 public:
  bool passive() {
    const auto policy = static_cast<WaitPolicy>(policy_setting().load(std::memory_order_relaxed));
    if (policy != WaitPolicy::kAuto) return policy == WaitPolicy::kPassive;
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = sampled_ms_.load(std::memory_order_relaxed);
    if (now - last >= 50 && sampled_ms_.compare_exchange_strong(last, now)) {
      const int contended = sample() ? contended_.load(std::memory_order_relaxed) + 1 : 0;
      contended_.store(contended, std::memory_order_relaxed);
      passive_.store(contended >= kContendedSamples, std::memory_order_relaxed);
    }
    return passive_.load(std::memory_order_relaxed);
  }

 private:
  static constexpr int kContendedSamples = 3;

  static bool sample() {
    // Our own runnable threads are counted before and after the system's, and the larger count
    // taken: a helper that starts or stops spinning between the reads is not another process.
    const int own_before = own_running_threads();
    std::ifstream loadavg("/proc/loadavg");
    std::string text;
    if (!std::getline(loadavg, text)) return false;
    const int all = running_in_loadavg(text);
    const int own = std::max(own_before, own_running_threads());
    if (all < 0 || own_before < 0) return false;
    return fewer_free_cores_than(kernel_threads(), hardware_cores(), all - own);
  }

  std::atomic<int64_t> sampled_ms_{-1000};
  std::atomic<int> contended_{0};
  std::atomic<bool> passive_{false};
};

ContentionProbe& probe() {
  static ContentionProbe instance;
  return instance;
}

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
    const bool passive = probe().passive();
    passive_.store(passive, std::memory_order_relaxed);
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
    // Only chunks a helper has taken and not finished are waited for. Passively, the caller
    // yields at once: the helper it waits for may need this very core.
    const int spin_limit = passive ? 0 : 4096;
    for (int spins = 0; job->done.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < spin_limit) {
        PROMPTCACHE_PAUSE();
      } else {
        std::this_thread::yield();
      }
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
  // Between calls a helper spins this long before it sleeps: a decode step's next kernel call
  // comes within tens of microseconds, a wake-up from sleep costs about as much again. When the
  // machine has fewer free cores than kernel threads (or PROMPTCACHE_WAIT_POLICY=passive) it
  // sleeps at once: its spinning would take the core from the thread doing the work, ours or
  // another process's.
  static constexpr auto kSpin = std::chrono::microseconds(300);

  void helper_loop() {
    uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + kSpin;
      int spins = 0;
      while (!passive_.load(std::memory_order_relaxed) &&
             generation_.load(std::memory_order_acquire) == seen) {
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
  std::atomic<bool> passive_{false};  // the last call's wait policy, for the helpers
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

bool parse_wait_policy(const std::string& text, WaitPolicy& out) {
  if (text == "auto") {
    out = WaitPolicy::kAuto;
  } else if (text == "active") {
    out = WaitPolicy::kActive;
  } else if (text == "passive") {
    out = WaitPolicy::kPassive;
  } else {
    return false;
  }
  return true;
}

void set_wait_policy(WaitPolicy policy) {
  policy_setting().store(static_cast<int>(policy));
}

WaitPolicy wait_policy() {
  return static_cast<WaitPolicy>(policy_setting().load());
}

bool waiting_passively() {
  return probe().passive();
}

int running_in_loadavg(const std::string& text) {
  // "0.20 0.18 0.12 3/80 11206": the fourth field is runnable/all scheduling entities.
  std::size_t field = 0, at = 0;
  while (field < 3) {
    at = text.find(' ', at);
    if (at == std::string::npos) return -1;
    while (at < text.size() && text[at] == ' ') ++at;
    ++field;
  }
  const std::size_t slash = text.find('/', at);
  if (slash == std::string::npos || slash == at || slash - at > 9) return -1;
  int running = 0;
  for (std::size_t i = at; i < slash; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    running = running * 10 + (text[i] - '0');
  }
  return running;
}

bool fewer_free_cores_than(int threads, int cores, int others_running) {
  return threads > cores - std::max(0, others_running);
}

}  // namespace promptcache
