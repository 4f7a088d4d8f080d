// promptcache/batch_session.hpp — continuous batching: prompts join and leave a decoding batch.
//
//   BatchSession session(*engine);
//   auto a = session.admit(prompt_a, params);        // prefilled, first token sampled
//   session.step();                                  // one decode step for every active row
//   auto b = session.admit(prompt_b, params);        // joins the running batch
//   while (!session.empty())
//     for (auto& done : session.step()) use(done.id, done.response);
//
// The session owns one batch KV cache. admit() assembles a prompt's modules and runs its fresh
// tokens in a KV buffer of its own (exactly as Engine::generate does), copies those states into a
// row of the batch cache at slots the other rows never see, and samples the first token. step()
// feeds every active row its last token in one batched forward, each row attending to its own
// prompt slots and to the slots its decoding appended. A row whose sequence ends is reported
// once by step() and leaves the batch (its row is reused by the next admit, or dropped with
// KVCache::keep_rows once enough rows are free). admit_tokens() does the same for a prompt of
// plain token ids (no modules), prefilled in the session's prefix store after the longest prefix
// it shares with the previous plain prompt, and copied into its row from there.
//
// Contract (tests/contracts/test_session_exact.cpp): a prompt gets what Engine::generate gives it
// alone — the same tokens under greedy decoding or the same seed, logits equal within float
// rounding — whenever it is admitted and whatever else runs beside it; a plain prompt gets what
// generate() (generation.hpp) gives its ids alone.
//
// Slots: every row shares the cache's slot count, which grows by one per step while any row
// decodes and by a long prompt's excess over it at admission (the rows' decoded slots then move
// up past the new prompt's end). A row sees its prompt's slots and
// those its decoding appended, nothing between; once a quarter of the slots serve no running row
// the decoded slots move down (a copy of decoded tokens only), so the batch holds about as many
// slots as its fullest row needs. It starts again from 0 whenever the session is empty. admit()
// returns nothing (the caller retries after a step) when the prompt's slots and the decoding every
// row may still do would pass max_slots; an empty session admits any prompt within the model's
// context.
//
// One thread uses a session; the engine may serve other requests meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "promptcache/engine.hpp"
#include "promptcache/logprobs.hpp"

namespace promptcache {

struct BatchSessionOptions {
  int64_t max_rows = 16;  // rows decoding at once; admit() refuses more
  int64_t max_slots = 0;  // slots of the batch cache; 0: twice the model's context
};

class BatchSession {
 public:
  using RowId = uint64_t;
  struct Finished {
    RowId id = 0;
    Response response;
    // With `logprobs` >= 0 at admission: one entry per token of response.tokens.
    std::vector<TokenLogprob> logprobs;
  };

  explicit BatchSession(Engine& engine, BatchSessionOptions options = {});
  BatchSession(const BatchSession&) = delete;
  BatchSession& operator=(const BatchSession&) = delete;
  ~BatchSession();

  // Resolves, assembles and prefills the prompt, samples its first token (streamed through
  // on_token) and makes it a row of the batch. RequestOptions::recompute (or the schema's
  // default) applies as in generate: the chosen tokens are recomputed while the prompt is
  // prefilled alone. Errors as Engine::generate (unknown schema, context overflow, bad
  // parameters, a recompute share outside [0, 1]). Nothing (and no work done) when the
  // batch is full or its slots cannot hold the prompt now. A prompt whose sequence ends at its
  // first token is reported by the next step().
  //
  // `logprobs` >= 0 (at most kMaxTopLogprobs): every generated token's log-probability under the
  // model's raw distribution and its `logprobs` likeliest alternatives are kept
  // (Finished::logprobs) and shown to on_token (current_logprob()); -1 (the default) costs
  // nothing.
  std::optional<RowId> admit(const pml::Prompt& prompt, const SamplingParams& params,
                             TokenCallback on_token = {}, const RequestOptions& request = {},
                             int logprobs = -1);

