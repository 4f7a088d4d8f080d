#include "promptcache/model/cpu_linear.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <vector>

#include "cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/quant_linear.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache {
static_assert(kCpuLinearQ8IntegerRows == kernels::kQ8DotMaxRows);
namespace {

bool cpu_has(CpuLinearKernel kernel) {
#if defined(__x86_64__)
  switch (kernel) {
    case CpuLinearKernel::kNone:
      return true;
    case CpuLinearKernel::kAvx2:
      return kernels::linear_rows_avx2 != nullptr && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma") && cpu::has_f16c();
    case CpuLinearKernel::kAvx512:
      return kernels::linear_rows_avx512 != nullptr && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("fma") && cpu::has_f16c();
    case CpuLinearKernel::kAvx512Bf16:
      return cpu_has(CpuLinearKernel::kAvx512) &&
             kernels::linear_rows_bf16_dot_avx512bf16 != nullptr &&
             kernels::round_bf16_avx512bf16 != nullptr && cpu::has_avx512_bf16();
  }
  return false;
#else
  return kernel == CpuLinearKernel::kNone;
#endif
}

// The best kernel this processor has, or the one PROMPTCACHE_CPU_KERNELS names ("off" or "0":
// none; "avx512-bf16", "avx512", "avx2": that one where the processor has it, else the best it
// has below it).
CpuLinearKernel default_kernel() {
  const char* env = std::getenv("PROMPTCACHE_CPU_KERNELS");
  if (env != nullptr && (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0)) {
    return CpuLinearKernel::kNone;
  }
  const CpuLinearKernel order[] = {CpuLinearKernel::kAvx512Bf16, CpuLinearKernel::kAvx512,
                                   CpuLinearKernel::kAvx2};
  std::size_t first = 0;
  for (std::size_t i = 0; env != nullptr && i < std::size(order); ++i) {
    if (cpu_linear_name(order[i]) == env) first = i;
  }
  for (std::size_t i = first; i < std::size(order); ++i) {
    if (cpu_has(order[i])) return order[i];
  }
  return CpuLinearKernel::kNone;
}

std::atomic<CpuLinearKernel>& selected() {
  static std::atomic<CpuLinearKernel> kernel{default_kernel()};
  return kernel;
}

// The kernel for weights of element type W (float, kernels::Bf16, kernels::F16, kernels::Q8).
template <class W>
kernels::LinearRowsOf<W> rows_fn(CpuLinearKernel kernel) {
  auto pick = [](auto f32, auto bf16, auto f16, auto q8) -> kernels::LinearRowsOf<W> {
    if constexpr (std::is_same_v<W, float>) return f32;
    if constexpr (std::is_same_v<W, kernels::Bf16>) return bf16;
    if constexpr (std::is_same_v<W, kernels::F16>) return f16;
    if constexpr (std::is_same_v<W, kernels::Q8>) return q8;
  };
  switch (kernel) {
    case CpuLinearKernel::kAvx512:
    case CpuLinearKernel::kAvx512Bf16:  // bf16 weights go to bf16_dot_linear before this
      return pick(kernels::linear_rows_avx512, kernels::linear_rows_bf16_avx512,
                  kernels::linear_rows_f16_avx512, kernels::linear_rows_q8_avx512);
    case CpuLinearKernel::kAvx2:
      return pick(kernels::linear_rows_avx2, kernels::linear_rows_bf16_avx2,
                  kernels::linear_rows_f16_avx2, kernels::linear_rows_q8_avx2);
    case CpuLinearKernel::kNone:
      break;
  }
  return nullptr;
}

// Calls rows(n0, n1) for ranges of weight rows covering [0, n), on kernel_threads() threads,
// for a call with m rows of x. The weight rows go in chunks (a multiple of 12 rows, so the 4-
// and 3-row blocks of the kernels stay whole) that the pool's threads take as they come, about
// four per thread; small matrices stay on one thread. A call along the lanes transposes x into
// its thread's scratch for every chunk, so it takes one chunk per thread (more cost a 17-token
// prefill of bench-small 7%).
template <class Rows>
void split_weight_rows(int64_t m, int64_t n, const Rows& rows) {
  constexpr int64_t kGrain = 12 * 16;
  const int threads =
      static_cast<int>(std::min<int64_t>(kernel_threads(), (n + kGrain - 1) / kGrain));
  if (threads <= 1) {
    rows(0, n);
    return;
  }
  const int64_t per_thread = m >= kernels::kLinearLaneMinRows ? 1 : 4;
  const int64_t share =
      std::max<int64_t>(kGrain / 2, (n + per_thread * threads - 1) / (per_thread * threads));
  const int64_t rows_per_chunk = (share + 11) / 12 * 12;
  const int64_t chunks = (n + rows_per_chunk - 1) / rows_per_chunk;
  parallel_chunks(chunks, threads, [&](int64_t c) {
    const int64_t n0 = c * rows_per_chunk;
    rows(n0, std::min(n, n0 + rows_per_chunk));
  });
}

// x [..., k] (f32, m rows) times w [n, k] by `fn`, into a new f32 [..., n].
template <class W>
torch::Tensor run_rows(kernels::LinearRowsOf<W> fn, const torch::Tensor& x, int64_t m, int64_t k,
                       const W* wp, int64_t n) {
  const auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto out = torch::empty(sizes, x.options());
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // Each thread transposes x into its own scratch (kept between calls: a fresh allocation of
  // that size would be page-faulted anew each time).
  // f16 weights use it from 2 rows on too, for rows converted once for several passes.
  // So do Q8 weights.
  constexpr bool kConvertFirst = std::is_same_v<W, kernels::F16> || std::is_same_v<W, kernels::Q8>;
  // Q8 weights take it at every size (x quantized to 8 bits there, up to 12 rows).
  const bool lanes =
      std::is_same_v<W, kernels::Q8> || m >= (kConvertFirst ? 2 : kernels::kLinearLaneMinRows);
  auto scratch = [&]() -> float* {
    if (!lanes) return nullptr;
    thread_local std::vector<float> xt;
    const auto need = static_cast<std::size_t>(kernels::linear_scratch_floats(m, k));
    if (xt.size() < need) xt.resize(need);
    return xt.data();
  };
  split_weight_rows(m, n,
                    [&](int64_t n0, int64_t n1) { fn(xp, m, k, wp, n0, n1, op, n, scratch()); });
  return out;
}

// More than kCpuLinearMaxRows rows with bf16/f16 weights: the weights converted to f32 into a
// scratch kept by the calling thread, then LibTorch's f32 GEMM; weights of more than
// kLongBlockFloats go in blocks of rows, which bounds the scratch (16 MB) where converting a
// whole 8B-model matrix would allocate and page-fault hundreds of MB per call. Measured on
// bench-small's shapes (768x768, 2048x768, 768x2048; m = 65, 128, 512, 2048; one thread, 2-core
// AVX2 host shared with builds, so +-15%): converting the whole weight per call costs 1-12%
// over f32 weights at 65-128 rows and 1-3% from 512; converting blocks of 64 or 256 rows into
// the scratch and at::mm_out per block was as fast at 65-128 rows but up to 1.5x slower at 2048
// (a GEMM per small block); LibTorch 1.13's own bf16 matmul (x.to(bf16)) took 10-35x as long.
constexpr int64_t kLongBlockFloats = int64_t{4} << 20;

// The weight's rows [r0, r0 + rows) converted to f32 into dst by `widen`, on the calling thread.
// Not LibTorch's copy_ nor an OpenMP region: either leaves OpenMP's threads spinning while the
// OpenBLAS GEMM that follows wants both cores, and took this path to 2.0-2.4x the f32 time at
// 128 rows with 2 threads (bench_linear); converted so, it is ~1.1x.
template <class W>
void widen_rows(kernels::WidenOf<W> widen, const torch::Tensor& weight, int64_t r0, int64_t rows,
                float* dst) {
  const int64_t k = weight.size(1);
  widen(reinterpret_cast<const W*>(weight.data_ptr()) + r0 * k, rows * k, dst);
}

template <class W>
torch::Tensor long_half_linear(kernels::WidenOf<W> widen, const torch::Tensor& x,
                               const torch::Tensor& weight) {
  const int64_t n = weight.size(0), k = weight.size(1);
  thread_local torch::Tensor scratch;
  const int64_t block = std::max<int64_t>(16, kLongBlockFloats / k / 16 * 16);
  const int64_t rows = std::min(n, block);
  if (!scratch.defined() || scratch.numel() < rows * k) {
    scratch = torch::empty({rows * k}, x.options());
  }
  auto convert = [&](const torch::Tensor& w, int64_t r0, int64_t nb) {
    if (widen != nullptr) {
      widen_rows<W>(widen, weight, r0, nb, w.data_ptr<float>());
    } else {
      w.copy_(weight.narrow(0, r0, nb));
    }
  };
  if (n <= block) {
    auto w = scratch.narrow(0, 0, n * k).view({n, k});
    convert(w, 0, n);
    return torch::linear(x, w);
  }
  const auto x2 = x.reshape({-1, k});
  auto out = torch::empty({x2.size(0), n}, x.options());
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t nb = std::min(block, n - r0);
    auto w = scratch.narrow(0, 0, nb * k).view({nb, k});
    convert(w, r0, nb);
    auto part = out.narrow(1, r0, nb);
    at::mm_out(part, x2, w.t());
  }
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return out.view(sizes);
}

