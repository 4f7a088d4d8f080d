#include "promptcache/model/cpu_attention.hpp"

#include <omp.h>

#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"

namespace promptcache {
namespace {

struct AttendKernel {
  kernels::AttendRowsFn fn = nullptr;
  int64_t width = 0;
};

// The widest kernel at or below the selected one whose vector width divides the head size
// (a head of 8, as in stories260K, takes the AVX2 kernel on an AVX-512 processor).
AttendKernel kernel_for(int64_t head_dim) {
  const CpuLinearKernel selected = cpu_linear_kernel();
  if (head_dim <= 0) return {};
  if (selected == CpuLinearKernel::kAvx512 && kernels::attend_rows_avx512 != nullptr &&
      head_dim % kernels::kAvx512Width == 0) {
    return {kernels::attend_rows_avx512, kernels::kAvx512Width};
  }
  // Every AVX-512 processor this project has met also has AVX2 + FMA; checked all the same.
#if defined(__x86_64__)
  const bool avx2 = selected == CpuLinearKernel::kAvx2 ||
                    (selected == CpuLinearKernel::kAvx512 && __builtin_cpu_supports("avx2") &&
                     __builtin_cpu_supports("fma"));
#else
  const bool avx2 = false;
#endif
  if (avx2 && kernels::attend_rows_avx2 != nullptr && head_dim % kernels::kAvx2Width == 0) {
    return {kernels::attend_rows_avx2, kernels::kAvx2Width};
  }
  return {};
}

}  // namespace

bool cpu_attention_available(int64_t head_dim) {
  return kernel_for(head_dim).fn != nullptr;
}

torch::Tensor attend_few_queries(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask_in,
                                 int64_t open, int threads) {
  auto refuse = [](const std::string& why) {
    throw Error(ErrorKind::kInvalidArgument, "attend_few_queries: " + why);
  };
  if (qg.dim() != 4 || keys.dim() != 4 || values.dim() != 4) {
    refuse("queries, keys and values must be [batch, kv_heads, rows or slots, head_dim]");
  }
  const int64_t b = qg.size(0), hkv = qg.size(1), rows = qg.size(2), d = qg.size(3);
  const int64_t slots = keys.size(2);
  if (keys.sizes() != values.sizes() || keys.size(0) != b || keys.size(1) != hkv ||
      keys.size(3) != d) {
    refuse("keys and values must be [batch, kv_heads, slots, head_dim] matching the queries");
  }
  if (!qg.device().is_cpu() || !keys.device().is_cpu() || !values.device().is_cpu() ||
      qg.scalar_type() != torch::kFloat32 || keys.scalar_type() != torch::kFloat32 ||
      values.scalar_type() != torch::kFloat32) {
    refuse("takes f32 tensors on the CPU");
  }
  const AttendKernel kernel = kernel_for(d);
  if (kernel.fn == nullptr) {
    refuse("no fused kernel for a head of " + std::to_string(d) +
           " with the CPU kernels selected now (" + cpu_linear_name(cpu_linear_kernel()) + ")");
  }
  if (keys.stride(3) != 1 || keys.stride(2) != d || values.stride(3) != 1 ||
      values.stride(2) != d) {
    refuse("each key and value must be a dense row of head_dim values");
  }
  if (open < 0 || open > slots) refuse("open must be within [0, slots]");
  torch::Tensor mask;
  int64_t tokens = rows;
  if (mask_in.defined()) {
    const bool shape_ok = (mask_in.dim() == 2 || (mask_in.dim() == 3 && mask_in.size(0) == b)) &&
                          mask_in.size(-1) == slots && mask_in.size(-2) > 0 &&
                          rows % mask_in.size(-2) == 0;
    if (!shape_ok) {
      refuse("the mask must be [n, slots] or [batch, n, slots], with rows a multiple of n");
    }
    // A block's rows and visible columns of a larger mask are read in place: only the columns
    // must be dense.
    mask = mask_in.to(torch::kCPU, torch::kBool);
    if (mask.stride(-1) != 1) mask = mask.contiguous();
    tokens = mask.size(-2);
  }
  const auto q = qg.contiguous();
  auto out = torch::empty({b, hkv, rows, d}, qg.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t tasks = b * hkv;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tasks)));
#pragma omp parallel num_threads(team)
  {
    // Kept per thread between calls: a layer's scratch is a few hundred KB, and a fresh
    // allocation of that size would be mapped (and page-faulted) anew on every call.
    thread_local std::vector<float> scratch;
    const auto need = static_cast<std::size_t>(kernels::attend_scratch_floats(d, slots));
    if (scratch.size() < need) scratch.resize(need);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t bi = task / hkv, h = task % hkv;
      kernels::AttendArgs a;
      a.q = qp + task * rows * d;
      a.rows = rows;
      a.d = d;
      a.k = kp + bi * keys.stride(0) + h * keys.stride(1);
      a.v = vp + bi * values.stride(0) + h * values.stride(1);
      a.slots = slots;
      if (mp != nullptr) {
        a.mask = mask.dim() == 3 ? mp + bi * mask.stride(0) : mp;
        a.mask_ld = mask.stride(-2);
      }
      a.tokens = tokens;
      a.open = open;
      a.out = op + task * rows * d;
      a.scratch = scratch.data();
      kernel.fn(a);
    }
  }
  return out;
}

}  // namespace promptcache
