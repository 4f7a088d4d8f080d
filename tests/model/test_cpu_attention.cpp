// The fused few-query CPU attention equals softmax(q kᵀ, masked) v computed in double precision
// for every kernel the processor has, across head sizes, row counts (every register-block and
// row-chunk tail), slot counts (whole and partial key blocks), masks and thread counts.
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/threads.hpp"
#include "support/cpu_kernels.hpp"

using namespace promptcache;
using test::available_kernels;
using test::KernelGuard;

namespace {

// qg [b, h, groups * n, d], keys/values [b, h, slots, d], mask [n, slots] / [b, n, slots] or
// undefined; slots before `open` are visible to every row. Rows that see nothing give zeros.
torch::Tensor reference(const torch::Tensor& qg, const torch::Tensor& keys,
                        const torch::Tensor& values, const torch::Tensor& mask, int64_t open) {
  const int64_t b = qg.size(0), rows = qg.size(2), slots = keys.size(2);
  auto scores = torch::matmul(qg.to(torch::kFloat64), keys.to(torch::kFloat64).transpose(-1, -2));
  if (mask.defined()) {
    const int64_t n = mask.size(-2);
    auto visible = mask.dim() == 3 ? mask : mask.unsqueeze(0).expand({b, n, slots});
    visible = visible.clone();
    visible.narrow(-1, 0, open).fill_(true);
    // Row g * n + i is token i: repeat the token rows over the groups, broadcast over heads.
    visible = visible.repeat({1, rows / n, 1}).unsqueeze(1);
    scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  }
  auto p = scores.softmax(-1).nan_to_num(0.0);  // a row that sees nothing: all -inf, NaN
  return torch::matmul(p, values.to(torch::kFloat64));
}

double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kFloat64) - want).abs().max().item<double>();
}

// Runs of random lengths (`len` picks each), every other one shared by the batch rows
// ([1, h, len, d]) as a stored module block is, in `dtype`; keys/values are all of them as one
// f32 run [b, h, slots, d] (what the kernel reads, converted), for the reference.
struct RandomRuns {
  std::vector<KVSegment> runs;
  torch::Tensor keys, values;
  int64_t slots = 0;
};
RandomRuns random_runs(int count, int64_t b, int64_t h, int64_t d, torch::Dtype dtype,
                       const std::function<int64_t(int)>& len) {
  RandomRuns out;
  std::vector<torch::Tensor> ks, vs;
  for (int r = 0; r < count; ++r) {
    const int64_t n = len(r);
    const int64_t rb = r % 2 == 0 ? 1 : b;
    auto k = torch::randn({rb, h, n, d}).to(dtype), v = torch::randn({rb, h, n, d}).to(dtype);
    out.runs.push_back({k, v});
    ks.push_back(k.to(torch::kFloat32).expand({b, h, n, d}));
    vs.push_back(v.to(torch::kFloat32).expand({b, h, n, d}));
    out.slots += n;
  }
  out.keys = torch::cat(ks, 2);
  out.values = torch::cat(vs, 2);
  return out;
}

}  // namespace

TEST_CASE("fused CPU attention equals the double-precision reference", "[attention][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  const auto kernels = available_kernels();
  if (kernels.empty()) {
    WARN("this processor has neither AVX2+FMA nor AVX-512F: the fused attention is not built");
    REQUIRE_FALSE(cpu_attention_available(64));
    return;
  }
  torch::manual_seed(3);
  std::mt19937 rng(17);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    for (int64_t d : {8, 16, 24, 64, 80, 128}) {
      if (!cpu_attention_available(d)) continue;
      for (int64_t groups : {1, 3}) {
        for (int64_t n : {1, 2, 5, 16, 17}) {
          for (int64_t past : {0, 7, 31, 64, 200}) {
            const int64_t slots = past + n;
            const int64_t b = n % 2 == 0 ? 2 : 1, h = 2;
            // Scaled as the model scales its queries (1/sqrt(d)): scores of std 2.
            auto q = torch::randn({b, h, groups * n, d}) * (2.0 / std::sqrt(double(d)));
            auto k = torch::randn({b, h, slots, d});
            auto v = torch::randn({b, h, slots, d});
            // Causal over the fresh tokens after `past` open slots (the cached-request case).
            auto causal = torch::ones({n, slots}, torch::kBool);
            causal.narrow(1, past, n).copy_(torch::tril(torch::ones({n, n}, torch::kBool)));
            // Random gaps anywhere after a random open prefix, one mask per batch row.
            const int64_t open = static_cast<int64_t>(rng() % (past + 1));
            auto gaps = torch::rand({b, n, slots}) < 0.6;
            for (int threads : {1, 2, 3}) {
              INFO(cpu_linear_name(kernel) << " d " << d << " groups " << groups << " n " << n
                                           << " past " << past << " threads " << threads);
              auto none = attend_few_queries(q, k, v, torch::Tensor(), slots, threads);
              REQUIRE(none.sizes() == q.sizes());
              REQUIRE(max_error(none, reference(q, k, v, torch::Tensor(), slots)) < 1e-5);
              auto c = attend_few_queries(q, k, v, causal, past, threads);
              REQUIRE(max_error(c, reference(q, k, v, causal, past)) < 1e-5);
              auto g = attend_few_queries(q, k, v, gaps, open, threads);
              REQUIRE(max_error(g, reference(q, k, v, gaps, open)) < 1e-5);
              checked += 3;
            }
          }
        }
      }
    }
  }
  REQUIRE(checked >= 2 * 5 * 5 * 3 * 3);
}

