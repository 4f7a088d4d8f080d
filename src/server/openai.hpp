// The OpenAI-compatible endpoints' answers: the response and chunk shapes OpenAI clients read.
// Their requests are read in request.hpp (parse_completion_request): with a "promptcache" field
// the messages are the turns of a PML prompt after the selected modules; without it the request
// runs on the plain model (in the same continuous batch), reusing the longest token prefix of
// the previous such request.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "job.hpp"

namespace promptcache::server {

// What every response and chunk of one request shares.
struct OpenAIReply {
  bool chat = true;
  std::string id;  // "chatcmpl-N" / "cmpl-N"
  std::string model;
  int64_t created = 0;  // Unix seconds
};

// The whole answer (non-streaming), usage included.
nlohmann::json openai_response(const OpenAIReply& reply, const Event& done, int64_t prompt_tokens);
// One streamed chunk: `text` as the delta (chat: the first one also carries the role), and
// finish_reason on the last.
nlohmann::json openai_chunk(const OpenAIReply& reply, const std::string& text, bool first,
                            const char* finish_reason);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json openai_usage_chunk(const OpenAIReply& reply, const Event& done,
                                  int64_t prompt_tokens);
// "stop" or "length" (the token limit or the context).
const char* finish_reason(StopReason reason);

}  // namespace promptcache::server
