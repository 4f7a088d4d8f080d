// promptcache/logprobs.hpp — log-probabilities of chosen tokens and their likeliest alternatives
// (the `logprobs` / `top_logprobs` / `echo` fields of `promptcache serve`, docs/server.md).
//
// A log-probability here is always the model's own distribution: log-softmax of the raw logits
// at temperature 1, before any sampling adjustment (temperature, top-k, top-p, repetition
// penalty), as OpenAI reports it. Computed in double from float32 logits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "promptcache/model/llama.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache {

// The most alternatives one token may report (OpenAI's top_logprobs limit).
constexpr int kMaxTopLogprobs = 20;

struct TokenLogprob {
  TokenId token = -1;
  double logprob = 0;
  // The `top` likeliest tokens at that step, most likely first (ties: lower id first).
  std::vector<std::pair<TokenId, double>> top;
};

// `chosen`'s log-probability under `n` float logits and the `top` likeliest tokens
// (0 <= top <= kMaxTopLogprobs; Error(kInvalidArgument) otherwise). O(n log top), no allocation
// beyond the result.
TokenLogprob token_logprob(const float* logits, std::size_t n, TokenId chosen, int top);

// Error(kInvalidArgument) for an id outside the model's vocabulary, Error(kContextOverflow) for
// more ids than its context.
void check_prompt_ids(const LlamaModel& model, const std::vector<TokenId>& ids);

// The log-probability of every prompt token after the first (entry i is token i + 1's, given
// tokens 0..i), from ordinary forwards at positions 0..n-1 without any cache reuse, run in chunks
// of `chunk` tokens so that at most chunk x vocab logits exist at once. Error(kInvalidArgument)
// for an id outside the vocabulary, kContextOverflow past the model's context.
// With `next` given, the last token runs too and *next receives its float logits ([vocab]: what
// the position after the whole sequence is predicted to hold; token_logprob reads them).
std::vector<TokenLogprob> prompt_logprobs(const LlamaModel& model, const std::vector<TokenId>& ids,
                                          int top, int64_t chunk = 128,
                                          std::vector<float>* next = nullptr);

}  // namespace promptcache