// The conversion for weights of element type W with `kernel`'s instruction set (null: none).
template <class W>
kernels::WidenOf<W> widen_fn(CpuLinearKernel kernel) {
  const bool avx512 = kernel == CpuLinearKernel::kAvx512 || kernel == CpuLinearKernel::kAvx512Bf16;
  if (kernel == CpuLinearKernel::kNone) return nullptr;
  if constexpr (std::is_same_v<W, kernels::Bf16>) {
    return avx512 ? kernels::widen_bf16_avx512 : kernels::widen_bf16_avx2;
  } else {
    return avx512 ? kernels::widen_f16_avx512 : kernels::widen_f16_avx2;
  }
}

// More than kCpuLinearMaxRows rows with Q8 weights: as long_half_linear, the rows dequantized
// into the calling thread's f32 scratch (kLongBlockFloats at a time) for LibTorch's GEMM.
torch::Tensor long_q8_linear(kernels::WidenQ8Fn widen, const torch::Tensor& x,
                             const torch::Tensor& weight, int64_t k) {
  const int64_t n = weight.size(0);
  thread_local torch::Tensor scratch;
  const int64_t block = std::min(n, std::max<int64_t>(16, kLongBlockFloats / k / 16 * 16));
  if (!scratch.defined() || scratch.numel() < block * k) {
    scratch = torch::empty({block * k}, x.options());
  }
  const auto x2 = x.reshape({-1, k});
  auto out = torch::empty({x2.size(0), n}, x.options());
  const auto* q = reinterpret_cast<const kernels::Q8*>(weight.data_ptr<int8_t>());
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t nb = std::min(block, n - r0);
    auto w = scratch.narrow(0, 0, nb * k).view({nb, k});
    widen(q + r0 * weight.size(1), nb, k, w.data_ptr<float>());
    auto part = out.narrow(1, r0, nb);
    at::mm_out(part, x2, w.t());
  }
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return out.view(sizes);
}

