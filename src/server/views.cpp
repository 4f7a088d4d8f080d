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
            {"exact", r.exact_tokens},
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

json error_json(const LimitError& e) {
  json j = error_json(e.what(), e.status == 429 ? "rate_limit_error" : "invalid_request_error");
  if (!e.limit.empty()) j["error"]["limit"] = e.limit;
  return j;
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
    case ErrorKind::kCancelled:
      return 409;  // deleted while it compiled, or the server is stopping
    default:
      return 400;
  }
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace promptcache::server