TEST_CASE("fused CPU attention over several runs of slots equals one run", "[attention][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  const auto kernels = available_kernels();
  if (kernels.empty()) {
    WARN("this processor has neither AVX2+FMA nor AVX-512F: the fused attention is not built");
    return;
  }
  torch::manual_seed(8);
  std::mt19937 rng(23);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    for (int64_t d : {8, 16, 64}) {
      if (!cpu_attention_available(d)) continue;
      // 5 rows take dot products, 12 rows and more run along the vector lanes
      // (kAttendLaneMinRows), 100 rows in several chunks.
      for (int64_t rows : {5, 12, 17, 40, 100}) {
        for (int trial = 0; trial < 4; ++trial) {
          const int64_t b = 2, h = 2;
          // Runs of random lengths (single slots and runs that start mid-tile among them).
          const int count = 1 + static_cast<int>(rng() % 5);
          const auto made = random_runs(count, b, h, d, torch::kFloat32, [&](int r) {
            return r % 3 == 2 ? int64_t{1} : 1 + static_cast<int64_t>(rng() % 70);
          });
          const auto& runs = made.runs;
          const auto &k = made.keys, &v = made.values;
          const int64_t slots = made.slots;
          const auto q = torch::randn({b, h, rows, d}) * (2.0 / std::sqrt(double(d)));
          const int64_t open = static_cast<int64_t>(rng() % (slots + 1));
          const auto gaps = torch::rand({b, rows, slots}) < 0.5;
          INFO(cpu_linear_name(kernel)
               << " d " << d << " rows " << rows << " runs " << count << " slots " << slots);
          const auto got = attend_few_queries(q, runs, gaps, open, 2);
          REQUIRE(max_error(got, reference(q, k, v, gaps, open)) < 1e-5);
          const auto all = attend_few_queries(q, runs, torch::Tensor(), slots, 1);
          REQUIRE(max_error(all, reference(q, k, v, torch::Tensor(), slots)) < 1e-5);
          // first_slots: the runs of a prefix, the last one cut.
          const int64_t prefix = 1 + static_cast<int64_t>(rng() % slots);
          const auto cut = first_slots(runs, prefix);
          int64_t cut_slots = 0;
          for (const auto& r : cut) cut_slots += r.slots();
          REQUIRE(cut_slots == prefix);
          const auto part = attend_few_queries(q, cut, torch::Tensor(), prefix, 2);
          REQUIRE(max_error(part, reference(q, k.narrow(2, 0, prefix), v.narrow(2, 0, prefix),
                                            torch::Tensor(), prefix)) < 1e-5);
          checked += 3;
        }
      }
    }
  }
  REQUIRE(checked >= 3 * 3 * 4 * 3);
  // A run must match the queries' heads and head size, and there must be one.
  const auto q = torch::randn({1, 2, 4, 16});
  CHECK_THROWS_WITH(attend_few_queries(q, std::vector<KVSegment>{}, torch::Tensor(), 0, 1),
                    Catch::Contains("at least one run"));
  CHECK_THROWS_WITH(
      attend_few_queries(
          q, std::vector<KVSegment>{{torch::randn({1, 3, 4, 16}), torch::randn({1, 3, 4, 16})}},
          torch::Tensor(), 0, 1),
      Catch::Contains("matching the queries"));
}

