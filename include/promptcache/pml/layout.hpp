// promptcache/pml/layout.hpp — THE place where PML positions are assigned.
//
// layout() tokenizes a Schema and gives every token a position id:
//   * the root starts with BOS at position 0 (LayoutOptions::add_bos);
//   * every text node, chat-template text and parameter slot is one *span*, tokenized on its
//     own (encode_span: trimmed, no BOS, so a span's tokens never depend on its neighbours);
//   * positions are assigned depth-first in document order with one cursor;
//   * all members of a union start at the union's offset; the union reserves the longest
//     member, and the cursor continues after it;
//   * a parameter reserves `length` positions holding its scaffold's tokens padded with unk
//     (filler_id: pad or EOS for tokenizers without unk)
//     (or cut to `length`).
// The result lists modules (path, [begin, end), cache flag), spans, unions, and answers the
// questions the cache compiler asks: which spans form an encoding pass (scaffold pass, one pass
// per non-scaffold union member) and which spans each pass stores. docs/pml.md has the rules
// with worked examples. Header-only, no LibTorch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/chat_template.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache::pml {

inline constexpr std::size_t kNoIndex = static_cast<std::size_t>(-1);

enum class SpanKind {
  kBos,        // the BOS token at position 0 (belongs to the root)
  kText,       // a text node (or a module's src file)
  kTemplate,   // the opening or closing text of a chat tag
  kParameter,  // a parameter slot: `length` positions of scaffold tokens padded with unk
};

inline const char* to_string(SpanKind kind) {
  switch (kind) {
    case SpanKind::kBos:
      return "bos";
    case SpanKind::kText:
      return "text";
    case SpanKind::kTemplate:
      return "template";
    case SpanKind::kParameter:
      return "parameter";
  }
  return "?";
}

// "This is inside member `member` (0-based, document order) of union `union_id`".
struct UnionMembership {
  std::size_t union_id = 0;
  std::size_t member = 0;
  bool operator==(const UnionMembership& o) const {
    return union_id == o.union_id && member == o.member;
  }
  bool operator!=(const UnionMembership& o) const { return !(*this == o); }
};

// A contiguous run of tokens that belongs to one module. Spans of one pass never overlap.
struct Span {
  SpanKind kind = SpanKind::kText;
  std::size_t module = 0;  // owning (innermost) module: index into Layout::modules
  std::size_t begin = 0;   // position of tokens[0]; the span covers [begin, end())
  std::vector<TokenId> tokens;
  // Its states may be stored: false for parameter slots (placeholders are never stored) and for
  // spans of a cache="false" module or of any module nested in one.
  bool cacheable = true;
  std::string text;       // kText/kTemplate: the source text; kParameter: its scaffold; kBos: ""
  std::string parameter;  // kParameter: the parameter's name
  ChatRole role = ChatRole::kUser;  // kTemplate: the chat tag's role
  bool closing = false;             // kTemplate: closing (true) or opening text
  // Every union member this span sits in, outermost first (empty: in no union).
  std::vector<UnionMembership> unions;
  SourceLocation where;

  std::size_t end() const { return begin + tokens.size(); }
  std::size_t size() const { return tokens.size(); }
};

struct ModuleLayout {
  std::string path;  // names joined by '/': "" for the root, "doc", "doc/intro"
  std::string name;  // last path component (the root: the schema name)
  std::size_t parent = kNoIndex;
  bool cache = true;                         // its own cache attribute
  bool cacheable = true;                     // cache, and every ancestor's cache
  std::optional<ModuleRecompute> recompute;  // its recompute attribute (Node::recompute)
  // Reserved positions, nested modules and unions included: [begin, end).
  std::size_t begin = 0;
  std::size_t end = 0;
  std::vector<std::size_t> spans;       // its own spans (nested modules' spans excluded), in order
  std::vector<std::size_t> children;    // modules in its scope, union members included, in order
  std::vector<std::size_t> parameters;  // its own parameter spans
  std::vector<UnionMembership> unions;  // unions this module is inside, outermost first
  SourceLocation where;

  bool is_root() const { return parent == kNoIndex; }
  std::size_t length() const { return end - begin; }
};

struct UnionLayout {
  std::size_t module = 0;               // the enclosing module
  std::vector<std::size_t> members;     // member modules (indices into Layout::modules)
  std::optional<std::size_t> scaffold;  // index into members; none when no scaffold attribute
  std::size_t begin = 0;                // every member starts here
  std::size_t length = 0;               // max member length
  std::vector<UnionMembership> unions;  // unions the union itself is inside, outermost first
  SourceLocation where;
};

// One causal encoding pass over the schema: which member represents each union.
struct Pass {
  std::vector<std::optional<std::size_t>> choice;  // per union id: the member, or none (left out)
  std::optional<UnionMembership> member;           // the swapped-in member; none = scaffold pass
};

