#include "request.hpp"

#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "promptcache/pml/source.hpp"

namespace promptcache::server {

using nlohmann::json;

namespace {

Error bad(const std::string& message) {
  return Error(ErrorKind::kInvalidArgument, message);
}

SourceLocation request_at(const std::string& element) {
  return {"<request>", 0, 0, element};
}

// What a value is, for error messages, without dumping a client's whole (possibly huge) value.
std::string preview(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "a list of " + std::to_string(v.size()) + " items";
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      return s.size() <= 40
                 ? json(s).dump()
                 : json(s.substr(0, 40)).dump(-1, ' ', false, json::error_handler_t::replace) +
                       "... (" + std::to_string(s.size()) + " bytes)";
    }
    default:
      return v.dump();  // a number, a boolean or null: short
  }
}

Error field_error(const std::string& key, const std::string& wanted, const json& got) {
  return bad("'" + key + "' must be " + wanted + ", got " + preview(got));
}

// A finite number in [min, max]. nlohmann reads 1e400 as infinity: refused here, with every
// other value outside the range.
double number_field(const json& body, const std::string& key, double min, double max) {
  const json& v = body.at(key);
  if (!v.is_number()) throw field_error(key, "a number", v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || !(x >= min && x <= max)) {
    throw field_error(key, "a number from " + json(min).dump() + " to " + json(max).dump(), v);
  }
  return x;
}

int64_t whole_field(const json& body, const std::string& key, int64_t min, int64_t max) {
  const json& v = body.at(key);
  if (!v.is_number_integer()) throw field_error(key, "a whole number", v);
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(max)
                             : (v.get<int64_t>() < min || v.get<int64_t>() > max)) {
    throw field_error(
        key, "a whole number from " + std::to_string(min) + " to " + std::to_string(max), v);
  }
  return v.get<int64_t>();
}

bool present(const json& body, const char* key) {
  const auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

bool bool_field(const json& body, const std::string& key, const std::string& name, bool fallback) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw field_error(name, "true or false", *it);
  return it->get<bool>();
}

// Every key of `body` must be in `known` (listed in the error).
void refuse_unknown_fields(const json& body, const std::vector<const char*>& known) {
  for (const auto& item : body.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || item.key() == k;
    if (ok) continue;
    std::string list;
    for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
    std::string key = item.key();
    if (key.size() > 64) key = key.substr(0, 64) + "...";
    throw bad("unknown field '" + key + "' (known: " + list + ")");
  }
}

// A message's content: a string, or a list of {"type": "text", "text": ...} parts.
std::string content_text(const json& content, const std::string& where,
                         const RequestLimits& limits) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    if (content.size() > limits.max_content_parts) {
      throw bad(where + " has " + std::to_string(content.size()) + " parts, more than the " +
                std::to_string(limits.max_content_parts) + " a message may have");
    }
    std::string text;
    for (const json& part : content) {
      const auto type = part.is_object() ? part.find("type") : part.end();
      const auto value = part.is_object() ? part.find("text") : part.end();
      if (!part.is_object() || type == part.end() || *type != "text" || value == part.end() ||
          !value->is_string()) {
        throw bad(where +
                  ": only text content parts ({\"type\": \"text\", \"text\": ...}) are "
                  "supported");
      }
      text += value->get_ref<const std::string&>();
    }
    return text;
  }
  throw bad(where + " must be a string or a list of text parts");
}

}  // namespace

