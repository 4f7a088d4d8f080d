// The small-row CPU linear kernels equal torch::linear for every shape they take (all tails of
// the register blocks, one and several threads), and everything they do not take falls back.
// bf16/f16 weights with f32 x equal the f32 product with the weights converted to f32, and Q8
// weights the f32 product with the dequantized weights.
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/threads.hpp"
#include "support/cpu_kernels.hpp"

using namespace promptcache;
using test::available_kernels;
using test::KernelGuard;

namespace {

double max_rel_error(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = want.abs().max().item<double>() + 1e-6;
  return (got - want).abs().max().item<double>() / scale;
}

// x [m, k] as the Q8 kernels see it up to kCpuLinearQ8IntegerRows rows: each block of 32
// rounded to a multiple of its scale max |x| / 127, with the same f32 operations (scale =
// amax / 127, value = nearbyint(x * (1 / scale))), so the values are the kernel's exactly.
torch::Tensor q8_rounded_rows(const torch::Tensor& x) {
  auto c = x.contiguous().to(torch::kFloat32);
  auto out = torch::empty_like(c);
  const int64_t m = c.size(0), k = c.size(1);
  const float* src = c.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t b0 = 0; b0 < k; b0 += kQ8BlockSize) {
      const int64_t len = std::min<int64_t>(kQ8BlockSize, k - b0);
      const float* in = src + t * k + b0;
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(in[i]));
      const float scale = amax / 127.0f;
      const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (int64_t i = 0; i < len; ++i) {
        dst[t * k + b0 + i] = std::nearbyint(in[i] * inverse) * scale;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("small-row CPU linear kernels equal torch::linear on every block tail",
          "[cpu_linear][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  const auto kernels = available_kernels();
  if (kernels.empty()) {
    WARN("this processor has neither AVX2+FMA nor AVX-512F: only the fallback is tested");
  }
  torch::manual_seed(7);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    REQUIRE(cpu_linear_kernel() == kernel);
    for (int threads : {1, 2, 3}) {
      set_kernel_threads(threads);
      // Up to 12 rows the weight-row blocks, from 13 on (kLinearLaneMinRows) the tokens along
      // the lanes, in passes of up to 32 (AVX-512) or 16 (AVX2) tokens.
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 33, 40, 64}) {
        for (int64_t k : {1, 7, 8, 9, 15, 16, 17, 64, 100}) {
          for (int64_t n : {1, 2, 3, 4, 5, 12, 13, 191, 400}) {
            auto x = torch::randn({m, k});
            auto w = torch::randn({n, k});
            auto got = linear_layer(x, w);
            auto want = torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64));
            INFO(cpu_linear_name(kernel)
                 << " threads " << threads << " m " << m << " k " << k << " n " << n);
            REQUIRE(got.sizes() == want.sizes());
            REQUIRE(got.scalar_type() == torch::kFloat32);
            REQUIRE(max_rel_error(got.to(torch::kFloat64), want) < 1e-5);
            ++checked;
          }
        }
      }
    }
    // A model-sized case with batch and token axes, as the decoder layers call it.
    set_kernel_threads(2);
    auto x = torch::randn({1, 16, 768});
    auto w = torch::randn({2048, 768});
    auto got = linear_layer(x, w);
    REQUIRE(got.sizes() == torch::IntArrayRef({1, 16, 2048}));
    REQUIRE(max_rel_error(got.to(torch::kFloat64),
                          torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64))) < 1e-5);
    // A non-contiguous x (a transposed view) is read correctly.
    auto xt = torch::randn({768, 5}).t();
    REQUIRE(max_rel_error(linear_layer(xt, w), torch::linear(xt, w)) < 1e-5);
  }
  if (!kernels.empty()) REQUIRE(checked == static_cast<int>(kernels.size()) * 3 * 17 * 9 * 9);
}

