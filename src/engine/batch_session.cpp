#include "promptcache/batch_session.hpp"

#include <algorithm>
#include <cstring>

#include "decode_room.hpp"
#include "promptcache/error.hpp"

namespace promptcache {

struct BatchSession::Row {
  RowId id = 0;
  std::unique_ptr<TokenStream> stream;
  int64_t prompt_slots = 0;     // slots [0, prompt_slots) hold its prompt's states
  int64_t decode_begin = 0;     // slots from here on are its decoding (those between: not its own)
  TokenId next_token = -1;      // fed at the next step
  int64_t next_position = 0;    // the position it is fed at
  int64_t room = 0;             // decode steps it may still take (its share of the slots)
  bool finished = false;        // its sequence ended
  bool reported = false;        // step() returned it: the row is free for the next admit
  uint64_t prefix_version = 0;  // a plain row: the prefix store's version after its admission
  double start_ms = 0, first_token_ms = 0, last_token_ms = 0;
  Response response;
  int logprobs = -1;               // alternatives kept per token; -1: no log-probabilities
  std::vector<TokenLogprob> kept;  // per sampled token (the stop token's dropped at the end)
};

namespace {

// A row's sampled token as its stream takes it: -1 when the sequence ends there (a stop, or no
// room left in the row's share of the slots or in the context).
TokenId accept_token(TokenStream& stream, TokenId sampled, int64_t room, int64_t next_position,
                     int64_t context) {
  const TokenId id = stream.accept(sampled);
  if (id >= 0 && (room <= 0 || next_position >= context)) {
    stream.stop(StopReason::kContextFull);
    return -1;
  }
  return id;
}

void check_logprobs(int logprobs) {
  if (logprobs < -1 || logprobs > kMaxTopLogprobs) {
    throw Error(ErrorKind::kInvalidArgument, "logprobs must be -1 (none) or from 0 to " +
                                                 std::to_string(kMaxTopLogprobs) + ", got " +
                                                 std::to_string(logprobs));
  }
}

}  // namespace

TokenId BatchSession::sample_and_accept(Row& r, const float* logits, std::size_t n,
                                        int64_t context) {
  const TokenId id = r.stream->sample(logits, n);
  r.last_token_ms = now_ms();
  if (r.logprobs < 0 || id < 0)
    return accept_token(*r.stream, id, r.room, r.next_position, context);
  // Only rows that asked pay for the log-softmax (one pass over the logits, before sampling
  // adjustments: the model's own distribution).
  r.kept.push_back(token_logprob(logits, n, id, r.logprobs));
  current_logprob_ = &r.kept.back();
  TokenId next = -1;
  try {
    next = accept_token(*r.stream, id, r.room, r.next_position, context);
  } catch (...) {
    current_logprob_ = nullptr;
    throw;
  }
  current_logprob_ = nullptr;
  return next;
}

BatchSession::BatchSession(Engine& engine, BatchSessionOptions options)
    : engine_(engine), options_(options) {
  const int64_t context = engine_.model().config().max_position_embeddings;
  if (options_.max_rows <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "BatchSession: max_rows must be positive, got " +
                                                 std::to_string(options_.max_rows));
  }
  if (options_.max_slots <= 0) options_.max_slots = 2 * context;
  cache_ = engine_.model().make_cache(0);
  scratch_ = engine_.model().make_cache(0);
}

BatchSession::~BatchSession() = default;

int64_t BatchSession::active() const {
  return std::count_if(rows_.begin(), rows_.end(), [](const auto& r) { return !r->reported; });
}

int64_t BatchSession::place_row() const {
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    if (rows_[r]->reported) return static_cast<int64_t>(r);
  }
  return rows();
}

bool BatchSession::fits(int64_t prompt_slots, int64_t decode_room) const {
  if (rows_.empty()) return true;  // the session starts again from slot 0
  int64_t room = decode_room;
  for (const auto& r : rows_) {
    if (!r->finished) room = std::max(room, r->room);
  }
  return std::max(cache_.length(), prompt_slots) + room <= options_.max_slots;
}

bool BatchSession::make_room(int64_t prompt_slots, int64_t decode_room) {
  if (fits(prompt_slots, decode_room)) return true;
  compact();
  return fits(prompt_slots, decode_room);
}

