#include "openai.hpp"

#include "request.hpp"
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

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// JSON strings must be UTF-8: a token that is part of a character is sent with U+FFFD in its
// place ("bytes" has the exact bytes).
std::string printable(const std::string& s) {
  if (invalid_utf8_at(s) == std::string::npos) return s;
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

std::string raw_text_of(const OpenAIReply& reply, TokenId id) {
  return reply.token_text ? reply.token_text(id) : std::to_string(id);
}

std::string text_of(const OpenAIReply& reply, TokenId id) {
  return printable(raw_text_of(reply, id));
}

}  // namespace

std::string token_string(const OpenAIReply& reply, TokenId id) {
  return text_of(reply, id);
}

json completion_logprobs(const OpenAIReply& reply, const std::vector<TokenId>& ids,
                         const std::vector<TokenLogprob>& lps, std::size_t offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  // An echoed prompt has no entry for its first token.
  const std::size_t skip = ids.size() - std::min(ids.size(), lps.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string s = text_of(reply, ids[i]);
    tokens.push_back(s);
    offsets.push_back(offset);
    offset += s.size();
    if (i < skip) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    const TokenLogprob& lp = lps[i - skip];
    token_logprobs.push_back(lp.logprob);
    json alternatives = json::object();
    for (const auto& [id, value] : lp.top) {
      const std::string key = text_of(reply, id);
      // Two ids of one string (byte pieces of the same replacement): the likelier one stays.
      if (!alternatives.contains(key)) alternatives[key] = value;
    }
    top.push_back(std::move(alternatives));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json chat_logprobs(const OpenAIReply& reply, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string s = raw_text_of(reply, lp.token);
    json top = json::array();
    for (const auto& [id, value] : lp.top) {
      const std::string t = raw_text_of(reply, id);
      top.push_back({{"token", printable(t)}, {"logprob", value}, {"bytes", bytes_of(t)}});
    }
    content.push_back({{"token", printable(s)},
                       {"logprob", lp.logprob},
                       {"bytes", bytes_of(s)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

const char* finish_reason(StopReason reason) {
  return reason == StopReason::kMaxTokens || reason == StopReason::kContextFull ? "length" : "stop";
}

json openai_response(const OpenAIReply& reply, const Event& done, int64_t prompt_tokens) {
  json choice = {{"index", 0}, {"finish_reason", finish_reason(done.response.stop_reason)}};
  if (reply.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", done.response.text}};
    choice["logprobs"] = reply.logprobs >= 0 ? chat_logprobs(reply, done.logprobs) : json(nullptr);
  } else {
    // echo: the prompt as the model read it (its tokens' strings), then the completion.
    std::string prompt_text;
    if (reply.echo) {
      for (TokenId id : done.prompt_ids) prompt_text += text_of(reply, id);
    }
    choice["text"] = prompt_text + done.response.text;
    if (reply.logprobs < 0) {
      choice["logprobs"] = nullptr;
    } else {
      json lp = completion_logprobs(reply, done.response.tokens, done.logprobs, prompt_text.size());
      if (reply.echo) {
        json all = completion_logprobs(reply, done.prompt_ids, done.prompt_logprobs, 0);
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          for (auto& v : lp[key]) all[key].push_back(std::move(v));
        }
        lp = std::move(all);
      }
      choice["logprobs"] = std::move(lp);
    }
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

json openai_chunk(const OpenAIReply& reply, const std::string& text, bool first, const char* finish,
                  const std::vector<TokenLogprob>& lps, std::size_t offset) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
  const bool with_logprobs = reply.logprobs >= 0 && !lps.empty();
  if (reply.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = text;
    choice["delta"] = delta;
    choice["logprobs"] = with_logprobs ? chat_logprobs(reply, lps) : json(nullptr);
  } else {
    choice["text"] = text;
    std::vector<TokenId> ids;
    for (const TokenLogprob& lp : lps) ids.push_back(lp.token);
    choice["logprobs"] =
        with_logprobs ? completion_logprobs(reply, ids, lps, offset) : json(nullptr);
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
