// promptcache/engine.hpp — the application-facing API.
//
//   auto engine = promptcache::Engine::open("models/llama-2-7b-chat");
//   engine->add_schema_file("schemas/docqa.xml");           // compiles every module once
//   auto r = engine->generate_xml(R"(<prompt schema="docqa"><doc-a/> Who wrote it?</prompt>)");
//   std::cout << r.text << " (TTFT " << r.timings.ttft_ms << " ms)\n";
//
// generate() assembles the stored states of the modules a prompt selects, runs only the fresh
// tokens, and decodes; with use_cache = false it runs the very same token sequence as one
// ordinary prefill at positions 0..n-1 (the baseline the speedup is measured against).
//
// Threads (docs/reliability.md, "Concurrency"): one Engine serves any number of threads at once.
// generate, generate_xml, generate_batch, resolve, layout_only and has_schema may be called from
// several threads together, and with add_schema*. Compiled states are read-only and shared; each
// request takes its own KV buffer from a pool (so it reuses the leading modules the buffer kept
// from an earlier request, as one thread did) and holds the schema it resolved against until it
// returns, so adding or replacing a schema while requests run changes nothing for them: the next
// request sees the new one. add_schema calls are serialised among themselves; requests do not
// wait for a compile. The references layout(), compile_report() and add_schema*() return stay
// valid until that schema is added again or the engine is destroyed; store() is for inspection
// while no add_schema runs. Process-wide settings (configure_threads, set_kernel_threads) are
// made before serving, not per request. remove_schema, like add_schema, may run beside requests.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/cache/span_store.hpp"
#include "promptcache/cache/store.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/jinja/chat_source.hpp"
#include "promptcache/logprobs.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/recompute.hpp"

