// OpenBLAS's kernels (promptcache/model/blas_core.hpp): which generic cores are replaced by what
// the processor's features allow, that select_blas_core() leaves none of them in place on a
// processor with AVX2, and that the GEMMs still compute the right thing after the switch.
#include "support/catch_torch.hpp"

#include <cstdlib>
#include <tuple>

#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

TEST_CASE("better_blas_core replaces generic cores only, by the processor's features",
          "[blas_core]") {
  // Generic cores (SSE only, or AVX without AVX2) go to the widest the features allow.
  CHECK(better_blas_core("Prescott", true, true, true) == "Cooperlake");
  CHECK(better_blas_core("prescott", true, true, false) == "SkylakeX");
  CHECK(better_blas_core("Nehalem", true, false, false) == "Haswell");
  CHECK(better_blas_core("Sandybridge", true, false, false) == "Haswell");
  CHECK(better_blas_core("Core2", false, false, false).empty());
  CHECK(better_blas_core("Sandybridge", false, false, false).empty());
  // A core OpenBLAS chose from a model it knows stays, and so does a name it does not list.
  CHECK(better_blas_core("Haswell", true, true, true).empty());
  CHECK(better_blas_core("Zen", true, true, true).empty());
  CHECK(better_blas_core("SkylakeX", true, true, true).empty());
  CHECK(better_blas_core("Cooperlake", true, true, true).empty());
  CHECK(better_blas_core("SomethingNew", true, true, true).empty());
}

TEST_CASE("select_blas_core leaves no generic core on a processor with AVX2", "[blas_core]") {
  configure_threads(0);  // what every executable does first; it selects the core
  const BlasCore& core = select_blas_core();
  if (!core.openblas) {
    WARN("OpenBLAS with run-time kernel choice not found (" << core.note << "): nothing to check");
    return;
  }
  WARN("OpenBLAS chose " << core.detected << "; in use: " << core.core << " (" << core.note << ")");
  CHECK(&select_blas_core() == &core);  // decided once
#if defined(__x86_64__)
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    // Whatever OpenBLAS chose, nothing better is left to switch to ...
    CHECK(better_blas_core(core.core, avx2_fma, avx512, false).empty());
    // ... and a switch happened exactly when OpenBLAS's own choice was generic.
    CHECK(core.switched == !better_blas_core(core.detected, avx2_fma, avx512, false).empty());
  }
#endif
  // The GEMMs (f32 and f64, several shapes with tails) against a plain triple loop in f64.
  torch::manual_seed(3);
  for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{67, 131, 45}, {256, 96, 130}}) {
    auto a = torch::randn({m, k}), b = torch::randn({k, n});
    auto a64 = a.to(torch::kFloat64), b64 = b.to(torch::kFloat64);
    auto ref = torch::zeros({m, n}, torch::kFloat64);
    auto pa = a64.accessor<double, 2>(), pb = b64.accessor<double, 2>();
    auto pr = ref.accessor<double, 2>();
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < n; ++j) pr[i][j] += pa[i][p] * pb[p][j];
      }
    }
    CHECK((torch::mm(a, b).to(torch::kFloat64) - ref).abs().max().item<double>() < 1e-3);
    CHECK((torch::mm(a64, b64) - ref).abs().max().item<double>() < 1e-9);
  }
}
