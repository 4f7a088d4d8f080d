// promptcache/pml/schema.hpp — the PML schema: parsed, validated, as a tree of nodes.
//
//   <schema name="docs">                         root module (its own text is always in a prompt)
//     <system>You answer questions.</system>     chat tag: template text around its content
//     <module name="doc" src="doc.txt"/>         module whose text is read from a file
//     <union scaffold="short">                   exactly one member may be selected
//       <module name="short">Be brief.</module>
//       <module name="long" cache="false">Explain.</module>
//     </union>
//     <module name="ask">Question about <parameter name="topic" length="8"/>:</module>
//   </schema>
//
// parse_schema_file / parse_schema_string check everything that does not need a tokenizer (the
// full list is in docs/pml.md, "Validation"); layout.hpp turns a Schema into tokens and positions.
// Header-only, no LibTorch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/pml/source.hpp"
#include "promptcache/pml/src_files.hpp"

namespace promptcache::pml {

enum class NodeKind {
  kText,       // literal text (already whitespace-compacted at its edges)
  kModule,     // <module> (and the <schema> root itself)
  kUnion,      // <union>: children are kModule only
  kParameter,  // <parameter>: no children
  kChat,       // <system>/<user>/<assistant>: children like a module's, in the enclosing scope
};

enum class ChatRole { kSystem, kUser, kAssistant };

inline const char* to_string(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
  }
  return "?";
}

// A module's recompute budget (recompute="..." on <module>, or on a module reference in a
// prompt, which overrides it): a whole number of its cached tokens ("16", digits only) or a
// fraction of them ("0.25", a number in [0, 1] with a decimal point or an exponent). The tokens
// are chosen among the module's own cached tokens by the request's criterion
// (docs/fidelity.md, "Per-module budgets").
struct ModuleRecompute {
  std::optional<std::size_t> tokens;  // set: a count of tokens; unset: `fraction`
  double fraction = 0;

  // Of `cached` tokens of the module, how many: the tokens (at most `cached`), or the fraction
  // rounded to nearest, at least one when it is above 0 and a token is cached.
  std::size_t count(std::size_t cached) const {
    if (tokens) return std::min(*tokens, cached);
    if (fraction <= 0 || cached == 0) return 0;
    const auto n = static_cast<std::size_t>(fraction * static_cast<double>(cached) + 0.5);
    return std::clamp<std::size_t>(n, 1, cached);
  }
  bool operator==(const ModuleRecompute& o) const {
    return tokens == o.tokens && fraction == o.fraction;
  }
};

// The largest token count a recompute budget may name (no context is longer).
constexpr std::size_t kMaxRecomputeTokens = 10'000'000;

// Parses a module's recompute value (ModuleRecompute), or nullopt when `text` is neither a
// whole number of at most kMaxRecomputeTokens nor a fraction in [0, 1]. No regex, no
// exceptions: a digit scan, then strtod over the whole value (no trailing text; NaN and the
// infinities fall outside the range).
inline std::optional<ModuleRecompute> parse_module_recompute(const std::string& text) {
  if (text.empty() || text.size() > 32) return std::nullopt;
  const bool digits =
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  ModuleRecompute r;
  if (digits) {
    std::size_t n = 0;
    for (char c : text) {
      n = n * 10 + static_cast<std::size_t>(c - '0');
      if (n > kMaxRecomputeTokens) return std::nullopt;
    }
    r.tokens = n;
    return r;
  }
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !(value >= 0.0 && value <= 1.0)) return std::nullopt;
  r.fraction = value;
  return r;
}

// What a bad recompute value on <element> is told.
inline std::string module_recompute_message(const std::string& text, const std::string& element) {
  return "recompute=\"" + text + "\" on <" + element + "> must be a whole number of tokens (0-" +
         std::to_string(kMaxRecomputeTokens) +
         ", e.g. \"16\") or a fraction of the module's cached tokens in [0, 1] with a decimal "
         "point (e.g. \"0.25\")";
}

// One node of the schema tree. A single struct (rather than a variant) keeps traversal simple;
// the comment on each field says which kinds use it.
struct Node {
  NodeKind kind = NodeKind::kText;
  // kModule: module name (root: the schema name); kParameter: parameter name.
  std::string name;
  // kText: the text (edges compacted to one space); kParameter: the scaffold text ("" = none);
  // kUnion: the name of the scaffold member ("" = the union has none).
  std::string text;
  bool cache = true;                         // kModule: false for cache="false"
  std::optional<ModuleRecompute> recompute;  // kModule: its recompute attribute (not the root)
  std::string src;                           // kModule: the src attribute as written ("" = none)
  std::size_t length = 0;                    // kParameter: reserved positions (>= 1)
  ChatRole role = ChatRole::kUser;           // kChat
  std::vector<Node> children;                // kModule, kUnion (members), kChat
  SourceLocation where;                      // file, line, column, element of the node

