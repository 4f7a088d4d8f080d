#include "promptcache/fidelity.hpp"

#include <algorithm>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"

namespace promptcache {
namespace {

struct Run {
  KVCache cache;
  torch::Tensor first_logits;  // [vocab] float32
  double ttft_ms = 0;
  int64_t cached_tokens = 0, recomputed_tokens = 0, exact_tokens = 0;
};

int64_t top_token(const torch::Tensor& logits) {
  return logits.argmax().item<int64_t>();
}

// One step of decoding: appends `token` at the next position and returns the logits after it.
torch::Tensor step(const LlamaModel& model, KVCache& cache, TokenId token) {
  const int64_t position = cache.max_position() + 1;
  return model
      .forward(torch::tensor({static_cast<int64_t>(token)}, torch::kInt64).unsqueeze(0),
               torch::tensor({position}, torch::kInt64).unsqueeze(0), cache)
      .reshape({-1});
}

// log p(top-1) - log p(top-2) of one logit vector, nats.
double top_margin(const torch::Tensor& logits) {
  auto top = std::get<0>(torch::topk(torch::log_softmax(logits.to(torch::kFloat64), -1), 2));
  return (top[0] - top[1]).item<double>();
}

// Up to `count` greedy tokens from `logits`; the stream ends after an end-of-turn token.
// `margins`, when given, receives top_margin of every step.
std::vector<TokenId> greedy(const Engine& engine, KVCache& cache, torch::Tensor logits,
                            int64_t count, std::vector<double>* margins = nullptr) {
  const auto stops = engine.tokenizer().end_of_turn_ids();
  std::vector<TokenId> out;
  for (int64_t i = 0; i < count; ++i) {
    const auto token = static_cast<TokenId>(top_token(logits));
    if (margins != nullptr) margins->push_back(top_margin(logits));
    out.push_back(token);
    if (std::find(stops.begin(), stops.end(), token) != stops.end() || i + 1 == count) break;
    logits = step(engine.model(), cache, token);
  }
  return out;
}

// Sum of the log-probabilities of `tokens` continuing the prompt held in `cache` (its first
// logits given), teacher-forced in one forward; the cache is left as it was.
double continuation_logprob(const LlamaModel& model, KVCache& cache,
                            const torch::Tensor& first_logits, const std::vector<TokenId>& tokens) {
  if (tokens.empty()) return 0;
  double sum = torch::log_softmax(first_logits, -1)[tokens[0]].item<double>();
  if (tokens.size() == 1) return sum;
  const int64_t length = cache.length();
  const int64_t next = cache.max_position() + 1;
  const auto n = static_cast<int64_t>(tokens.size()) - 1;
  std::vector<int64_t> ids(tokens.begin(), tokens.end() - 1);
  ForwardOptions options;
  options.all_logits = true;
  auto logits = model.forward(torch::tensor(ids, torch::kInt64).unsqueeze(0),
                              torch::arange(next, next + n, torch::kInt64).unsqueeze(0), cache,
                              options)[0];  // [n, vocab]
  auto targets =
      torch::tensor(std::vector<int64_t>(tokens.begin() + 1, tokens.end()), torch::kInt64)
          .to(logits.device());
  sum += torch::log_softmax(logits, -1).gather(1, targets.unsqueeze(1)).sum().item<double>();
  cache.truncate(length);
  return sum;
}

Run prefill_run(const Engine& engine, const pml::ResolvedPrompt& resolved, bool use_cache,
                const FidelityOptions& options) {
  Run run;
  run.cache = engine.model().make_cache(0);
  const double start = now_ms();
  auto pre = engine.prefill(resolved, run.cache, use_cache, options.tokens + 1,
                            AssembleOptions{false, options.in_place},
                            use_cache ? options.recompute : RecomputeOptions{});
  run.ttft_ms = now_ms() - start;
  run.first_logits = pre.logits;
  run.cached_tokens = pre.assembled.cached_tokens;
  run.recomputed_tokens = pre.recomputed_tokens;
  run.exact_tokens = pre.assembled.exact_tokens;
  return run;
}

}  // namespace

double logits_kl(const torch::Tensor& p_logits, const torch::Tensor& q_logits) {
  auto log_p = torch::log_softmax(p_logits.to(torch::kFloat64), -1);
  auto log_q = torch::log_softmax(q_logits.to(torch::kFloat64), -1);
  return std::max(0.0, (log_p.exp() * (log_p - log_q)).sum().item<double>());
}

PromptFidelity measure_fidelity(const Engine& engine, const pml::Prompt& prompt,
                                const FidelityOptions& options) {
  if (options.tokens < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "fidelity: tokens must be at least 1, got " + std::to_string(options.tokens));
  }
  check_recompute_fraction(options.recompute.fraction, "fidelity: recompute");
  const pml::ResolvedPrompt resolved = engine.resolve(prompt);
  Run base = prefill_run(engine, resolved, false, options);
  Run cached = prefill_run(engine, resolved, true, options);
  PromptFidelity f;
  f.prompt_tokens = static_cast<int64_t>(resolved.baseline.size());
  f.cached_tokens = cached.cached_tokens;
  f.recomputed_tokens = cached.recomputed_tokens;
  f.exact_tokens = cached.exact_tokens;
  f.baseline_ttft_ms = base.ttft_ms;
  f.cached_ttft_ms = cached.ttft_ms;
  f.first_token_kl = logits_kl(base.first_logits, cached.first_logits);
  f.first_token_agrees = top_token(base.first_logits) == top_token(cached.first_logits);
  const int64_t base_length = base.cache.length(), cached_length = cached.cache.length();
  std::vector<double> margins;
  f.baseline_continuation = greedy(engine, base.cache, base.first_logits, options.tokens, &margins);
  f.first_token_margin = margins.front();
  f.cached_continuation = greedy(engine, cached.cache, cached.first_logits, options.tokens);
  f.compared_tokens = static_cast<int64_t>(f.baseline_continuation.size());
  const auto& a = f.baseline_continuation;
  const auto& b = f.cached_continuation;
  while (f.agreed_tokens < static_cast<int64_t>(std::min(a.size(), b.size())) &&
         a[f.agreed_tokens] == b[f.agreed_tokens]) {
    ++f.agreed_tokens;
  }
  f.exact = a == b;
  if (!f.exact) {
    const auto at =
        std::min<std::size_t>(static_cast<std::size_t>(f.agreed_tokens), margins.size() - 1);
    f.divergence_margin = margins[at];
  }
  base.cache.truncate(base_length);
  cached.cache.truncate(cached_length);
  f.baseline_logprob = continuation_logprob(engine.model(), base.cache, base.first_logits, a);
  f.continuation_logprob =
      continuation_logprob(engine.model(), cached.cache, cached.first_logits, a);
  return f;
}