// f32 x times Q8 weights: the kernel up to kCpuLinearMaxRows rows, then long_q8_linear;
// torch::linear on the dequantized weights when the kernels are off (the reference).
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  const int64_t k = x.size(-1);
  if (weight.size(1) != q8_row_bytes(k)) {
    throw Error(ErrorKind::kInvalidArgument,
                "q8 weight rows of " + std::to_string(weight.size(1)) + " bytes do not hold " +
                    std::to_string(k) + " inputs (" + std::to_string(q8_row_bytes(k)) + " bytes)");
  }
  const CpuLinearKernel kernel = cpu_linear_kernel();
  const auto fn = rows_fn<kernels::Q8>(kernel);
  const int64_t n = weight.size(0);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  const bool takes = fn != nullptr && x.device().is_cpu() && weight.device().is_cpu() &&
                     weight.is_contiguous() && x.scalar_type() == torch::kFloat32 &&
                     !(at::GradMode::is_enabled() && x.requires_grad());
  if (!takes || m == 0 || k == 0 || n == 0) {
    return torch::linear(x.to(torch::kFloat32), dequantize_q8(weight, k).to(x.device()));
  }
  if (m > kCpuLinearMaxRows) {
    return long_q8_linear(
        kernel == CpuLinearKernel::kAvx2 ? kernels::widen_q8_avx2 : kernels::widen_q8_avx512, x,
        weight, k);
  }
  return run_rows<kernels::Q8>(fn, x, m, k,
                               reinterpret_cast<const kernels::Q8*>(weight.data_ptr<int8_t>()), n);
}