namespace promptcache {

struct EngineOptions {
  LoadOptions load;
  EncodingMode encoding = EncodingMode::kScaffold;
  // A family (llama-2, llama-3, mistral, chatml, plain) or "jinja"; empty: the model config's
  // family, else the model's Jinja chat template when it splits into role texts, else the family
  // the tokenizer suggests (jinja::model_chat_template).
  std::string chat_template;
  // Where the model's Jinja chat template is looked for (Engine::open: the model folder; empty:
  // nowhere), or the template itself (a GGUF file's tokenizer.chat_template).
  std::string chat_template_folder;
  std::optional<jinja::ChatTemplateSource> jinja_template;
  int64_t compile_chunk_tokens = 512;
  // Byte budgets of the span tiers (promptcache/cache/span_store.hpp; 0: no limit). With one,
  // a schema's states are not held by the schema: requests take theirs from the tiers.
  int64_t max_host_bytes = 0;
  int64_t max_device_bytes = 0;  // device-resident states, when the model is not on the CPU
  // A Redis server shared by many engines ("redis://HOST:PORT"; redis_tier.hpp): compiled spans
  // are written there, and a schema whose spans it holds is added without compiling.
  std::string redis_url;
  // The secret its values are sealed with (HMAC-SHA256; redis_tier.hpp): the same in every
  // engine sharing the server. Required with redis_url (Error(kInvalidArgument) when empty).
  std::string cache_secret;
  // Seconds a value stays in the Redis server unused (each use refreshes it); 0: it never
  // expires (redis_tier.hpp).
  int64_t redis_ttl_seconds = 0;
};

struct RequestOptions {
  bool use_cache = true;
  // Keep the module states the engine's KV buffer still holds from the previous request when
  // this prompt selects the same leading modules; false fills every span again.
  bool reuse_buffer = true;
  // generate_batch: once a quarter of the rows still in the batch are finished (and at least 4
  // steps may remain), they are dropped, moving the other rows' states down in place; false
  // keeps every row to the end (for comparison: bench_batch --uneven 1).
  bool drop_finished_rows = true;
  // Leave module states in the store, read there by the attention, where it can (CPU, f32 compute,
  // fused kernel, states f32/bf16/f16; AssembleOptions::in_place); false copies them into the
  // buffer (for comparison: bench_ttft's copied_* columns). Single prompts only; a batch copies.
  bool in_place = true;
  // The share r in [0, 1] of the cached tokens whose states are recomputed in the prompt's full
  // context, chosen by recompute_criterion (promptcache/recompute.hpp, docs/fidelity.md): 0 is
  // plain Prompt Cache, 1 the no-cache result. Unset: the schema's recompute attribute, else 0.
  // generate_batch and BatchSession apply it too (each recomputing prompt is prefilled alone).
  std::optional<double> recompute;
  RecomputeCriterion recompute_criterion = RecomputeCriterion::kImpact;
  int64_t recompute_select_layer = 1;  // RecomputeOptions::select_layer (kImpact, kDeviation)
  int64_t recompute_first_k = 8;       // RecomputeOptions::first_k (kFirstK*)
};

struct ResponseTimings {
  double assembly_ms = 0;       // placing stored states in the KV cache (copies, references)
  double fresh_prefill_ms = 0;  // forward over the fresh (or, without cache, all) tokens
  double ttft_ms = 0;           // request start to first token, prompt resolution included
  double decode_ms = 0;
  int64_t decode_tokens = 0;
  double decode_tokens_per_s() const { return decode_ms > 0 ? decode_tokens * 1e3 / decode_ms : 0; }
};

struct Response {
  std::string text;
  std::vector<TokenId> tokens;
  StopReason stop_reason = StopReason::kMaxTokens;
  ResponseTimings timings;
  int64_t cached_tokens = 0;    // prompt tokens served from the store
  int64_t reused_tokens = 0;    // of those, tokens already in the buffer from the previous request
  int64_t in_place_tokens = 0;  // of those, tokens read in place from the store (not copied)
  int64_t fresh_tokens = 0;     // prompt tokens run through the model
  int64_t recomputed_tokens = 0;  // cached tokens run again (RequestOptions::recompute)
  // When the request recomputes: of the cached tokens, the prompt's exact leading run, whose
  // states are the no-cache ones already and which recompute never chooses (recompute.hpp).
  int64_t exact_tokens = 0;
  int64_t kv_bytes = 0;  // bytes copied into the KV cache (none for in-place tokens)
};

// Scoring (Engine::score, `promptcache eval`): how likely the model finds each continuation
// of a prompt. Token i's log-probability is log p(tokens[i] | prompt, tokens[0..i)).
struct ContinuationScore {
  std::vector<TokenId> tokens;
  std::vector<double> logprob_per_token;
  double logprob = 0;  // their sum
  bool greedy = true;  // every token was the model's argmax (lm-eval's is_greedy)
  // Each token's entry with its likeliest alternatives: only when they were asked for
  // (Engine::sequence_logprobs); empty otherwise.
  std::vector<TokenLogprob> detail;
};

// Engine::sequence_logprobs: every token of a plain token sequence after the first, with its
// log-probability given the tokens before it (entry i is token i + 1's, as prompt_logprobs).
struct SequenceLogprobs {
  std::vector<TokenLogprob> tokens;
  std::string schema;         // the registered schema whose stored states were reused ("": none)
  int64_t cached_tokens = 0;  // the sequence's first tokens read from that schema's states
  int64_t fresh_tokens = 0;   // tokens run through the model for this call
};

struct ScoreResponse {
  std::vector<ContinuationScore> continuations;
  int64_t prompt_tokens = 0;  // the prompt's whole sequence (ResolvedPrompt::baseline)
  int64_t cached_tokens = 0;  // of its tokens, served from the store
  int64_t fresh_tokens = 0;   // of its tokens, run through the model
  int64_t scored_tokens = 0;  // continuation tokens run through the model (each one's last is not)
  double prefill_ms = 0;      // the prompt (a batch: every row's, together)
  double score_ms = 0;        // the continuations' forward (a batch: every row's, together)
};

// Called for every generated token of prompt `index` of a batch, as TokenCallback is for one
// prompt; returning false stops that prompt only.
using BatchTokenCallback =
    std::function<bool(std::size_t index, TokenId id, const std::string& text)>;

class Engine {
 public:
  Engine(std::unique_ptr<LlamaModel> model, std::unique_ptr<Tokenizer> tokenizer,
         EngineOptions options = {});
  // Loads a HuggingFace folder (config.json, *.safetensors, tokenizer.model).
  static std::unique_ptr<Engine> open(const std::string& model_dir, EngineOptions options = {});

