// Requests without prompt modules: the model as a plain LLM that keeps the KV states of the
// previous such request and reuses the longest token prefix the next one shares with it (what
// vLLM, SGLang and llama-server do), so a chat's follow-up runs only its new tokens.
#pragma once

#include <vector>

#include "promptcache/engine.hpp"

namespace promptcache::server {

class PrefixSession {
 public:
  explicit PrefixSession(const Engine& engine) : engine_(engine) {}

  // Generates after `prompt` (ids at positions 0..n-1). Response::cached_tokens and
  // reused_tokens are the prefix kept from the previous request; fresh_tokens the rest.
  // Error(kPrompt) for an empty prompt, Error(kContextOverflow) past the model's context.
  Response generate(const std::vector<TokenId>& prompt, const SamplingParams& params,
                    const TokenCallback& on_token);

  // Tokens whose states the session holds (slot i = position i).
  const std::vector<TokenId>& held() const { return held_; }

 private:
  const Engine& engine_;
  KVCache cache_;
  std::vector<TokenId> held_;
};

// The ids of a chat without modules: BOS (when the tokenizer adds one), each turn wrapped by the
// chat template as PML wraps a prompt's turns, then the generation prompt after a final user
// turn. Turn texts are whitespace-compacted at their edges as PML text is.
std::vector<TokenId> encode_chat(const Tokenizer& tokenizer, const pml::ChatTemplate& tmpl,
                                 const std::vector<pml::Turn>& turns);

}  // namespace promptcache::server
