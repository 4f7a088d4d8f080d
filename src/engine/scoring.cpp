// Engine::score and score_batch: log-probabilities of continuations after a prompt whose states
// are computed once (promptcache eval, docs/eval.md).
//
// A row's continuations run in ONE forward after its prompt: they are packed one after another
// (all but each one's last token, whose logits nobody needs), continuation k's token j at position
// next + j, and an attention mask lets each packed token see the prompt's slots and the earlier
// tokens of its own continuation only. So the prompt is never run again, no KV state is copied per
// continuation, and no padding is spent on short ones. A batch of rows does the same with the
// rows' masks of prefill_batch in front of each row's packing (shorter packings are padded with
// tokens that see only themselves).
#include <algorithm>

#include "buffer_lease.hpp"
#include "promptcache/error.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache {
namespace {

// One row's continuations packed after its prompt.
struct Packing {
  std::vector<int64_t> ids, positions;
  std::vector<int64_t> owner;  // per packed token: the packed index of its continuation's first
  std::vector<int64_t> first;  // per continuation: the packed index of its first token
};

Packing pack(const std::vector<std::vector<TokenId>>& continuations, int64_t next_position) {
  Packing p;
  for (const auto& c : continuations) {
    const auto begin = static_cast<int64_t>(p.ids.size());
    p.first.push_back(begin);
    for (std::size_t j = 0; j + 1 < c.size(); ++j) {
      p.ids.push_back(c[j]);
      p.positions.push_back(next_position + static_cast<int64_t>(j));
      p.owner.push_back(begin);
    }
  }
  return p;
}

// Checks a row's continuations before any work: not empty, ids in the vocabulary, the last token
// within the context (`next`: the position after the prompt).
void check_continuations(const std::vector<std::vector<TokenId>>& continuations, int64_t next,
                         int64_t vocab, int64_t limit, const std::string& row,
                         const SourceLocation& where) {
  for (std::size_t k = 0; k < continuations.size(); ++k) {
    const auto& c = continuations[k];
    const std::string what = "continuation " + std::to_string(k + 1) + row;
    if (c.empty()) throw Error(ErrorKind::kInvalidArgument, what + " has no tokens", where);
    for (TokenId id : c) {
      if (id < 0 || id >= vocab) {
        throw Error(ErrorKind::kInvalidArgument,
                    what + " holds token id " + std::to_string(id) +
                        ", outside the model's vocabulary of " + std::to_string(vocab),
                    where);
      }
    }
    const int64_t last = next + static_cast<int64_t>(c.size()) - 1;
    if (last >= limit) {
      throw Error(ErrorKind::kContextOverflow,
                  "the prompt and " + what + " (" + std::to_string(c.size()) +
                      " tokens) need positions up to " + std::to_string(last) +
                      " but the model's context is " + std::to_string(limit),
                  where);
    }
  }
}

// Fills row `r`'s scores from the prompt's last-token log-probabilities `prompt_lp` [vocab] and
// its packed tokens' `packed_lp` [packed, vocab] (contiguous; undefined when nothing was
// packed), with their argmaxes; with top >= 0, each token's entry and `top` alternatives too.
void fill_scores(ScoreResponse& out, const std::vector<std::vector<TokenId>>& continuations,
                 const Packing& packing, const torch::Tensor& prompt_lp,
                 const torch::Tensor& prompt_best, const torch::Tensor& packed_lp,
                 const torch::Tensor& packed_best, int top) {
  const auto first_lp = prompt_lp.accessor<float, 1>();
  const int64_t first_best = prompt_best.item<int64_t>();
  const float* lps = packed_lp.defined() ? packed_lp.data_ptr<float>() : nullptr;
  const int64_t* bests = packed_best.defined() ? packed_best.data_ptr<int64_t>() : nullptr;
  const int64_t vocab = prompt_lp.size(0);
  for (std::size_t k = 0; k < continuations.size(); ++k) {
    const auto& c = continuations[k];
    ContinuationScore s;
    s.tokens = c;
    for (std::size_t j = 0; j < c.size(); ++j) {
      double lp = 0;
      int64_t best = 0;
      const float* row = nullptr;
      if (j == 0) {
        lp = first_lp[c[0]];
        best = first_best;
        row = prompt_lp.data_ptr<float>();
      } else {
        const int64_t at = packing.first[k] + static_cast<int64_t>(j) - 1;
        lp = lps[at * vocab + c[j]];
        best = bests[at];
        row = lps + at * vocab;
      }
      // The rows are log-probabilities already: token_logprob's normalization leaves them be.
      if (top >= 0)
        s.detail.push_back(token_logprob(row, static_cast<std::size_t>(vocab), c[j], top));
      s.logprob_per_token.push_back(lp);
      s.logprob += lp;
      s.greedy = s.greedy && best == c[j];
    }
    out.scored_tokens += static_cast<int64_t>(c.size()) - 1;
    out.continuations.push_back(std::move(s));
  }
}

}  // namespace

