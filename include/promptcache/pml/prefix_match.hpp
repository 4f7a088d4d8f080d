// promptcache/pml/prefix_match.hpp — which stored spans of a schema a plain token sequence
// begins with, such that reusing their states is exact.
//
// A client that sends token ids (an evaluation harness scoring context + continuation with
// `echo`) names no modules, yet its prompts often begin with exactly the text a registered
// schema holds (the instruction and few-shot examples). match_prefix finds the longest run of
// such spans whose stored states equal what an ordinary forward over the sequence's first tokens
// would compute, so the server can reuse them without changing a single log-probability beyond
// rounding (DESIGN.md contract 2). A run qualifies when, walking one encoding pass in position
// order:
//   * each span starts where the previous one ended, from position 0 (no gap: a shorter union
//     member or an unselected module ends the run), and holds exactly the sequence's next tokens;
//   * each span is stored (cacheable, not a parameter slot) — its states exist;
//   * the pass that stored it saw exactly the run's spans before it (a span stored by a union
//     member's own pass is exact only if no union before it was represented differently there).
// Token comparison is on ids, so a tokenization that differs at a boundary simply ends the run.
// Header-only, no LibTorch; linear in the matched tokens for each encoding pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <vector>

#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

namespace promptcache::pml {

struct PrefixMatch {
  std::vector<std::size_t> spans;  // matched spans in position order, covering [0, tokens)
  std::size_t tokens = 0;
};

namespace detail {

// Whether `stored_by` saw the same spans as `walked` before `position`: the two passes represent
// every union that starts before it the same way (unions without tokens aside).
inline bool same_context_before(const Layout& layout, const Pass& walked, const Pass& stored_by,
                                std::size_t position) {
  for (std::size_t u = 0; u < layout.unions.size(); ++u) {
    const UnionLayout& un = layout.unions[u];
    if (un.length == 0 || un.begin >= position) continue;
    if (walked.choice[u] != stored_by.choice[u]) return false;
  }
  return true;
}

inline PrefixMatch match_pass(const Layout& layout, const Pass& pass,
                              const std::vector<TokenId>& ids, std::size_t max_tokens) {
  PrefixMatch out;
  for (std::size_t s : layout.spans_in(pass)) {
    const Span& span = layout.spans[s];
    if (span.begin != out.tokens) break;
    if (span.tokens.empty()) continue;
    if (span.kind == SpanKind::kParameter || !span.cacheable) break;
    if (span.size() > max_tokens - out.tokens) break;
    if (!std::equal(span.tokens.begin(), span.tokens.end(), ids.begin() + out.tokens)) break;
    const std::optional<UnionMembership> member = layout.storing_member(span);
    const Pass stored_by = member ? layout.member_pass(*member) : layout.scaffold_pass();
    if (!same_context_before(layout, pass, stored_by, span.begin)) break;
    out.spans.push_back(s);
    out.tokens += span.size();
  }
  return out;
}

}  // namespace detail

// The longest exact run (see the top of this file) of at most max_tokens tokens, and at most
// ids.size(); tokens == 0 when `ids` does not begin with the schema's first stored span.
inline PrefixMatch match_prefix(const Layout& layout, const std::vector<TokenId>& ids,
                                std::size_t max_tokens) {
  max_tokens = std::min(max_tokens, ids.size());
  PrefixMatch best;
  if (max_tokens == 0) return best;
  for (const Pass& pass : layout.encoding_passes()) {
    PrefixMatch m = detail::match_pass(layout, pass, ids, max_tokens);
    if (m.tokens > best.tokens) best = std::move(m);
  }
  return best;
}

// A prompt that reads the matched spans from the store and `ids[match.tokens, end)` fresh after
// them, at the positions that follow: what resolve() would give for a prompt naming those
// modules with that text, had the text tokenized to exactly those ids. `end` <= ids.size().
inline ResolvedPrompt matched_prompt(const Layout& layout, const PrefixMatch& match,
                                     const std::vector<TokenId>& ids, std::size_t end) {
  ResolvedPrompt out;
  out.schema = layout.schema_name;
  out.union_choice.assign(layout.unions.size(), std::nullopt);
  std::vector<bool> selected(layout.modules.size(), false);
  for (std::size_t s : match.spans) {
    for (std::size_t m = layout.spans[s].module; m != kNoIndex; m = layout.modules[m].parent) {
      selected[m] = true;
    }
    for (const UnionMembership& u : layout.spans[s].unions) out.union_choice[u.union_id] = u.member;
  }
  for (std::size_t m = 0; m < selected.size(); ++m) {
    if (selected[m]) out.modules.push_back(m);
  }
  out.spans = match.spans;
  out.text_begin = match.tokens;
  out.text_tokens.assign(ids.begin() + static_cast<std::ptrdiff_t>(match.tokens),
                         ids.begin() + static_cast<std::ptrdiff_t>(end));
  out.baseline.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(end));
  return out;
}

}  // namespace promptcache::pml
