#include "support/catch_torch.hpp"

#include <map>
#include <set>

#include "promptcache/error.hpp"
#include "promptcache/sampling.hpp"

using namespace promptcache;

namespace {
std::vector<TokenId> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<TokenId> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits.data(), logits.size(), {}));
  return out;
}
const std::vector<float> kLogits = {0.1f, 2.0f, 1.5f, -1.0f, 1.9f, 0.0f, 0.5f, 1.0f};
}  // namespace

TEST_CASE("greedy picks the argmax", "[sampling]") {
  SamplingParams p;
  CHECK(draw(p, kLogits, 3) == std::vector<TokenId>{1, 1, 1});
}

TEST_CASE("sampling is deterministic for a seed and differs across seeds", "[sampling]") {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  const auto a = draw(p, kLogits, 64), b = draw(p, kLogits, 64);
  CHECK(a == b);
  p.seed = 43;
  CHECK(draw(p, kLogits, 64) != a);
  CHECK(std::set<TokenId>(a.begin(), a.end()).size() > 2);  // it really samples
}

TEST_CASE("top-k and top-p restrict the candidates", "[sampling]") {
  SamplingParams p;
  p.temperature = 5.0f;  // nearly flat, so any leak outside the set would show
  p.top_k = 2;
  for (TokenId id : draw(p, kLogits, 200)) CHECK((id == 1 || id == 4));
  p.top_k = 0;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // softmax mass of {1, 4} is ~0.51 at T=1
  for (TokenId id : draw(p, kLogits, 200)) CHECK((id == 1 || id == 4));
}

TEST_CASE("repetition penalty discourages seen tokens", "[sampling]") {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  CHECK(s.sample(kLogits.data(), kLogits.size(), {1}) == 4);  // 2.0/2 = 1.0 < 1.9
  CHECK(s.sample(kLogits.data(), kLogits.size(), {}) == 1);
}

TEST_CASE("sampling parameters are validated", "[sampling]") {
  SamplingParams p;
  p.top_p = 0.0f;
  CHECK_THROWS_AS(p.validate(), Error);
  p.top_p = 1.0f;
  p.temperature = -1.0f;
  CHECK_THROWS_WITH(p.validate(), Catch::Contains("temperature"));
}
