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

std::size_t exact_prefix_tokens(const pml::Layout& layout, const pml::ResolvedPrompt& prompt,
                                EncodingMode mode) {
  // Which pass stores each span, and where the span sits in it.
  constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  const std::vector<EncodingPass> passes = encoding_passes(layout, mode);
  std::vector<std::size_t> stored_by(layout.spans.size(), kNone);
  for (std::size_t p = 0; p < passes.size(); ++p) {
    for (std::size_t s : passes[p].stored) stored_by[s] = p;
  }
  auto non_empty = [&](std::size_t s) { return !layout.spans[s].tokens.empty(); };
  std::vector<std::size_t> run;  // the run's non-empty spans so far
  std::size_t tokens = 0;
  for (std::size_t s : prompt.spans) {
    const pml::Span& span = layout.spans[s];
    if (span.tokens.empty()) continue;
    if (span.begin != tokens || span.kind == pml::SpanKind::kParameter || !span.cacheable ||
        stored_by[s] == kNone) {
      break;
    }
    const std::vector<std::size_t>& order = passes[stored_by[s]].spans;
    std::vector<std::size_t> context;
    for (auto it = order.begin(); it != order.end() && *it != s; ++it) {
      if (non_empty(*it)) context.push_back(*it);
    }
    if (context != run) break;
    run.push_back(s);
    tokens += span.size();
  }
  return tokens;
}

bool exact_without_recompute(const pml::Layout& layout, const pml::ResolvedPrompt& prompt,
                             EncodingMode mode) {
  return exact_prefix_tokens(layout, prompt, mode) == prompt.text_begin &&
         prompt.text_begin + prompt.text_tokens.size() == prompt.baseline.size();
}

namespace {

// Error(kCancelled) once the caller's `cancelled` says so.
void check_cancelled(const std::function<bool()>& cancelled) {
  if (cancelled && cancelled()) {
    throw Error(ErrorKind::kCancelled, "the compile was cancelled before it finished");
  }
}

void run_tokens(const LlamaModel& model, KVCache& cache, const std::vector<TokenId>& tokens,
                const std::vector<int64_t>& positions, std::size_t from, int64_t chunk,
                int64_t& forwards, const std::function<bool()>& cancelled = {}) {
  const auto options = torch::TensorOptions().dtype(torch::kInt64);
  for (std::size_t i = from; i < tokens.size(); i += static_cast<std::size_t>(chunk)) {
    check_cancelled(cancelled);
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(chunk), tokens.size() - i);
    std::vector<int64_t> ids(tokens.begin() + i, tokens.begin() + i + n);
    std::vector<int64_t> pos(positions.begin() + i, positions.begin() + i + n);
    model.forward(torch::tensor(ids, options).unsqueeze(0),
                  torch::tensor(pos, options).unsqueeze(0), cache);
    ++forwards;
  }
}

// A pass laid out as one token sequence: its tokens and positions, and where each span starts.
struct PassTokens {
  std::vector<TokenId> tokens;
  std::vector<int64_t> positions;
  std::vector<std::size_t> slot_of;  // slot of each span of the pass, plus the end
};

PassTokens lay_out(const pml::Layout& layout, const EncodingPass& pass) {
  PassTokens out;
  out.slot_of.assign(pass.spans.size() + 1, 0);
  for (std::size_t i = 0; i < pass.spans.size(); ++i) {
    const pml::Span& span = layout.spans[pass.spans[i]];
    out.slot_of[i] = out.tokens.size();
    for (std::size_t t = 0; t < span.size(); ++t) {
      out.tokens.push_back(span.tokens[t]);
      out.positions.push_back(static_cast<int64_t>(span.begin + t));
    }
  }
  out.slot_of[pass.spans.size()] = out.tokens.size();
  return out;
}

