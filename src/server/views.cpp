#include "views.hpp"

#include <limits>

namespace promptcache::server {

using nlohmann::json;

json layout_json(const pml::Layout& layout, const CompileReport& report) {
  json modules = json::array();
  for (std::size_t m = 0; m < layout.modules.size(); ++m) {
    const pml::ModuleLayout& mod = layout.modules[m];
    int64_t own_tokens = 0;
    for (std::size_t s : mod.spans) own_tokens += static_cast<int64_t>(layout.spans[s].size());
    json parameters = json::array();
    for (std::size_t s : mod.parameters) {
      const pml::Span& p = layout.spans[s];
      parameters.push_back(
          {{"name", p.parameter}, {"begin", p.begin}, {"length", p.size()}, {"scaffold", p.text}});
    }
    json entry = {{"path", mod.path},        {"name", mod.name},         {"root", mod.is_root()},
                  {"begin", mod.begin},      {"end", mod.end},           {"tokens", own_tokens},
                  {"cached", mod.cacheable}, {"parameters", parameters}, {"union", nullptr},
                  {"scaffold", false}};
    if (!mod.unions.empty()) {
      const pml::UnionMembership direct = mod.unions.back();
      const pml::UnionLayout& u = layout.unions[direct.union_id];
      if (u.members[direct.member] == m) {
        entry["union"] = direct.union_id;
        entry["scaffold"] = u.scaffold && *u.scaffold == direct.member;
      }
    }
    modules.push_back(std::move(entry));
  }
  json spans = json::array();
  for (const pml::Span& s : layout.spans) {
    spans.push_back({{"module", layout.modules[s.module].path},
                     {"kind", pml::to_string(s.kind)},
                     {"begin", s.begin},
                     {"end", s.end()},
                     {"tokens", s.size()},
                     {"cached", s.cacheable},
                     {"text", s.text}});
  }
  return {{"name", layout.schema_name},
          {"total_length", layout.total_length},
          {"modules", modules},
          {"spans", spans},
          {"compile",
           {{"source", report.source},
            {"passes", report.passes},
            {"tokens_run", report.tokens_run},
            {"tokens_stored", report.tokens_stored},
            {"bytes", report.bytes},
            {"ms", report.ms}}}};
}

json response_json(const Response& r, bool use_cache, int batch_size, double queue_ms) {
  return {{"text", r.text},
          {"token_ids", r.tokens},
          {"stop_reason", to_string(r.stop_reason)},
          {"use_cache", use_cache},
          {"batch_size", batch_size},
          {"timings",
           {{"ttft_ms", r.timings.ttft_ms},
            {"queue_ms", queue_ms},
            {"assembly_ms", r.timings.assembly_ms},
            {"fresh_prefill_ms", r.timings.fresh_prefill_ms},
            {"decode_ms", r.timings.decode_ms},
            {"decode_tokens_per_s", r.timings.decode_tokens_per_s()}}},
          {"tokens",
           {{"cached", r.cached_tokens},
            {"fresh", r.fresh_tokens},
            {"reused", r.reused_tokens},
            {"in_place", r.in_place_tokens},
            {"recomputed", r.recomputed_tokens},
            {"generated", r.tokens.size()}}}};
}

json error_json(const Error& e) {
  json j = error_json(e.what(), e.kind() == ErrorKind::kUnknownSchema ? "not_found_error"
                                                                      : "invalid_request_error");
  auto& err = j["error"];
  err["kind"] = to_string(e.kind());
  err["detail"] = e.message();
  const SourceLocation& w = e.where();
  if (!w.file.empty()) err["file"] = w.file;
  if (w.line > 0) err["line"] = w.line;
  if (w.column > 0) err["column"] = w.column;
  if (!w.element.empty()) err["element"] = w.element;
  return j;
}

json error_json(const std::string& message, const std::string& type) {
  return {{"error", {{"message", message}, {"type", type}}}};
}

int error_status(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kUnknownSchema:
      return 404;
    case ErrorKind::kIo:
    case ErrorKind::kModel:
    case ErrorKind::kSafetensors:
    case ErrorKind::kTokenizer:
    case ErrorKind::kCacheFile:
      return 500;
    default:
      return 400;
  }
}

namespace {

Error field_error(const std::string& key, const std::string& wanted, const json& got) {
  return Error(ErrorKind::kInvalidArgument,
               "'" + key + "' must be " + wanted + ", got " + got.dump().substr(0, 80));
}

double number_field(const json& body, const std::string& key, double min, double max) {
  const json& v = body.at(key);
  if (!v.is_number()) throw field_error(key, "a number", v);
  const double x = v.get<double>();
  if (!(x >= min && x <= max)) {
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

}  // namespace

SamplingParams sampling_from_json(const json& body, const std::string& max_tokens_key) {
  SamplingParams p;
  const int64_t int_max = std::numeric_limits<int>::max();
  const double inf = std::numeric_limits<double>::infinity();
  if (body.contains(max_tokens_key) && !body[max_tokens_key].is_null()) {
    p.max_new_tokens = static_cast<int>(whole_field(body, max_tokens_key, 0, int_max));
  }
  if (body.contains("temperature") && !body["temperature"].is_null()) {
    p.temperature = static_cast<float>(number_field(body, "temperature", 0, inf));
  }
  if (body.contains("top_k") && !body["top_k"].is_null()) {
    p.top_k = static_cast<int>(whole_field(body, "top_k", 0, int_max));
  }
  if (body.contains("top_p") && !body["top_p"].is_null()) {
    p.top_p = static_cast<float>(number_field(body, "top_p", 0, 1));
  }
  if (body.contains("repetition_penalty") && !body["repetition_penalty"].is_null()) {
    p.repetition_penalty = static_cast<float>(number_field(body, "repetition_penalty", 1e-6, inf));
  }
  if (body.contains("seed") && !body["seed"].is_null()) {
    const json& v = body["seed"];
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      throw field_error("seed", "a whole number >= 0", v);
    }
    p.seed = v.get<uint64_t>();
  }
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& v = body["stop"];
    if (v.is_string()) {
      p.stop_strings.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (const json& s : v) {
        if (!s.is_string()) throw field_error("stop", "a string or a list of strings", v);
        p.stop_strings.push_back(s.get<std::string>());
      }
    } else {
      throw field_error("stop", "a string or a list of strings", v);
    }
  }
  p.validate();
  return p;
}

std::optional<double> recompute_from_json(const json& body, const std::string& name) {
  if (!body.contains("recompute") || body["recompute"].is_null()) return std::nullopt;
  const json& v = body["recompute"];
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1)) {
    throw field_error(name, "a number from 0 to 1", v);
  }
  return v.get<double>();
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json parse_body(const std::string& text) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(ErrorKind::kInvalidArgument,
                "the request body is not valid JSON: " + std::string(e.what()));
  }
  if (!body.is_object()) {
    throw Error(ErrorKind::kInvalidArgument, "the request body must be a JSON object");
  }
  return body;
}

}  // namespace promptcache::server
