// The OpenAI-compatible endpoints' answers: the response and chunk shapes OpenAI clients read.
// Their requests are read in request.hpp (parse_completion_request): with a "promptcache" field
// the messages are the turns of a PML prompt after the selected modules; without it the request
// runs on the plain model (in the same continuous batch), reusing the longest token prefix of
// the previous such request.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "job.hpp"

namespace promptcache::server {

// What every response and chunk of one request shares.
struct OpenAIReply {
  bool chat = true;
  std::string id;  // "chatcmpl-N" / "cmpl-N"
  std::string model;
  int64_t created = 0;  // Unix seconds
  // Log-probabilities asked for (-1: none; else the alternatives per token) and, for
  // /v1/completions, echo. token_text gives a token's string (the tokenizer's text of the id
  // alone: a SentencePiece word start keeps its space, a control id is "").
  int logprobs = -1;
  bool echo = false;
  std::function<std::string(TokenId)> token_text;
};

// A token's string in an answer: reply.token_text's, U+FFFD in place of bytes that are not
// UTF-8 on their own (JSON strings must be).
std::string token_string(const OpenAIReply& reply, TokenId id);
// The "logprobs" of a /v1/completions choice (OpenAI's legacy shape): {"tokens", "token_logprobs",
// "top_logprobs": [{token: logprob}], "text_offset"}, for `ids` (each with its entry in `lps`,
// or null where `lps` holds one entry fewer than `ids`: the first token of an echoed prompt).
// text_offset counts bytes from `offset` (the length of the text before these tokens), each
// token advancing it by its token_string's length.
nlohmann::json completion_logprobs(const OpenAIReply& reply, const std::vector<TokenId>& ids,
                                   const std::vector<TokenLogprob>& lps, std::size_t offset);
// The "logprobs" of a chat choice: {"content": [{"token", "logprob", "bytes", "top_logprobs":
// [{"token", "logprob", "bytes"}]}]}.
nlohmann::json chat_logprobs(const OpenAIReply& reply, const std::vector<TokenLogprob>& lps);

// The whole answer (non-streaming), usage included.
nlohmann::json openai_response(const OpenAIReply& reply, const Event& done, int64_t prompt_tokens);
// One streamed chunk: `text` as the delta (chat: the first one also carries the role), and
// finish_reason on the last.
// With reply.logprobs >= 0, `lps` (the tokens this chunk's text ends; text_offset from
// `offset`) go in its "logprobs".
nlohmann::json openai_chunk(const OpenAIReply& reply, const std::string& text, bool first,
                            const char* finish_reason, const std::vector<TokenLogprob>& lps = {},
                            std::size_t offset = 0);
// The last chunk of a stream with stream_options.include_usage: no choices, the usage.
nlohmann::json openai_usage_chunk(const OpenAIReply& reply, const Event& done,
                                  int64_t prompt_tokens);
// "stop" or "length" (the token limit or the context).
const char* finish_reason(StopReason reason);

}  // namespace promptcache::server