std::vector<pml::Turn> chat_turns_from_json(const json& body, const RequestLimits& limits) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    throw bad("'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  }
  const json& messages = *it;
  if (messages.size() > limits.max_messages) {
    throw bad("'messages' has " + std::to_string(messages.size()) + " items, more than the " +
              std::to_string(limits.max_messages) + " a request may have");
  }
  std::vector<pml::Turn> turns;
  turns.reserve(messages.size());
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content")) {
      throw bad(where + " must be an object with a 'role' and a 'content'");
    }
    const std::string& role = m["role"].get_ref<const std::string&>();
    pml::Turn turn;
    if (role == "system" || role == "developer") {
      turn.role = pml::ChatRole::kSystem;
    } else if (role == "user") {
      turn.role = pml::ChatRole::kUser;
    } else if (role == "assistant") {
      turn.role = pml::ChatRole::kAssistant;
    } else {
      throw bad(where + ".role '" + (role.size() > 40 ? role.substr(0, 40) + "..." : role) +
                "' is not supported (system, developer, user, assistant)");
    }
    turn.text = pml::compact_whitespace(content_text(m["content"], where + ".content", limits));
    turn.where = request_at(where);
    turns.push_back(std::move(turn));
  }
  return turns;
}

namespace {

// A list of token ids (whole numbers from 0 to 2^31 - 1), or nothing when `v` is not one.
std::optional<std::vector<TokenId>> token_ids(const json& v) {
  if (!v.is_array() || v.empty() || !v[0].is_number()) return std::nullopt;
  std::vector<TokenId> ids;
  ids.reserve(v.size());
  for (const json& x : v) {
    if (!x.is_number_integer() ||
        (x.is_number_unsigned() ? x.get<uint64_t>() > uint64_t{INT32_MAX}
                                : x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)) {
      throw field_error("prompt", "a string or a list of token ids (whole numbers >= 0)", v);
    }
    ids.push_back(static_cast<TokenId>(x.get<int64_t>()));
  }
  return ids;
}

// The one prompt of a /v1/completions body: its text, or (into `ids`) its token ids.
std::string completion_text(const json& body, std::optional<std::vector<TokenId>>& ids) {
  const auto it = body.find("prompt");
  if (it == body.end()) throw bad("'prompt' is missing");
  const json& p = *it;
  if (p.is_string()) return p.get<std::string>();
  if (p.is_array() && p.size() == 1 && p[0].is_string()) return p[0].get<std::string>();
  if ((ids = token_ids(p))) return {};
  if (p.is_array() && p.size() == 1 && (ids = token_ids(p[0]))) return {};
  throw bad("'prompt' must be a string or a list of token ids (one prompt per request)");
}

// One module reference (a name, or {"name", "arguments", "modules"}) without its children.
pml::ModuleRef module_ref(const json& m, const std::string& where, const RequestLimits& limits) {
  pml::ModuleRef ref;
  ref.where = request_at(where);
  if (m.is_string()) {
    ref.name = m.get<std::string>();
    return ref;
  }
  if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) {
    throw bad(where + " must be a module name or {\"name\", \"arguments\", \"modules\"}");
  }
  refuse_unknown_fields(m, {"name", "arguments", "modules"});
  ref.name = m["name"];
  if (m.contains("arguments")) {
    const json& args = m["arguments"];
    if (!args.is_object()) throw bad(where + ".arguments must be an object");
    if (args.size() > limits.max_arguments) {
      throw bad(where + ".arguments has " + std::to_string(args.size()) + " entries, more than " +
                std::to_string(limits.max_arguments));
    }
    for (const auto& [name, value] : args.items()) {
      if (!value.is_string()) throw bad(where + ".arguments." + name + " must be a string");
      ref.arguments.push_back(
          {name, value.get<std::string>(), request_at(where + ".arguments." + name)});
    }
  }
  if (m.contains("modules") && !m["modules"].is_array()) {
    throw bad(where + ".modules must be a list");
  }
  return ref;
}

}  // namespace