TEST_CASE("CPU linear falls back to torch::linear for what the kernels do not take",
          "[cpu_linear][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  REQUIRE(cpu_linear_name(cpu_linear_kernel()) == "off");
  auto x = torch::randn({3, 32});
  auto w = torch::randn({10, 32});
  REQUIRE(torch::equal(linear_layer(x, w), torch::linear(x, w)));
  for (auto kernel : available_kernels()) {
    REQUIRE(select_cpu_linear(kernel));
    // Too many rows, another dtype, a non-contiguous weight: all exactly torch::linear.
    auto many = torch::randn({kCpuLinearMaxRows + 1, 32});
    REQUIRE(torch::equal(linear_layer(many, w), torch::linear(many, w)));
    auto xb = x.to(torch::kBFloat16), wb = w.to(torch::kBFloat16);
    auto yb = linear_layer(xb, wb);
    REQUIRE(yb.scalar_type() == torch::kBFloat16);
    REQUIRE(torch::equal(yb, torch::linear(xb, wb)));
    auto wt = torch::randn({32, 10}).t();
    REQUIRE(torch::equal(linear_layer(x, wt), torch::linear(x, wt)));
    // Shape errors are torch::linear's own, not an out-of-bounds read.
    REQUIRE_THROWS(linear_layer(torch::randn({2, 31}), w));
  }
}

TEST_CASE("CPU linear leaves tensors that want gradients to autograd", "[cpu_linear][kernels]") {
  KernelGuard guard;
  for (auto kernel : available_kernels()) {
    REQUIRE(select_cpu_linear(kernel));
    auto xg = torch::randn({2, 32}, torch::requires_grad());
    auto w = torch::randn({10, 32});
    auto y = linear_layer(xg, w);
    REQUIRE(y.requires_grad());
    y.sum().backward();
    REQUIRE(torch::allclose(xg.grad(), w.sum(0).expand({2, 32})));
  }
}

TEST_CASE("bf16 and f16 weights with f32 x equal torch::linear on the converted weights",
          "[cpu_linear][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  // The reference is off (torch::linear on the weights converted to f32) and every kernel.
  auto kernels = available_kernels();
  kernels.insert(kernels.begin(), CpuLinearKernel::kNone);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
      for (int threads : {1, 2}) {
        set_kernel_threads(threads);
        // The few-row blocks (1-12), the lanes (13 on), past kCpuLinearMaxRows the long path.
        for (int64_t m : {1,  2,  3,  4,  5,  6,  7,  8,  9,   11,  12,  13,  16,  17,
                          31, 33, 40, 63, 64, 65, 70, 96, 128, 129, 200, 256, 257, 300}) {
          for (int64_t k : {1, 7, 9, 17, 100, 257}) {
            for (int64_t n : {1, 5, 13, 191, 400}) {
              auto x = torch::randn({m, k});
              auto w = torch::randn({n, k}).to(dtype);
              auto got = linear_layer(x, w);
              // The converted weights are exact, so the sums are f32 sums of exact products:
              // the same 1e-5 (relative to the largest output) as for f32 weights, both dtypes.
              auto want = torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64));
              INFO(cpu_linear_name(kernel) << " " << dtype << " threads " << threads << " m " << m
                                           << " k " << k << " n " << n);
              REQUIRE(got.sizes() == want.sizes());
              REQUIRE(got.scalar_type() == torch::kFloat32);
              REQUIRE(max_rel_error(got.to(torch::kFloat64), want) < 1e-5);
              if (kernel == CpuLinearKernel::kNone) {
                REQUIRE(torch::equal(got, torch::linear(x, w.to(torch::kFloat32))));
              }
              ++checked;
            }
          }
        }
      }
    }
    // Model-sized cases as the decoder layers call them: a decode step and a 16-token question
    // with batch and token axes, and a weight that is a view with an offset into its storage.
    set_kernel_threads(2);
    for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
      auto whole = torch::randn({2049, 768}).to(dtype);
      auto w = whole.narrow(0, 1, 2048);
      REQUIRE(w.is_contiguous());
      for (int64_t tokens : {1, 16}) {
        auto x = torch::randn({1, tokens, 768});
        auto got = linear_layer(x, w);
        REQUIRE(got.sizes() == torch::IntArrayRef({1, tokens, 2048}));
        REQUIRE(max_rel_error(got.to(torch::kFloat64),
                              torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64))) < 1e-5);
      }
      // A non-contiguous x is read correctly; a non-contiguous weight falls back.
      auto xt = torch::randn({768, 5}).t();
      REQUIRE(max_rel_error(linear_layer(xt, w), torch::linear(xt, w.to(torch::kFloat32))) < 1e-5);
      auto wt = torch::randn({32, 10}).to(dtype).t();
      auto x = torch::randn({3, 32});
      REQUIRE(torch::equal(linear_layer(x, wt), torch::linear(x, wt.to(torch::kFloat32))));
      // Shape errors are torch::linear's own.
      REQUIRE_THROWS(linear_layer(torch::randn({2, 767}), w));
    }
    // Past kCpuLinearMaxRows a weight of more than 4M elements is converted in blocks of rows.
    auto big = torch::randn({4101, 1027}).to(torch::kBFloat16);
    auto xl = torch::randn({2, kCpuLinearMaxRows, 1027});
    auto got = linear_layer(xl, big);
    REQUIRE(got.sizes() == torch::IntArrayRef({2, kCpuLinearMaxRows, 4101}));
    REQUIRE(max_rel_error(got.to(torch::kFloat64),
                          torch::linear(xl.to(torch::kFloat64), big.to(torch::kFloat64))) < 1e-5);
  }
  REQUIRE(checked == static_cast<int>(kernels.size()) * 2 * 2 * 28 * 6 * 5);
}