  bool is(NodeKind k) const { return kind == k; }
};

struct Schema {
  std::string name;  // the <schema name>
  std::string file;  // origin: path or the name given to parse_schema_string
  // recompute="r": the share of cached tokens a prompt of this schema recomputes unless its
  // request says otherwise (RequestOptions::recompute, docs/fidelity.md); unset = 0.
  std::optional<double> recompute;
  Node root;  // kModule named after the schema
  // What was accepted leniently ('<' and '&' read as text: lenient.hpp), one per line.
  std::vector<Warning> warnings;
};

// The element names of a schema: a tag with another name that is never closed is text
// (lenient.hpp, rule 5), so code like `#include <vector>` can stand in module text.
inline RepairOptions schema_repair_options() {
  return RepairOptions{{"schema", "module", "union", "parameter", "system", "user", "assistant"}};
}

// Names a module may not have: prompts use <system>/<user>/<assistant> as turns.
inline bool is_reserved_module_name(const std::string& name) {
  return name == "system" || name == "user" || name == "assistant";
}

namespace detail {

class SchemaParser {
 public:
  SchemaParser(const XmlSource& src, const SrcResolver& files) : src_(src), files_(files) {}

  Schema parse() {
    const pugi::xml_node top = document_element(src_, "schema", ErrorKind::kSchema);
    if (std::string(top.name()) != "schema") {
      throw Error(ErrorKind::kSchema,
                  "the top element must be <schema>, not <" + std::string(top.name()) + ">",
                  src_.at(top));
    }
    check_attributes(top, {"name", "recompute"});
    Schema schema;
    schema.file = src_.origin();
    schema.name = required_name(top, "schema");
    schema.recompute = recompute_attribute(top);
    schema.root.kind = NodeKind::kModule;
    schema.root.name = schema.name;
    schema.root.where = src_.at(top);
    schema.warnings = src_.warnings();
    Scope scope;
    parse_children(top, schema.root.children, scope, /*in_root=*/true, /*in_chat=*/false);
    if (!has_content(schema.root)) {
      throw Error(ErrorKind::kSchema, "schema '" + schema.name + "' is empty", src_.at(top));
    }
    return schema;
  }

 private:
  // Names already used in one module's scope (modules and parameters are separate namespaces).
  struct Scope {
    std::set<std::string> modules;
    std::set<std::string> parameters;
  };

  static bool has_content(const Node& node) {
    for (const Node& child : node.children) {
      if (child.kind != NodeKind::kText || !is_blank(child.text)) return true;
    }
    return false;
  }

  void check_attributes(const pugi::xml_node& element, std::initializer_list<const char*> allowed) {
    for (pugi::xml_attribute attr : element.attributes()) {
      bool ok = false;
      for (const char* name : allowed) ok = ok || std::string(attr.name()) == name;
      if (!ok) {
        std::string list;
        for (const char* name : allowed) list += std::string(list.empty() ? "" : ", ") + name;
        throw Error(ErrorKind::kSchema,
                    "unknown attribute '" + std::string(attr.name()) + "' on <" + element.name() +
                        ">" + (list.empty() ? " (it takes none)" : " (allowed: " + list + ")"),
                    src_.at(element));
      }
    }
  }

  // recompute="r" with r a number in [0, 1] (strtod over the whole value: no trailing text,
  // and NaN or infinities fall outside the range).
  std::optional<double> recompute_attribute(const pugi::xml_node& element) {
    const pugi::xml_attribute attr = element.attribute("recompute");
    if (!attr) return std::nullopt;
    const std::string text = attr.value();
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(value >= 0.0 && value <= 1.0)) {
      throw Error(ErrorKind::kSchema,
                  "recompute=\"" + text + "\" on <" + element.name() +
                      "> must be a number in [0, 1] (the share of cached tokens recomputed)",
                  src_.at(element));
    }
    return value;
  }

  std::string required_name(const pugi::xml_node& element, const char* what) {
    const pugi::xml_attribute attr = element.attribute("name");
    if (!attr) {
      throw Error(ErrorKind::kSchema, std::string("<") + what + "> needs a name attribute",
                  src_.at(element));
    }
    const std::string name = attr.value();
    if (!is_xml_name(name)) {
      throw Error(ErrorKind::kSchema,
                  std::string(what) + " name '" + name +
                      "' is not an XML name (a letter or '_' first, then letters, digits, '.', "
                      "'-', '_')",
                  src_.at(element));
    }
    return name;
  }