struct LayoutOptions {
  bool add_bos = true;  // put the tokenizer's BOS at position 0, as the root's first span
  // The model's context (0 = no limit): a schema that needs more positions is refused with
  // Error(kContextOverflow) as soon as that is certain — a text too heavy to fit in the positions
  // left before it is tokenized (limits.hpp), a parameter before its slot is made — instead of
  // after tokenizing all of it. Prompts resolved against the layout are held to it too.
  std::size_t max_positions = 0;
  // What max_positions is, for the messages ("past the model's context (2048 positions)").
  std::string limit_name = "the model's context";
};

// The id that pads a parameter slot past its scaffold's tokens: unk, or where the tokenizer has
// none (byte-level BPE: Qwen, Llama 3) its pad id, else its EOS (else id 0). Only encoding context:
// a parameter's placeholder states are never stored.
inline TokenId filler_id(const Tokenizer& tokenizer) {
  if (tokenizer.unk_id() >= 0) return tokenizer.unk_id();
  if (tokenizer.pad_id() >= 0) return tokenizer.pad_id();
  return tokenizer.eos_id() >= 0 ? tokenizer.eos_id() : 0;
}

class Layout {
 public:
  std::string schema_name;
  ChatTemplate chat_template;  // the template chat tags were laid out with (prompts reuse it)
  std::vector<ModuleLayout> modules;  // depth-first document order; modules[0] is the root
  std::vector<UnionLayout> unions;    // document order of their opening tags
  std::vector<Span> spans;            // document order (members of one union one after another)
  std::size_t total_length = 0;       // positions reserved by the whole schema (= root's end)
  bool has_bos = false;
  std::size_t max_positions = 0;    // LayoutOptions::max_positions it was laid out for (0: none)
  std::optional<double> recompute;  // the schema's recompute attribute (Schema::recompute)
  std::vector<Warning> warnings;    // the schema's (Schema::warnings)

  const ModuleLayout& root() const { return modules.front(); }

  // The module at path, or nullptr.
  const ModuleLayout* find_module(std::string_view path) const {
    for (const ModuleLayout& m : modules) {
      if (m.path == path) return &m;
    }
    return nullptr;
  }
  std::size_t module_index(std::string_view path) const {
    const ModuleLayout* m = find_module(path);
    if (!m)
      throw Error(ErrorKind::kUnknownModule,
                  "no module '" + std::string(path) + "' in schema '" + schema_name + "'");
    return static_cast<std::size_t>(m - modules.data());
  }
  const ModuleLayout& module(std::string_view path) const { return modules[module_index(path)]; }

  // The module's own tokens (its spans in order; nested modules excluded; parameter slots hold
  // their scaffold/unk tokens).
  std::vector<TokenId> module_tokens(std::size_t module) const {
    std::vector<TokenId> out;
    for (std::size_t s : modules[module].spans) {
      out.insert(out.end(), spans[s].tokens.begin(), spans[s].tokens.end());
    }
    return out;
  }

  // Every union represented by its scaffold member (a union without one is left out).
  Pass scaffold_pass() const {
    Pass pass;
    pass.choice.reserve(unions.size());
    for (const UnionLayout& u : unions) pass.choice.push_back(u.scaffold);
    return pass;
  }

  // The scaffold pass with member m swapped in (and the unions around m set to the members
  // that contain it).
  Pass member_pass(UnionMembership m) const {
    Pass pass = scaffold_pass();
    for (const UnionMembership& outer : unions.at(m.union_id).unions) {
      pass.choice[outer.union_id] = outer.member;
    }
    pass.choice[m.union_id] = m.member;
    pass.member = m;
    return pass;
  }

  // The passes the cache compiler runs: the scaffold pass, then one per non-scaffold member of
  // every union, in document order. Every cacheable span is stored by exactly one of them.
  std::vector<Pass> encoding_passes() const {
    std::vector<Pass> passes{scaffold_pass()};
    for (std::size_t u = 0; u < unions.size(); ++u) {
      for (std::size_t i = 0; i < unions[u].members.size(); ++i) {
        if (unions[u].scaffold != i) passes.push_back(member_pass({u, i}));
      }
    }
    return passes;
  }

  bool in_pass(const Span& span, const Pass& pass) const {
    for (const UnionMembership& m : span.unions) {
      if (pass.choice.at(m.union_id) != m.member) return false;
    }
    return true;
  }

  // The spans of a pass in position order (= document order): what one causal forward sees.
  std::vector<std::size_t> spans_in(const Pass& pass) const {
    std::vector<std::size_t> out;
    for (std::size_t s = 0; s < spans.size(); ++s) {
      if (in_pass(spans[s], pass)) out.push_back(s);
    }
    return out;
  }

