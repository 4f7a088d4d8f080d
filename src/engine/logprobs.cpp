#include "promptcache/logprobs.hpp"

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "promptcache/error.hpp"

namespace promptcache {

TokenLogprob token_logprob(const float* logits, std::size_t n, TokenId chosen, int top) {
  if (top < 0 || top > kMaxTopLogprobs) {
    throw Error(ErrorKind::kInvalidArgument, "top_logprobs must be from 0 to " +
                                                 std::to_string(kMaxTopLogprobs) + ", got " +
                                                 std::to_string(top));
  }
  if (n == 0 || chosen < 0 || static_cast<std::size_t>(chosen) >= n) {
    throw Error(ErrorKind::kInvalidArgument, "token_logprob: token " + std::to_string(chosen) +
                                                 " outside " + std::to_string(n) + " logits");
  }
  double max = logits[0];
  for (std::size_t i = 1; i < n; ++i) max = std::max(max, static_cast<double>(logits[i]));
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  TokenLogprob out;
  out.token = chosen;
  out.logprob = static_cast<double>(logits[chosen]) - log_z;
  if (top == 0) return out;
  // A min-heap of the `top` best (logit, id): the worst kept one on top.
  const auto k = std::min<std::size_t>(static_cast<std::size_t>(top), n);
  std::vector<std::pair<float, TokenId>> heap;
  heap.reserve(k);
  // Greater = better: a higher logit, or the same logit and a lower id.
  const auto better = [](const std::pair<float, TokenId>& a, const std::pair<float, TokenId>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const std::pair<float, TokenId> item{logits[i], static_cast<TokenId>(i)};
    if (heap.size() < k) {
      heap.push_back(item);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(item, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = item;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  out.top.reserve(heap.size());
  for (const auto& [logit, id] : heap) out.top.emplace_back(id, static_cast<double>(logit) - log_z);
  return out;
}

void check_prompt_ids(const LlamaModel& model, const std::vector<TokenId>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t vocab = model.config().vocab_size;
  const int64_t limit = model.config().max_position_embeddings;
  if (n > limit) {
    throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(n) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(limit));
  }
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab) {
      throw Error(ErrorKind::kInvalidArgument, "prompt token id " + std::to_string(id) +
                                                   " is outside the model's vocabulary of " +
                                                   std::to_string(vocab));
    }
  }
}

std::vector<TokenLogprob> prompt_logprobs(const LlamaModel& model, const std::vector<TokenId>& ids,
                                          int top, int64_t chunk, std::vector<float>* next) {
  check_prompt_ids(model, ids);
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<TokenLogprob> out;
  if (next != nullptr) next->clear();
  // Without `next`, the last token's logits predict nothing in the prompt: it is not run.
  const int64_t run = next != nullptr ? n : n - 1;
  if (run < 1) return out;
  out.reserve(static_cast<std::size_t>(n - 1));
  chunk = std::max<int64_t>(chunk, 1);
  KVCache cache = model.make_cache(run);
  ForwardOptions options;
  options.all_logits = true;
  for (int64_t begin = 0; begin < run; begin += chunk) {
    const int64_t len = std::min(chunk, run - begin);
    std::vector<int64_t> part(ids.begin() + begin, ids.begin() + begin + len);
    auto positions = torch::arange(begin, begin + len, torch::kInt64).unsqueeze(0);
    auto logits =
        model.forward(torch::tensor(part, torch::kInt64).unsqueeze(0), positions, cache, options);
    auto host = logits.reshape({len, -1}).to(torch::kCPU, torch::kFloat32).contiguous();
    const float* data = host.data_ptr<float>();
    const auto width = static_cast<std::size_t>(host.size(1));
    for (int64_t t = 0; t < len; ++t) {
      const float* row = data + t * static_cast<int64_t>(width);
      if (begin + t + 1 < n) {
        out.push_back(token_logprob(row, width, ids[static_cast<std::size_t>(begin + t + 1)], top));
      } else {
        next->assign(row, row + width);
      }
    }
  }
  return out;
}

}  // namespace promptcache
