// src/model/quant_linear.cpp — x Wᵀ for block-quantized weights
// (promptcache/model/quant_linear.hpp): chooses the integer kernel (kernels/quant_*.cpp) for few
// rows of x, or dequantizes blocks of weight rows for LibTorch's GEMM for many, and splits the
// weight rows over the kernel threads.
#include "promptcache/model/quant_linear.hpp"

#include <algorithm>
#include <iterator>
#include <vector>

#include "cpu_features.hpp"
#include "kernels/quant_blocks.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache {
namespace {

namespace kq = kernels::quant;

kq::Format format_of(ggml::Type t) {
  switch (t) {
    case ggml::Type::Q4_0:
      return kq::Format::kQ4_0;
    case ggml::Type::Q8_0:
      return kq::Format::kQ8_0;
    case ggml::Type::Q4_K:
      return kq::Format::kQ4_K;
    case ggml::Type::Q5_K:
      return kq::Format::kQ5_K;
    case ggml::Type::Q5_0:
      return kq::Format::kQ5_0;
    case ggml::Type::Q5_1:
      return kq::Format::kQ5_1;
    default:
      return kq::Format::kQ6_K;
  }
}

const kq::QuantRowsFn* table(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kAvx512Vnni:
      return kq::quant_rows_avx512vnni;
    case QuantKernel::kAvx2:
      return kq::quant_rows_avx2;
    case QuantKernel::kScalar:
      break;
  }
  return kq::quant_rows_scalar;
}

// The weight's type and k, checked against x.
struct Shape {
  ggml::Type type;
  kq::Format format;
  int64_t n, k, m;
};

Shape check(const torch::Tensor& x, const torch::Tensor& weight) {
  const auto type = ggml::quant_type_of(weight);
  if (!type) {
    throw Error(ErrorKind::kInvalidArgument, "quant_linear: the weight is not block-quantized");
  }
  const int64_t k = weight.size(1) * ggml::block_elements(*type);
  if (x.dim() < 1 || x.size(-1) != k) {
    throw Error(ErrorKind::kInvalidArgument,
                "quant_linear: a " + std::string(ggml::type_name(*type)) + " weight of " +
                    std::to_string(k) + " inputs met x with " +
                    std::to_string(x.dim() < 1 ? 0 : x.size(-1)));
  }
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  return {*type, format_of(*type), weight.size(0), k, m};
}

torch::Tensor output_like(const torch::Tensor& x, int64_t n) {
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  return torch::empty(sizes, x.options().dtype(torch::kFloat32));
}

// Runs rows(n0, n1) for chunks of weight rows over the kernel threads (at least 64 rows a chunk,
// about four chunks per thread).
template <class Rows>
void split_rows(int64_t n, const Rows& rows) {
  constexpr int64_t kGrain = 64;
  const int threads = static_cast<int>(std::min<int64_t>(kernel_threads(), n / kGrain));
  if (threads <= 1) {
    rows(0, n);
    return;
  }
  const int64_t per_chunk = std::max<int64_t>(kGrain, (n + 4 * threads - 1) / (4 * threads));
  parallel_chunks((n + per_chunk - 1) / per_chunk, threads, [&](int64_t c) {
    const int64_t n0 = c * per_chunk;
    rows(n0, std::min(n, n0 + per_chunk));
  });
}

// Dequantized weight rows per GEMM block: a bounded scratch (16 MB) even for an lm_head.
constexpr int64_t kDequantBlockFloats = int64_t{4} << 20;

bool detect_quant_kernel(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kScalar:
      return true;
    case QuantKernel::kAvx2:
#if defined(__x86_64__)
      return kq::quant_rows_avx2[0] != nullptr && __builtin_cpu_supports("avx2") && cpu::has_f16c();
#else
      return false;
#endif
    case QuantKernel::kAvx512Vnni:
#if defined(__x86_64__)
      return kq::quant_rows_avx512vnni[0] != nullptr && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni") && cpu::has_f16c();
#else
      return false;
#endif
  }
  return false;
}

}  // namespace

// Detected once: CPUID traps to the hypervisor in a virtual machine, which made this check a
// visible share of a decode step when every linear asked again.
bool quant_kernel_available(QuantKernel kernel) {
  static const bool available[] = {detect_quant_kernel(QuantKernel::kScalar),
                                   detect_quant_kernel(QuantKernel::kAvx2),
                                   detect_quant_kernel(QuantKernel::kAvx512Vnni)};
  const auto index = static_cast<std::size_t>(kernel);
  return index < std::size(available) && available[index];
}

std::string quant_kernel_name(QuantKernel kernel) {
  switch (kernel) {
    case QuantKernel::kAvx512Vnni:
      return "avx512-vnni";
    case QuantKernel::kAvx2:
      return "avx2";
    case QuantKernel::kScalar:
      break;
  }
  return "scalar";
}

std::optional<QuantKernel> quant_kernel_in_use() {
  const CpuLinearKernel selected = cpu_linear_kernel();
  if (selected == CpuLinearKernel::kNone) return std::nullopt;
  if (selected != CpuLinearKernel::kAvx2 && quant_kernel_available(QuantKernel::kAvx512Vnni)) {
    return QuantKernel::kAvx512Vnni;
  }
  if (quant_kernel_available(QuantKernel::kAvx2)) return QuantKernel::kAvx2;
  return QuantKernel::kScalar;
}

