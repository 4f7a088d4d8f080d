// benchmarks/bench_kernels.hpp — the --kernels flag of the benchmarks that compare the CPU's
// small-row paths (linear kernels and fused attention) with LibTorch's.
#pragma once

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "promptcache/model/cpu_linear.hpp"

namespace promptcache::bench {

// "on": `initial`, the kernel in use before the settings were read (the best this processor
// has, or the one PROMPTCACHE_CPU_KERNELS named; where that was off, the best; with a warning,
// "off" where it has none); "off": torch::linear and the blocked attention; "avx512-bf16",
// "avx512", "avx2": that kernel (an AVX-512 processor can measure its AVX2 path too, an AVX512_BF16
// one its widening bf16 path). Anything else, or a kernel this processor lacks, exits with 2.
inline CpuLinearKernel kernel_setting(const std::string& program, const std::string& name,
                                      CpuLinearKernel initial) {
  if (name == "off") return CpuLinearKernel::kNone;
  if (name == "on") {
    if (initial != CpuLinearKernel::kNone) return initial;
    for (auto k :
         {CpuLinearKernel::kAvx512Bf16, CpuLinearKernel::kAvx512, CpuLinearKernel::kAvx2}) {
      if (select_cpu_linear(k)) return k;
    }
    std::cerr << program
              << ": --kernels on, but this processor or build has no small-row "
                 "kernel; measuring 'off' instead\n";
    return CpuLinearKernel::kNone;
  }
  for (auto k : {CpuLinearKernel::kAvx512Bf16, CpuLinearKernel::kAvx512, CpuLinearKernel::kAvx2}) {
    if (name != cpu_linear_name(k)) continue;
    if (select_cpu_linear(k)) return k;
    std::cerr << program << ": --kernels " << name << ", but this processor or build lacks it\n";
    std::exit(2);
  }
  std::cerr << program
            << ": --kernels takes on, off, avx512-bf16, avx512 or avx2 (comma-separated), not '"
            << name << "'\n";
  std::exit(2);
}

inline std::vector<CpuLinearKernel> kernel_settings(const std::string& program,
                                                    const std::vector<std::string>& names) {
  std::vector<CpuLinearKernel> out;
  const CpuLinearKernel initial = cpu_linear_kernel();
  for (const auto& name : names) out.push_back(kernel_setting(program, name, initial));
  return out;
}

}  // namespace promptcache::bench