  // A prompt without modules (the model as a plain LLM): token ids at positions 0..n-1. The
  // session keeps the states of the last plain prompt it admitted (and, once that one has
  // finished, of the tokens it generated) and copies the longest prefix the next plain prompt
  // shares with them into its row instead of running it again (exact prefix reuse, as in vLLM,
  // SGLang and llama-server); only the rest is prefilled, at least the last prompt token (its
  // logits give the first token). Response::cached_tokens and reused_tokens count the prefix,
  // fresh_tokens the rest. Errors: kPrompt for an empty prompt, kContextOverflow past the model's
  // context, bad parameters. Nothing (and no work done) when there is no room now, as admit().
  std::optional<RowId> admit_tokens(const std::vector<TokenId>& prompt,
                                    const SamplingParams& params, TokenCallback on_token = {},
                                    int logprobs = -1);
  // While an on_token callback of a row admitted with logprobs runs: the log-probability entry
  // of the token it is passed; nullptr otherwise.
  const TokenLogprob* current_logprob() const { return current_logprob_; }
  // The tokens whose states the plain prefix store holds (slot i = position i).
  const std::vector<TokenId>& prefix_tokens() const { return prefix_tokens_; }

  // One decode step for every active row; returns the rows that finished (each once).
  std::vector<Finished> step();

  // Rows still decoding (or finished and not yet reported).
  int64_t active() const;
  bool empty() const { return active() == 0; }
  // Slots the batch cache holds now (every row's, see "Slots" above).
  int64_t slots() const { return cache_.length(); }
  // Rows of the batch cache, finished ones not yet dropped included.
  int64_t rows() const { return static_cast<int64_t>(rows_.size()); }
  // How many times the slots were compacted (see "Slots" above).
  int64_t compactions() const { return compactions_; }

 private:
  struct Row;
  // Where a new prompt of `prompt_slots` slots goes: a free row's index, or rows() for a new one.
  int64_t place_row() const;
  bool fits(int64_t prompt_slots, int64_t decode_room) const;
  // fits(), after dropping the slots no running row needs when it does not.
  bool make_room(int64_t prompt_slots, int64_t decode_room);
  // Makes the prefilled `prompt` states (`logits`: after its last token) row `row` of the batch
  // and samples its first token; `response` carries the prompt's token counts and timings.
  RowId join(int64_t row, const KVCache& prompt, const torch::Tensor& logits,
             std::vector<TokenId> history, const SamplingParams& params, TokenCallback on_token,
             int64_t room, double start, Response response, uint64_t prefix_version, int logprobs);
  // Samples row `r`'s next token from `n` logits and passes it to its stream (with its
  // log-probability when the row keeps them): accept_token's result.
  TokenId sample_and_accept(Row& r, const float* logits, std::size_t n, int64_t context);
  // A finished plain row whose prompt the prefix store still holds: its fed-back tokens' states
  // are appended there, so a follow-up that repeats the answer reuses them too.
  void keep_generated(const Row& r, int64_t row, const std::vector<TokenId>& tokens);
  void write_row(int64_t row, const KVCache& prompt);
  void retire_finished(std::vector<Finished>& out);
  // The most slots a row still running needs (its prompt and its decoding).
  int64_t used_slots() const;
  // Drops the slots no running row needs (moving decoded slots down); the _if_sparse form only
  // when at least a quarter of them are unused.
  void compact();
  void compact_if_sparse();
  // Moves every running row's decoded slots by `by` slots (down when negative), its prompt
  // staying where it is; the batch's slot count changes by `by`.
  void move_decoded(int64_t by);
  torch::Tensor visibility() const;  // [rows, 1, 1, slots + 1] for the next step

  Engine& engine_;
  BatchSessionOptions options_;
  KVCache cache_;    // the batch: row r holds rows_[r]
  KVCache scratch_;  // one prompt's assembly and prefill (keeps its modules for the next)
  KVCache prefix_;   // the plain prefix store: states of prefix_tokens_ (batch 1)
  std::vector<TokenId> prefix_tokens_;
  uint64_t prefix_version_ = 0;  // changes whenever prefix_ does
  std::vector<std::unique_ptr<Row>> rows_;
  RowId next_id_ = 1;
  const TokenLogprob* current_logprob_ = nullptr;  // see current_logprob()
  int64_t compactions_ = 0;
};

}  // namespace promptcache