TEST_CASE("fused CPU attention reads bf16 and f16 keys and values", "[attention][kernels]") {
  // The kernel converts each key and value to f32 as it reads it and computes in f32: the
  // reference is the double-precision attention over the converted keys and values, to the
  // same 1e-5 as f32 inputs. Runs of several lengths (some shared by the batch rows, as stored
  // module blocks are), decode-sized and lane-sized row counts, odd slot counts (partial key
  // and value blocks of the conversion).
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  const auto kernels = available_kernels();
  if (kernels.empty()) {
    WARN("this processor has neither AVX2+FMA nor AVX-512F: the fused attention is not built");
    return;
  }
  torch::manual_seed(12);
  std::mt19937 rng(41);
  int checked = 0;
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
      REQUIRE(cpu_attention_takes(torch::TensorOptions().dtype(dtype), 64));
      for (int64_t d : {8, 64, 80, 128}) {
        if (!cpu_attention_available(d)) continue;
        for (int64_t rows : {1, 3, 11, 12, 17, 48, 100}) {
          const int64_t b = 2, h = 2;
          const int count = 1 + static_cast<int>(rng() % 4);
          const auto made = random_runs(count, b, h, d, dtype,
                                        [&](int) { return 1 + static_cast<int64_t>(rng() % 150); });
          const auto& runs = made.runs;
          const auto &k = made.keys, &v = made.values;
          const int64_t slots = made.slots;
          const auto q = torch::randn({b, h, rows, d}) * (2.0 / std::sqrt(double(d)));
          const int64_t open = static_cast<int64_t>(rng() % (slots + 1));
          const auto gaps = torch::rand({b, rows, slots}) < 0.5;
          INFO(cpu_linear_name(kernel) << " " << c10::toString(dtype) << " d " << d << " rows "
                                       << rows << " runs " << count << " slots " << slots);
          for (int threads : {1, 2}) {
            const auto got = attend_few_queries(q, runs, gaps, open, threads);
            REQUIRE(got.scalar_type() == torch::kFloat32);
            REQUIRE(max_error(got, reference(q, k, v, gaps, open)) < 1e-5);
            const auto all = attend_few_queries(q, runs, torch::Tensor(), slots, threads);
            REQUIRE(max_error(all, reference(q, k, v, torch::Tensor(), slots)) < 1e-5);
            checked += 2;
          }
        }
      }
    }
  }
  REQUIRE(checked >= 2 * 3 * 7 * 4);
  // One call reads one dtype: runs of different dtypes are refused.
  if (cpu_attention_available(16)) {
    const auto q = torch::randn({1, 2, 4, 16});
    const auto f32 = torch::randn({1, 2, 5, 16});
    const auto bf16 = f32.to(torch::kBFloat16);
    CHECK_THROWS_WITH(attend_few_queries(q, std::vector<KVSegment>{{bf16, bf16}, {f32, f32}},
                                         torch::Tensor(), 0, 1),
                      Catch::Contains("all of one dtype"));
    CHECK_THROWS_WITH(attend_few_queries(q, bf16, f32, torch::Tensor(), 0, 1),
                      Catch::Contains("all of one dtype"));
  }
}