TEST_CASE("bf16 weights that want gradients go to autograd through the f32 weights",
          "[cpu_linear][kernels]") {
  KernelGuard guard;
  for (auto kernel : available_kernels()) {
    REQUIRE(select_cpu_linear(kernel));
    auto xg = torch::randn({2, 32}, torch::requires_grad());
    auto w = torch::randn({10, 32}).to(torch::kBFloat16);
    auto y = linear_layer(xg, w);
    REQUIRE(y.requires_grad());
    REQUIRE(y.scalar_type() == torch::kFloat32);
    y.sum().backward();
    REQUIRE(torch::allclose(xg.grad(), w.to(torch::kFloat32).sum(0).expand({2, 32})));
  }
}

TEST_CASE("q8 quantization keeps each weight within half a step of its block's scale",
          "[cpu_linear][q8]") {
  torch::manual_seed(5);
  for (int64_t k : {1, 31, 32, 33, 64, 100, 768}) {
    auto w = torch::randn({7, k}) * 0.05;
    w[3].zero_();  // a row of zeros: scale 0, values 0
    const auto q = quantize_q8(w);
    INFO("k " << k);
    REQUIRE(q.scalar_type() == torch::kInt8);
    REQUIRE(q.sizes() == torch::IntArrayRef({7, q8_row_bytes(k)}));
    REQUIRE(q8_in_features(q) == k);
    const auto back = dequantize_q8(q, k);
    REQUIRE(back.sizes() == w.sizes());
    REQUIRE(torch::equal(back[3], torch::zeros({k})));
    // |w - back| <= step / 2 per block, step = max|w| / 127, plus the f16 rounding of the step
    // (relative 2^-11, or absolute 2^-25 for a step below f16's normal range: a short last
    // block may hold one tiny weight) times up to 127 steps.
    for (int64_t b0 = 0; b0 < k; b0 += kQ8BlockSize) {
      const int64_t len = std::min<int64_t>(kQ8BlockSize, k - b0);
      const auto block = w.narrow(1, b0, len);
      const auto step = block.abs().amax(1, /*keepdim=*/true) / 127.0;
      const auto err = (block - back.narrow(1, b0, len)).abs();
      REQUIRE((err <= step * (0.5 + 127.0 / 2048) * (1 + 1e-6) + 127 * 3e-8).all().item<bool>());
    }
  }
  REQUIRE(q8_in_features(torch::zeros({2, 35}, torch::kInt8)) == -1);  // no k gives 35 bytes
  REQUIRE_THROWS(dequantize_q8(torch::zeros({2, 35}, torch::kInt8), 32));
}

