// Contract 3's reference: one forward pass over the expanded sequence (each selected span
// preceded by its own copy of its encoding context), every token at its own position id, under
// the Prompt Cache block mask. Shared by the position-exact tests of every model family.
#pragma once

#include <utility>
#include <vector>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

namespace promptcache::test {

struct Sequence {
  std::vector<int64_t> tokens, positions;
  void add(const std::vector<TokenId>& t, std::size_t begin) {
    for (std::size_t i = 0; i < t.size(); ++i) {
      tokens.push_back(t[i]);
      positions.push_back(static_cast<int64_t>(begin + i));
    }
  }
};

// The reference: one forward pass over the expanded sequence with the block mask. Returns the
// fresh tokens' logits; `shift` moves the fresh positions (to show the test can fail).
inline torch::Tensor reference_logits(const LlamaModel& model, const pml::Layout& layout,
                                      const pml::ResolvedPrompt& r, EncodingMode mode,
                                      Sequence& fresh_out, int64_t shift = 0) {
  Sequence seq;
  std::vector<std::pair<std::size_t, std::size_t>> blocks;   // [begin, end) of each block
  std::vector<std::pair<std::size_t, std::size_t>> visible;  // the selected span inside it
  Sequence fresh;
  for (std::size_t index : r.spans) {
    const pml::Span& span = layout.spans[index];
    if (span.kind == pml::SpanKind::kParameter) {
      for (const auto& a : r.arguments) {
        if (a.span == index) fresh.add(a.tokens, a.begin);
      }
    } else if (!span.cacheable) {
      fresh.add(span.tokens, span.begin);
    } else if (span.size() > 0) {
      const std::size_t begin = seq.tokens.size();
      for (std::size_t c : encoding_context(layout, index, mode)) {
        seq.add(layout.spans[c].tokens, layout.spans[c].begin);
      }
      const std::size_t own = seq.tokens.size();
      seq.add(span.tokens, span.begin);
      blocks.push_back({begin, seq.tokens.size()});
      visible.push_back({own, seq.tokens.size()});
    }
  }
  fresh.add(r.text_tokens, r.text_begin);
  fresh_out = fresh;
  const std::size_t fresh_begin = seq.tokens.size();
  for (std::size_t i = 0; i < fresh.tokens.size(); ++i) {
    seq.tokens.push_back(fresh.tokens[i]);
    seq.positions.push_back(fresh.positions[i] + shift);
  }
  const int64_t n = static_cast<int64_t>(seq.tokens.size());
  auto mask = torch::zeros({n, n}, torch::kBool);
  auto m = mask.accessor<bool, 2>();
  for (const auto& [b, e] : blocks) {
    for (std::size_t i = b; i < e; ++i)
      for (std::size_t j = b; j <= i; ++j) m[i][j] = true;
  }
  for (std::size_t i = fresh_begin; i < seq.tokens.size(); ++i) {
    for (const auto& [b, e] : visible)
      for (std::size_t j = b; j < e; ++j) m[i][j] = true;
    for (std::size_t j = fresh_begin; j <= i; ++j) m[i][j] = true;
  }
  KVCache cache = model.make_cache(n);
  ForwardOptions options;
  options.all_logits = true;
  options.attention_mask = mask;
  auto logits = model.forward(torch::tensor(seq.tokens).unsqueeze(0),
                              torch::tensor(seq.positions).unsqueeze(0), cache, options)[0];
  return logits.narrow(0, static_cast<int64_t>(fresh_begin),
                       static_cast<int64_t>(fresh.tokens.size()));
}

// The cached side: the layout's spans compiled into a store (chunks of `chunk_tokens` per pass),
// the prompt's cache assembled from them (read in place or copied) and its fresh tokens run.
struct CachedRun {
  torch::Tensor logits;  // the fresh tokens', [n, vocab]
  AssembledPrompt assembled;
  CompileReport report;
};
inline CachedRun cached_run(const LlamaModel& model, const pml::Layout& layout,
                            const pml::ResolvedPrompt& resolved, EncodingMode mode,
                            int64_t chunk_tokens, bool in_place) {
  CachedRun run;
  CacheStore store;
  CompileOptions options;
  options.mode = mode;
  options.chunk_tokens = chunk_tokens;
  run.report = ModuleCompiler(model).compile(layout, store, options);
  KVCache cache = model.make_cache(0);
  AssembleOptions assembly;
  assembly.in_place = in_place;
  run.assembled = Assembler().assemble(resolved, layout, store, cache, 0, assembly);
  ForwardOptions all;
  all.all_logits = true;
  const auto& a = run.assembled;
  run.logits = model.forward(
      torch::tensor(std::vector<int64_t>(a.fresh_tokens.begin(), a.fresh_tokens.end()))
          .unsqueeze(0),
      torch::tensor(a.fresh_positions).unsqueeze(0), cache, all)[0];
  return run;
}

}  // namespace promptcache::test