std::vector<TokenId> Engine::encode_continuation(const std::string& text) const {
  return pml::encode_span(*tokenizer_, text);
}

ScoreResponse Engine::score(const pml::Prompt& prompt,
                            const std::vector<std::vector<TokenId>>& continuations,
                            const RequestOptions& request) {
  return score_batch({prompt}, {continuations}, request).front();
}

std::vector<ScoreResponse> Engine::score_batch(
    const std::vector<pml::Prompt>& prompts,
    const std::vector<std::vector<std::vector<TokenId>>>& continuations,
    const RequestOptions& request) {
  if (prompts.size() != continuations.size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "score_batch: " + std::to_string(prompts.size()) + " prompts but " +
                    std::to_string(continuations.size()) + " lists of continuations");
  }
  if (prompts.empty()) return {};
  const int64_t vocab = model_->config().vocab_size;
  const int64_t limit = model_->config().max_position_embeddings;
  // Each prompt's schema is held to the end, as in generate.
  std::vector<EntryPtr> entries;
  std::vector<pml::ResolvedPrompt> resolved;
  bool recomputing = false;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    entries.push_back(entry_for(prompts[i]));
    resolved.push_back(pml::resolve(prompts[i], entries.back()->layout, *tokenizer_));
    const auto& r = resolved.back();
    const auto next =
        static_cast<int64_t>(request.use_cache ? r.next_position() : r.baseline.size());
    const std::string row =
        prompts.size() > 1 ? " of prompt " + std::to_string(i + 1) + " of the batch" : "";
    check_continuations(continuations[i], next, vocab, limit, row, r.where);
    recomputing = recomputing || recomputes(*entries.back(), r, request);
  }
  if (prompts.size() == 1 || recomputing) {
    std::vector<ScoreResponse> out;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto one = score_rows({entries[i]}, {resolved[i]}, {continuations[i]}, request, true);
      out.push_back(std::move(one.front()));
    }
    return out;
  }
  return score_rows(entries, resolved, continuations, request, false);
}