torch::Tensor quant_linear_integer(const torch::Tensor& x, const torch::Tensor& weight,
                                   QuantKernel kernel) {
  const Shape s = check(x, weight);
  if (!quant_kernel_available(kernel)) {
    throw Error(ErrorKind::kInvalidArgument,
                "quant_linear: the " + quant_kernel_name(kernel) + " kernel is not available");
  }
  auto out = output_like(x, s.n);
  if (s.m == 0 || s.n == 0) return out;
  if (s.k == 0) return out.zero_();
  const auto xc = x.to(torch::kFloat32).contiguous();
  const auto wc = weight.contiguous();
  const int64_t xrow = kq::x_row_bytes(s.format, s.k);
  thread_local std::vector<uint8_t> xq;
  if (xq.size() < static_cast<std::size_t>(s.m * xrow)) xq.resize(s.m * xrow);
  // x's rows quantized over the kernel threads too: one thread took 6% of a 128-token prefill.
  const float* xp_f = xc.data_ptr<float>();
  uint8_t* xq_p = xq.data();
  const auto quantize = [&](int64_t t) {
    kq::quantize_x(s.format, xp_f + t * s.k, s.k, xq_p + t * xrow);
  };
  const int quantize_threads = static_cast<int>(std::min<int64_t>(kernel_threads(), s.m / 8));
  if (quantize_threads > 1) {
    parallel_chunks(s.m, quantize_threads, quantize);
  } else {
    for (int64_t t = 0; t < s.m; ++t) quantize(t);
  }
  const kq::QuantRowsFn fn = table(kernel)[static_cast<int>(s.format)];
  const uint8_t* wp = wc.data_ptr<uint8_t>();
  const uint8_t* xp = xq.data();
  float* op = out.data_ptr<float>();
  split_rows(s.n, [&](int64_t n0, int64_t n1) { fn(wp, s.k, xp, s.m, n0, n1, op, s.n); });
  return out;
}

namespace {

// The row dequantization for `kernel` (AVX2's for both SIMD kernels; the scalar reference else).
void (*dequant_fn(std::optional<QuantKernel> kernel, kq::Format format))(const uint8_t*, long long,
                                                                         float*) {
  if (kernel && *kernel != QuantKernel::kScalar && quant_kernel_available(QuantKernel::kAvx2)) {
    return kq::dequant_row_avx2[static_cast<int>(format)];
  }
  return nullptr;
}

void dequant_row(kq::DequantRowFn fn, kq::Format format, const uint8_t* w, int64_t k, float* y) {
  if (fn != nullptr) {
    fn(w, k, y);
  } else {
    kq::dequantize_row(format, w, k, y);
  }
}

}  // namespace

torch::Tensor dequantize_with(const torch::Tensor& weight, QuantKernel kernel) {
  const auto type = ggml::quant_type_of(weight);
  if (!type) {
    throw Error(ErrorKind::kInvalidArgument, "dequantize_with: the weight is not block-quantized");
  }
  const auto wc = weight.to(torch::kCPU).contiguous();
  const int64_t n = wc.size(0), k = wc.size(1) * ggml::block_elements(*type);
  const auto format = format_of(*type);
  const auto fn = dequant_fn(kernel, format);
  auto out = torch::empty({n, k}, torch::TensorOptions().dtype(torch::kFloat32));
  const int64_t row_bytes = wc.size(1) * wc.size(2);
  for (int64_t r = 0; r < n; ++r) {
    dequant_row(fn, format, wc.data_ptr<uint8_t>() + r * row_bytes, k,
                out.data_ptr<float>() + r * k);
  }
  return out;
}

torch::Tensor quant_rounded_x(const torch::Tensor& x, const torch::Tensor& weight) {
  const Shape s = check(x, weight);
  const auto xc = x.to(torch::kCPU, torch::kFloat32).contiguous();
  auto out = torch::empty_like(xc);
  const float* xp = xc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t t = 0; t < s.m; ++t) kq::round_x(s.format, xp + t * s.k, s.k, op + t * s.k);
  return out.to(x.device());
}

torch::Tensor quant_linear_dequant(const torch::Tensor& x, const torch::Tensor& weight) {
  const Shape s = check(x, weight);
  auto out = output_like(x, s.n);
  if (s.m == 0 || s.n == 0) return out;
  if (s.k == 0) return out.zero_();
  const auto x2 = quant_rounded_x(x, weight).reshape({-1, s.k});
  auto out2 = out.view({-1, s.n});
  const auto wc = weight.contiguous();
  const int64_t row_bytes = wc.size(1) * wc.size(2);
  const int64_t block = std::min(s.n, std::max<int64_t>(16, kDequantBlockFloats / s.k / 16 * 16));
  thread_local torch::Tensor scratch;
  if (!scratch.defined() || scratch.numel() < block * s.k) {
    scratch = torch::empty({block * s.k}, torch::TensorOptions().dtype(torch::kFloat32));
  }
  const uint8_t* wp = wc.data_ptr<uint8_t>();
  float* sp = scratch.data_ptr<float>();
  const auto fn = dequant_fn(quant_kernel_in_use(), s.format);
  for (int64_t r0 = 0; r0 < s.n; r0 += block) {
    const int64_t nb = std::min(block, s.n - r0);
    split_rows(nb, [&](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        dequant_row(fn, s.format, wp + (r0 + r) * row_bytes, s.k, sp + r * s.k);
      }
    });
    auto part = out2.narrow(1, r0, nb);
    at::mm_out(part, x2, scratch.narrow(0, 0, nb * s.k).view({nb, s.k}).t());
  }
  return out;
}

torch::Tensor quant_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  check(x, weight);
  const auto kernel = quant_kernel_in_use();
  const bool cpu = x.device().is_cpu() && weight.device().is_cpu() &&
                   x.scalar_type() == torch::kFloat32 &&
                   !(at::GradMode::is_enabled() && x.requires_grad());
  if (!kernel || !cpu) {
    return torch::linear(quant_rounded_x(x, weight), ggml::dequantize(weight).to(x.device()));
  }
  return quant_linear_integer(x, weight, *kernel);
}

}  // namespace promptcache
