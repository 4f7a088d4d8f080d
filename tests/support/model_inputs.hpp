// tests/support/model_inputs.hpp — the inputs the model tests' plain reference forwards take:
// random token ids, a [1, n] id row, and a full causal mask as nested bools.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <random>
#include <vector>

namespace promptcache::test {

inline std::vector<std::vector<bool>> causal_mask(int64_t n) {
  std::vector<std::vector<bool>> m(n, std::vector<bool>(n, false));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) m[i][j] = true;
  return m;
}

inline std::vector<int64_t> random_ids(int64_t n, int64_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(rng() % vocab);
  return ids;
}

inline torch::Tensor row(const std::vector<int64_t>& v) {
  return torch::tensor(v, torch::kInt64).unsqueeze(0);
}

}  // namespace promptcache::test
