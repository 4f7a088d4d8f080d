// The edge of `promptcache serve`: every request body becomes a typed, validated value here,
// once, before any other code looks at it (docs/server.md, "Security").
//
// - JSON is parsed with a nesting bound (RequestLimits::max_json_depth): a body nested deeper is
//   refused while it is read, before a tree of that depth exists, so nothing downstream (dumps,
//   copies, error messages) recurses on client-chosen depth.
// - Every field is checked for its type and range (numbers must be finite: 1e400 is a 400), lists
//   and strings for their sizes, and unknown fields are refused with the list of known ones.
// - `promptcache.modules` is walked with an explicit stack and a depth bound.
// - A posted schema is parsed with the module src resolver the server was given (none by
//   default: every src is refused) and its element nesting is bounded too.
// Errors are promptcache::Error(kInvalidArgument / kSchema / kXmlSyntax / kPrompt) naming the
// field, which the HTTP layer turns into a 4xx JSON body.
//
// No LibTorch and no HTTP library here: the fuzz targets (tests/fuzz) link this unit with the
// PML headers and promptcache_core only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/src_files.hpp"
#include "promptcache/sampling.hpp"

namespace promptcache::server {

// What one request may hold. The defaults are far above what a real client sends and far below
// what would cost the server memory or time; each is a `promptcache serve` flag or fixed here.
struct RequestLimits {
  std::size_t max_body_bytes = std::size_t{4} << 20;  // --max-body-bytes (the HTTP layer: 413)
  int max_json_depth = 64;                            // --max-json-depth
  int max_pml_depth = 64;                // element nesting of a posted schema or prompt
  std::size_t max_messages = 4096;       // chat messages in one request
  std::size_t max_content_parts = 4096;  // text parts of one message's content
  std::size_t max_stop_strings = 16;
  std::size_t max_stop_bytes = 1024;   // one stop string
  std::size_t max_module_refs = 4096;  // promptcache.modules, nested ones included
  int max_module_depth = 32;           // nesting of promptcache.modules
  std::size_t max_arguments = 256;     // arguments of one module reference
};

// Parses a JSON object body. Error(kInvalidArgument): not JSON (with the position), nested deeper
// than limits.max_json_depth, or not an object.
nlohmann::json parse_json_body(std::string_view text, const RequestLimits& limits);

// Parses one JSON value of any type, refusing (Error(kInvalidArgument), its message starting with
// `what`) text that is not JSON, holds a number out of a double's range, or nests deeper than
// max_depth (while it is read: no tree that deep is built; `depth_hint` ends that message).
// `promptcache eval` reads its data lines with it.
nlohmann::json parse_json_bounded(std::string_view text, int max_depth, const std::string& what,
                                  const std::string& depth_hint = "");

// A list of module references as ModuleRefs: names, or {"name", "arguments": {...}, "modules":
// [...]} objects for arguments and nested modules (promptcache.modules of the OpenAI extension,
// `modules` of an eval data line). Errors name the field as `field` ("promptcache.modules[2]").
std::vector<pml::ModuleRef> module_refs_from_json(const nlohmann::json& list,
                                                  const std::string& field,
                                                  const RequestLimits& limits);

// The chat turns of a body's "messages" ([{"role", "content"}], roles system/developer, user,
// assistant; content a string or text parts), each checked.
std::vector<pml::Turn> chat_turns_from_json(const nlohmann::json& body,
                                            const RequestLimits& limits);

// Sampling parameters from a request body, each checked for its type and range (finite numbers
// only); unknown keys are left to the caller. `max_tokens_key` is "max_new_tokens" (native) or
// "max_tokens"/"max_completion_tokens" (OpenAI).
SamplingParams sampling_from_json(const nlohmann::json& body, const std::string& max_tokens_key,
                                  const RequestLimits& limits = {});
// The body's "recompute" share, a number in [0, 1]; nothing when absent or null. Errors name the
// field as `name`.
std::optional<double> recompute_from_json(const nlohmann::json& body, const std::string& name);

// POST /v1/prompt: {"prompt": "<prompt schema=...>...</prompt>", "stream", "use_cache",
// "recompute", and the sampling fields}.
struct PromptRequest {
  pml::Prompt prompt;
  SamplingParams params;
  bool stream = false;
  bool use_cache = true;
  std::optional<double> recompute;
};
PromptRequest parse_prompt_request(std::string_view body, const RequestLimits& limits);

// The most alternatives a request may ask per token: /v1/completions' "logprobs" (OpenAI's legacy
// limit) and /v1/chat/completions' "top_logprobs".
constexpr int kMaxCompletionLogprobs = 5;
constexpr int kMaxChatTopLogprobs = 20;

// POST /v1/chat/completions (chat) and /v1/completions: the OpenAI fields we take, plus the
// "promptcache" field that selects modules:
//   "promptcache": {"schema": "docs", "modules": ["doc-a", {"name": "focus",
//                   "arguments": {"topic": "x"}, "modules": [...]}], "use_cache", "recompute"}
struct CompletionRequest {
  bool chat = true;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  SamplingParams params;
  std::vector<pml::Turn> turns;  // the messages (chat) or the one prompt text
  // /v1/completions with "prompt" as token ids ([1, 2, 3] or [[1, 2, 3]]): used as they are
  // (no BOS added; each a whole number >= 0, checked against the vocabulary by the server);
  // `turns` is then empty.
  std::optional<std::vector<TokenId>> prompt_ids;
  // Log-probabilities of the generated (and, with echo, prompt) tokens: -1 none, else how many
  // likeliest alternatives each token reports. /v1/completions: "logprobs": N (0..5);
  // chat: "logprobs": true, "top_logprobs": N (0..20, only with logprobs).
  int logprobs = -1;
  // /v1/completions "echo": the prompt's tokens come back before the completion, with their
  // log-probabilities when logprobs is set. Not with "stream" or "promptcache" (a 400).
  bool echo = false;
  // With a "promptcache" field: the PML prompt (schema, modules; its turns are `turns`).
  std::optional<pml::Prompt> prompt;
  bool use_cache = true;
  std::optional<double> recompute;
};
CompletionRequest parse_completion_request(std::string_view body, bool chat,
                                           const RequestLimits& limits);

// POST /v1/schemas: the schema's XML, sent as application/xml or as JSON {"xml": "..."}.
// `content_type` is the request's media type (parameters such as charset ignored).
std::string schema_xml_from_body(std::string_view body, std::string_view content_type,
                                 const RequestLimits& limits);
// Parses a posted schema: src attributes go through `files` only, and elements may nest at most
// limits.max_pml_depth deep.
pml::Schema parse_posted_schema(const std::string& xml, const pml::SrcResolver& files,
                                const RequestLimits& limits);

// The offset of the first byte of `text` that does not begin a well-formed UTF-8 character (no
// overlong forms, no surrogates, nothing past U+10FFFF), or npos when all of it is well formed.
std::size_t invalid_utf8_at(std::string_view text);

// The element nesting of a schema tree (the <schema> root is 1; text counts as a level), walked
// without recursion.
std::size_t schema_depth(const pml::Node& root);

// The media type of a Content-Type value, lower-cased, without parameters and spaces:
// "Application/JSON; charset=utf-8" -> "application/json".
std::string media_type(std::string_view content_type);

}  // namespace promptcache::server