  // The pass whose states a span is stored from: its innermost union membership whose member is
  // not that union's scaffold; none (the scaffold pass) when every membership is a scaffold.
  std::optional<UnionMembership> storing_member(const Span& span) const {
    for (auto it = span.unions.rbegin(); it != span.unions.rend(); ++it) {
      if (unions[it->union_id].scaffold != it->member) return *it;
    }
    return std::nullopt;
  }

  // The cacheable spans whose states are taken from this pass.
  std::vector<std::size_t> spans_stored_by(const Pass& pass) const {
    std::vector<std::size_t> out;
    for (std::size_t s : spans_in(pass)) {
      if (spans[s].cacheable && storing_member(spans[s]) == pass.member) out.push_back(s);
    }
    return out;
  }
};

namespace detail {

class LayoutBuilder {
 public:
  LayoutBuilder(const Tokenizer& tokenizer, const ChatTemplate& tmpl, LayoutOptions options)
      : tok_(tokenizer), tmpl_(tmpl), options_(options) {}

  Layout build(const Schema& schema) {
    out_.schema_name = schema.name;
    out_.chat_template = tmpl_;
    out_.max_positions = options_.max_positions;
    out_.recompute = schema.recompute;
    out_.warnings = schema.warnings;
    lay_module(schema.root, kNoIndex, {});
    out_.total_length = out_.modules.front().end;
    return std::move(out_);
  }

 private:
  std::string module_name(std::size_t module) const {
    return out_.modules[module].is_root() ? "the schema's root"
                                          : "module '" + out_.modules[module].path + "'";
  }

  // Error(kContextOverflow) when `needed` more positions from the cursor pass max_positions.
  void check_room(std::size_t needed, std::size_t module, const SourceLocation& where,
                  const std::string& what) const {
    const std::size_t limit = options_.max_positions;
    if (limit == 0 || (cursor_ <= limit && needed <= limit - cursor_)) return;
    throw Error(ErrorKind::kContextOverflow,
                what + " of " + module_name(module) + " needs positions " +
                    std::to_string(cursor_) + " to " + std::to_string(cursor_ + needed) +
                    ", past " + options_.limit_name + " (" + std::to_string(limit) + " positions)",
                where);
  }

  // Before tokenizing: Error(kContextOverflow) when the text certainly cannot fit in the
  // positions left (limits.hpp: more than kMaxBytesPerToken bytes a position), so that a 100 MB
  // module costs no tokenization.
  void check_text_room(std::string_view text, std::size_t module,
                       const SourceLocation& where) const {
    const std::size_t limit = options_.max_positions;
    if (limit == 0) return;
    const std::size_t left = cursor_ < limit ? limit - cursor_ : 0;
    if (!cannot_fit(text, left)) return;
    throw Error(ErrorKind::kContextOverflow,
                "a text of " + std::to_string(text.size()) + " bytes in " + module_name(module) +
                    " cannot fit in the " + std::to_string(left) + " positions left of " +
                    options_.limit_name + " (" + std::to_string(limit) +
                    " positions): no tokenizer packs more than " +
                    std::to_string(kMaxBytesPerToken) + " bytes into a token; it was not tokenized",
                where);
  }

  std::size_t add_span(Span span) {
    check_room(span.tokens.size(), span.module, span.where,
               span.kind == SpanKind::kParameter ? "parameter '" + span.parameter + "'"
                                                 : std::string("a text"));
    const std::size_t id = out_.spans.size();
    const ModuleLayout& owner = out_.modules[span.module];
    span.begin = cursor_;
    span.unions = owner.unions;
    if (span.kind == SpanKind::kParameter)
      span.cacheable = false;
    else
      span.cacheable = owner.cacheable;
    cursor_ += span.tokens.size();
    out_.modules[span.module].spans.push_back(id);
    if (span.kind == SpanKind::kParameter) out_.modules[span.module].parameters.push_back(id);
    out_.spans.push_back(std::move(span));
    return id;
  }

  void lay_module(const Node& node, std::size_t parent, std::vector<UnionMembership> unions) {
    const std::size_t idx = out_.modules.size();
    ModuleLayout m;
    m.name = node.name;
    m.parent = parent;
    m.cache = node.cache;
    m.recompute = node.recompute;
    m.begin = cursor_;
    m.unions = std::move(unions);
    m.where = node.where;
    if (parent != kNoIndex) {
      const ModuleLayout& p = out_.modules[parent];
      m.path = p.path.empty() ? node.name : p.path + "/" + node.name;
      m.cacheable = node.cache && p.cacheable;
      out_.modules[parent].children.push_back(idx);
    } else {
      m.cacheable = node.cache;
    }
    out_.modules.push_back(std::move(m));
    if (parent == kNoIndex && options_.add_bos && tok_.adds_bos() && tok_.bos_id() >= 0) {
      Span bos;
      bos.kind = SpanKind::kBos;
      bos.module = idx;
      bos.tokens = {tok_.bos_id()};
      bos.where = node.where;
      add_span(std::move(bos));
      out_.has_bos = true;
    }
    lay_children(node.children, idx);
    out_.modules[idx].end = cursor_;
  }

