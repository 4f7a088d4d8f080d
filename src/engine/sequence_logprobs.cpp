// Engine::sequence_logprobs: the log-probabilities of a plain token sequence (the server's
// `echo` with `logprobs`), reusing a registered schema's stored states where the sequence
// begins with them.
//
// For a sequence ids[0, n) whose first k tokens are an exact run of stored spans
// (pml::match_prefix, k <= n - 1):
//   * tokens 1..k-1 and the distribution after token k-1 come from an ordinary forward over
//     ids[0, k) — the same for every sequence with that prefix, so it runs once and is kept
//     (a few recent prefixes, keyed by the schema's published version and the prefix ids);
//   * token k (its entry from that distribution) then runs fresh after the stored states, and
//     ids[k+1, n) are scored as its one continuation (Engine::score's packed forward): tokens
//     k+1..n-1 get their entries from those logits.
// So a harness scoring many continuations after one few-shot context runs the context once in
// all, not once per request.
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"
#include "promptcache/pml/prefix_match.hpp"

namespace promptcache {

// A matched prefix's own log-probabilities (see the top of this file).
struct Engine::PrefixLogprobs {
  // The schema version matched: a replaced (or removed) schema's prefixes never match again.
  std::weak_ptr<const SchemaEntry> entry;
  std::vector<TokenId> ids;          // the prefix
  std::vector<TokenLogprob> tokens;  // tokens 1..k-1, with kMaxTopLogprobs alternatives
  std::vector<float> next;           // logits after the prefix's last token
};

namespace {

// How many matched prefixes are kept; each holds k entries and one row of vocabulary logits.
constexpr std::size_t kKeptPrefixes = 8;

// `entry` cut to `top` alternatives.
TokenLogprob with_top(TokenLogprob entry, int top) {
  if (entry.top.size() > static_cast<std::size_t>(top)) entry.top.resize(top);
  return entry;
}

}  // namespace

SequenceLogprobs Engine::sequence_logprobs(const std::vector<TokenId>& ids, int top,
                                           bool use_cache) {
  if (top < 0 || top > kMaxTopLogprobs) {
    throw Error(ErrorKind::kInvalidArgument, "top_logprobs must be from 0 to " +
                                                 std::to_string(kMaxTopLogprobs) + ", got " +
                                                 std::to_string(top));
  }
  check_prompt_ids(*model_, ids);
  SequenceLogprobs out;
  const std::size_t n = ids.size();
  // The best exact run of any registered schema, leaving the last token fresh (it must run for
  // the sequence to be read after the stored states at all).
  EntryPtr matched;
  pml::PrefixMatch match;
  if (use_cache && n >= 2) {
    std::vector<EntryPtr> entries;
    {
      std::shared_lock<std::shared_mutex> lock(schemas_mutex_);
      for (const auto& [name, e] : schemas_) entries.push_back(e);
    }
    for (const EntryPtr& e : entries) {
      pml::PrefixMatch m = pml::match_prefix(e->layout, ids, n - 1);
      if (m.tokens > match.tokens) {
        match = std::move(m);
        matched = e;
      }
    }
  }
  // A run of BOS alone saves nothing.
  if (!matched || match.tokens < 2) {
    out.tokens = prompt_logprobs(*model_, ids, top);
    out.fresh_tokens = n >= 2 ? static_cast<int64_t>(n) - 1 : 0;
    return out;
  }
  const std::size_t k = match.tokens;
  const std::vector<TokenId> prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k));
  std::shared_ptr<const PrefixLogprobs> head;
  {
    std::lock_guard<std::mutex> lock(prefix_logprobs_mutex_);
    for (auto it = prefix_logprobs_.begin(); it != prefix_logprobs_.end(); ++it) {
      if ((*it)->entry.lock() == matched && (*it)->ids == prefix) {
        head = *it;
        std::rotate(prefix_logprobs_.begin(), it, it + 1);  // most recent first
        break;
      }
    }
  }
  if (!head) {
    auto made = std::make_shared<PrefixLogprobs>();
    made->entry = matched;
    made->ids = prefix;
    made->tokens = prompt_logprobs(*model_, prefix, kMaxTopLogprobs, 128, &made->next);
    out.fresh_tokens += static_cast<int64_t>(k);
    head = made;
    std::lock_guard<std::mutex> lock(prefix_logprobs_mutex_);
    prefix_logprobs_.insert(prefix_logprobs_.begin(), head);
    if (prefix_logprobs_.size() > kKeptPrefixes) prefix_logprobs_.resize(kKeptPrefixes);
  }
  out.tokens.reserve(n - 1);
  for (const TokenLogprob& t : head->tokens) out.tokens.push_back(with_top(t, top));
  out.tokens.push_back(token_logprob(head->next.data(), head->next.size(), ids[k], top));
  if (k + 1 < n) {
    // Token k fresh after the stored spans; the rest scored as its continuation.
    const pml::ResolvedPrompt prompt = pml::matched_prompt(matched->layout, match, ids, k + 1);
    const std::vector<TokenId> rest(ids.begin() + static_cast<std::ptrdiff_t>(k + 1), ids.end());
    RequestOptions request;
    request.recompute = 0.0;  // exactness: the stored states as they are
    std::vector<ScoreResponse> scored =
        score_rows({matched}, {prompt}, {{rest}}, request, /*alone=*/true, top);
    auto& detail = scored.front().continuations.front().detail;
    out.tokens.insert(out.tokens.end(), std::make_move_iterator(detail.begin()),
                      std::make_move_iterator(detail.end()));
    out.fresh_tokens += static_cast<int64_t>(n - k) - 1;
  }
  out.schema = matched->layout.schema_name;
  out.cached_tokens = static_cast<int64_t>(k);
  return out;
}

}  // namespace promptcache