TEST_CASE("fused CPU attention: long rows, large scores and rows that see nothing",
          "[attention][kernels]") {
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  if (!cpu_attention_available(64)) {
    WARN("no fused attention for a 64-wide head on this processor or build");
    return;
  }
  torch::manual_seed(5);
  // 192 rows (3 groups of 64 tokens: several row chunks) over 2100 slots, with scores large
  // enough (std 32, maxima past 88) that e^s would overflow without subtracting the row maximum.
  const int64_t n = 64, slots = 2100, d = 64;
  auto q = torch::randn({1, 2, 3 * n, d}) * 2.0;
  auto k = torch::randn({1, 2, slots, d}) * 2.0;
  auto v = torch::randn({1, 2, slots, d});
  const double top = torch::matmul(q, k.transpose(-1, -2)).abs().max().item<double>();
  REQUIRE(top > 88.0);
  auto got = attend_few_queries(q, k, v, torch::Tensor(), slots, 2);
  REQUIRE(torch::isfinite(got).all().item<bool>());
  // A score of size s carries an f32 rounding error of about s * 6e-8, which the softmax turns
  // into a relative error of the weights: the bound grows with the largest score.
  REQUIRE(max_error(got, reference(q, k, v, torch::Tensor(), slots)) < 1e-5 + 1e-6 * top);
  // A row whose mask closes every slot after an open prefix of 0 gets zeros, not NaN.
  auto mask = torch::ones({2, 40}, torch::kBool);
  mask[1].fill_(false);
  auto q2 = torch::randn({1, 2, 2, d}), k2 = torch::randn({1, 2, 40, d}),
       v2 = torch::randn({1, 2, 40, d});
  auto out = attend_few_queries(q2, k2, v2, mask, 0, 2);
  REQUIRE(out.select(2, 1).abs().max().item<double>() == 0.0);
  REQUIRE(max_error(out, reference(q2, k2, v2, mask, 0)) < 1e-5);
  // A mask that is a view into a larger one (rows and columns of a block, as the model passes
  // them) is read in place and gives what its copy gives.
  auto big = torch::rand({5, 60}) < 0.5;
  big.narrow(1, 0, 3).fill_(true);
  auto view = big.narrow(0, 1, 2).narrow(1, 0, 40);
  REQUIRE_FALSE(view.is_contiguous());
  REQUIRE(torch::equal(attend_few_queries(q2, k2, v2, view, 3, 2),
                       attend_few_queries(q2, k2, v2, view.contiguous(), 3, 2)));
  REQUIRE(max_error(attend_few_queries(q2, k2, v2, view, 3, 2),
                    reference(q2, k2, v2, view.contiguous(), 3)) < 1e-5);
}

TEST_CASE("fused CPU attention is not offered where it does not apply", "[attention][kernels]") {
  KernelGuard guard;
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  REQUIRE_FALSE(cpu_attention_available(64));
  auto q = torch::randn({1, 1, 2, 64});
  auto kv = torch::randn({1, 1, 4, 64});
  REQUIRE_THROWS(attend_few_queries(q, kv, kv, torch::Tensor(), 4, 1));
  for (auto k : {CpuLinearKernel::kAvx2, CpuLinearKernel::kAvx512}) {
    if (!select_cpu_linear(k)) continue;
    INFO(cpu_linear_name(k));
    REQUIRE_FALSE(cpu_attention_available(12));  // not a multiple of 8
    REQUIRE_FALSE(cpu_attention_available(0));
    REQUIRE(cpu_attention_available(64));
    // f64 inputs are refused (the model runs another path for them), and so are shapes that
    // do not fit together.
    REQUIRE_THROWS_WITH(attend_few_queries(q.to(torch::kFloat64), kv.to(torch::kFloat64),
                                           kv.to(torch::kFloat64), torch::Tensor(), 4, 1),
                        Catch::Contains("f32"));
    REQUIRE_THROWS_WITH(
        attend_few_queries(q, kv, torch::randn({1, 1, 5, 64}), torch::Tensor(), 4, 1),
        Catch::Contains("keys and values"));
    REQUIRE_THROWS_WITH(attend_few_queries(q, kv, kv, torch::ones({2, 5}, torch::kBool), 4, 1),
                        Catch::Contains("mask"));
    REQUIRE_THROWS_WITH(attend_few_queries(q, kv, kv, torch::ones({3, 4}, torch::kBool), 4, 1),
                        Catch::Contains("mask"));
    REQUIRE_THROWS_WITH(attend_few_queries(q, kv, kv, torch::Tensor(), 5, 1),
                        Catch::Contains("open"));
    REQUIRE_THROWS_WITH(attend_few_queries(q, kv.transpose(2, 3).contiguous().transpose(2, 3), kv,
                                           torch::Tensor(), 4, 1),
                        Catch::Contains("dense"));
  }
}

