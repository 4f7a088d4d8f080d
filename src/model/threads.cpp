#include "promptcache/model/threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <thread>

#include <algorithm>
#include <atomic>

#include "promptcache/model/blas_core.hpp"

namespace promptcache {

int hardware_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

std::atomic<int>& kernel_thread_count() {
  static std::atomic<int> threads{hardware_cores()};
  return threads;
}

// OpenBLAS is reached through LibTorch's libblas.so.3; look its thread functions up at run time
// so the build does not depend on which BLAS provides them.
using SetThreads = void (*)(int);
using GetThreads = int (*)();
SetThreads openblas_setter() {
  static const auto fn =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  return fn;
}
GetThreads openblas_getter() {
  static const auto fn =
      reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return fn;
}

}  // namespace

int kernel_threads() {
  return kernel_thread_count().load();
}
void set_kernel_threads(int threads) {
  kernel_thread_count().store(std::max(1, threads));
}

int blas_threads() {
  const GetThreads get = openblas_getter();
  return get != nullptr ? get() : 0;
}

void set_blas_threads(int threads) {
  const SetThreads set = openblas_setter();
  if (set != nullptr) set(std::max(1, threads));
}

ThreadSettings configure_threads(int threads, int torch_threads) {
  select_blas_core();  // before the first GEMM: OpenBLAS's kernels for this processor
  ThreadSettings applied;
  const int total = threads > 0 ? threads : hardware_cores();
  const SetThreads set_blas = openblas_setter();
  if (set_blas != nullptr) {
    set_blas(total);
    applied.openblas = true;
    applied.blas_threads = total;
    // GEMMs dominate and OpenBLAS threads them itself; a one-thread intra-op pool avoids the two
    // pools fighting over the same cores.
    applied.torch_threads = torch_threads > 0 ? torch_threads : 1;
  } else {
    applied.torch_threads = torch_threads > 0 ? torch_threads : total;
  }
  at::set_num_threads(applied.torch_threads);
  // The library's own kernels take the place of BLAS calls, so they get the BLAS width.
  set_kernel_threads(total);
  return applied;
}

}  // namespace promptcache