// Walked with an explicit stack (no recursion on the client's nesting), bounded in depth and count.
std::vector<pml::ModuleRef> module_refs_from_json(const json& list, const std::string& field,
                                                  const RequestLimits& limits) {
  if (!list.is_array()) throw bad("'" + field + "' must be a list");
  struct Frame {
    const json* items;                 // the list being read
    std::size_t next;                  // its next index
    std::vector<pml::ModuleRef>* out;  // where its refs go
    std::string where;                 // "promptcache.modules" / "...[2].modules"
  };
  std::vector<pml::ModuleRef> top;
  std::vector<Frame> stack{{&list, 0, &top, field}};
  std::size_t count = 0;
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next == f.items->size()) {
      stack.pop_back();
      continue;
    }
    const std::size_t i = f.next++;
    const std::string where = f.where + "[" + std::to_string(i) + "]";
    if (++count > limits.max_module_refs) {
      throw bad("'" + field + "' names more than " + std::to_string(limits.max_module_refs) +
                " modules");
    }
    const json& item = (*f.items)[i];
    f.out->push_back(module_ref(item, where, limits));
    if (item.is_object() && item.contains("modules") && !item["modules"].empty()) {
      if (static_cast<int>(stack.size()) >= limits.max_module_depth) {
        throw bad(where + ".modules nests deeper than " + std::to_string(limits.max_module_depth) +
                  " levels");
      }
      std::vector<pml::ModuleRef>* children = &f.out->back().children;
      const json* items = &item["modules"];
      stack.push_back({items, 0, children, where + ".modules"});  // `f` is invalid from here
    }
  }
  return top;
}