// The kernels' preconditions on x and weight besides the dtypes.
bool kernel_takes(const torch::Tensor& x, const torch::Tensor& weight) {
  return x.device().is_cpu() && weight.device().is_cpu() && weight.dim() == 2 && x.dim() >= 1 &&
         weight.is_contiguous() && x.size(-1) == weight.size(1) &&
         !(at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()));
}

// f32 x times bf16 weights with vdpbf16ps (kAvx512Bf16), at every row count: x rounded to
// bf16 once, into the calling thread's scratch, then the weight rows split over the threads as
// in run_rows (from 13 rows one chunk per thread: every chunk reads all of x). m, k, n > 0.
torch::Tensor bf16_dot_linear(const torch::Tensor& x, const torch::Tensor& weight, int64_t m) {
  const int64_t k = weight.size(1), n = weight.size(0);
  const auto xc = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto out = torch::empty(sizes, x.options());
  thread_local std::vector<kernels::Bf16> xb;
  const auto need = static_cast<std::size_t>(m * kernels::bf16_dot_stride(k));
  if (xb.size() < need) xb.resize(need);
  kernels::round_bf16_avx512bf16(xc.data_ptr<float>(), m, k, xb.data());
  const auto* wp = reinterpret_cast<const kernels::Bf16*>(weight.data_ptr());
  float* op = out.data_ptr<float>();
  const kernels::Bf16* xp = xb.data();
  split_weight_rows(m, n, [&](int64_t n0, int64_t n1) {
    kernels::linear_rows_bf16_dot_avx512bf16(xp, m, k, wp, n0, n1, op, n);
  });
  return out;
}

// f32 x times bf16/f16 weights (W): the kernel up to kCpuLinearMaxRows rows, beyond that
// long_half_linear; torch::linear on the f32 weights when the kernels are off (the reference).
// bf16 weights under kAvx512Bf16 take bf16_dot_linear at every size.
template <class W>
torch::Tensor half_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  if constexpr (std::is_same_v<W, kernels::Bf16>) {
    if (cpu_linear_kernel() == CpuLinearKernel::kAvx512Bf16 && kernel_takes(x, weight)) {
      const int64_t k = weight.size(1);
      const int64_t m = k == 0 ? 0 : x.numel() / k;
      if (m > 0 && k > 0 && weight.size(0) > 0) return bf16_dot_linear(x, weight, m);
    }
  }
  const auto fn = rows_fn<W>(cpu_linear_kernel());
  if (fn == nullptr || !kernel_takes(x, weight)) {
    return torch::linear(x, weight.to(torch::kFloat32));
  }
  const int64_t k = weight.size(1), n = weight.size(0);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  if (m == 0 || k == 0 || n == 0) return torch::linear(x, weight.to(torch::kFloat32));
  if (m > kCpuLinearMaxRows) {
    return long_half_linear<W>(widen_fn<W>(cpu_linear_kernel()), x, weight);
  }
  return run_rows<W>(fn, x, m, k, reinterpret_cast<const W*>(weight.data_ptr()), n);
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
    case CpuLinearKernel::kAvx512Bf16:
      return "avx512-bf16";
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
  if (is_q8(weight)) return q8_linear(x, weight);
  if (ggml::quant_type_of(weight)) return quant_linear(x, weight);
  if (x.scalar_type() == torch::kFloat32) {
    if (weight.scalar_type() == torch::kBFloat16) return half_linear<kernels::Bf16>(x, weight);
    if (weight.scalar_type() == torch::kFloat16) return half_linear<kernels::F16>(x, weight);
  }
  const kernels::LinearRowsFn fn = rows_fn<float>(cpu_linear_kernel());
  if (fn == nullptr || x.scalar_type() != torch::kFloat32 ||
      weight.scalar_type() != torch::kFloat32 || !kernel_takes(x, weight)) {
    return torch::linear(x, weight);
  }
  const int64_t k = weight.size(1), n = weight.size(0);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  if (m == 0 || m > kCpuLinearMaxRows || k == 0 || n == 0) return torch::linear(x, weight);
  return run_rows<float>(fn, x, m, k, weight.data_ptr<float>(), n);
}

}  // namespace promptcache
