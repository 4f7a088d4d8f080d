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

GenerationResult continue_generation(const LlamaModel& model, const Tokenizer& tokenizer,
                                     KVCache& cache, const torch::Tensor& last_logits,
                                     int64_t next_position, std::vector<TokenId> history,
                                     const SamplingParams& params, const TokenCallback& on_token,
                                     double start_ms, GenerationTimings timings) {
  params.validate();
  GenerationResult result;
  Sampler sampler(params);
  std::vector<TokenId> stops = params.stop_token_ids;
  std::vector<TokenId> eos;
  if (params.stop_at_eos) {
    for (int64_t id : model.config().eos_token_ids) eos.push_back(static_cast<TokenId>(id));
  }
  torch::Tensor logits = last_logits;
  std::string emitted;  // text already passed to the callback
  std::string stream_lead;
  double decode_start = 0;
  const auto device = model.device();
  for (int step = 0; step < params.max_new_tokens; ++step) {
    auto row = logits.reshape({-1}).to(torch::kCPU, torch::kFloat32).contiguous();
    const TokenId id = sampler.sample(row.data_ptr<float>(), row.numel(), history);
    if (step == 0) {
      timings.ttft_ms = now_ms() - start_ms;
      decode_start = now_ms();
    }
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) {
      result.stop_reason = StopReason::kEos;
      break;
    }
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      result.stop_reason = StopReason::kStopToken;
      break;
    }
    result.tokens.push_back(id);
    history.push_back(id);
    // Decode the whole continuation each time: SentencePiece spacing and multi-byte characters
    // depend on neighbours, so per-piece decoding would garble text.
    std::string text = tokenizer.decode(result.tokens);
    bool stop_string = false;
    for (const auto& s : params.stop_strings) {
      const auto at = s.empty() ? std::string::npos : text.find(s);
      if (at != std::string::npos) {
        text.resize(at);
        stop_string = true;
      }
    }
    result.text = text;
    if (on_token) {
      // Decoding drops the dummy-prefix space of the first piece; after a prompt it is a real
      // space, so the stream keeps it (the returned text, like HF's decode, does not).
      if (result.tokens.size() == 1 && history.size() > 1 && !text.empty() &&
          tokenizer.decode_piece(id).rfind(' ', 0) == 0) {
        stream_lead = " ";
      }
      text = stream_lead + text;
      const std::size_t ready = stop_string ? text.size() : complete_utf8_prefix(text);
      std::string piece;
      if (ready > emitted.size() && text.compare(0, emitted.size(), emitted) == 0) {
        piece = text.substr(emitted.size(), ready - emitted.size());
        emitted = text.substr(0, ready);
      }
      if (!on_token(id, piece)) {
        result.stop_reason = StopReason::kCallback;
        break;
      }
    }
    if (stop_string) {
      result.stop_reason = StopReason::kStopString;
      break;
    }
    if (step + 1 == params.max_new_tokens) break;
    if (cache.length() >= cache.capacity() ||
        next_position >= model.config().max_position_embeddings) {
      result.stop_reason = StopReason::kContextFull;
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