  using ProgressCallback = std::function<void(const std::string& schema, const CompileProgress&)>;
  // Parses, lays out and compiles a schema; replaces a schema of the same name. With a
  // cache_file the states are loaded from it when it matches this schema layout, model, dtype
  // and encoding mode, and compiled then saved to it otherwise: a file of another layout, model,
  // dtype or mode, or one whose checksums fail, is replaced (compile_report().source says why);
  // one the safetensors reader refuses (truncated, malformed) is an error and left alone.
  // A schema refused while it is parsed or laid out (kContextOverflow when it cannot fit the
  // model's context), or one that fails to compile, leaves the engine as it was (an earlier
  // version of it stays loaded: the new states are built beside the old ones); one compiled but
  // not saved (Error(kIo) naming the file) is added before the error is thrown.
  // `policy` kRecompile compiles even when the file or the remote store holds the states, and
  // overwrites both (`promptcache compile --force`).
  enum class StatesPolicy { kReuse, kRecompile };
  // `cancelled`, asked before every forward of the compile, stops it with Error(kCancelled) when
  // it returns true (the engine is left as it was).
  const pml::Layout& add_schema(const pml::Schema& schema, const ProgressCallback& progress = {},
                                const std::string& cache_file = "",
                                StatesPolicy policy = StatesPolicy::kReuse,
                                const std::function<bool()>& cancelled = {});
  // A schema file: its module src attributes name files inside its own folder
  // (pml::parse_schema_file; parse it with another pml::SrcResolver and call add_schema to allow
  // more). A schema string: with a base_dir its src files are read inside that folder, without
  // one they are refused.
  const pml::Layout& add_schema_file(const std::string& path, const ProgressCallback& progress = {},
                                     const std::string& cache_file = "");
  const pml::Layout& add_schema_string(const std::string& xml,
                                       const std::string& origin = "<string>",
                                       const std::string& base_dir = "",
                                       const ProgressCallback& progress = {});
  // Lays a schema out without compiling it, held to the model's context (Error(kContextOverflow)
  // when it cannot fit; `promptcache layout` lays out without that limit and warns instead).
  pml::Layout layout_only(const pml::Schema& schema) const;

  // Unloads a schema: prompts naming it get Error(kUnknownSchema) from now on, and its states
  // are freed once no request holds them (requests running on it keep them until they return).
  // False when no schema of that name is loaded. The layout() and compile_report() references
  // of it are invalid afterwards.
  bool remove_schema(const std::string& name);

  bool has_schema(const std::string& name) const;
  const pml::Layout& layout(const std::string& schema) const;
  const CompileReport& compile_report(const std::string& schema) const;

  // Error(kUnknownSchema) naming the prompt's schema and the loaded ones.
  pml::ResolvedPrompt resolve(const pml::Prompt& prompt) const;

  Response generate(const pml::Prompt& prompt, const SamplingParams& params = {},
                    const TokenCallback& on_token = {}, const RequestOptions& request = {});
  Response generate_xml(const std::string& prompt_xml, const SamplingParams& params = {},
                        const TokenCallback& on_token = {}, const RequestOptions& request = {},
                        const std::string& origin = "<string>");

  // Several prompts at once, each selecting its own modules (of one schema or several): they are
  // assembled into the rows of one batch KV cache, their fresh tokens run as one batched forward
  // and every unfinished prompt decodes in the same steps. Response i is what
  // generate(prompts[i], params) gives — the same tokens under greedy decoding or the same seed,
  // logits equal within float rounding — except that assembly_ms and fresh_prefill_ms are the
  // whole batch's. With use_cache = false each prompt runs its baseline sequence, batched the
  // same way. reuse_buffer does not apply: a batch copies every span it selects. When a prompt
  // recomputes (RequestOptions::recompute, or its schema's default), the batch runs as a
  // BatchSession instead: each prompt is prefilled alone, recompute included, and they decode
  // together (each Response then has its own timings).
  std::vector<Response> generate_batch(const std::vector<pml::Prompt>& prompts,
                                       const SamplingParams& params = {},
                                       const BatchTokenCallback& on_token = {},
                                       const RequestOptions& request = {});

  // A continuation's tokens: its text encoded as a PML text span of its own (pml::encode_span:
  // the edges' whitespace compacted; a SentencePiece tokenizer reads it as following a space, a
  // byte-level one keeps a leading space as its first byte). Empty for blank text.
  std::vector<TokenId> encode_continuation(const std::string& text) const;

