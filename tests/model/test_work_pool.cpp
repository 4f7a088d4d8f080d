// parallel_chunks runs every chunk exactly once, on several threads when asked, and stays
// correct when called from several threads at once or from inside a chunk; its wait policy turns
// passive when asked to and, under auto, when busy processes hold the cores.
#include "support/catch.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "promptcache/model/work_pool.hpp"

using namespace promptcache;

TEST_CASE("parallel_chunks runs each chunk once and returns after all", "[work_pool]") {
  for (int threads : {1, 2, 4}) {
    for (int64_t chunks : {0, 1, 2, 3, 17, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(chunks));
      for (auto& r : runs) r = 0;
      parallel_chunks(chunks, threads, [&](int64_t c) { runs[static_cast<std::size_t>(c)]++; });
      INFO("threads " << threads << " chunks " << chunks);
      for (auto& r : runs) REQUIRE(r.load() == 1);
    }
  }
}

TEST_CASE("parallel_chunks uses more than the calling thread when chunks wait", "[work_pool]") {
  if (std::thread::hardware_concurrency() < 2) {
    WARN("SKIPPED: one hardware thread");
    return;
  }
  // Each chunk waits until two threads have entered: only a second thread can release it.
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> entered{0};
  parallel_chunks(2, 2, [&](int64_t) {
    {
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }
    entered++;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (entered.load() < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  });
  CHECK(ids.size() == 2);
  CHECK(entered.load() == 2);
}

TEST_CASE("parallel_chunks from several threads and from inside a chunk", "[work_pool]") {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        parallel_chunks(8, 2, [&](int64_t c) {
          // A nested call runs on the calling thread.
          parallel_chunks(3, 2, [&](int64_t) { total += 1; });
          total += c;
        });
      }
    });
  }
  for (auto& c : callers) c.join();
  // Per outer call: 8 chunks x 3 nested + (0 + ... + 7) = 24 + 28.
  CHECK(total.load() == int64_t{8} * 200 * (24 + 28));
}

TEST_CASE("the wait policy's pieces: loadavg's runnable count and the free-core rule",
          "[work_pool]") {
  CHECK(running_in_loadavg("0.20 0.18 0.12 3/80 11206") == 3);
  CHECK(running_in_loadavg("7.98 7.55 4.78 12/166 31526\n") == 12);
  CHECK(running_in_loadavg("") == -1);
  CHECK(running_in_loadavg("0.20 0.18 0.12") == -1);
  CHECK(running_in_loadavg("0.20 0.18 0.12 /80 1") == -1);
  CHECK(running_in_loadavg("0.20 0.18 0.12 x/80 1") == -1);
  CHECK(running_in_loadavg("0.20 0.18 0.12 99999999999/80 1") == -1);
  // Two kernel threads on two cores: passive as soon as another process runs.
  CHECK_FALSE(fewer_free_cores_than(2, 2, 0));
  CHECK(fewer_free_cores_than(2, 2, 1));
  CHECK_FALSE(fewer_free_cores_than(1, 2, 1));
  CHECK(fewer_free_cores_than(1, 2, 2));
  CHECK_FALSE(fewer_free_cores_than(2, 2, -3));  // a sample taken between two counts
  WaitPolicy p = WaitPolicy::kActive;
  CHECK(parse_wait_policy("passive", p));
  CHECK(p == WaitPolicy::kPassive);
  CHECK(parse_wait_policy("auto", p));
  CHECK(p == WaitPolicy::kAuto);
  CHECK_FALSE(parse_wait_policy("spin", p));
  CHECK(p == WaitPolicy::kAuto);
}

TEST_CASE("parallel_chunks waits passively when told, and auto sees busy processes",
          "[work_pool]") {
  const WaitPolicy before = wait_policy();
  set_wait_policy(WaitPolicy::kPassive);
  CHECK(waiting_passively());
  std::vector<std::atomic<int>> runs(257);
  for (auto& r : runs) r = 0;
  for (int rep = 0; rep < 50; ++rep) {
    parallel_chunks(257, 4, [&](int64_t c) { runs[static_cast<std::size_t>(c)]++; });
  }
  for (auto& r : runs) REQUIRE(r.load() == 50);
  set_wait_policy(WaitPolicy::kActive);
  CHECK_FALSE(waiting_passively());

  // Auto: as many busy processes as cores leave no core free for the kernel threads.
  set_wait_policy(WaitPolicy::kAuto);
  std::vector<pid_t> busy;
  for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (std::chrono::steady_clock::now() < until) {
      }
      _exit(0);
    }
    busy.push_back(pid);
  }
  bool seen = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!seen && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    seen = waiting_passively();
  }
  for (pid_t pid : busy) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  set_wait_policy(before);
  CHECK(seen);
}