// A pass still to run: the part of it after the prefix it shares with the base pass.
struct PendingPass {
  std::size_t index = 0;  // into the pass list
  PassTokens laid;
  std::size_t shared_spans = 0;  // leading spans identical to the base pass's
  int64_t shared_slots = 0;      // their tokens (slots [0, shared_slots) of the base cache)
  int64_t suffix() const { return static_cast<int64_t>(laid.tokens.size()) - shared_slots; }
};

}  // namespace

SpanStates compile_span(const LlamaModel& model, const pml::Layout& layout, std::size_t span,
                        EncodingMode mode, int64_t chunk_tokens) {
  if (chunk_tokens <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "compile chunk size must be positive");
  }
  EncodingPass pass;
  pass.spans = encoding_context(layout, span, mode);
  pass.spans.push_back(span);
  pass.stored = {span};
  const PassTokens laid = lay_out(layout, pass);
  const int64_t n = static_cast<int64_t>(layout.spans[span].size());
  const int64_t total = static_cast<int64_t>(laid.tokens.size());
  KVCache cache = model.make_cache(total);
  int64_t forwards = 0;
  run_tokens(model, cache, laid.tokens, laid.positions, 0, chunk_tokens, forwards);
  return SpanStates::from_block(cache.all_slots(total - n, n).select(2, 0).clone(),
                                static_cast<int64_t>(layout.spans[span].begin));
}

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
  const int64_t chunk = options.chunk_tokens;

  // Copies a pass's stored spans out of `cache`; slot_in_cache maps a pass slot to a cache slot.
  auto keep = [&](const EncodingPass& pass, const PassTokens& laid, const KVCache& cache,
                  const std::function<int64_t(int64_t)>& slot_in_cache) {
    for (std::size_t s : pass.stored) {
      const std::size_t i = static_cast<std::size_t>(
          std::find(pass.spans.begin(), pass.spans.end(), s) - pass.spans.begin());
      const int64_t begin = static_cast<int64_t>(laid.slot_of[i]);
      const int64_t n = static_cast<int64_t>(laid.slot_of[i + 1]) - begin;
      if (n == 0) continue;
      // Batch row 0 of every layer's K and V, copied out of the cache.
      SpanStates states =
          SpanStates::from_block(cache.all_slots(slot_in_cache(begin), n).select(2, 0).clone(),
                                 static_cast<int64_t>(layout.spans[s].begin));
      report.tokens_stored += n;
      store.put(layout.schema_name, s, std::move(states));
    }
  };
  auto finished = [&](std::size_t pass_index, int64_t tokens) {
    progress.pass = pass_index + 1;
    progress.tokens_done += tokens;
    if (options.on_progress) options.on_progress(progress);
  };

  // Scaffold mode: the first pass is the base. Later passes share its prefix (everything before
  // the union member they swap in) and run only the rest. Isolated mode: passes share nothing,
  // the base is empty.
  const bool scaffold = options.mode == EncodingMode::kScaffold;
  PassTokens base_laid;
  if (scaffold && !passes.empty()) base_laid = lay_out(layout, passes[0]);
  const int64_t base_length = static_cast<int64_t>(base_laid.tokens.size());
  const bool more = passes.size() > (scaffold ? 1u : 0u);
  KVCache base = model_.make_cache(base_length + (more ? chunk : 0));
  if (base_length > 0) {
    run_tokens(model_, base, base_laid.tokens, base_laid.positions, 0, chunk, report.forwards,
               options.cancelled);
    report.tokens_run += base_length;
    keep(passes[0], base_laid, base, [](int64_t slot) { return slot; });
  }
  if (scaffold && !passes.empty()) finished(0, base_length);

  std::vector<PendingPass> pending;
  for (std::size_t p = scaffold ? 1 : 0; p < passes.size(); ++p) {
    PendingPass pass;
    pass.index = p;
    pass.laid = lay_out(layout, passes[p]);
    if (scaffold) {
      const auto& spans = passes[p].spans;
      const auto& base_spans = passes[0].spans;
      while (pass.shared_spans < spans.size() && pass.shared_spans < base_spans.size() &&
             spans[pass.shared_spans] == base_spans[pass.shared_spans]) {
        ++pass.shared_spans;
      }
      pass.shared_slots = static_cast<int64_t>(base_laid.slot_of[pass.shared_spans]);
    }
    pending.push_back(std::move(pass));
  }

  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  for (std::size_t next = 0; next < pending.size();) {
    const PendingPass& first = pending[next];
    if (first.suffix() == 0) {  // everything it stores is in the shared prefix
      keep(passes[first.index], first.laid, base, [](int64_t slot) { return slot; });
      finished(first.index, static_cast<int64_t>(first.laid.tokens.size()));
      ++next;
      continue;
    }
    if (first.suffix() > chunk || !options.batch_passes) {
      // Too long to share a forward (or batching is off): its own cache, starting from a copy of
      // the shared prefix, run in chunks.
      KVCache cache = model_.make_cache(static_cast<int64_t>(first.laid.tokens.size()));
      const int64_t slots = first.shared_slots;
      if (slots > 0) {
        cache.all_slots(0, slots).copy_(base.all_slots(0, slots));
        cache.fill_external(slots, std::vector<int64_t>(first.laid.positions.begin(),
                                                        first.laid.positions.begin() + slots));
      }
      run_tokens(model_, cache, first.laid.tokens, first.laid.positions,
                 static_cast<std::size_t>(slots), chunk, report.forwards, options.cancelled);
      report.tokens_run += first.suffix();
      keep(passes[first.index], first.laid, cache, [](int64_t slot) { return slot; });
      finished(first.index, static_cast<int64_t>(first.laid.tokens.size()));
      ++next;
      continue;
    }
    // Short passes go together, as many as fit in one chunk: their rest is appended after the
    // base and a block mask lets each token see its shared prefix and its own pass only.
    std::size_t end = next;
    int64_t batch = 0;
    while (end < pending.size() && pending[end].suffix() > 0 &&
           batch + pending[end].suffix() <= chunk) {
      batch += pending[end].suffix();
      ++end;
    }
    std::vector<int64_t> ids, pos;
    std::vector<int64_t> offsets;  // where each pass's rest starts in the batch
    auto mask = torch::zeros({batch, base_length + batch}, torch::kBool);
    auto visible = mask.accessor<bool, 2>();
    for (std::size_t q = next; q < end; ++q) {
      const PendingPass& pass = pending[q];
      const int64_t offset = static_cast<int64_t>(ids.size());
      offsets.push_back(offset);
      ids.insert(ids.end(), pass.laid.tokens.begin() + pass.shared_slots, pass.laid.tokens.end());
      pos.insert(pos.end(), pass.laid.positions.begin() + pass.shared_slots,
                 pass.laid.positions.end());
      for (int64_t r = 0; r < pass.suffix(); ++r) {
        for (int64_t c = 0; c < pass.shared_slots; ++c) visible[offset + r][c] = true;
        for (int64_t c = 0; c <= r; ++c) visible[offset + r][base_length + offset + c] = true;
      }
    }
    check_cancelled(options.cancelled);
    ForwardOptions forward;
    forward.attention_mask = mask;
    model_.forward(torch::tensor(ids, int64).unsqueeze(0), torch::tensor(pos, int64).unsqueeze(0),
                   base, forward);
    ++report.forwards;
    report.tokens_run += batch;
    for (std::size_t q = next; q < end; ++q) {
      const PendingPass& pass = pending[q];
      const int64_t shift = base_length + offsets[q - next] - pass.shared_slots;
      keep(passes[pass.index], pass.laid, base,
           [&](int64_t slot) { return slot < pass.shared_slots ? slot : slot + shift; });
      finished(pass.index, static_cast<int64_t>(pass.laid.tokens.size()));
    }
    base.truncate(base_length);
    next = end;
  }
  report.bytes = store.bytes(layout.schema_name);
  report.ms = now_ms() - start;
  return report;
}

}  // namespace promptcache