  void parse_children(const pugi::xml_node& parent, std::vector<Node>& out, Scope& scope,
                      bool in_root, bool in_chat) {
    for (pugi::xml_node child : parent.children()) {
      switch (child.type()) {
        case pugi::node_pcdata:
        case pugi::node_cdata: {
          Node text;
          text.kind = NodeKind::kText;
          text.text = compact_whitespace(child.value());
          text.where = src_.at(child);
          text.where.element = src_.describe(parent);
          out.push_back(std::move(text));
          break;
        }
        case pugi::node_element:
          out.push_back(parse_element(child, scope, in_root, in_chat));
          break;
        default:
          break;  // comments, processing instructions
      }
    }
  }

  Node parse_element(const pugi::xml_node& element, Scope& scope, bool in_root, bool in_chat) {
    const std::string tag = element.name();
    if (tag == "module") return parse_module(element, scope);
    if (tag == "union") return parse_union(element, scope);
    if (tag == "parameter") return parse_parameter(element, scope, in_root);
    if (tag == "system" || tag == "user" || tag == "assistant") {
      if (in_chat) {
        throw Error(ErrorKind::kSchema, "chat tag <" + tag + "> inside another chat tag",
                    src_.at(element));
      }
      check_attributes(element, {});
      Node chat;
      chat.kind = NodeKind::kChat;
      chat.role = tag == "system" ? ChatRole::kSystem
                  : tag == "user" ? ChatRole::kUser
                                  : ChatRole::kAssistant;
      chat.where = src_.at(element);
      parse_children(element, chat.children, scope, in_root, /*in_chat=*/true);
      return chat;
    }
    if (tag == "schema") {
      throw Error(ErrorKind::kSchema, "<schema> may only be the top element", src_.at(element));
    }
    throw Error(ErrorKind::kSchema,
                "unknown element <" + tag +
                    "> (expected <module>, <union>, <parameter>, <system>, <user> or <assistant>)",
                src_.at(element));
  }

  Node parse_module(const pugi::xml_node& element, Scope& scope) {
    check_attributes(element, {"name", "src", "cache", "recompute"});
    Node module;
    module.kind = NodeKind::kModule;
    module.where = src_.at(element);
    module.name = required_name(element, "module");
    if (is_reserved_module_name(module.name)) {
      throw Error(ErrorKind::kSchema,
                  "module name '" + module.name + "' is reserved for chat turns in prompts",
                  module.where);
    }
    if (!scope.modules.insert(module.name).second) {
      throw Error(ErrorKind::kSchema,
                  "duplicate module name '" + module.name + "' in the same scope", module.where);
    }
    if (auto cache = element.attribute("cache")) {
      const std::string value = cache.value();
      if (value != "true" && value != "false") {
        throw Error(ErrorKind::kSchema,
                    "cache must be \"true\" or \"false\", not \"" + value + "\"", module.where);
      }
      module.cache = value == "true";
    }
    if (auto recompute = element.attribute("recompute")) {
      module.recompute = parse_module_recompute(recompute.value());
      if (!module.recompute) {
        throw Error(ErrorKind::kSchema, module_recompute_message(recompute.value(), "module"),
                    module.where);
      }
    }
    Scope inner;
    if (auto src = element.attribute("src")) {
      module.src = src.value();
      for (pugi::xml_node child : element.children()) {
        const bool blank_text =
            (child.type() == pugi::node_pcdata || child.type() == pugi::node_cdata) &&
            is_blank(child.value());
        if (!blank_text && child.type() != pugi::node_comment) {
          throw Error(ErrorKind::kSchema,
                      "module '" + module.name + "' has a src file and content; use one of them",
                      module.where);
        }
      }
      if (module.src.empty()) {
        throw Error(ErrorKind::kSchema, "module '" + module.name + "' has an empty src",
                    module.where);
      }
      // The file is read through the resolver the caller handed in: the only way a schema
      // reaches a file (src_files.hpp).
      Node text;
      text.kind = NodeKind::kText;
      text.text = compact_whitespace(files_.read(module.src, module.where));
      text.where = module.where;
      module.children.push_back(std::move(text));
    } else {
      parse_children(element, module.children, inner, /*in_root=*/false, /*in_chat=*/false);
    }
    return module;
  }