TEST_CASE("q8 weights with f32 x equal torch::linear on the dequantized weights",
          "[cpu_linear][kernels][q8]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  torch::manual_seed(12);
  auto kernels = available_kernels();
  kernels.insert(kernels.begin(), CpuLinearKernel::kNone);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    for (int threads : {1, 2}) {
      set_kernel_threads(threads);
      // Integer sums (1-4 rows), dequantized weight rows (5-12), lanes (13 on), the long path.
      for (int64_t m : {1, 2, 3, 4, 5, 7, 12, 13, 17, 40, 65, 256, 257, 300}) {
        // Whole blocks, a short last block, a row shorter than a vector.
        for (int64_t k : {5, 32, 33, 100, 257}) {
          for (int64_t n : {1, 5, 13, 191}) {
            auto x = torch::randn({m, k});
            auto q = quantize_q8(torch::randn({n, k}));
            auto got = linear_layer(x, q);
            // The dequantized weights are exact in f32, so the kernels' sums are f32 sums of
            // exact products: 1e-5 relative to the largest output, as for the other dtypes. Up
            // to kCpuLinearQ8IntegerRows rows the kernels meet x rounded to 8 bits (integer
            // sums, exact), so the reference takes x rounded the same way.
            const bool x_rounded = kernel != CpuLinearKernel::kNone && m <= kCpuLinearQ8IntegerRows;
            auto want = torch::linear((x_rounded ? q8_rounded_rows(x) : x).to(torch::kFloat64),
                                      dequantize_q8(q, k).to(torch::kFloat64));
            INFO(cpu_linear_name(kernel)
                 << " threads " << threads << " m " << m << " k " << k << " n " << n);
            REQUIRE(got.sizes() == want.sizes());
            REQUIRE(got.scalar_type() == torch::kFloat32);
            REQUIRE(max_rel_error(got.to(torch::kFloat64), want) < 1e-5);
            ++checked;
          }
        }
      }
    }
    // A model-sized decode step and question, batch and token axes; a weight past 4M elements
    // on the long path (dequantized in blocks of rows).
    set_kernel_threads(2);
    auto q = quantize_q8(torch::randn({2048, 768}));
    for (int64_t tokens : {1, 16}) {
      auto x = torch::randn({1, tokens, 768});
      auto got = linear_layer(x, q);
      REQUIRE(got.sizes() == torch::IntArrayRef({1, tokens, 2048}));
      auto xr = kernel != CpuLinearKernel::kNone && tokens <= kCpuLinearQ8IntegerRows
                    ? q8_rounded_rows(x[0]).unsqueeze(0)
                    : x;
      REQUIRE(max_rel_error(got.to(torch::kFloat64),
                            torch::linear(xr.to(torch::kFloat64),
                                          dequantize_q8(q, 768).to(torch::kFloat64))) < 1e-5);
      // Against f32 x, the 8-bit x of a decode step costs well under 1% of the largest output.
      REQUIRE(max_rel_error(got.to(torch::kFloat64),
                            torch::linear(x.to(torch::kFloat64),
                                          dequantize_q8(q, 768).to(torch::kFloat64))) < 1e-2);
    }
    auto big = quantize_q8(torch::randn({4101, 1027}));
    auto xl = torch::randn({kCpuLinearMaxRows + 1, 1027});
    REQUIRE(max_rel_error(linear_layer(xl, big).to(torch::kFloat64),
                          torch::linear(xl.to(torch::kFloat64),
                                        dequantize_q8(big, 1027).to(torch::kFloat64))) < 1e-5);
    // An x whose width does not match the rows is an error naming both.
    REQUIRE_THROWS_WITH(linear_layer(torch::randn({2, 767}), q),
                        Catch::Contains("do not hold 767 inputs"));
  }
  REQUIRE(checked == static_cast<int>(kernels.size()) * 2 * 14 * 5 * 4);
}
