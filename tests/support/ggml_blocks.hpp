// Random GGML blocks for the block-quantized weight tests: every byte random except the f16
// scales, which are finite (random bits there would give infinities and NaNs, on which equality
// says nothing) and of either sign.
#pragma once

#include <cstring>

#include "promptcache/model/ggml_quant.hpp"
#include "support/catch_torch.hpp"

namespace promptcache::test {

inline torch::Tensor random_blocks(int64_t rows, int64_t k, ggml::Type t) {
  const int64_t nb = k / ggml::block_elements(t), bytes = ggml::block_bytes(t);
  auto q = torch::randint(0, 256, {rows, nb, bytes}, torch::kUInt8);
  auto scales = (torch::randn({rows, nb, 2}) * 0.05).to(torch::kFloat16).contiguous();
  const auto* s = static_cast<const uint8_t*>(scales.data_ptr());
  uint8_t* p = q.data_ptr<uint8_t>();
  // Where the f16 fields lie: d at 0 (Q4_0, Q5_0, Q8_0), d and dmin (or m) at 0 and 2 (Q4_K,
  // Q5_K, Q5_1), d at 208 (Q6_K).
  for (int64_t i = 0; i < rows * nb; ++i) {
    uint8_t* b = p + i * bytes;
    if (t == ggml::Type::Q6_K) {
      std::memcpy(b + 208, s + i * 4, 2);
    } else {
      std::memcpy(b, s + i * 4, 2);
      if (t == ggml::Type::Q4_K || t == ggml::Type::Q5_K || t == ggml::Type::Q5_1) {
        std::memcpy(b + 2, s + i * 4 + 2, 2);
      }
    }
  }
  return q;
}

}  // namespace promptcache::test
