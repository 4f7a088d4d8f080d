// promptcache/cache/compiler.hpp — THE place where module states are produced.
//
// Scaffold encoding (the default, as the reference does it): the schema is run in causal passes,
// the scaffold pass (every union represented by its scaffold member, parameters holding their
// scaffold/unk tokens) and one pass per non-scaffold union member; each cacheable span's K/V is
// taken from the pass that stores it (pml::Layout::spans_stored_by), at its reserved positions.
// Isolated encoding: every module's own spans form a pass of their own, so a module attends only
// to itself (the paper's description; useful for fidelity experiments).
// Short passes are batched: their tokens go through one forward call, each seeing only its own
// pass (and, in scaffold mode, the prefix it shares with the scaffold pass).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "promptcache/cache/store.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"

namespace promptcache {

enum class EncodingMode { kScaffold, kIsolated };
const char* to_string(EncodingMode mode);
EncodingMode parse_encoding_mode(const std::string& text);

struct CompileProgress {
  std::size_t pass = 0;  // 1-based index of the pass just finished
  std::size_t passes = 0;
  int64_t tokens_done = 0;  // tokens run through the model so far
  int64_t tokens_total = 0;
};

struct CompileOptions {
  EncodingMode mode = EncodingMode::kScaffold;
  // Tokens per forward call: long passes run in chunks through the KV cache (same result as one
  // causal forward, bounded attention memory), and passes shorter than this run together in one
  // forward, as many as fit, under a block mask.
  int64_t chunk_tokens = 512;
  // Off: every pass runs in forwards of its own (for comparison; the states are the same).
  bool batch_passes = true;
  std::function<void(const CompileProgress&)> on_progress;
  // Asked before every forward: true stops the compile with Error(kCancelled) (the store keeps
  // none of its states). A server cancels a compile whose client went away this way.
  std::function<bool()> cancelled;
};

struct CompileReport {
  std::size_t passes = 0;
  int64_t tokens_run = 0;     // tokens the model processed (shared prefixes counted once)
  int64_t tokens_stored = 0;  // tokens whose states went into the store
  int64_t forwards = 0;       // forward calls (short passes share one)
  int64_t bytes = 0;
  double ms = 0;
  // How the states came to be: "compiled", or with a cache file "loaded from FILE",
  // "compiled, saved to FILE", "FILE was stale (REASON); compiled and saved".
  std::string source = "compiled";
};

// One encoding pass: the spans it runs (in order) and the spans whose states it keeps.
struct EncodingPass {
  std::vector<std::size_t> spans;
  std::vector<std::size_t> stored;
};

// The passes a schema is compiled with, in the given mode.
std::vector<EncodingPass> encoding_passes(const pml::Layout& layout, EncodingMode mode);

// The spans a stored span attended to when it was encoded (those before it in its pass).
std::vector<std::size_t> encoding_context(const pml::Layout& layout, std::size_t span,
                                          EncodingMode mode);

// How many of the prompt's first baseline tokens have stored states equal to what its no-cache
// prefill computes (within float rounding, as DESIGN.md contract 2): the longest run of its
// selected spans, from position 0 without a gap, each stored (cacheable, not a parameter slot)
// and encoded with exactly the spans before it in that run as its context. A prefix prompt's
// whole cached part; 0 when the first span is not such a one. Recompute never needs to touch
// these tokens (recompute.hpp).
std::size_t exact_prefix_tokens(const pml::Layout& layout, const pml::ResolvedPrompt& prompt,
                                EncodingMode mode);

// Whether the prompt's text follows its exact leading run directly, which holds every token
// before it: a prefix prompt, whose cached answer is the no-cache one without any recompute.
bool exact_without_recompute(const pml::Layout& layout, const pml::ResolvedPrompt& prompt,
                             EncodingMode mode);

// Compiles one stored span alone: its encoding context and itself, run causally (in chunks of
// `chunk_tokens`), its states kept (a span evicted from every tier, see span_store.hpp). The same
// states as ModuleCompiler's within float rounding (which may run the same tokens grouped
// otherwise).
SpanStates compile_span(const LlamaModel& model, const pml::Layout& layout, std::size_t span,
                        EncodingMode mode, int64_t chunk_tokens);

class ModuleCompiler {
 public:
  explicit ModuleCompiler(const LlamaModel& model) : model_(model) {}
  // Encodes every cacheable span of the layout and puts its states into the store (replacing
  // what the store had for this schema).
  CompileReport compile(const pml::Layout& layout, CacheStore& store,
                        const CompileOptions& options = {}) const;

 private:
  const LlamaModel& model_;
};

}  // namespace promptcache