std::optional<BatchSession::RowId> BatchSession::admit(const pml::Prompt& prompt,
                                                       const SamplingParams& params,
                                                       TokenCallback on_token,
                                                       const RequestOptions& request,
                                                       int logprobs) {
  const double start = now_ms();
  params.validate();
  check_logprobs(logprobs);
  const int64_t context = engine_.model().config().max_position_embeddings;
  const int64_t room = decode_room(params.max_new_tokens, context);
  const int64_t row = place_row();
  if (row >= options_.max_rows) return std::nullopt;
  // The schema is held until the prompt's states are in the batch cache (as in generate).
  const Engine::EntryPtr entry = engine_.entry_for(prompt);
  const pml::ResolvedPrompt resolved = pml::resolve(prompt, entry->layout, engine_.tokenizer());
  // The prompt's slots are at most its positions (checked before any work is done).
  const auto bound =
      static_cast<int64_t>(request.use_cache ? resolved.next_position() : resolved.baseline.size());
  if (!make_room(bound, room)) return std::nullopt;

  // Assembled and prefilled alone, exactly as generate does, recompute included (the states are
  // copied below; a recomputed scratch buffer is never reused as if it held the stored states).
  Engine::Prefill pre = engine_.prefill_with(
      request.use_cache ? entry.get() : nullptr, resolved, scratch_, request.use_cache, 0,
      AssembleOptions{request.reuse_buffer, false},
      RecomputeOptions{request.recompute.value_or(entry->layout.recompute.value_or(0)),
                       request.recompute_criterion, request.recompute_select_layer,
                       request.recompute_first_k});
  Response response;
  response.timings.assembly_ms = pre.assembled.ms;
  response.timings.fresh_prefill_ms = pre.prefill_ms;
  response.cached_tokens = pre.assembled.cached_tokens;
  response.reused_tokens = pre.assembled.reused_tokens;
  response.fresh_tokens = static_cast<int64_t>(pre.assembled.fresh_tokens.size());
  response.recomputed_tokens = pre.recomputed_tokens;
  response.exact_tokens = pre.assembled.exact_tokens;
  response.kv_bytes = pre.assembled.kv_bytes;
  return join(row, scratch_, pre.logits, resolved.baseline, params, std::move(on_token), room,
              start, std::move(response), 0, logprobs);
}

std::optional<BatchSession::RowId> BatchSession::admit_tokens(const std::vector<TokenId>& prompt,
                                                              const SamplingParams& params,
                                                              TokenCallback on_token,
                                                              int logprobs) {
  const double start = now_ms();
  params.validate();
  check_logprobs(logprobs);
  const LlamaModel& model = engine_.model();
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t context = model.config().max_position_embeddings;
  if (n == 0) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  if (n > context) {
    throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(n) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(context));
  }
  const int64_t room = decode_room(params.max_new_tokens, context);
  const int64_t row = place_row();
  if (row >= options_.max_rows || !make_room(n, room)) return std::nullopt;

  if (prefix_.layers() == 0) prefix_ = model.make_cache(0);
  // Slot i of the store depends only on tokens 0..i, so a shared prefix is exact.
  int64_t keep = 0;
  const auto common = static_cast<int64_t>(std::min(prefix_tokens_.size(), prompt.size()));
  while (keep < common && prefix_tokens_[keep] == prompt[keep]) ++keep;
  keep = std::min(keep, n - 1);
  if (keep < prefix_.length()) prefix_.truncate(keep);
  prefix_tokens_.resize(static_cast<std::size_t>(keep));
  ++prefix_version_;
  // Room for the tokens it generates too, kept here once it finishes (keep_generated).
  prefix_.reserve(std::min(context, n + room));

  const double prefill_start = now_ms();
  std::vector<int64_t> ids(prompt.begin() + keep, prompt.end()), positions(ids.size());
  for (std::size_t i = 0; i < positions.size(); ++i) positions[i] = keep + static_cast<int64_t>(i);
  const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
  torch::Tensor logits;
  try {
    logits = model.forward(torch::tensor(ids, int64).unsqueeze(0),
                           torch::tensor(positions, int64).unsqueeze(0), prefix_);
    synchronize(logits);
  } catch (...) {
    prefix_.clear();
    prefix_tokens_.clear();
    throw;
  }
  prefix_tokens_ = prompt;
  Response response;
  response.timings.fresh_prefill_ms = now_ms() - prefill_start;
  response.cached_tokens = keep;
  response.reused_tokens = keep;
  response.fresh_tokens = n - keep;
  return join(row, prefix_, logits, prompt, params, std::move(on_token), room, start,
              std::move(response), prefix_version_, logprobs);
}