std::vector<ScoreResponse> Engine::score_rows(
    const std::vector<EntryPtr>& entries, const std::vector<pml::ResolvedPrompt>& resolved,
    const std::vector<std::vector<std::vector<TokenId>>>& conts, const RequestOptions& request,
    bool alone, int top) {
  const auto rows = static_cast<int64_t>(resolved.size());
  int64_t most_packed = 0;
  for (const auto& c : conts) {
    int64_t n = 0;
    for (const auto& one : c) n += static_cast<int64_t>(one.size()) - 1;
    most_packed = std::max(most_packed, n);
  }
  std::vector<ScoreResponse> out(rows);
  // The prompts' states, their last-token logits [rows, vocab], the slots each row sees
  // [rows, slots] and where each row's continuations start.
  std::unique_ptr<BufferLease> lease;
  torch::Tensor prompt_logits, visible;
  std::vector<int64_t> next(rows);
  double prefill_ms = 0;
  if (alone) {
    const EntryPtr& schema = entries.front();
    const pml::ResolvedPrompt& r = resolved.front();
    lease = std::make_unique<BufferLease>(*this, take_buffer(*schema, r), false);
    Prefill pre = prefill_with(
        schema.get(), r, (*lease)->cache, request.use_cache, most_packed,
        AssembleOptions{request.reuse_buffer, request.in_place},
        RecomputeOptions{request.recompute.value_or(schema->layout.recompute.value_or(0)),
                         request.recompute_criterion, request.recompute_select_layer,
                         request.recompute_first_k});
    (*lease)->schema = request.use_cache ? r.schema : "";
    (*lease)->entry = request.use_cache ? schema.get() : nullptr;
    prompt_logits = pre.logits.reshape({1, -1});
    next[0] = pre.assembled.max_position + 1;
    out[0].cached_tokens = pre.assembled.cached_tokens;
    out[0].fresh_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
    prefill_ms = pre.assembled.ms + pre.prefill_ms;
  } else {
    lease = std::make_unique<BufferLease>(*this, take_batch_buffer(rows), true);
    BatchPrefill pre =
        prefill_batch_with(entries, resolved, (*lease)->cache, request.use_cache, most_packed);
    prompt_logits = pre.logits;
    visible = pre.visible;
    for (int64_t i = 0; i < rows; ++i) {
      const AssembledPrompt& a = pre.assembled.rows[i];
      next[i] = a.max_position + 1;
      out[i].cached_tokens = a.cached_tokens;
      out[i].fresh_tokens = static_cast<int64_t>(a.fresh_tokens.size());
    }
    prefill_ms = pre.assembled.ms + pre.prefill_ms;
  }
  KVCache& cache = (*lease)->cache;
  const int64_t prompt_slots = cache.length();
  std::vector<Packing> packings;
  for (int64_t i = 0; i < rows; ++i) packings.push_back(pack(conts[i], next[i]));

  const double start = now_ms();
  torch::Tensor packed_lp, packed_best;  // [rows, packed, vocab], [rows, packed]
  if (most_packed > 0) {
    const int64_t p = most_packed, total = prompt_slots + p;
    auto ids = torch::zeros({rows, p}, torch::kInt64);
    auto positions = torch::zeros({rows, p}, torch::kInt64);
    auto mask = torch::zeros({rows, p, total}, torch::kBool);
    auto m = mask.accessor<bool, 3>();
    auto id = ids.accessor<int64_t, 2>();
    auto pos = positions.accessor<int64_t, 2>();
    for (int64_t i = 0; i < rows; ++i) {
      const Packing& k = packings[i];
      const auto n = static_cast<int64_t>(k.ids.size());
      // The prompt: every slot of a row alone; a batch row, the slots prefill_batch gave it.
      if (alone) {
        mask[i].narrow(0, 0, n).narrow(1, 0, prompt_slots).fill_(true);
      } else {
        mask[i]
            .narrow(0, 0, n)
            .narrow(1, 0, prompt_slots)
            .copy_(visible[i].narrow(0, 0, prompt_slots).unsqueeze(0).expand({n, prompt_slots}));
      }
      for (int64_t t = 0; t < n; ++t) {
        id[i][t] = k.ids[t];
        pos[i][t] = k.positions[t];
        for (int64_t u = k.owner[t]; u <= t; ++u) m[i][t][prompt_slots + u] = true;
      }
      for (int64_t t = n; t < p; ++t) m[i][t][prompt_slots + t] = true;  // padding: itself only
    }
    ForwardOptions options;
    options.all_logits = true;
    options.attention_mask = alone ? mask[0] : mask;
    auto logits = model_->forward(ids, positions, cache, options);
    packed_lp = torch::log_softmax(logits.to(torch::kCPU, torch::kFloat32), -1).contiguous();
    packed_best = packed_lp.argmax(-1);
    synchronize(logits);
  }
  auto prompt_lp =
      torch::log_softmax(prompt_logits.to(torch::kCPU, torch::kFloat32), -1).contiguous();
  auto prompt_best = prompt_lp.argmax(-1);
  const double score_ms = now_ms() - start;
  // A lone prompt's buffer keeps its states (not the continuations) for the next request.
  if (alone) cache.truncate(prompt_slots);
  lease->finished();
  for (int64_t i = 0; i < rows; ++i) {
    out[i].prompt_tokens = static_cast<int64_t>(resolved[i].baseline.size());
    out[i].prefill_ms = prefill_ms;
    out[i].score_ms = score_ms;
    fill_scores(out[i], conts[i], packings[i], prompt_lp[i], prompt_best[i],
                packed_lp.defined() ? packed_lp[i].contiguous() : torch::Tensor(),
                packed_best.defined() ? packed_best[i].contiguous() : torch::Tensor(), top);
  }
  return out;
}

}  // namespace promptcache