TEST_CASE("fused CPU attention with vdpbf16ps: bf16 keys and values as stored",
          "[attention][kernels]") {
  // Under the avx512-bf16 kernels, bf16 keys and values meet 12 query rows and more through
  // vdpbf16ps, the queries and the softmax numerators split into a high and a low bf16 part
  // (x = high + low to 2^-16 |x|). A score is then off by at most 2^-16 sum_i |q_i k_i| besides
  // f32's sums, a weight by the softmax of that plus 2^-16 of itself, so the output by about
  // 2^-15 (1 + max sum_i |q_i k_i|) max |v|: bound, against the double-precision attention,
  // with f32's 1e-5 on top.
  KernelGuard guard;
  torch::NoGradGuard no_grad;
  if (!select_cpu_linear(CpuLinearKernel::kAvx512Bf16)) {
    WARN(
        "SKIPPED: this processor or build lacks AVX512_BF16 (vdpbf16ps): the bf16 attention "
        "is not tested here");
    REQUIRE_FALSE(cpu_attention_bf16_dot(64));
    return;
  }
  REQUIRE(cpu_attention_bf16_dot(64));
  REQUIRE_FALSE(cpu_attention_bf16_dot(8));  // not a multiple of 16: f32 kernels
  torch::manual_seed(13);
  std::mt19937 rng(43);
  double worst_bound = 0, worst = 0;
  int checked = 0;
  for (int64_t d : {16, 64, 128}) {
    for (int64_t rows : {12, 17, 33, 48, 49, 100}) {
      const int64_t b = 2, h = 2;
      const int count = 1 + static_cast<int>(rng() % 4);
      // Odd lengths too: a run's last slot then pairs with a zero weight.
      const auto made = random_runs(count, b, h, d, torch::kBFloat16,
                                    [&](int) { return 1 + static_cast<int64_t>(rng() % 150); });
      const int64_t slots = made.slots;
      const auto q = torch::randn({b, h, rows, d}) * (2.0 / std::sqrt(double(d)));
      const int64_t open = static_cast<int64_t>(rng() % (slots + 1));
      const auto gaps = torch::rand({b, rows, slots}) < 0.5;
      const double top =
          torch::matmul(q.abs(), made.keys.abs().transpose(-1, -2)).max().item<double>();
      const double bound =
          1e-5 + std::ldexp(1.0, -15) * (1.0 + top) * made.values.abs().max().item<double>();
      INFO("d " << d << " rows " << rows << " runs " << count << " slots " << slots);
      for (int threads : {1, 2}) {
        for (bool masked : {true, false}) {
          const auto mask = masked ? gaps : torch::Tensor();
          const int64_t o = masked ? open : slots;
          const auto got = attend_few_queries(q, made.runs, mask, o, threads);
          const double error = max_error(got, reference(q, made.keys, made.values, mask, o));
          REQUIRE(error < bound);
          worst_bound = std::max(worst_bound, error / bound);
          worst = std::max(worst, error);
          ++checked;
        }
      }
      // A row's output does not depend on the other rows of the call: the first 12 rows alone
      // give bitwise what they give among all of them (the mask's token rows: rows % 12 == 0
      // for 12 and 48 only, so those go with a [12, slots] mask, the others without one).
      const auto first = q.narrow(2, 0, 12).contiguous();
      const bool by_token = rows % 12 == 0;
      const auto token_mask = by_token ? gaps.narrow(1, 0, 12) : torch::Tensor();
      const int64_t o = by_token ? open : slots;
      REQUIRE(torch::equal(attend_few_queries(first, made.runs, token_mask, o, 1),
                           attend_few_queries(q, made.runs, token_mask, o, 2).narrow(2, 0, 12)));
    }
  }
  REQUIRE(checked == 3 * 6 * 4);
  WARN("vdpbf16ps attention: largest error " << worst << ", largest error / bound " << worst_bound);
  // Decode-sized calls (under 12 rows) and f16 keys and values keep the f32 kernels: exact.
  const auto made = random_runs(2, 1, 2, 64, torch::kBFloat16, [](int) { return int64_t{70}; });
  const auto q = torch::randn({1, 2, 11, 64}) * 0.25;
  REQUIRE(max_error(attend_few_queries(q, made.runs, torch::Tensor(), made.slots, 2),
                    reference(q, made.keys, made.values, torch::Tensor(), made.slots)) < 1e-5);
  const auto q16 = torch::randn({1, 2, 16, 64}) * 0.25;
  const auto k16 = torch::randn({1, 2, 70, 64}).to(torch::kFloat16);
  const auto v16 = torch::randn({1, 2, 70, 64}).to(torch::kFloat16);
  REQUIRE(max_error(attend_few_queries(q16, k16, v16, torch::Tensor(), 70, 2),
                    reference(q16, k16.to(torch::kFloat32), v16.to(torch::kFloat32),
                              torch::Tensor(), 70)) < 1e-5);
  // The avx512 kernels (selected by hand) keep bf16 exact.
  REQUIRE(select_cpu_linear(CpuLinearKernel::kAvx512));
  REQUIRE_FALSE(cpu_attention_bf16_dot(64));
}