  // Scores continuations of a prompt: the prompt is assembled and prefilled once (as generate
  // does: modules from the store, only fresh tokens run; with use_cache = false its baseline
  // sequence), then every continuation runs in ONE forward from those states — continuations
  // packed one after another, each at the positions after the prompt and seeing the prompt and
  // its own earlier tokens only — never re-encoding the prompt. Equal to a no-cache forward of
  // prompt + continuation when the modules form a prefix (contract 2), and to contract 3's
  // reference otherwise. Error(kInvalidArgument) for an empty continuation or an id outside the
  // vocabulary, Error(kContextOverflow) when a continuation's last token would pass the context,
  // and the errors of generate. RequestOptions::recompute applies as in generate.
  ScoreResponse score(const pml::Prompt& prompt,
                      const std::vector<std::vector<TokenId>>& continuations,
                      const RequestOptions& request = {});
  // Several prompts, each with its own continuations (of one schema or several, any module
  // selections and lengths): the prompts are prefilled as one batch (prefill_batch) and every
  // row's packed continuations run in one batched forward. Response i is what score(prompts[i],
  // continuations[i]) gives (log-probabilities within float rounding), except that prefill_ms
  // and score_ms are the batch's. Prompts that recompute are scored one by one.
  std::vector<ScoreResponse> score_batch(
      const std::vector<pml::Prompt>& prompts,
      const std::vector<std::vector<std::vector<TokenId>>>& continuations,
      const RequestOptions& request = {});

  // The log-probability of every token of `ids` after the first, with `top` (0..kMaxTopLogprobs)
  // likeliest alternatives each — what prompt_logprobs computes with an ordinary forward at
  // positions 0..n-1, and equal to it within rounding (contract 2) — but when use_cache and the
  // sequence begins with a registered schema's stored spans (pml::match_prefix: the longest exact
  // run of any schema, leaving at least one token fresh), those tokens are read from the store
  // and only the rest runs. The matched part's own log-probabilities are computed once per schema
  // version and prefix and kept for the next calls (a few recent prefixes). This is how an
  // evaluation client that sends plain token ids (`echo` with `logprobs`) reuses a schema's
  // instruction and few-shot examples. Error(kInvalidArgument) for an id outside the vocabulary
  // or top out of range, Error(kContextOverflow) past the context.
  SequenceLogprobs sequence_logprobs(const std::vector<TokenId>& ids, int top,
                                     bool use_cache = true);

  // The prompt's KV cache and last-position logits without decoding (tests, benchmarks). The
  // prompt's schema as loaded now is used: resolve and prefill while it is not being replaced.
  struct Prefill {
    torch::Tensor logits;  // [vocab] float32, after the last prompt token
    AssembledPrompt assembled;
    double prefill_ms = 0;
    int64_t recomputed_tokens = 0;  // `recompute`'s share of the cached tokens
  };
  // `assembly`: whether spans `cache` already holds from an earlier prefill are kept, and
  // whether the others are read in place (Assembler::assemble). `recompute` (cached only): see
  // RequestOptions::recompute; the slots it rewrites are copied, never changed in the store.
  Prefill prefill(const pml::ResolvedPrompt& resolved, KVCache& cache, bool use_cache,
                  int64_t extra_capacity = 0, const AssembleOptions& assembly = {},
                  const RecomputeOptions& recompute = {}) const;

  // A batch's KV cache (batch = prompts) and each prompt's last-position logits (the schemas as
  // loaded now, as prefill).
  struct BatchPrefill {
    torch::Tensor logits;  // [prompts, vocab] float32
    AssembledBatch assembled;
    // [rows, cache capacity] bool on the CPU: the slots each row may attend to (its own stored
    // states, its fresh tokens, and every slot decoding appends after them).
    torch::Tensor visible;
    double prefill_ms = 0;
  };
  BatchPrefill prefill_batch(const std::vector<pml::ResolvedPrompt>& resolved, KVCache& cache,
                             bool use_cache, int64_t extra_capacity = 0) const;

  const LlamaModel& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Every loaded schema's states (requests read their schema's own, see SchemaEntry).
  const CacheStore& store() const { return store_; }
  const pml::ChatTemplate& chat_template() const { return template_; }
  // Where chat_template() came from (a Jinja template's file, or a family and why).
  const std::string& chat_template_origin() const { return template_origin_; }
  const EngineOptions& options() const { return options_; }
  // Hits, misses, evictions, bytes per tier of the stored spans (span_store.hpp).
  TierStats tier_stats() const { return spans_->stats(); }