FidelitySummary summarize_fidelity(const std::vector<PromptFidelity>& results) {
  FidelitySummary s;
  s.prompts = static_cast<int64_t>(results.size());
  if (results.empty()) return s;
  int64_t cached = 0, recomputed = 0;
  for (const auto& f : results) {
    s.mean_first_token_kl += f.first_token_kl;
    s.first_token_agreement += f.first_token_agrees ? 1 : 0;
    s.mean_agreed_tokens += static_cast<double>(f.agreed_tokens);
    s.exact_agreement += f.exact ? 1 : 0;
    const double n = static_cast<double>(std::max<int64_t>(f.compared_tokens, 1));
    s.mean_logprob_per_token += f.continuation_logprob / n;
    s.mean_baseline_logprob_per_token += f.baseline_logprob / n;
    s.cached_ttft_ms += f.cached_ttft_ms;
    s.baseline_ttft_ms += f.baseline_ttft_ms;
    cached += f.cached_tokens;
    recomputed += f.recomputed_tokens;
  }
  const double n = static_cast<double>(s.prompts);
  for (double* v : {&s.mean_first_token_kl, &s.first_token_agreement, &s.mean_agreed_tokens,
                    &s.exact_agreement, &s.mean_logprob_per_token,
                    &s.mean_baseline_logprob_per_token, &s.cached_ttft_ms, &s.baseline_ttft_ms}) {
    *v /= n;
  }
  s.recomputed_share = cached > 0 ? static_cast<double>(recomputed) / cached : 0;
  std::vector<double> diverged;
  for (const auto& f : results) {
    if (!f.exact) diverged.push_back(f.divergence_margin);
  }
  if (!diverged.empty()) {
    std::sort(diverged.begin(), diverged.end());
    const std::size_t mid = diverged.size() / 2;
    s.median_divergence_margin =
        diverged.size() % 2 == 1 ? diverged[mid] : (diverged[mid - 1] + diverged[mid]) / 2;
    s.near_tie_divergences = static_cast<double>(std::count_if(diverged.begin(), diverged.end(),
                                                               [](double m) { return m < 0.5; })) /
                             static_cast<double>(diverged.size());
  }
  return s;
}

}  // namespace promptcache
