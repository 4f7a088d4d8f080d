#include "prefix_session.hpp"

#include <algorithm>

#include "promptcache/error.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache::server {

Response PrefixSession::generate(const std::vector<TokenId>& prompt, const SamplingParams& params,
                                 const TokenCallback& on_token) {
  const double start = now_ms();
  params.validate();
  const LlamaModel& model = engine_.model();
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t limit = model.config().max_position_embeddings;
  if (n == 0) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  if (n > limit) {
    throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(n) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(limit));
  }
  if (cache_.layers() == 0) cache_ = model.make_cache(0);
  // The held states of slot i depend only on tokens 0..i, so a shared prefix is exact. At least
  // the last prompt token runs again: its logits start the generation.
  int64_t keep = 0;
  const auto common = static_cast<int64_t>(std::min(held_.size(), prompt.size()));
  while (keep < common && held_[keep] == prompt[keep]) ++keep;
  keep = std::min(keep, n - 1);
  if (keep < cache_.length()) cache_.truncate(keep);
  held_.resize(static_cast<std::size_t>(keep));
  cache_.reserve(n + std::clamp<int64_t>(params.max_new_tokens, 0, limit));

  const double prefill_start = now_ms();
  std::vector<int64_t> ids(prompt.begin() + keep, prompt.end()), positions(ids.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = keep + static_cast<int64_t>(i);
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  torch::Tensor logits;
  try {
    logits = model
                 .forward(torch::tensor(ids, int64).unsqueeze(0),
                          torch::tensor(positions, int64).unsqueeze(0), cache_)
                 .reshape({-1});
    synchronize(logits);
  } catch (...) {
    cache_.clear();
    held_.clear();
    throw;
  }
  GenerationTimings gt;
  gt.prefill_ms = now_ms() - prefill_start;
  gt.prefill_tokens = n - keep;
  GenerationResult result = continue_generation(model, engine_.tokenizer(), cache_, logits, n,
                                                prompt, params, on_token, start, gt);
  // The cache now holds the prompt and the generated tokens that were fed back.
  const auto fed = std::min<int64_t>(cache_.length() - n, result.tokens.size());
  cache_.truncate(n + fed);
  held_ = prompt;
  held_.insert(held_.end(), result.tokens.begin(), result.tokens.begin() + fed);

  Response r;
  r.text = std::move(result.text);
  r.tokens = std::move(result.tokens);
  r.stop_reason = result.stop_reason;
  r.timings.fresh_prefill_ms = gt.prefill_ms;
  r.timings.ttft_ms = result.timings.ttft_ms;
  r.timings.decode_ms = result.timings.decode_ms;
  r.timings.decode_tokens = result.timings.decode_tokens;
  r.cached_tokens = keep;
  r.reused_tokens = keep;
  r.fresh_tokens = n - keep;
  return r;
}

std::vector<TokenId> encode_chat(const Tokenizer& tokenizer, const pml::ChatTemplate& tmpl,
                                 const std::vector<pml::Turn>& turns) {
  std::vector<TokenId> out;
  auto append = [&](const std::vector<TokenId>& ids) {
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (tokenizer.adds_bos()) out.push_back(tokenizer.bos_id());
  std::optional<pml::ChatRole> previous;
  for (const pml::Turn& turn : turns) {
    if (!turn.role) {
      append(pml::encode_span(tokenizer, turn.text));
      continue;
    }
    const pml::ChatRole prev = previous.value_or(pml::ChatRole::kUser);
    append(tmpl.encode(tokenizer, tmpl.open_text(*turn.role, previous ? &prev : nullptr)));
    append(pml::encode_span(tokenizer, turn.text));
    append(tmpl.encode(tokenizer, tmpl.role(*turn.role).close));
    previous = turn.role;
  }
  if (!turns.empty() && turns.back().role == pml::ChatRole::kUser) {
    append(tmpl.encode(tokenizer, tmpl.generation_prompt));
  }
  return out;
}

}  // namespace promptcache::server
