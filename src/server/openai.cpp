#include "openai.hpp"

#include "views.hpp"

namespace promptcache::server {

using nlohmann::json;

namespace {

json usage(const Event& done, int64_t prompt_tokens) {
  const auto completion = static_cast<int64_t>(done.response.tokens.size());
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", done.response.cached_tokens}}}};
}

}  // namespace

const char* finish_reason(StopReason reason) {
  return reason == StopReason::kMaxTokens || reason == StopReason::kContextFull ? "length" : "stop";
}

json openai_response(const OpenAIReply& reply, const Event& done, int64_t prompt_tokens) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason(done.response.stop_reason)}};
  if (reply.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", done.response.text}};
  } else {
    choice["text"] = done.response.text;
    choice["logprobs"] = nullptr;
  }
  const Response& r = done.response;
  return {{"id", reply.id},
          {"object", reply.chat ? "chat.completion" : "text_completion"},
          {"created", reply.created},
          {"model", reply.model},
          {"choices", json::array({choice})},
          {"usage", usage(done, prompt_tokens)},
          {"promptcache",
           {{"ttft_ms", r.timings.ttft_ms},
            {"queue_ms", done.queue_ms},
            {"assembly_ms", r.timings.assembly_ms},
            {"fresh_prefill_ms", r.timings.fresh_prefill_ms},
            {"cached_tokens", r.cached_tokens},
            {"fresh_tokens", r.fresh_tokens},
            {"batch_size", done.batch_size}}}};
}

json openai_chunk(const OpenAIReply& reply, const std::string& text, bool first,
                  const char* finish) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
  if (reply.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", reply.id},
          {"object", reply.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", reply.created},
          {"model", reply.model},
          {"choices", json::array({choice})}};
}

json openai_usage_chunk(const OpenAIReply& reply, const Event& done, int64_t prompt_tokens) {
  return {{"id", reply.id},
          {"object", reply.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", reply.created},
          {"model", reply.model},
          {"choices", json::array()},
          {"usage", usage(done, prompt_tokens)}};
}

}  // namespace promptcache::server
