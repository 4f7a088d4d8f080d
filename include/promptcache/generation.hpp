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

// The per-sequence half of decoding: sampling, stop rules, the detokenised text and streaming.
// The caller runs the model: one sequence (continue_generation) or a batch of them
// (Engine::generate_batch) share this.
class TokenStream {
 public:
  // `history` (the prompt's ids) seeds the repetition penalty and tells whether the stream
  // follows a prompt (which decides the streamed leading space).
  TokenStream(const LlamaModel& model, const Tokenizer& tokenizer, const SamplingParams& params,
              std::vector<TokenId> history, TokenCallback on_token);
  // Picks a token from `n` float logits (-1 once the sequence has ended).
  TokenId sample(const float* logits, std::size_t n);
  // Takes the sampled token: stop rules, text, callback. Returns the token to feed to the model
  // next, or -1 when the sequence has ended (take_result().stop_reason says why).
  TokenId accept(TokenId id);
  // Ends the sequence from outside (the KV cache or the context is full).
  void stop(StopReason reason);
  bool done() const { return done_; }
  GenerationResult take_result() { return std::move(result_); }

 private:
  const Tokenizer& tokenizer_;
  SamplingParams params_;
  TokenCallback on_token_;
  Sampler sampler_;
  std::vector<TokenId> stops_;  // the model's EOS ids (when stop_at_eos), then stop_token_ids
  std::size_t stops_eos_ = 0;   // how many of stops_ are EOS ids
  std::vector<TokenId> history_;
  std::string emitted_;  // text already passed to the callback
  std::string stream_lead_;
  int samples_ = 0;
  bool done_ = false;
  GenerationResult result_;
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
