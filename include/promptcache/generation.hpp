// promptcache/generation.hpp — prefill + decode loop with streaming, stops and timing.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "promptcache/model/kv_cache.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/sampling.hpp"

namespace promptcache {

// Called for every generated token with the text it adds (may be empty mid-UTF-8 character).
// Return false to stop generating.
using TokenCallback = std::function<bool(TokenId id, const std::string& text)>;

struct GenerationTimings {
  double prefill_ms = 0;  // forward over the prompt (or the fresh tokens)
  double ttft_ms = 0;     // request start to first generated token chosen
  double decode_ms = 0;   // all decode steps after the first token
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;  // tokens produced by decode steps (generated - 1)
  double prefill_tokens_per_s() const {
    return prefill_ms > 0 ? prefill_tokens * 1e3 / prefill_ms : 0;
  }
  double decode_tokens_per_s() const { return decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0; }
};

enum class StopReason { kMaxTokens, kEos, kStopToken, kStopString, kCallback, kContextFull };
const char* to_string(StopReason reason);

struct GenerationResult {
  std::string text;             // the continuation, stop string removed
  std::vector<TokenId> tokens;  // generated ids (stop token excluded)
  StopReason stop_reason = StopReason::kMaxTokens;
  GenerationTimings timings;
};

// Continues from logits the caller already has (after prefilling `cache` by any means, such as
// the Prompt Cache assembler): samples, feeds each token at next_position, next_position + 1, ...
// `history` seeds the repetition penalty. `start` is when the request began (for TTFT).
GenerationResult continue_generation(const LlamaModel& model, const Tokenizer& tokenizer,
                                     KVCache& cache, const torch::Tensor& last_logits,
                                     int64_t next_position, std::vector<TokenId> history,
                                     const SamplingParams& params, const TokenCallback& on_token,
                                     double start_ms, GenerationTimings timings);

// Ordinary generation: prefill `prompt` at positions 0..n-1 into a fresh cache, then decode.
GenerationResult generate(const LlamaModel& model, const Tokenizer& tokenizer,
                          const std::vector<TokenId>& prompt, const SamplingParams& params,
                          const TokenCallback& on_token = {});

// Milliseconds on a monotonic clock (for timings across calls).
double now_ms();
// Blocks until the device work queued on t's device is done (no-op on the CPU), so that a
// timing measures the work and not only its launch.
void synchronize(const torch::Tensor& t);

}  // namespace promptcache
