#include "promptcache/cache/compiler.hpp"

#include <algorithm>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"

namespace promptcache {

const char* to_string(EncodingMode mode) {
  return mode == EncodingMode::kScaffold ? "scaffold" : "isolated";
}

EncodingMode parse_encoding_mode(const std::string& text) {
  if (text == "scaffold") return EncodingMode::kScaffold;
  if (text == "isolated") return EncodingMode::kIsolated;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown encoding mode '" + text + "' (use scaffold or isolated)");
}

std::vector<EncodingPass> encoding_passes(const pml::Layout& layout, EncodingMode mode) {
  std::vector<EncodingPass> passes;
  auto add = [&](std::vector<std::size_t> spans, std::vector<std::size_t> stored) {
    if (stored.empty()) return;
    // Causal attention: nothing after the last stored span can change what is stored.
    const auto last = std::find(spans.begin(), spans.end(), stored.back());
    spans.erase(last + 1, spans.end());
    passes.push_back({std::move(spans), std::move(stored)});
  };
  if (mode == EncodingMode::kScaffold) {
    for (const pml::Pass& pass : layout.encoding_passes()) {
      add(layout.spans_in(pass), layout.spans_stored_by(pass));
    }
  } else {
    for (const pml::ModuleLayout& m : layout.modules) {
      std::vector<std::size_t> stored;
      for (std::size_t s : m.spans) {
        if (layout.spans[s].cacheable) stored.push_back(s);
      }
      add(m.spans, stored);
    }
  }
  return passes;
}

std::vector<std::size_t> encoding_context(const pml::Layout& layout, std::size_t span,
                                          EncodingMode mode) {
  for (const EncodingPass& pass : encoding_passes(layout, mode)) {
    if (std::find(pass.stored.begin(), pass.stored.end(), span) == pass.stored.end()) continue;
    const auto at = std::find(pass.spans.begin(), pass.spans.end(), span);
    return std::vector<std::size_t>(pass.spans.begin(), at);
  }
  throw Error(ErrorKind::kInvalidArgument,
              "span " + std::to_string(span) + " is not stored by any encoding pass");
}

namespace {

void run_tokens(const LlamaModel& model, KVCache& cache, const std::vector<TokenId>& tokens,
                const std::vector<int64_t>& positions, std::size_t from, int64_t chunk) {
  const auto options = torch::TensorOptions().dtype(torch::kInt64);
  for (std::size_t i = from; i < tokens.size(); i += static_cast<std::size_t>(chunk)) {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), tokens.size() - i);
    std::vector<int64_t> ids(tokens.begin() + i, tokens.begin() + i + n);
    std::vector<int64_t> pos(positions.begin() + i, positions.begin() + i + n);
    model.forward(torch::tensor(ids, options).unsqueeze(0),
                  torch::tensor(pos, options).unsqueeze(0), cache);
  }
}

}  // namespace

CompileReport ModuleCompiler::compile(const pml::Layout& layout, CacheStore& store,
                                      const CompileOptions& options) const {
  if (options.chunk_tokens <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "compile chunk size must be positive");
  }
  const double start = now_ms();
  const auto passes = encoding_passes(layout, options.mode);
  const int64_t limit = model_.config().max_position_embeddings;
  if (static_cast<int64_t>(layout.total_length) > limit) {
    throw Error(ErrorKind::kContextOverflow,
                "schema '" + layout.schema_name + "' reserves " +
                    std::to_string(layout.total_length) + " positions but the model's context is " +
                    std::to_string(limit),
                layout.root().where);
  }
  CompileReport report;
  report.passes = passes.size();
  CompileProgress progress;
  progress.passes = passes.size();
  for (const auto& pass : passes) {
    for (std::size_t s : pass.spans) progress.tokens_total += layout.spans[s].size();
  }
  store.erase_schema(layout.schema_name);

  // The first pass's cache is kept: later passes share its prefix (everything before the union
  // member they swap in) and start from a copy of it instead of recomputing.
  KVCache base;
  std::vector<std::size_t> base_spans;
  std::vector<std::size_t> base_slots;  // slot offset of each base span, plus the end
  for (std::size_t p = 0; p < passes.size(); ++p) {
    const EncodingPass& pass = passes[p];
    std::vector<TokenId> tokens;
    std::vector<int64_t> positions;
    std::vector<std::size_t> slot_of(pass.spans.size() + 1, 0);
    for (std::size_t i = 0; i < pass.spans.size(); ++i) {
      const pml::Span& span = layout.spans[pass.spans[i]];
      slot_of[i] = tokens.size();
      for (std::size_t t = 0; t < span.size(); ++t) {
        tokens.push_back(span.tokens[t]);
        positions.push_back(static_cast<int64_t>(span.begin + t));
      }
    }
    slot_of[pass.spans.size()] = tokens.size();
    if (tokens.empty()) continue;

    KVCache cache = model_.make_cache(static_cast<int64_t>(tokens.size()));
    std::size_t shared = 0;  // spans copied from the base pass
    if (p > 0 && options.mode == EncodingMode::kScaffold) {
      while (shared < pass.spans.size() && shared < base_spans.size() &&
             pass.spans[shared] == base_spans[shared]) {
        ++shared;
      }
      const int64_t slots = static_cast<int64_t>(base_slots[shared]);
      if (slots > 0) {
        for (int64_t l = 0; l < cache.layers(); ++l) {
          cache.key_slots(l, 0, slots).copy_(base.key_slots(l, 0, slots));
          cache.value_slots(l, 0, slots).copy_(base.value_slots(l, 0, slots));
        }
        cache.fill_external(slots,
                            std::vector<int64_t>(positions.begin(), positions.begin() + slots));
      }
    }
    const std::size_t from = slot_of[shared];
    run_tokens(model_, cache, tokens, positions, from, options.chunk_tokens);
    report.tokens_run += static_cast<int64_t>(tokens.size() - from);

    for (std::size_t s : pass.stored) {
      const std::size_t i = static_cast<std::size_t>(
          std::find(pass.spans.begin(), pass.spans.end(), s) - pass.spans.begin());
      const int64_t begin = static_cast<int64_t>(slot_of[i]);
      const int64_t n = static_cast<int64_t>(slot_of[i + 1] - slot_of[i]);
      if (n == 0) continue;
      // Batch row 0 of every layer's K and V, copied out of the pass's cache.
      SpanStates states = SpanStates::from_block(cache.all_slots(begin, n).select(2, 0).clone(),
                                                 static_cast<int64_t>(layout.spans[s].begin));
      report.tokens_stored += n;
      store.put(layout.schema_name, s, std::move(states));
    }
    progress.pass = p + 1;
    progress.tokens_done += static_cast<int64_t>(tokens.size());
    if (options.on_progress) options.on_progress(progress);
    if (p == 0) {
      base = std::move(cache);
      base_spans = pass.spans;
      base_slots = slot_of;
    }
  }
  report.bytes = store.bytes(layout.schema_name);
  report.ms = now_ms() - start;
  return report;
}

}  // namespace promptcache
