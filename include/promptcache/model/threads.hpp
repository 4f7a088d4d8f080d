// promptcache/model/threads.hpp — CPU thread settings for LibTorch and its BLAS.
//
// LibTorch's OpenMP pool and OpenBLAS's own pthread pool oversubscribe the cores when both run
// at full width, so the defaults split them (see docs/benchmarks-history.md for the measurements).
#pragma once

namespace promptcache {

struct ThreadSettings {
  int torch_threads = 0;  // LibTorch intra-op threads (elementwise ops, softmax, ...)
  int blas_threads = 0;   // OpenBLAS threads (GEMMs); 0 when the BLAS is not OpenBLAS
  bool openblas = false;  // whether OpenBLAS was found at run time
};

// threads = total CPU threads to use (0 = all hardware cores); torch_threads overrides the
// intra-op pool (0 = the measured default). Returns what was applied. The first call also
// chooses OpenBLAS's kernels for this processor (select_blas_core, blas_core.hpp), so call it
// before any GEMM runs on another thread.
ThreadSettings configure_threads(int threads = 0, int torch_threads = 0);
int hardware_cores();

// Threads for the library's own CPU work outside BLAS (the small-row linear kernels, the
// attention of a few fresh tokens, KV head by KV head). configure_threads sets it to the BLAS
// width; it starts at hardware_cores().
int kernel_threads();
void set_kernel_threads(int threads);

// OpenBLAS's thread count (0 when the BLAS is not OpenBLAS) and a way to change it;
// set_blas_threads does nothing without OpenBLAS.
int blas_threads();
void set_blas_threads(int threads);

}  // namespace promptcache
