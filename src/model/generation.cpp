#include "promptcache/generation.hpp"

#include <algorithm>
#include <chrono>

#include <torch/cuda.h>

#include "promptcache/error.hpp"

namespace promptcache {

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kEos:
      return "eos";
    case StopReason::kStopToken:
      return "stop_token";
    case StopReason::kStopString:
      return "stop_string";
    case StopReason::kCallback:
      return "callback";
    case StopReason::kContextFull:
      return "context_full";
  }
  return "unknown";
}

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

void synchronize(const torch::Tensor& t) {
  if (t.defined() && t.is_cuda()) torch::cuda::synchronize(t.device().index());
}

namespace {

// Length of the longest prefix of `s` that is a complete UTF-8 sequence run.
std::size_t complete_utf8_prefix(const std::string& s) {
  std::size_t i = s.size();
  std::size_t back = 0;
  while (i > 0 && back < 4) {
    const unsigned char c = static_cast<unsigned char>(s[i - 1]);
    if ((c & 0xC0) != 0x80) {  // a lead byte or ASCII
      const std::size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
      return back + 1 >= need ? s.size() : i - 1;
    }
    --i;
    ++back;
  }
  return s.size();
}

}  // namespace

TokenStream::TokenStream(const LlamaModel& model, const Tokenizer& tokenizer,
                         const SamplingParams& params, std::vector<TokenId> history,
                         TokenCallback on_token)
    : tokenizer_(tokenizer),
      params_(params),
      on_token_(std::move(on_token)),
      sampler_(params),
      history_(std::move(history)) {
  params_.validate();
  if (params_.stop_at_eos) {
    for (int64_t id : model.config().eos_token_ids) stops_.push_back(static_cast<TokenId>(id));
    // And the tokenizer's end-of-turn ids (its EOS, <|im_end|>, <|eot_id|>, generation_config's).
    for (TokenId id : tokenizer.end_of_turn_ids()) stops_.push_back(id);
  }
  stops_eos_ = stops_.size();
  stops_.insert(stops_.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
  done_ = params_.max_new_tokens <= 0;
}

void TokenStream::stop(StopReason reason) {
  if (done_) return;
  result_.stop_reason = reason;
  done_ = true;
}

TokenId TokenStream::sample(const float* logits, std::size_t n) {
  if (done_) return -1;
  ++samples_;
  return sampler_.sample(logits, n, history_);
}

TokenId TokenStream::accept(TokenId id) {
  if (done_) return -1;
  const auto stop_at = std::find(stops_.begin(), stops_.end(), id);
  if (stop_at != stops_.end()) {
    stop(stop_at - stops_.begin() < static_cast<std::ptrdiff_t>(stops_eos_)
             ? StopReason::kEos
             : StopReason::kStopToken);
    return -1;
  }
  result_.tokens.push_back(id);
  history_.push_back(id);
  // Decode the whole continuation each time: SentencePiece spacing and multi-byte characters
  // depend on neighbours, so per-piece decoding would garble text.
  std::string text = tokenizer_.decode(result_.tokens);
  bool stop_string = false;
  for (const auto& s : params_.stop_strings) {
    const auto at = s.empty() ? std::string::npos : text.find(s);
    if (at != std::string::npos) {
      text.resize(at);
      stop_string = true;
    }
  }
  result_.text = text;
  if (on_token_) {
    // Decoding drops the dummy-prefix space of the first piece; after a prompt it is a real
    // space, so the stream keeps it (the returned text, like HF's decode, does not).
    if (result_.tokens.size() == 1 && history_.size() > 1 && !text.empty() &&
        tokenizer_.decode_piece(id).rfind(' ', 0) == 0) {
      stream_lead_ = " ";
    }
    text = stream_lead_ + text;
    const std::size_t ready = stop_string ? text.size() : complete_utf8_prefix(text);
    std::string piece;
    if (ready > emitted_.size() && text.compare(0, emitted_.size(), emitted_) == 0) {
      piece = text.substr(emitted_.size(), ready - emitted_.size());
      emitted_ = text.substr(0, ready);
    }
    if (!on_token_(id, piece)) {
      stop(StopReason::kCallback);
      return -1;
    }
  }
  if (stop_string) {
    stop(StopReason::kStopString);
    return -1;
  }
  if (samples_ == params_.max_new_tokens) {
    stop(StopReason::kMaxTokens);
    return -1;
  }
  return id;
}

GenerationResult continue_generation(const LlamaModel& model, const Tokenizer& tokenizer,
                                     KVCache& cache, const torch::Tensor& last_logits,
                                     int64_t next_position, std::vector<TokenId> history,
                                     const SamplingParams& params, const TokenCallback& on_token,
                                     double start_ms, GenerationTimings timings) {
  TokenStream stream(model, tokenizer, params, std::move(history), on_token);
  torch::Tensor logits = last_logits;
  double decode_start = 0;
  const auto device = model.device();
  while (!stream.done()) {
    auto row = logits.reshape({-1}).to(torch::kCPU, torch::kFloat32).contiguous();
    TokenId id = stream.sample(row.data_ptr<float>(), static_cast<std::size_t>(row.numel()));
    if (decode_start == 0) {
      timings.ttft_ms = now_ms() - start_ms;
      decode_start = now_ms();
    }
    if ((id = stream.accept(id)) < 0) break;
    if (cache.length() >= cache.capacity() ||
        next_position >= model.config().max_position_embeddings) {
      stream.stop(StopReason::kContextFull);
      break;
    }
    auto ids = torch::full({1, 1}, static_cast<int64_t>(id),
                           torch::TensorOptions().dtype(torch::kInt64).device(device));
    auto pos = torch::full({1, 1}, next_position++,
                           torch::TensorOptions().dtype(torch::kInt64).device(device));
    logits = model.forward(ids, pos, cache);
    ++timings.decode_tokens;
  }
  synchronize(logits);
  if (decode_start > 0) timings.decode_ms = now_ms() - decode_start;
  GenerationResult result = stream.take_result();
  result.timings = timings;
  return result;
}

GenerationResult generate(const LlamaModel& model, const Tokenizer& tokenizer,
                          const std::vector<TokenId>& prompt, const SamplingParams& params,
                          const TokenCallback& on_token) {
  if (prompt.empty()) throw Error(ErrorKind::kInvalidArgument, "prompt has no tokens");
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t limit = model.config().max_position_embeddings;
  if (n > limit) {
    throw Error(ErrorKind::kContextOverflow, "prompt has " + std::to_string(n) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(limit));
  }
  const double start = now_ms();
  KVCache cache = model.make_cache(std::min<int64_t>(n + params.max_new_tokens, limit));
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  auto options = torch::TensorOptions().dtype(torch::kInt64);
  auto id_tensor = torch::tensor(ids, options).unsqueeze(0);
  auto positions = torch::arange(n, options).unsqueeze(0);
  auto logits = model.forward(id_tensor, positions, cache);
  synchronize(logits);
  GenerationTimings timings;
  timings.prefill_ms = now_ms() - start;
  timings.prefill_tokens = n;
  return continue_generation(model, tokenizer, cache, logits, n, prompt, params, on_token, start,
                             timings);
}

}  // namespace promptcache