BatchSession::RowId BatchSession::join(int64_t row, const KVCache& prompt,
                                       const torch::Tensor& logits, std::vector<TokenId> history,
                                       const SamplingParams& params, TokenCallback on_token,
                                       int64_t room, double start, Response response,
                                       uint64_t prefix_version, int logprobs) {
  const int64_t context = engine_.model().config().max_position_embeddings;
  if (rows_.empty()) {
    cache_.clear();
  } else if (row == rows()) {
    cache_.add_rows(1);
  }
  const int64_t prompt_slots = prompt.length();
  const int64_t length = std::max(cache_.length(), prompt_slots);
  int64_t needed = length + room;
  for (const auto& r : rows_) {
    if (!r->finished) needed = std::max(needed, length + r->room);
  }
  if (needed > cache_.capacity()) {
    // Grown by half at least, so a steady stream of admissions reallocates rarely.
    cache_.reserve(std::max(needed, std::min(options_.max_slots, cache_.capacity() * 3 / 2)));
  }
  // A prompt longer than the batch's slots: every row's decoded slots move up to make room (the
  // slots between a row's prompt and its decoding are hidden from it).
  if (prompt_slots > cache_.length()) move_decoded(prompt_slots - cache_.length());
  write_row(row, prompt);

  auto r = std::make_unique<Row>();
  r->id = next_id_++;
  r->prompt_slots = prompt_slots;
  r->decode_begin = cache_.length();
  r->room = room;
  r->prefix_version = prefix_version;
  r->start_ms = start;
  r->stream = std::make_unique<TokenStream>(engine_.model(), engine_.tokenizer(), params,
                                            std::move(history), std::move(on_token));
  r->response = std::move(response);
  r->logprobs = logprobs;

  // The first token, from the prefill's logits (generate's first iteration).
  auto host = logits.reshape({-1}).to(torch::kCPU, torch::kFloat32).contiguous();
  r->next_position = prompt.max_position() + 1;
  r->next_token = sample_and_accept(*r, host.data_ptr<float>(),
                                    static_cast<std::size_t>(host.numel()), context);
  r->first_token_ms = r->last_token_ms;
  r->finished = r->next_token < 0;
  const RowId admitted = r->id;
  if (row == rows()) {
    rows_.push_back(std::move(r));
  } else {
    rows_[static_cast<std::size_t>(row)] = std::move(r);
  }
  return admitted;
}

void BatchSession::keep_generated(const Row& r, int64_t row, const std::vector<TokenId>& tokens) {
  if (r.prefix_version == 0 || r.prefix_version != prefix_version_) return;
  // Decoded slot i holds the i-th token fed back (tokens[i], at position n + i).
  const int64_t fed =
      std::min<int64_t>(r.response.timings.decode_tokens, static_cast<int64_t>(tokens.size()));
  if (fed <= 0) return;
  const int64_t n = prefix_.length();
  prefix_.reserve(n + fed);
  prefix_.write_block(n, cache_.all_slots(r.decode_begin, fed).select(2, row).contiguous());
  std::vector<int64_t> positions(static_cast<std::size_t>(fed));
  for (int64_t i = 0; i < fed; ++i) positions[static_cast<std::size_t>(i)] = n + i;
  prefix_.fill_external(fed, positions);
  prefix_tokens_.insert(prefix_tokens_.end(), tokens.begin(), tokens.begin() + fed);
  ++prefix_version_;
}

void BatchSession::write_row(int64_t row, const KVCache& prompt) {
  const int64_t n = prompt.length(), length = cache_.length();
  cache_.write_block(0, prompt.all_slots(0, n).select(2, 0).contiguous(), row);
  std::vector<int64_t> positions = prompt.positions();
  if (length > n) {
    // Slots between the prompt and the row's decoding: hidden from it, zeroed so that no stale
    // value of an earlier row can reach the attention.
    cache_.all_slots(n, length - n).narrow(2, row, 1).zero_();
    positions.resize(static_cast<std::size_t>(length), -1);
  }
  cache_.set_row_positions(row, 0, positions);
}

int64_t BatchSession::used_slots() const {
  int64_t used = 0;
  for (const auto& r : rows_) {
    if (!r->reported) used = std::max(used, r->prompt_slots + cache_.length() - r->decode_begin);
  }
  return used;
}

void BatchSession::compact_if_sparse() {
  const int64_t unused = cache_.length() - used_slots();
  if (unused >= 16 && unused * 4 >= cache_.length()) compact();
}

void BatchSession::compact() {
  const int64_t unused = cache_.length() - used_slots();
  if (unused <= 0) return;
  move_decoded(-unused);
  ++compactions_;
}

