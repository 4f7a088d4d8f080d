// parallel_chunks runs every chunk exactly once, on several threads when asked, and stays
// correct when called from several threads at once or from inside a chunk.
#include "support/catch.hpp"

#include <atomic>
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
