// The fused small-row steps (RMSNorm; RoPE with the queries' scale and the keys' and values' move
// into the KV cache) equal the library operators they replace, leave the rest of the cache
// alone, refuse what they do not take, and apply only where LlamaModel should take them.
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <cmath>

#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/cpu_ops.hpp"
#include "support/cpu_kernels.hpp"

using namespace promptcache;
using test::KernelGuard;

namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// RoPE as LlamaModel writes it with library operators: x [b, heads, n, d], cos/sin [b, n, d].
torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1);
}

double max_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>();
}

}  // namespace

TEST_CASE("fused RMSNorm equals the library operators", "[kernels][ops]") {
  torch::manual_seed(3);
  for (int64_t h : {1, 7, 64, 768}) {
    INFO("h = " << h);
    auto x = torch::randn({2, 5, h}) * 3.0;
    auto weight = torch::randn({h});
    const double eps = 1e-5;
    auto want = weight * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
    auto got = cpu_rms_norm(x, weight, eps);
    REQUIRE(got.sizes() == x.sizes());
    CHECK(max_error(got, want) <= 1e-5 * (1.0 + want.abs().max().item<double>()));
    // A strided input (the last token of each row, as the final norm takes it) is read right.
    auto last = x.narrow(1, 4, 1);
    CHECK(max_error(cpu_rms_norm(last, weight, eps), want.narrow(1, 4, 1)) <=
          1e-5 * (1.0 + want.abs().max().item<double>()));
  }
  // A row of zeros gives zeros (eps keeps the scale finite).
  auto zeros = cpu_rms_norm(torch::zeros({1, 8}), torch::ones({8}), 1e-6);
  CHECK(zeros.abs().max().item<double>() == 0.0);
  REQUIRE_THROWS_WITH(cpu_rms_norm(torch::randn({2, 8}), torch::randn({7}), 1e-5),
                      Catch::Contains("cpu_rms_norm") && Catch::Contains("weight"));
  REQUIRE_THROWS_WITH(cpu_rms_norm(torch::randn({2, 8}, torch::kFloat64), torch::randn({8}), 1e-5),
                      Catch::Contains("f32"));
}

TEST_CASE("fused RoPE scales the queries and writes rotated keys and values into the cache",
          "[kernels][ops]") {
  torch::manual_seed(4);
  const int64_t b = 2, n = 3, hkv = 2, groups = 3, hq = hkv * groups, d = 16, capacity = 10;
  const int64_t past = 4;  // the new tokens go to slots [past, past + n)
  auto q = torch::randn({b, n, hq * d});
  auto k = torch::randn({b, n, hkv * d});
  auto v = torch::randn({b, n, hkv * d});
  auto angles = torch::rand({b, n, d / 2}) * 20.0;
  auto cos = torch::cat({angles, angles}, -1).cos();
  auto sin = torch::cat({angles, angles}, -1).sin();
  auto keys = torch::full({b, hkv, capacity, d}, 7.0f);
  auto values = torch::full({b, hkv, capacity, d}, 7.0f);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  auto q_rot = cpu_rope_into_cache(q, k, v, cos, sin, scale, keys.narrow(2, past, n),
                                   values.narrow(2, past, n));
  REQUIRE(q_rot.sizes() == at::IntArrayRef({b, hq, n, d}));
  REQUIRE(q_rot.is_contiguous());
  auto want_q = rope(q.view({b, n, hq, d}).transpose(1, 2), cos, sin) * scale;
  auto want_k = rope(k.view({b, n, hkv, d}).transpose(1, 2), cos, sin);
  auto want_v = v.view({b, n, hkv, d}).transpose(1, 2);
  CHECK(max_error(q_rot, want_q) <= 1e-6);
  CHECK(max_error(keys.narrow(2, past, n), want_k) <= 1e-6);
  CHECK(max_error(values.narrow(2, past, n), want_v) == 0.0);
  // The other slots are untouched.
  for (auto* t : {&keys, &values}) {
    CHECK((t->narrow(2, 0, past) == 7.0f).all().item<bool>());
    CHECK((t->narrow(2, past + n, capacity - past - n) == 7.0f).all().item<bool>());
  }
  // The queries come out grouped by KV head as the fused attention reads them: row g * n + i of
  // KV head h is token i of query head h * groups + g.
  auto grouped = q_rot.view({b, hkv, groups * n, d});
  CHECK(max_error(grouped[1][1][2 * n + 1], want_q[1][1 * groups + 2][1]) == 0.0);
}

TEST_CASE("fused RoPE refuses what it does not take", "[kernels][ops]") {
  const int64_t b = 1, n = 2, d = 8;
  auto q = torch::randn({b, n, 4 * d}), kv = torch::randn({b, n, 2 * d});
  auto cs = torch::randn({b, n, d});
  auto dst = torch::zeros({b, 2, n, d});
  CHECK_NOTHROW(cpu_rope_into_cache(q, kv, kv, cs, cs, 1.0, dst, dst.clone()));
  REQUIRE_THROWS_WITH(cpu_rope_into_cache(q, kv, kv, torch::randn({b, n, 7}),
                                          torch::randn({b, n, 7}), 1.0, dst, dst.clone()),
                      Catch::Contains("cpu_rope_into_cache") && Catch::Contains("even"));
  REQUIRE_THROWS_WITH(
      cpu_rope_into_cache(q, torch::randn({b, n, 3 * d}), kv, cs, cs, 1.0, dst, dst.clone()),
      Catch::Contains("shapes do not match"));
  REQUIRE_THROWS_WITH(
      cpu_rope_into_cache(q, kv, kv, cs, cs, 1.0, torch::zeros({b, 2, n + 1, d}), dst.clone()),
      Catch::Contains("shapes do not match"));
  // Cache rows must be dense: a view with d not innermost is refused, not written wrongly.
  auto strided = torch::zeros({b, 2, d, n}).transpose(2, 3);
  REQUIRE_THROWS_WITH(cpu_rope_into_cache(q, kv, kv, cs, cs, 1.0, strided, dst.clone()),
                      Catch::Contains("dense"));
  REQUIRE_THROWS_WITH(
      cpu_rope_into_cache(q.to(torch::kFloat64), kv, kv, cs, cs, 1.0, dst, dst.clone()),
      Catch::Contains("f32"));
}

TEST_CASE("the fused steps apply to a few f32 rows on the CPU with the kernels on",
          "[kernels][ops]") {
  KernelGuard guard;
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  CHECK_FALSE(cpu_small_ops_apply(torch::zeros({1, 16, 64})));
  bool any = false;
  for (auto kernel : test::available_kernels()) {
    REQUIRE(select_cpu_linear(kernel));
    any = true;
    INFO(cpu_linear_name(kernel));
    CHECK(cpu_small_ops_apply(torch::zeros({1, 16, 64})));
    CHECK(cpu_small_ops_apply(torch::zeros({2, kCpuLinearMaxRows / 2, 64})));
    CHECK_FALSE(cpu_small_ops_apply(torch::zeros({1, kCpuLinearMaxRows + 1, 64})));
    CHECK_FALSE(cpu_small_ops_apply(torch::zeros({1, 16, 64}, torch::kBFloat16)));
    CHECK_FALSE(cpu_small_ops_apply(torch::zeros({1, 16, 64}, torch::kFloat64)));
  }
  if (!any) WARN("no SIMD kernels on this processor: the fused steps never apply here");
}
