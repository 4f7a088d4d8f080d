#include "openai.hpp"

#include "chat_encoding.hpp"
#include "promptcache/pml/source.hpp"
#include "views.hpp"

namespace promptcache::server {

using nlohmann::json;

namespace {

Error bad(const std::string& message) {
  return Error(ErrorKind::kInvalidArgument, message);
}

SourceLocation request_at(const std::string& element) {
  return {"<request>", 0, 0, element};
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (const json& part : content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        throw bad(where +
                  ": only text content parts ({\"type\": \"text\", \"text\": ...}) are "
                  "supported");
      }
      text += part["text"].get<std::string>();
    }
    return text;
  }
  throw bad(where + " must be a string or a list of text parts");
}

std::vector<pml::Turn> chat_turns(const json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    throw bad("'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  }
  std::vector<pml::Turn> turns;
  const json& messages = body["messages"];
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content")) {
      throw bad(where + " must be an object with a 'role' and a 'content'");
    }
    const std::string role = m["role"];
    pml::Turn turn;
    if (role == "system" || role == "developer") {
      turn.role = pml::ChatRole::kSystem;
    } else if (role == "user") {
      turn.role = pml::ChatRole::kUser;
    } else if (role == "assistant") {
      turn.role = pml::ChatRole::kAssistant;
    } else {
      throw bad(where + ".role '" + role +
                "' is not supported (system, developer, user, assistant)");
    }
    turn.text = pml::compact_whitespace(content_text(m["content"], where + ".content"));
    turn.where = request_at(where);
    turns.push_back(std::move(turn));
  }
  return turns;
}

std::string completion_text(const json& body) {
  if (!body.contains("prompt")) throw bad("'prompt' is missing");
  const json& p = body["prompt"];
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  throw bad("'prompt' must be a string (one prompt per request)");
}

pml::ModuleRef module_ref(const json& m, const std::string& where) {
  pml::ModuleRef ref;
  ref.where = request_at(where);
  if (m.is_string()) {
    ref.name = m.get<std::string>();
    return ref;
  }
  if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) {
    throw bad(where + " must be a module name or {\"name\", \"arguments\", \"modules\"}");
  }
  ref.name = m["name"];
  if (m.contains("arguments")) {
    if (!m["arguments"].is_object()) throw bad(where + ".arguments must be an object");
    for (const auto& [name, value] : m["arguments"].items()) {
      if (!value.is_string()) throw bad(where + ".arguments." + name + " must be a string");
      ref.arguments.push_back(
          {name, value.get<std::string>(), request_at(where + ".arguments." + name)});
    }
  }
  if (m.contains("modules")) {
    if (!m["modules"].is_array()) throw bad(where + ".modules must be a list");
    for (std::size_t i = 0; i < m["modules"].size(); ++i) {
      ref.children.push_back(
          module_ref(m["modules"][i], where + ".modules[" + std::to_string(i) + "]"));
    }
  }
  return ref;
}

// The "promptcache" field: a PML prompt over `turns`.
void select_modules(Job& job, const json& field, std::vector<pml::Turn> turns) {
  if (!field.is_object() || !field.contains("schema") || !field["schema"].is_string()) {
    throw bad(
        "'promptcache' must be an object with a 'schema' (and 'modules', 'use_cache', "
        "'recompute')");
  }
  job.kind = Job::Kind::kPrompt;
  job.prompt.schema = field["schema"];
  job.prompt.file = "<request>";
  job.prompt.where = request_at("promptcache");
  if (field.contains("modules")) {
    if (!field["modules"].is_array()) throw bad("'promptcache.modules' must be a list");
    for (std::size_t i = 0; i < field["modules"].size(); ++i) {
      job.prompt.modules.push_back(
          module_ref(field["modules"][i], "promptcache.modules[" + std::to_string(i) + "]"));
    }
  }
  if (field.contains("use_cache")) {
    if (!field["use_cache"].is_boolean())
      throw bad("'promptcache.use_cache' must be true or false");
    job.use_cache = field["use_cache"];
  }
  job.recompute = recompute_from_json(field, "promptcache.recompute");
  job.prompt.turns = std::move(turns);
}

json usage(const Event& done, int64_t prompt_tokens) {
  const auto completion = static_cast<int64_t>(done.response.tokens.size());
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", done.response.cached_tokens}}}};
}

}  // namespace

OpenAIRequest openai_request(const json& body, bool chat) {
  OpenAIRequest out;
  out.chat = chat;
  out.job = std::make_shared<Job>();
  Job& job = *out.job;
  job.params = sampling_from_json(
      body, body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens");
  if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1)) {
    throw bad("'n' must be 1 (one choice per request)");
  }
  if (body.contains("stream")) {
    if (!body["stream"].is_boolean()) throw bad("'stream' must be true or false");
    out.stream = body["stream"];
  }
  if (body.contains("stream_options") && body["stream_options"].is_object()) {
    out.include_usage = body["stream_options"].value("include_usage", false);
  }
  std::vector<pml::Turn> turns;
  if (chat) {
    turns = chat_turns(body);
  } else {
    pml::Turn text;
    text.text = pml::compact_whitespace(completion_text(body));
    text.where = request_at("prompt");
    turns.push_back(std::move(text));
  }
  if (body.contains("promptcache") && !body["promptcache"].is_null()) {
    select_modules(job, body["promptcache"], std::move(turns));
  } else {
    job.kind = Job::Kind::kPlain;
    job.tokenize = [turns = std::move(turns)](const Engine& engine) {
      return encode_chat(engine.tokenizer(), engine.chat_template(), turns);
    };
  }
  return out;
}

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
