// The JSON the server sends: schema layouts, answers, errors; and the request fields it reads.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"

namespace promptcache::server {

// A schema's layout for GET /v1/schemas/{name} and the playground: modules (path, reserved
// positions, own tokens, cached, union, parameters) and spans, plus how it was compiled.
nlohmann::json layout_json(const pml::Layout& layout, const CompileReport& report);

// The answer of POST /v1/prompt.
nlohmann::json response_json(const Response& r, bool use_cache, int batch_size, double queue_ms);

// {"error": {"message", "type", "kind", "file", "line", "column", "element"}}: the message is
// Error::what() (file:line:col: kind error: message (in element)), the other fields its parts,
// so OpenAI clients (which read error.message) and scripts both find what they need.
nlohmann::json error_json(const Error& e);
nlohmann::json error_json(const std::string& message, const std::string& type);
// 400 for a bad request, 404 for an unknown schema, 500 for the server's own files and model.
int error_status(const Error& e);

// A size or budget limit a request ran into: 413 (too large) or 429 (too many at once). Its
// JSON error names the limit ("limit": "max_queue") and the message says which flag raises it.
struct LimitError : std::runtime_error {
  LimitError(int status, std::string limit, const std::string& message)
      : std::runtime_error(message), status(status), limit(std::move(limit)) {}
  int status;
  std::string limit;
};
nlohmann::json error_json(const LimitError& e);

// JSON text for the wire: a token's text cut inside a UTF-8 character (or a model's invalid
// bytes) becomes U+FFFD instead of an exception.
std::string dump(const nlohmann::json& j);

}  // namespace promptcache::server