void BatchSession::move_decoded(int64_t by) {
  const int64_t length = cache_.length(), target = length + by;
  if (by > 0) {  // new slots at the end: zeros at position -1 until a row's states move there
    cache_.all_slots(length, by).zero_();
    cache_.fill_external(by, std::vector<int64_t>(static_cast<std::size_t>(by), -1));
  }
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    Row& r = *rows_[i];
    const auto row = static_cast<int64_t>(i);
    if (r.reported) {  // a free row: sees only what it appends from now on
      r.prompt_slots = 0;
      r.decode_begin = target;
      continue;
    }
    const int64_t n = length - r.decode_begin;
    if (n > 0) {
      const auto moved = cache_.all_slots(r.decode_begin, n).narrow(2, row, 1).clone();
      cache_.all_slots(r.decode_begin + by, n).narrow(2, row, 1).copy_(moved);
      const auto& held = cache_.row_positions(row);
      const std::vector<int64_t> positions(held.begin() + r.decode_begin, held.begin() + length);
      cache_.set_row_positions(row, r.decode_begin + by, positions);
    }
    r.decode_begin += by;
  }
  if (by < 0) cache_.truncate(target);
}

torch::Tensor BatchSession::visibility() const {
  const int64_t columns = cache_.length() + 1;
  auto visible = torch::zeros({rows(), 1, columns}, torch::kBool);
  auto* data = visible.data_ptr<bool>();
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    bool* row = data + static_cast<int64_t>(r) * columns;
    std::memset(row, 1, static_cast<std::size_t>(rows_[r]->prompt_slots));
    std::memset(row + rows_[r]->decode_begin, 1,
                static_cast<std::size_t>(columns - rows_[r]->decode_begin));
  }
  return visible;
}

std::vector<BatchSession::Finished> BatchSession::step() {
  std::vector<Finished> out;
  const bool decoding =
      std::any_of(rows_.begin(), rows_.end(), [](const auto& r) { return !r->finished; });
  if (decoding) {
    const auto batch = rows();
    const auto int64 = torch::TensorOptions().dtype(torch::kInt64);
    auto ids = torch::zeros({batch, 1}, int64);
    auto positions = torch::zeros({batch, 1}, int64);
    int64_t* id_data = ids.data_ptr<int64_t>();
    int64_t* position_data = positions.data_ptr<int64_t>();
    for (int64_t i = 0; i < batch; ++i) {
      const Row& r = *rows_[static_cast<std::size_t>(i)];
      if (r.finished) continue;  // runs along on token 0, seen by no other row
      id_data[i] = static_cast<int64_t>(r.next_token);
      position_data[i] = r.next_position;
    }
    ForwardOptions forward;
    forward.attention_mask = visibility();
    auto logits = engine_.model().forward(ids, positions, cache_, forward).reshape({batch, -1});
    auto host = logits.to(torch::kCPU, torch::kFloat32).contiguous();
    const auto vocab = static_cast<std::size_t>(host.size(1));
    const int64_t context = engine_.model().config().max_position_embeddings;
    for (int64_t i = 0; i < batch; ++i) {
      Row& r = *rows_[static_cast<std::size_t>(i)];
      if (r.finished) continue;
      ++r.response.timings.decode_tokens;
      ++r.next_position;
      --r.room;
      r.next_token = sample_and_accept(r, host[i].data_ptr<float>(), vocab, context);
      r.finished = r.next_token < 0;
    }
  }
  retire_finished(out);
  return out;
}

void BatchSession::retire_finished(std::vector<Finished>& out) {
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    auto& r = rows_[i];
    if (!r->finished || r->reported) continue;
    GenerationResult result = r->stream->take_result();
    keep_generated(*r, static_cast<int64_t>(i), result.tokens);
    Response& response = r->response;
    response.text = std::move(result.text);
    response.tokens = std::move(result.tokens);
    response.stop_reason = result.stop_reason;
    response.timings.ttft_ms = r->first_token_ms - r->start_ms;
    response.timings.decode_ms = r->last_token_ms - r->first_token_ms;
    // The stop token (never in response.tokens) was sampled last: its entry goes.
    if (r->kept.size() > response.tokens.size()) r->kept.resize(response.tokens.size());
    out.push_back({r->id, std::move(response), std::move(r->kept)});
    r->reported = true;
    r->stream.reset();
  }
  std::vector<int64_t> keep;
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    if (!rows_[r]->reported) keep.push_back(static_cast<int64_t>(r));
  }
  if (keep.empty()) {
    // Empty: the next admission starts again from slot 0 with one row.
    rows_.clear();
    cache_.clear();
    if (cache_.shape().batch > 1) cache_.keep_rows({0});
    return;
  }
  compact_if_sparse();
  // Free rows run along until a new prompt takes them; once a quarter of the batch is free they
  // are dropped (moving the others' states down), as generate_batch drops finished rows.
  const auto free = static_cast<int64_t>(rows_.size() - keep.size());
  if (free * 4 < rows()) return;
  cache_.keep_rows(keep);
  std::vector<std::unique_ptr<Row>> kept;
  for (int64_t r : keep) kept.push_back(std::move(rows_[static_cast<std::size_t>(r)]));
  rows_ = std::move(kept);
}

}  // namespace promptcache