  void lay_template_text(std::size_t module, ChatRole role, bool closing, const std::string& text,
                         const SourceLocation& where) {
    Span span;
    span.kind = SpanKind::kTemplate;
    span.module = module;
    span.tokens = tmpl_.encode(tok_, text);
    span.text = text;
    span.role = role;
    span.closing = closing;
    span.where = where;
    if (!span.tokens.empty()) add_span(std::move(span));
  }

  void lay_children(const std::vector<Node>& children, std::size_t module) {
    for (const Node& child : children) {
      switch (child.kind) {
        case NodeKind::kText: {
          Span span;
          span.kind = SpanKind::kText;
          span.module = module;
          check_text_room(child.text, module, child.where);
          span.tokens = encode_span(tok_, child.text);
          span.text = child.text;
          span.where = child.where;
          if (!span.tokens.empty()) add_span(std::move(span));
          break;
        }
        case NodeKind::kModule:
          lay_module(child, module, out_.modules[module].unions);
          break;
        case NodeKind::kUnion:
          lay_union(child, module);
          break;
        case NodeKind::kParameter:
          lay_parameter(child, module);
          break;
        case NodeKind::kChat: {
          const bool has_previous = previous_chat_.has_value();
          const ChatRole previous = has_previous ? *previous_chat_ : ChatRole::kUser;
          previous_chat_ = child.role;
          lay_template_text(module, child.role, false,
                            tmpl_.open_text(child.role, has_previous ? &previous : nullptr),
                            child.where);
          lay_children(child.children, module);
          lay_template_text(module, child.role, true, tmpl_.role(child.role).close, child.where);
          break;
        }
      }
    }
  }

  void lay_union(const Node& node, std::size_t module) {
    const std::size_t u = out_.unions.size();
    UnionLayout ul;
    ul.module = module;
    ul.begin = cursor_;
    ul.unions = out_.modules[module].unions;
    ul.where = node.where;
    for (std::size_t i = 0; i < node.children.size(); ++i) {
      if (node.children[i].name == node.text) ul.scaffold = i;
    }
    out_.unions.push_back(std::move(ul));
    std::size_t longest = 0;
    for (std::size_t i = 0; i < node.children.size(); ++i) {
      cursor_ = out_.unions[u].begin;
      auto memberships = out_.modules[module].unions;
      memberships.push_back({u, i});
      out_.unions[u].members.push_back(out_.modules.size());
      lay_module(node.children[i], module, std::move(memberships));
      longest = std::max(longest, cursor_ - out_.unions[u].begin);
    }
    out_.unions[u].length = longest;
    cursor_ = out_.unions[u].begin + longest;
  }

  void lay_parameter(const Node& node, std::size_t module) {
    Span span;
    span.kind = SpanKind::kParameter;
    span.module = module;
    span.parameter = node.name;
    span.text = node.text;
    span.where = node.where;
    // The slot is checked before it is made: `length` may be up to kMaxParameterLength.
    check_room(node.length, module, node.where, "parameter '" + node.name + "'");
    // A scaffold is only a placeholder for the encoding context, and whether it fits depends on
    // the tokenizer, so a long one is cut to the slot rather than rejected — unless it is so
    // long that no tokenizer could fit it (limits.hpp): that is a mistake, not worth tokenizing.
    if (cannot_fit(node.text, node.length)) {
      throw Error(ErrorKind::kSchema,
                  "parameter '" + node.name + "' has a scaffold of " +
                      std::to_string(node.text.size()) + " bytes for a slot of " +
                      std::to_string(node.length) + " tokens; it could never fit",
                  node.where);
    }
    span.tokens = encode_span(tok_, node.text);
    span.tokens.resize(node.length, filler_id(tok_));
    add_span(std::move(span));
  }

  const Tokenizer& tok_;
  const ChatTemplate& tmpl_;
  LayoutOptions options_;
  Layout out_;
  std::size_t cursor_ = 0;
  std::optional<ChatRole> previous_chat_;
};

}  // namespace detail

// Tokenizes the schema and assigns positions (rules at the top of this file and in docs/pml.md).
inline Layout layout(const Schema& schema, const Tokenizer& tokenizer, const ChatTemplate& tmpl,
                     LayoutOptions options = {}) {
  return detail::LayoutBuilder(tokenizer, tmpl, options).build(schema);
}

}  // namespace promptcache::pml
