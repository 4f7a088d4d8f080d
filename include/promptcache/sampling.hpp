// promptcache/sampling.hpp — choosing the next token from logits (no LibTorch).
//
// Greedy (temperature 0), temperature, top-k, top-p and a repetition penalty, driven by a seeded
// RNG whose stream is the same on every platform (SplitMix64, not std::uniform_*_distribution).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"

namespace promptcache {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy (argmax)
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float repetition_penalty = 1.0f;  // 1 = off; >1 discourages tokens already in the context
  std::uint64_t seed = 0;
  int max_new_tokens = 64;
  std::vector<TokenId> stop_token_ids;  // in addition to the model's EOS ids
  std::vector<std::string> stop_strings;
  bool stop_at_eos = true;

  // Error(kInvalidArgument) naming the field on out-of-range values.
  void validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), state_(params.seed) {}
  // Picks a token from `n` float logits; `history` holds the ids the repetition penalty sees.
  TokenId sample(const float* logits, std::size_t n, const std::vector<TokenId>& history);

 private:
  double next_uniform();  // [0, 1)
  SamplingParams params_;
  std::uint64_t state_;
  std::vector<float> scratch_;
  std::vector<std::int32_t> order_;
};

}  // namespace promptcache
