// Test helpers for the CPU kernels: restoring the process-wide kernel choice, listing the kernels
// this processor and build have.
#pragma once

#include <vector>

#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/threads.hpp"

namespace promptcache::test {

// Restores the process-wide kernel choice and thread count when a test ends.
struct KernelGuard {
  CpuLinearKernel kernel = cpu_linear_kernel();
  ~KernelGuard() {
    select_cpu_linear(kernel);
    set_kernel_threads(hardware_cores());
  }
};

// The SIMD kernels select_cpu_linear() accepts here (possibly none).
inline std::vector<CpuLinearKernel> available_kernels() {
  std::vector<CpuLinearKernel> out;
  for (auto k : {CpuLinearKernel::kAvx2, CpuLinearKernel::kAvx512}) {
    KernelGuard guard;
    if (select_cpu_linear(k)) out.push_back(k);
  }
  return out;
}

}  // namespace promptcache::test
