// promptcache/model/work_pool.hpp — the threads the library's own CPU kernels run on.
//
// A decode step calls the kernels ~100 times (every linear layer, every attention), each a few
// tens of microseconds of work split over the cores. With an OpenMP team per call, every call
// ended at a barrier that waited for every thread of the team: when another process held a
// core, a thread that was not running held up the call until the scheduler ran it again. Here a
// call is cut into chunks that whichever threads run take from a shared counter; the caller
// takes chunks too and returns as soon as every chunk is done, so a helper that never got to run
// costs nothing. Helpers spin briefly between calls (the next call of a decode step comes within
// microseconds) and then sleep, so an idle pool takes no CPU from OpenBLAS's threads or anyone
// else. Measured on the 2-core host beside two busy processes (default threads, 64 new tokens):
// bench-small bf16 decode 1.5 tok/s with OpenMP teams, 22 with the pool (18 with one thread);
// stories260K 72 and 889 (945 with one thread). Idle, both decode at the same speed (bench-small
// bf16 91-92 tok/s, stories260K 2560-2700 tok/s; docs/benchmarks-history.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace promptcache {

// Runs fn(chunk) for every chunk in [0, chunks) on up to `threads` threads (the caller among
// them) and returns when all have returned. fn must not throw. Calls made while another call is
// in flight (from another thread, or from inside fn) run on the calling thread alone.
void parallel_chunks(int64_t chunks, int threads, const std::function<void(int64_t)>& fn);

// How the pool's threads wait between and within calls. kActive: helpers spin 300 us between
// calls and the caller spins before it yields (fastest on an idle machine). kPassive: helpers
// sleep at once and the caller yields. kAuto (the default): passive while the machine has fewer
// free cores than kernel_threads() (other processes' runnable threads, read from /proc at most
// every 50 ms; three samples in a row), active otherwise.
// PROMPTCACHE_WAIT_POLICY=auto|active|passive sets it at start.
enum class WaitPolicy { kAuto, kActive, kPassive };
bool parse_wait_policy(const std::string& text, WaitPolicy& out);  // false for other text
void set_wait_policy(WaitPolicy policy);
WaitPolicy wait_policy();
// Whether the pool waits passively now (kAuto: as last sampled).
bool waiting_passively();

// The pieces of kAuto's decision, for tests: the runnable count in /proc/loadavg's text (-1 when
// it is not there), and whether `threads` threads exceed the cores other processes leave free.
int running_in_loadavg(const std::string& text);
bool fewer_free_cores_than(int threads, int cores, int others_running);

}  // namespace promptcache