 private:
  // Continuous batching (batch_session.hpp) resolves and prefills against an entry it holds.
  friend class BatchSession;
  // A loaded schema: never changed once published. A request holds the entry it resolved
  // against (shared_ptr) until it returns, so its layout and states outlive a replacement.
  struct SchemaEntry {
    pml::Layout layout;
    CompileReport report;
    CacheStore states;  // this schema's states only (none with a tier budget: see spans)
    std::shared_ptr<const SchemaSpans> spans;  // its spans' keys in spans_
  };
  using EntryPtr = std::shared_ptr<const SchemaEntry>;
  // The schema as loaded now; Error(kUnknownSchema) if absent (entry_for: naming the prompt and
  // the loaded schemas).
  EntryPtr entry(const std::string& schema) const;
  EntryPtr entry_for(const pml::Prompt& prompt) const;
  // Whether a request's prefill of `resolved` would recompute anything: it uses the cache, asks
  // for a share (its own, else the schema's) or a module budget, and the prompt is not a prefix
  // (exact_without_recompute). Such prompts are prefilled one by one in batches.
  bool recomputes(const SchemaEntry& schema, const pml::ResolvedPrompt& resolved,
                  const RequestOptions& request) const;
  // Makes `entry` the schema's (replacing any), with its states in store_ too.
  void publish(const std::string& name, EntryPtr entry);
  // Empties the free KV buffers that hold states of the schema (replaced or removed).
  void forget_buffers_of(const std::string& name);
  // Cuts a free KV buffer's contents short before the stored block `id` (evicted from the span
  // tiers; SpanStore's eviction listener), so a block it read in place is not kept alive.
  void release_evicted(uint64_t id);

  // A KV buffer taken from the pool for one request and given back when it ends (see "The KV
  // buffer pool" in engine.cpp: which buffer a prompt gets, what it keeps).
  struct PooledBuffer {
    KVCache cache;
    std::string schema;                  // the schema whose states it last held ("" for none)
    const SchemaEntry* entry = nullptr;  // which version of it (compared, never dereferenced)
  };
  class BufferLease;
  std::unique_ptr<PooledBuffer> take_buffer(const SchemaEntry& entry,
                                            const pml::ResolvedPrompt& resolved);
  std::unique_ptr<PooledBuffer> take_batch_buffer(int64_t rows);
  // generate_batch for prompts of which some recompute: a BatchSession of them all.
  std::vector<Response> generate_in_session(const std::vector<pml::Prompt>& prompts,
                                            const SamplingParams& params,
                                            const BatchTokenCallback& on_token,
                                            const RequestOptions& request);
  void give_back(std::unique_ptr<PooledBuffer> buffer, bool batch, bool finished);
  // score_batch's rows, prefilled (as one batch, or one by one) and their continuations run.
  std::vector<ScoreResponse> score_rows(const std::vector<EntryPtr>& entries,
                                        const std::vector<pml::ResolvedPrompt>& resolved,
                                        const std::vector<std::vector<std::vector<TokenId>>>& conts,
                                        const RequestOptions& request, bool alone, int top = -1);

  Prefill prefill_with(const SchemaEntry* entry, const pml::ResolvedPrompt& resolved,
                       KVCache& cache, bool use_cache, int64_t extra_capacity,
                       const AssembleOptions& assembly, const RecomputeOptions& recompute) const;
  BatchPrefill prefill_batch_with(const std::vector<EntryPtr>& entries,
                                  const std::vector<pml::ResolvedPrompt>& resolved, KVCache& cache,
                                  bool use_cache, int64_t extra_capacity) const;

  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  EngineOptions options_;
  pml::ChatTemplate template_;
  std::string template_origin_;
  std::unique_ptr<SpanStore> spans_;         // before schemas_: outlives every entry's SchemaSpans
  std::mutex add_mutex_;                     // one add_schema at a time
  mutable std::shared_mutex schemas_mutex_;  // guards schemas_ and store_
  std::map<std::string, EntryPtr> schemas_;
  CacheStore store_;
  // Buffers no request holds now: as many as requests ran at once (single prompts and batches
  // apart). A batch buffer serves one batch size; one of another size is replaced.
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<PooledBuffer>> free_buffers_;
  std::vector<std::unique_ptr<PooledBuffer>> free_batch_buffers_;
  // sequence_logprobs's recent matched prefixes with their tokens' log-probabilities, most
  // recent first (sequence_logprobs.cpp).
  struct PrefixLogprobs;
  std::mutex prefix_logprobs_mutex_;
  std::vector<std::shared_ptr<const PrefixLogprobs>> prefix_logprobs_;
};

}  // namespace promptcache