  // Union members live in the enclosing module's scope (prompts name them as its children).
  Node parse_union(const pugi::xml_node& element, Scope& scope) {
    check_attributes(element, {"scaffold"});
    Node onion;
    onion.kind = NodeKind::kUnion;
    onion.where = src_.at(element);
    for (pugi::xml_node child : element.children()) {
      if (child.type() == pugi::node_pcdata || child.type() == pugi::node_cdata) {
        if (is_blank(child.value())) continue;
        SourceLocation where = src_.at(child);
        where.element = "<union>";
        throw Error(ErrorKind::kSchema, "text inside <union>; only <module> elements may go there",
                    where);
      }
      if (child.type() != pugi::node_element) continue;
      if (std::string(child.name()) != "module") {
        throw Error(
            ErrorKind::kSchema,
            "<" + std::string(child.name()) + "> inside <union>; only <module> may go there",
            src_.at(child));
      }
      onion.children.push_back(parse_module(child, scope));
    }
    if (onion.children.empty()) {
      throw Error(ErrorKind::kSchema, "<union> has no member modules", onion.where);
    }
    if (auto scaffold = element.attribute("scaffold")) {
      onion.text = scaffold.value();
      bool found = false;
      for (const Node& member : onion.children) found = found || member.name == onion.text;
      if (!found) {
        throw Error(ErrorKind::kSchema,
                    "union scaffold '" + onion.text + "' is not one of its member modules",
                    onion.where);
      }
    }
    return onion;
  }

  Node parse_parameter(const pugi::xml_node& element, Scope& scope, bool in_root) {
    check_attributes(element, {"name", "length", "scaffold"});
    Node param;
    param.kind = NodeKind::kParameter;
    param.where = src_.at(element);
    param.name = required_name(element, "parameter");
    if (in_root) {
      throw Error(ErrorKind::kSchema,
                  "parameter '" + param.name +
                      "' directly in <schema>; parameters must be inside a <module>",
                  param.where);
    }
    if (element.first_child()) {
      throw Error(ErrorKind::kSchema, "<parameter> must be empty (use the scaffold attribute)",
                  param.where);
    }
    if (param.name == "recompute") {
      throw Error(ErrorKind::kSchema,
                  "parameter name 'recompute' is reserved: on a module reference in a prompt, "
                  "recompute=\"...\" sets the module's recompute budget",
                  param.where);
    }
    if (!scope.parameters.insert(param.name).second) {
      throw Error(ErrorKind::kSchema,
                  "duplicate parameter name '" + param.name + "' in the same module", param.where);
    }
    const pugi::xml_attribute length = element.attribute("length");
    if (!length) {
      throw Error(ErrorKind::kSchema, "parameter '" + param.name + "' needs a length attribute",
                  param.where);
    }
    const std::string value = length.value();
    const bool digits = !value.empty() && std::all_of(value.begin(), value.end(),
                                                      [](char c) { return c >= '0' && c <= '9'; });
    // Read without overflow: anything past the limit is refused whatever its size.
    std::size_t parsed = 0;
    for (char c : digits ? value : std::string()) {
      parsed = std::min(parsed * 10 + static_cast<std::size_t>(c - '0'), kMaxParameterLength + 1);
    }
    if (parsed == 0) {
      throw Error(ErrorKind::kSchema,
                  "parameter '" + param.name +
                      "' length must be a positive integer (tokens), not \"" + value + "\"",
                  param.where);
    }
    if (parsed > kMaxParameterLength) {
      throw Error(ErrorKind::kSchema,
                  "parameter '" + param.name + "' length " + value + " is more than the " +
                      std::to_string(kMaxParameterLength) +
                      " positions a parameter may reserve (no model has a context that long)",
                  param.where);
    }
    param.length = parsed;
    param.text = element.attribute("scaffold").value();
    return param;
  }

  const XmlSource& src_;
  const SrcResolver& files_;
};

}  // namespace detail

// Parses and validates schema XML. origin names the input in errors ("<string>" if empty);
// module src attributes are read through `files` only (src_files.hpp). A '<' or '&' that starts
// no markup is read as text with a warning (Schema::warnings; lenient.hpp).
inline Schema parse_schema_string(const std::string& xml, const std::string& origin,
                                  const SrcResolver& files) {
  const std::string name = origin.empty() ? "<string>" : origin;
  check_source_size(xml, name);
  const XmlSource src(xml, name, schema_repair_options());
  return detail::SchemaParser(src, files).parse();
}

// A schema given as text reads no files: every src attribute is refused.
inline Schema parse_schema_string(const std::string& xml, const std::string& origin = "<string>") {
  return parse_schema_string(xml, origin, NoSrcFiles());
}

// Parses and validates a schema file; src attributes are read through `files`.
inline Schema parse_schema_file(const std::string& path, const SrcResolver& files) {
  return parse_schema_string(read_text_file(path), path, files);
}

// The resolver a schema file gets by default: files inside the file's own folder.
inline RootedSrcFiles src_files_beside(
    const std::string& schema_path,
    RootedSrcFiles::Scope scope = RootedSrcFiles::Scope::kInsideRoot,
    const std::string& hint = "") {
  return RootedSrcFiles(parent_dir(schema_path), scope, hint);
}

// Parses and validates a schema file; src attributes name files inside the file's folder.
inline Schema parse_schema_file(const std::string& path) {
  return parse_schema_file(path, src_files_beside(path));
}

}  // namespace promptcache::pml
