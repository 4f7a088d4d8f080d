#include "promptcache/model/threads.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <thread>

namespace promptcache {

int hardware_cores() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

ThreadSettings configure_threads(int threads, int torch_threads) {
  ThreadSettings applied;
  const int total = threads > 0 ? threads : hardware_cores();
  // OpenBLAS is reached through LibTorch's libblas.so.3; look the setter up at run time so the
  // build does not depend on which BLAS provides it.
  using SetThreads = void (*)(int);
  auto set_blas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
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
  return applied;
}

}  // namespace promptcache