namespace {

std::size_t prompt_depth(const std::vector<pml::ModuleRef>& refs) {
  std::size_t deepest = 1;
  std::vector<std::pair<const pml::ModuleRef*, std::size_t>> stack;
  for (const auto& r : refs) stack.push_back({&r, 2});
  while (!stack.empty()) {
    const auto [ref, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    for (const auto& child : ref->children) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

}  // namespace

std::size_t schema_depth(const pml::Node& root) {
  std::size_t deepest = 0;
  std::vector<std::pair<const pml::Node*, std::size_t>> stack{{&root, 1}};
  while (!stack.empty()) {
    const auto [node, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    for (const pml::Node& child : node->children) stack.push_back({&child, depth + 1});
  }
  return deepest;
}

json parse_json_body(std::string_view text, const RequestLimits& limits) {
  if (text.size() > limits.max_body_bytes) {
    throw bad("the request body is " + std::to_string(text.size()) + " bytes, more than the " +
              std::to_string(limits.max_body_bytes) +
              " the server takes (start it with --max-body-bytes N to allow more)");
  }
  json body = parse_json_bounded(text, limits.max_json_depth, "the request body",
                                 " (start the server with --max-json-depth N to allow more)");
  if (!body.is_object()) throw bad("the request body must be a JSON object");
  return body;
}

json parse_json_bounded(std::string_view text, int max_depth, const std::string& what,
                        const std::string& depth_hint) {
  // nlohmann's callback sees the depth of every value as it is read: a text nested past the
  // limit stops here, before a tree that deep exists.
  struct TooDeep {};
  const json::parser_callback_t depth_guard = [max_depth](int depth, json::parse_event_t event,
                                                          json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_depth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), depth_guard);
  } catch (const TooDeep&) {
    throw bad(what + " nests deeper than " + std::to_string(max_depth) + " levels" + depth_hint);
  } catch (const json::out_of_range& e) {
    // A number outside a double's range (1e400): refused, not read as infinity.
    throw bad(what + " holds a number out of range: " + std::string(e.what()));
  } catch (const json::exception& e) {
    throw bad(what + " is not valid JSON: " + std::string(e.what()));
  }
}

SamplingParams sampling_from_json(const json& body, const std::string& max_tokens_key,
                                  const RequestLimits& limits) {
  SamplingParams p;
  const int64_t int_max = std::numeric_limits<int>::max();
  const double float_max = std::numeric_limits<float>::max();
  if (present(body, max_tokens_key.c_str())) {
    p.max_new_tokens = static_cast<int>(whole_field(body, max_tokens_key, 0, int_max));
  }
  if (present(body, "temperature")) {
    p.temperature = static_cast<float>(number_field(body, "temperature", 0, float_max));
  }
  if (present(body, "top_k")) p.top_k = static_cast<int>(whole_field(body, "top_k", 0, int_max));
  if (present(body, "top_p")) p.top_p = static_cast<float>(number_field(body, "top_p", 0, 1));
  if (present(body, "repetition_penalty")) {
    p.repetition_penalty =
        static_cast<float>(number_field(body, "repetition_penalty", 1e-6, float_max));
  }
  if (present(body, "seed")) {
    const json& v = body["seed"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      throw field_error("seed", "a whole number >= 0", v);
    }
    p.seed = v.get<uint64_t>();
  }
  if (present(body, "stop")) {
    const json& v = body["stop"];
    const std::string wanted = "a string or a list of at most " +
                               std::to_string(limits.max_stop_strings) + " strings of at most " +
                               std::to_string(limits.max_stop_bytes) + " bytes";
    const auto take = [&](const json& s) {
      if (!s.is_string() || s.get_ref<const std::string&>().size() > limits.max_stop_bytes) {
        throw field_error("stop", wanted, v);
      }
      p.stop_strings.push_back(s.get<std::string>());
    };
    if (v.is_string()) {
      take(v);
    } else if (v.is_array() && v.size() <= limits.max_stop_strings) {
      for (const json& s : v) take(s);
    } else {
      throw field_error("stop", wanted, v);
    }
  }
  p.validate();
  return p;
}

std::optional<double> recompute_from_json(const json& body, const std::string& name) {
  if (!present(body, "recompute")) return std::nullopt;
  const json& v = body["recompute"];
  if (!v.is_number() || !std::isfinite(v.get<double>()) ||
      !(v.get<double>() >= 0 && v.get<double>() <= 1)) {
    throw field_error(name, "a number from 0 to 1", v);
  }
  return v.get<double>();
}

PromptRequest parse_prompt_request(std::string_view text, const RequestLimits& limits) {
  const json body = parse_json_body(text, limits);
  refuse_unknown_fields(
      body, {"prompt", "stream", "use_cache", "recompute", "max_new_tokens", "temperature", "top_k",
             "top_p", "repetition_penalty", "seed", "stop"});
  if (!body.contains("prompt") || !body["prompt"].is_string()) {
    throw bad("'prompt' must be a PML prompt string (<prompt schema=\"...\">...</prompt>)");
  }
  PromptRequest out;
  out.params = sampling_from_json(body, "max_new_tokens", limits);
  out.stream = bool_field(body, "stream", "stream", false);
  out.use_cache = bool_field(body, "use_cache", "use_cache", true);
  out.recompute = recompute_from_json(body, "recompute");
  out.prompt = pml::parse_prompt_string(body["prompt"].get<std::string>(), "<prompt>");
  if (prompt_depth(out.prompt.modules) > static_cast<std::size_t>(limits.max_pml_depth)) {
    throw Error(ErrorKind::kPrompt,
                "the prompt's elements nest deeper than " + std::to_string(limits.max_pml_depth) +
                    " levels",
                request_at("<prompt>"));
  }
  return out;
}

CompletionRequest parse_completion_request(std::string_view text, bool chat,
                                           const RequestLimits& limits) {
  const json body = parse_json_body(text, limits);
  CompletionRequest out;
  out.chat = chat;
  out.params = sampling_from_json(
      body, body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
      limits);
  if (body.contains("n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1)) {
    throw bad("'n' must be 1 (one choice per request)");
  }
  out.stream = bool_field(body, "stream", "stream", false);
  if (present(body, "stream_options")) {
    const json& options = body["stream_options"];
    if (!options.is_object()) throw field_error("stream_options", "an object", options);
    out.include_usage = bool_field(options, "include_usage", "stream_options.include_usage", false);
  }
  if (chat) {
    out.turns = chat_turns_from_json(body, limits);
    if (present(body, "echo")) throw bad("'echo' is a /v1/completions field");
    const bool logprobs = bool_field(body, "logprobs", "logprobs", false);
    if (present(body, "top_logprobs")) {
      if (!logprobs) throw bad("'top_logprobs' needs 'logprobs': true");
      out.logprobs = static_cast<int>(whole_field(body, "top_logprobs", 0, kMaxChatTopLogprobs));
    } else if (logprobs) {
      out.logprobs = 0;
    }
  } else {
    const std::string text = completion_text(body, out.prompt_ids);
    if (!out.prompt_ids) {
      pml::Turn turn;
      turn.text = pml::compact_whitespace(text);
      turn.where = request_at("prompt");
      out.turns.push_back(std::move(turn));
    }
    if (present(body, "top_logprobs")) {
      throw bad(
          "'top_logprobs' is a /v1/chat/completions field; /v1/completions takes "
          "'logprobs': N (0 to " +
          std::to_string(kMaxCompletionLogprobs) + ")");
    }
    if (present(body, "logprobs")) {
      out.logprobs = static_cast<int>(whole_field(body, "logprobs", 0, kMaxCompletionLogprobs));
    }
    out.echo = bool_field(body, "echo", "echo", false);
    if (out.echo && out.stream) throw bad("'echo' cannot be used with 'stream'");
  }
  if (present(body, "promptcache")) {
    const json& field = body["promptcache"];
    if (!field.is_object() || !field.contains("schema") || !field["schema"].is_string()) {
      throw bad(
          "'promptcache' must be an object with a 'schema' (and 'modules', 'use_cache', "
          "'recompute')");
    }
    refuse_unknown_fields(field, {"schema", "modules", "use_cache", "recompute"});
    if (out.echo) throw bad("'echo' cannot be used with 'promptcache' (plain prompts only)");
    if (out.prompt_ids) throw bad("'prompt' must be text with 'promptcache' (not token ids)");
    pml::Prompt prompt;
    prompt.schema = field["schema"];
    prompt.file = "<request>";
    prompt.where = request_at("promptcache");
    if (field.contains("modules")) {
      prompt.modules = module_refs_from_json(field["modules"], "promptcache.modules", limits);
    }
    prompt.turns = out.turns;
    out.use_cache = bool_field(field, "use_cache", "promptcache.use_cache", true);
    out.recompute = recompute_from_json(field, "promptcache.recompute");
    out.prompt = std::move(prompt);
  }
  return out;
}

std::size_t invalid_utf8_at(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return i;  // a continuation byte or 0xF8..0xFF where a character starts
    }
    if (i + n >= s.size()) return i;  // cut short at the end
    for (std::size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

std::string media_type(std::string_view content_type) {
  const auto semicolon = content_type.find(';');
  std::string_view type = pml::trim(content_type.substr(0, semicolon));
  std::string out(type);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string schema_xml_from_body(std::string_view body, std::string_view content_type,
                                 const RequestLimits& limits) {
  if (media_type(content_type) != "application/json") {
    // JSON strings are checked by the JSON parser; an XML body here (pugixml does not check):
    // a name with invalid bytes could never be named again in a URL or a prompt.
    const std::size_t bad_at = invalid_utf8_at(body);
    if (bad_at != std::string_view::npos) {
      throw bad("the schema is not valid UTF-8 (byte " + std::to_string(bad_at) + ")");
    }
    return std::string(body);
  }
  const json parsed = parse_json_body(body, limits);
  if (!parsed.contains("xml") || !parsed["xml"].is_string()) {
    throw bad("a JSON body must hold the schema as {\"xml\": \"<schema ...>\"}");
  }
  refuse_unknown_fields(parsed, {"xml"});
  return parsed["xml"].get<std::string>();
}

pml::Schema parse_posted_schema(const std::string& xml, const pml::SrcResolver& files,
                                const RequestLimits& limits) {
  pml::Schema schema = pml::parse_schema_string(xml, "<request>", files);
  if (schema_depth(schema.root) > static_cast<std::size_t>(limits.max_pml_depth)) {
    throw Error(ErrorKind::kSchema,
                "the schema's elements nest deeper than " + std::to_string(limits.max_pml_depth) +
                    " levels (the limit of a posted schema)",
                schema.root.where);
  }
  return schema;
}

}  // namespace promptcache::server
