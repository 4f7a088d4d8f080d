#include "promptcache/model/cpu_linear.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/kernels.hpp"
#include "promptcache/model/threads.hpp"

namespace promptcache {
namespace {

bool cpu_has(CpuLinearKernel kernel) {
#if defined(__x86_64__)
  switch (kernel) {
    case CpuLinearKernel::kNone:
      return true;
    case CpuLinearKernel::kAvx2:
      return kernels::linear_rows_avx2 != nullptr && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma");
    case CpuLinearKernel::kAvx512:
      return kernels::linear_rows_avx512 != nullptr && __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return kernel == CpuLinearKernel::kNone;
#endif
}

CpuLinearKernel default_kernel() {
  const char* env = std::getenv("PROMPTCACHE_CPU_KERNELS");
  if (env != nullptr && (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0)) {
    return CpuLinearKernel::kNone;
  }
  if (cpu_has(CpuLinearKernel::kAvx512)) return CpuLinearKernel::kAvx512;
  if (cpu_has(CpuLinearKernel::kAvx2)) return CpuLinearKernel::kAvx2;
  return CpuLinearKernel::kNone;
}

std::atomic<CpuLinearKernel>& selected() {
  static std::atomic<CpuLinearKernel> kernel{default_kernel()};
  return kernel;
}

kernels::LinearRowsFn rows_fn(CpuLinearKernel kernel) {
  switch (kernel) {
    case CpuLinearKernel::kAvx512:
      return kernels::linear_rows_avx512;
    case CpuLinearKernel::kAvx2:
      return kernels::linear_rows_avx2;
    case CpuLinearKernel::kNone:
      break;
  }
  return nullptr;
}

}  // namespace

CpuLinearKernel cpu_linear_kernel() {
  return selected().load();
}

bool select_cpu_linear(CpuLinearKernel kernel) {
  if (!cpu_has(kernel)) return false;
  selected().store(kernel);
  return true;
}

std::string cpu_linear_name(CpuLinearKernel kernel) {
  switch (kernel) {
    case CpuLinearKernel::kAvx512:
      return "avx512";
    case CpuLinearKernel::kAvx2:
      return "avx2";
    case CpuLinearKernel::kNone:
      break;
  }
  return "off";
}

torch::Tensor linear_layer(const torch::Tensor& x, const torch::Tensor& weight) {
  const kernels::LinearRowsFn fn = rows_fn(cpu_linear_kernel());
  if (fn == nullptr || !x.device().is_cpu() || !weight.device().is_cpu() ||
      x.scalar_type() != torch::kFloat32 || weight.scalar_type() != torch::kFloat32 ||
      weight.dim() != 2 || x.dim() < 1 || !weight.is_contiguous() || x.size(-1) != weight.size(1) ||
      (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()))) {
    return torch::linear(x, weight);
  }
  const int64_t k = weight.size(1), n = weight.size(0);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  if (m == 0 || m > kCpuLinearMaxRows || k == 0 || n == 0) return torch::linear(x, weight);
  const auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto out = torch::empty(sizes, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Each thread streams its own contiguous share of the weight rows (a multiple of 12, so the
  // 4- and 3-row blocks of the kernels stay whole); small matrices stay on one thread.
  constexpr int64_t kGrain = 12 * 16;
  const int threads =
      static_cast<int>(std::min<int64_t>(kernel_threads(), (n + kGrain - 1) / kGrain));
  // Each thread transposes x into its own scratch (kept between calls: a fresh allocation of
  // that size would be page-faulted anew each time).
  const bool lanes = m >= kernels::kLinearLaneMinRows;
  auto scratch = [&]() -> float* {
    if (!lanes) return nullptr;
    thread_local std::vector<float> xt;
    const auto need = static_cast<std::size_t>(kernels::linear_scratch_floats(m, k));
    if (xt.size() < need) xt.resize(need);
    return xt.data();
  };
  if (threads <= 1) {
    fn(xp, m, k, wp, 0, n, op, n, scratch());
    return out;
  }
  const int64_t share = ((n + threads - 1) / threads + 11) / 12 * 12;
#pragma omp parallel num_threads(threads)
  {
    const int64_t n0 = std::min<int64_t>(n, omp_get_thread_num() * share);
    const int64_t n1 = std::min<int64_t>(n, n0 + share);
    if (n0 < n1) fn(xp, m, k, wp, n0, n1, op, n, scratch());
  }
  return out;
}

}  // namespace promptcache
