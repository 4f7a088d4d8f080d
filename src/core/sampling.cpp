#include "promptcache/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

#include "promptcache/error.hpp"

namespace promptcache {

void SamplingParams::validate() const {
  auto bad = [](const std::string& what) { throw Error(ErrorKind::kInvalidArgument, what); };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    bad("temperature must be a finite number >= 0, not " + std::to_string(temperature));
  }
  if (top_k < 0) bad("top-k must be >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top-p must be in (0, 1]");
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    bad("repetition penalty must be > 0");
  }
  if (max_new_tokens < 0) bad("max new tokens must be >= 0");
}

double Sampler::next_uniform() {
  // SplitMix64: tiny, fast and the same stream everywhere.
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

TokenId Sampler::sample(const float* logits, std::size_t n, const std::vector<TokenId>& history) {
  scratch_.assign(logits, logits + n);
  if (params_.repetition_penalty != 1.0f) {
    // As in CTRL / HF: divide positive logits, multiply negative ones, once per distinct token.
    std::unordered_set<TokenId> seen(history.begin(), history.end());
    for (TokenId id : seen) {
      if (id < 0 || static_cast<std::size_t>(id) >= n) continue;
      float& l = scratch_[id];
      l = l > 0 ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    }
  }
  if (params_.temperature == 0.0f) {
    return static_cast<TokenId>(std::max_element(scratch_.begin(), scratch_.end()) -
                                scratch_.begin());
  }
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::size_t keep = n;
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return scratch_[a] > scratch_[b] || (scratch_[a] == scratch_[b] && a < b);
  };
  if (params_.top_k > 0 && static_cast<std::size_t>(params_.top_k) < n) {
    keep = static_cast<std::size_t>(params_.top_k);
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), by_logit);
  } else {
    std::sort(order_.begin(), order_.end(), by_logit);
  }
  // Softmax over the kept candidates at the given temperature (max-subtracted for stability).
  const float top = scratch_[order_[0]];
  std::vector<double> probs(keep);
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((scratch_[order_[i]] - top) / params_.temperature);
    total += probs[i];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0;
    std::size_t cut = keep;
    for (std::size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / total;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  const double r = next_uniform() * total;
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (r < acc) return order_[i];
  }
  return order_[keep - 1];
}

}  // namespace promptcache
