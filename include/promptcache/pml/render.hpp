// promptcache/pml/render.hpp — a Layout as a readable table (what `promptcache layout` prints).
//
//   schema "demo": 14 positions, 4 modules, 1 union, chat template llama-2
//   module   kind       positions  tokens  cached  union        text
//   (root)   bos        [0,1)      1       yes                  <s>
//   (root)   text       [1,4)      3       yes                  "You are helpful."
//   a        text       [4,6)      2       yes     u0 member 0* "First doc."
//   ...
// A '*' after the member marks the union's scaffold. Header-only, no LibTorch.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "promptcache/pml/layout.hpp"

namespace promptcache::pml {

namespace detail {

// Text shown in one table cell: newlines and tabs escaped, cut to max_chars with "...".
inline std::string preview(const std::string& text, std::size_t max_chars) {
  std::string out;
  for (char c : trim(text)) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else
      out += c;
  }
  if (out.size() > max_chars) out = out.substr(0, max_chars > 3 ? max_chars - 3 : 0) + "...";
  return out;
}

}  // namespace detail

struct RenderOptions {
  std::size_t max_text = 40;  // characters of each span's text shown
  bool show_ids = false;      // add a column with the span's token ids
};

inline std::string render_layout(const Layout& layout, RenderOptions options = {}) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"module", "kind", "positions", "tokens", "cached", "union", "text"});
  if (options.show_ids) rows.front().push_back("ids");
  for (const Span& span : layout.spans) {
    const ModuleLayout& m = layout.modules[span.module];
    std::string where;
    if (!span.unions.empty()) {
      const UnionMembership& u = span.unions.back();
      where = "u" + std::to_string(u.union_id) + " member " + std::to_string(u.member) +
              (layout.unions[u.union_id].scaffold == u.member ? "*" : "");
    }
    std::string text;
    switch (span.kind) {
      case SpanKind::kBos:
        text = "<bos>";
        break;
      case SpanKind::kText:
        text = "\"" + detail::preview(span.text, options.max_text) + "\"";
        break;
      case SpanKind::kTemplate:
        text = std::string(to_string(span.role)) + (span.closing ? " close " : " open ") + "\"" +
               detail::preview(span.text, options.max_text) + "\"";
        break;
      case SpanKind::kParameter:
        text = span.parameter + " = \"" + detail::preview(span.text, options.max_text) + "\"";
        break;
    }
    std::vector<std::string> row{
        m.is_root() ? "(root)" : m.path,
        to_string(span.kind),
        "[" + std::to_string(span.begin) + "," + std::to_string(span.end()) + ")",
        std::to_string(span.size()),
        span.cacheable ? "yes" : "no",
        where,
        text};
    if (options.show_ids) {
      std::string ids;
      for (TokenId id : span.tokens) ids += (ids.empty() ? "" : " ") + std::to_string(id);
      row.push_back(ids);
    }
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out =
      "schema \"" + layout.schema_name + "\": " + std::to_string(layout.total_length) +
      " positions, " + std::to_string(layout.modules.size()) + " modules, " +
      std::to_string(layout.unions.size()) + (layout.unions.size() == 1 ? " union" : " unions") +
      ", chat template " + layout.chat_template.family + "\n";
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  // Module summary: reserved ranges, nested modules included.
  out += "\nmodule ranges:\n";
  for (const ModuleLayout& m : layout.modules) {
    out += "  " + std::string(m.is_root() ? "(root)" : m.path) + "  [" + std::to_string(m.begin) +
           "," + std::to_string(m.end) + ")" + (m.cacheable ? "" : "  cache=false") + "\n";
  }
  return out;
}

}  // namespace promptcache::pml
