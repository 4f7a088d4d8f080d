// promptcache/pml/prompt.hpp — a PML prompt, and its resolution against a schema's layout.
//
//   <prompt schema="docs">
//     <doc/>                                  select module "doc"
//     <ask topic="the second chapter"/>       select "ask", argument for its parameter "topic"
//     <user>What happens in it?</user>        fresh text, as a chat turn (plain text works too)
//   </prompt>
//
// Module references come first, nested the way the modules are nested in the schema (a union
// member is referenced as a child of the module around the union); then the prompt's text:
// plain text and/or <system>/<user>/<assistant> turns. resolve() turns this into the spans to
// assemble, the argument tokens with their positions, the fresh text tokens with theirs, and
// the no-cache baseline sequence (docs/pml.md, "Prompts"). Header-only, no LibTorch.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/layout.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache::pml {

struct Argument {
  std::string name;   // the parameter's name (the attribute name)
  std::string value;  // the attribute value
  SourceLocation where;
};

struct ModuleRef {
  std::string name;
  std::vector<Argument> arguments;
  std::vector<ModuleRef> children;  // references to modules nested in this one
  // recompute="..." on the reference: this prompt's budget for the module, overriding the
  // schema's recompute attribute on it (ModuleRecompute; "0" recomputes none of it).
  std::optional<ModuleRecompute> recompute;
  SourceLocation where;
};

// A piece of the prompt's own text: plain (no role) or a chat turn.
struct Turn {
  std::optional<ChatRole> role;  // none: plain text
  std::string text;              // whitespace-compacted at its edges
  SourceLocation where;
};

struct Prompt {
  std::string schema;  // <prompt schema="...">
  std::string file;    // origin
  std::vector<ModuleRef> modules;
  std::vector<Turn> turns;
  SourceLocation where;
  // What was accepted leniently ('<' or '&' read as text: lenient.hpp), one per line.
  std::vector<Warning> warnings;
};

namespace detail {

class PromptParser {
 public:
  explicit PromptParser(const XmlSource& src) : src_(src) {}

  Prompt parse() {
    const pugi::xml_node top = document_element(src_, "prompt", ErrorKind::kPrompt);
    Prompt prompt;
    prompt.file = src_.origin();
    prompt.where = src_.at(top);
    prompt.warnings = src_.warnings();
    if (std::string(top.name()) != "prompt") {
      throw Error(ErrorKind::kPrompt,
                  "the top element must be <prompt>, not <" + std::string(top.name()) + ">",
                  prompt.where);
    }
    for (pugi::xml_attribute attr : top.attributes()) {
      if (std::string(attr.name()) != "schema") {
        throw Error(ErrorKind::kPrompt,
                    "unknown attribute '" + std::string(attr.name()) + "' on <prompt>",
                    prompt.where);
      }
    }
    prompt.schema = top.attribute("schema").value();
    if (prompt.schema.empty()) {
      throw Error(ErrorKind::kPrompt, "<prompt> needs a schema attribute", prompt.where);
    }
    // Module references first, then the text; anything else is an error rather than dropped.
    bool in_text = false;
    SourceLocation first_text;
    for (pugi::xml_node child : top.children()) {
      const auto type = child.type();
      if (type == pugi::node_pcdata || type == pugi::node_cdata) {
        if (!in_text && is_blank(child.value())) continue;
        if (!in_text) first_text = src_.at(child);
        in_text = true;
        prompt.turns.push_back({std::nullopt, compact_whitespace(child.value()), src_.at(child)});
        prompt.turns.back().where.element = "<prompt>";
        continue;
      }
      if (type != pugi::node_element) continue;
      const std::string tag = child.name();
      if (tag == "system" || tag == "user" || tag == "assistant") {
        in_text = true;
        prompt.turns.push_back(parse_turn(child, tag));
        continue;
      }
      if (in_text) {
        SourceLocation where = src_.at(child);
        throw Error(ErrorKind::kPrompt,
                    "module reference <" + tag +
                        "> after the prompt's text (text starting at line " +
                        std::to_string(first_text.line) +
                        "); text between module references is not allowed — put module "
                        "references first, then the text",
                    where);
      }
      prompt.modules.push_back(parse_ref(child));
    }
    // Blank plain text between turns and at the end carries nothing.
    std::vector<Turn> kept;
    for (Turn& t : prompt.turns) {
      if (t.role || !is_blank(t.text)) kept.push_back(std::move(t));
    }
    prompt.turns = std::move(kept);
    return prompt;
  }

 private:
  Turn parse_turn(const pugi::xml_node& element, const std::string& tag) {
    Turn turn;
    turn.role = tag == "system" ? ChatRole::kSystem
                : tag == "user" ? ChatRole::kUser
                                : ChatRole::kAssistant;
    turn.where = src_.at(element);
    if (element.first_attribute()) {
      throw Error(ErrorKind::kPrompt, "<" + tag + "> takes no attributes", turn.where);
    }
    std::string text;
    for (pugi::xml_node child : element.children()) {
      if (child.type() == pugi::node_element) {
        throw Error(
            ErrorKind::kPrompt,
            "<" + std::string(child.name()) + "> inside a <" + tag + "> turn; turns hold text only",
            src_.at(child));
      }
      if (child.type() == pugi::node_pcdata || child.type() == pugi::node_cdata) {
        text += child.value();
      }
    }
    turn.text = compact_whitespace(text);
    return turn;
  }

  ModuleRef parse_ref(const pugi::xml_node& element) {
    ModuleRef ref;
    ref.name = element.name();
    ref.where = src_.at(element);
    for (pugi::xml_attribute attr : element.attributes()) {
      if (std::string(attr.name()) == "recompute") {  // no parameter may be named so (schema.hpp)
        ref.recompute = parse_module_recompute(attr.value());
        if (!ref.recompute) {
          throw Error(ErrorKind::kPrompt, module_recompute_message(attr.value(), ref.name),
                      ref.where);
        }
        continue;
      }
      ref.arguments.push_back({attr.name(), attr.value(), ref.where});
    }
    for (pugi::xml_node child : element.children()) {
      const auto type = child.type();
      if (type == pugi::node_pcdata || type == pugi::node_cdata) {
        if (is_blank(child.value())) continue;
        SourceLocation where = src_.at(child);
        where.element = src_.describe(element);
        throw Error(ErrorKind::kPrompt,
                    "text inside module reference <" + ref.name +
                        ">; a reference holds only nested references — give parameter values "
                        "as attributes and put text after the references",
                    where);
      }
      if (type == pugi::node_element) ref.children.push_back(parse_ref(child));
    }
    return ref;
  }

  const XmlSource& src_;
};

}  // namespace detail

// Parses a prompt. Its elements are named after modules, so every `<name` is markup; only a '<'
// that starts no tag at all and a stray '&' are read as text, with a warning (lenient.hpp).
inline Prompt parse_prompt_string(const std::string& xml, const std::string& origin = "<string>") {
  const std::string name = origin.empty() ? "<string>" : origin;
  check_source_size(xml, name);
  const XmlSource src(xml, name);
  return detail::PromptParser(src).parse();
}

inline Prompt parse_prompt_file(const std::string& path) {
  return parse_prompt_string(read_text_file(path), path);
}

// The value of one selected parameter slot.
struct PlacedArgument {
  std::size_t span = 0;    // the parameter span in Layout::spans
  std::size_t module = 0;  // its module
  std::string parameter;
  std::size_t begin = 0;  // = the slot's first position; tokens occupy [begin, begin+size)
  std::vector<TokenId> tokens;
  // No argument given: the scaffold text's tokens (no unk padding, cut to the slot's length).
  bool from_scaffold = false;
  SourceLocation where;  // the argument attribute's element (or the parameter's)

  std::size_t end() const { return begin + tokens.size(); }
};

// A selected module's recompute budget and where its cached tokens are.
struct RecomputeBudget {
  std::size_t module = 0;  // index into Layout::modules
  ModuleRecompute budget;
  // The reserved positions [first, second) of its own cacheable text spans, in order.
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
};

struct ResolvedPrompt {
  std::string schema;
  SourceLocation where;              // the prompt's <prompt> element, for errors about all of it
  std::vector<std::size_t> modules;  // selected modules in document order; the root is first
  // Selected spans in document order, parameter slots included (their value is in arguments).
  // Cacheable spans come from the cache; the others are computed fresh at their positions.
  std::vector<std::size_t> spans;
  std::vector<std::optional<std::size_t>> union_choice;  // per union id: the selected member
  std::vector<PlacedArgument> arguments;                 // one per selected slot, document order
  std::vector<TokenId> text_tokens;  // the prompt's own text and turns (always fresh)
  std::size_t text_begin = 0;        // position of text_tokens[0]; the rest follow contiguously
  // The text text_tokens were made from: the prompt's text, its turns' contents and their chat
  // template texts, and the generation prompt (a cached part's text is its spans' Span::text).
  std::string text;
  // The no-cache baseline: selected spans in document order with arguments in their slots, then
  // text_tokens — run at positions 0..n-1 as one ordinary prefill.
  std::vector<TokenId> baseline;
  // The selected modules with a recompute budget (the prompt's recompute="..." on the module's
  // reference, else the schema's on the module), in document order; they are honoured when the
  // request recomputes (promptcache/recompute.hpp, docs/fidelity.md).
  std::vector<RecomputeBudget> recompute_budgets;

  // Where decoding continues: after the last fresh text token.
  std::size_t next_position() const { return text_begin + text_tokens.size(); }
};

namespace detail {

class Resolver {
 public:
  Resolver(const Layout& layout, const Tokenizer& tokenizer) : layout_(layout), tok_(tokenizer) {}

  ResolvedPrompt resolve(const Prompt& prompt) {
    if (prompt.schema != layout_.schema_name) {
      throw Error(ErrorKind::kUnknownSchema,
                  "prompt uses schema '" + prompt.schema + "', but the loaded schema is '" +
                      layout_.schema_name + "'",
                  prompt.where);
    }
    out_.schema = prompt.schema;
    out_.where = prompt.where;
    out_.union_choice.assign(layout_.unions.size(), std::nullopt);
    selected_.assign(layout_.modules.size(), false);
    selected_[0] = true;
    budget_override_.assign(layout_.modules.size(), std::nullopt);
    given_.assign(layout_.spans.size(), nullptr);
    for (const ModuleRef& ref : prompt.modules) select(ref, 0);

    for (std::size_t m = 0; m < layout_.modules.size(); ++m) {
      if (!selected_[m]) continue;
      out_.modules.push_back(m);
      const std::optional<ModuleRecompute>& budget =
          budget_override_[m] ? budget_override_[m] : layout_.modules[m].recompute;
      if (!budget) continue;
      RecomputeBudget b;
      b.module = m;
      b.budget = *budget;
      for (std::size_t s : layout_.modules[m].spans) {
        const Span& span = layout_.spans[s];
        if (span.cacheable && span.kind != SpanKind::kParameter && span.size() > 0) {
          b.ranges.emplace_back(span.begin, span.end());
        }
      }
      out_.recompute_budgets.push_back(std::move(b));
    }
    std::size_t text_begin = 0;
    for (std::size_t s = 0; s < layout_.spans.size(); ++s) {
      const Span& span = layout_.spans[s];
      if (!selected_[span.module]) continue;
      out_.spans.push_back(s);
      if (span.kind != SpanKind::kParameter) {
        out_.baseline.insert(out_.baseline.end(), span.tokens.begin(), span.tokens.end());
        text_begin = std::max(text_begin, span.end());
        continue;
      }
      PlacedArgument arg = place_argument(s);
      out_.baseline.insert(out_.baseline.end(), arg.tokens.begin(), arg.tokens.end());
      text_begin = std::max(text_begin, arg.end());
      out_.arguments.push_back(std::move(arg));
    }
    out_.text_begin = text_begin;
    encode_turns(prompt);
    out_.baseline.insert(out_.baseline.end(), out_.text_tokens.begin(), out_.text_tokens.end());
    return std::move(out_);
  }

 private:
  void select(const ModuleRef& ref, std::size_t parent) {
    const ModuleLayout& p = layout_.modules[parent];
    std::size_t idx = kNoIndex;
    for (std::size_t c : p.children) {
      if (layout_.modules[c].name == ref.name) idx = c;
    }
    if (idx == kNoIndex) {
      std::string known;
      for (std::size_t c : p.children)
        known += (known.empty() ? "" : ", ") + layout_.modules[c].name;
      const std::string scope =
          p.is_root() ? "schema '" + layout_.schema_name + "'" : "module '" + p.path + "'";
      throw Error(ErrorKind::kUnknownModule,
                  scope + " has no module '" + ref.name + "'" +
                      (known.empty() ? " (it has no modules)" : " (it has: " + known + ")"),
                  ref.where);
    }
    const ModuleLayout& m = layout_.modules[idx];
    if (selected_[idx]) {
      throw Error(ErrorKind::kPrompt, "module '" + m.path + "' is referenced twice", ref.where);
    }
    if (!m.unions.empty()) {
      const UnionMembership direct = m.unions.back();
      const UnionLayout& u = layout_.unions[direct.union_id];
      if (u.members[direct.member] == idx) {
        if (auto other = out_.union_choice[direct.union_id]) {
          throw Error(ErrorKind::kUnionConflict,
                      "modules '" + layout_.modules[u.members[*other]].name + "' and '" + m.name +
                          "' are members of one union; select at most one",
                      ref.where);
        }
        out_.union_choice[direct.union_id] = direct.member;
      }
    }
    selected_[idx] = true;
    budget_override_[idx] = ref.recompute;
    for (const Argument& arg : ref.arguments) {
      std::size_t slot = kNoIndex;
      for (std::size_t s : m.parameters) {
        if (layout_.spans[s].parameter == arg.name) slot = s;
      }
      if (slot == kNoIndex) {
        std::string known;
        for (std::size_t s : m.parameters) {
          known += (known.empty() ? "" : ", ") + layout_.spans[s].parameter;
        }
        throw Error(ErrorKind::kUnknownParameter,
                    "module '" + m.path + "' has no parameter '" + arg.name + "'" +
                        (known.empty() ? " (it has none)" : " (it has: " + known + ")"),
                    arg.where);
      }
      given_[slot] = &arg;
    }
    for (const ModuleRef& child : ref.children) select(child, idx);
  }

  PlacedArgument place_argument(std::size_t s) {
    const Span& span = layout_.spans[s];
    PlacedArgument arg;
    arg.span = s;
    arg.module = span.module;
    arg.parameter = span.parameter;
    arg.begin = span.begin;
    if (const Argument* given = given_[s]) {
      arg.where = given->where;
      // Refused by its size before tokenizing when no tokenizer could fit it (limits.hpp): a
      // 1 GB argument costs a scan of the first slot x 256 bytes, not a tokenization.
      if (cannot_fit(given->value, span.size())) {
        throw Error(ErrorKind::kArgumentTooLong,
                    "argument for parameter '" + span.parameter + "' of module '" +
                        layout_.modules[span.module].path + "' is " +
                        std::to_string(given->value.size()) + " bytes, more than a parameter of " +
                        std::to_string(span.size()) +
                        " tokens can hold (no tokenizer packs more than " +
                        std::to_string(kMaxBytesPerToken) + " bytes into a token)",
                    given->where);
      }
      arg.tokens = encode_span(tok_, given->value);
      if (arg.tokens.size() > span.size()) {
        throw Error(ErrorKind::kArgumentTooLong,
                    "argument for parameter '" + span.parameter + "' of module '" +
                        layout_.modules[span.module].path + "' is " +
                        std::to_string(arg.tokens.size()) + " tokens, but the parameter reserves " +
                        std::to_string(span.size()) + " tokens",
                    given->where);
      }
    } else {
      arg.where = span.where;
      arg.tokens = encode_span(tok_, span.text);
      if (arg.tokens.size() > span.size()) arg.tokens.resize(span.size());  // cut like the slot
      arg.from_scaffold = true;
    }
    return arg;
  }

  void append(const std::vector<TokenId>& ids) {
    out_.text_tokens.insert(out_.text_tokens.end(), ids.begin(), ids.end());
  }

  // With a context limit (Layout::max_positions), Error(kContextOverflow) before tokenizing a
  // turn that certainly cannot fit in the positions left (limits.hpp).
  void check_text_room(const std::string& text, const SourceLocation& where) const {
    const std::size_t limit = layout_.max_positions;
    if (limit == 0) return;
    const std::size_t used = out_.text_begin + out_.text_tokens.size();
    const std::size_t left = used < limit ? limit - used : 0;
    if (!cannot_fit(text, left)) return;
    throw Error(ErrorKind::kContextOverflow,
                "the prompt's text of " + std::to_string(text.size()) +
                    " bytes cannot fit in the " + std::to_string(left) +
                    " positions left of the model's context of " + std::to_string(limit) +
                    " (no tokenizer packs more than " + std::to_string(kMaxBytesPerToken) +
                    " bytes into a token); it was not tokenized",
                where);
  }

  void encode_turns(const Prompt& prompt) {
    const ChatTemplate& tmpl = layout_.chat_template;
    std::optional<ChatRole> previous;
    for (std::size_t s : out_.spans) {
      if (layout_.spans[s].kind == SpanKind::kTemplate) previous = layout_.spans[s].role;
    }
    for (const Turn& turn : prompt.turns) {
      check_text_room(turn.text, turn.where);
      if (!turn.role) {
        append(encode_span(tok_, turn.text));
        out_.text += turn.text;
        continue;
      }
      const ChatRole prev = previous.value_or(ChatRole::kUser);
      const std::string open = tmpl.open_text(*turn.role, previous ? &prev : nullptr);
      append(tmpl.encode(tok_, open));
      append(encode_span(tok_, turn.text));
      append(tmpl.encode(tok_, tmpl.role(*turn.role).close));
      out_.text += open + turn.text + tmpl.role(*turn.role).close;
      previous = turn.role;
    }
    if (!prompt.turns.empty() && prompt.turns.back().role == ChatRole::kUser) {
      append(tmpl.encode(tok_, tmpl.generation_prompt));
      out_.text += tmpl.generation_prompt;
    }
    // Whether the tokens fit is the engine's to check (it knows a batch's rows).
  }

  const Layout& layout_;
  const Tokenizer& tok_;
  ResolvedPrompt out_;
  std::vector<bool> selected_;
  std::vector<std::optional<ModuleRecompute>> budget_override_;  // per module: the prompt's
  std::vector<const Argument*> given_;
};

}  // namespace detail

// Resolves a prompt against the layout of its schema (rules in docs/pml.md, "Prompts").
// Errors: kUnknownSchema, kUnknownModule, kUnionConflict, kUnknownParameter, kArgumentTooLong
// (both lengths in tokens), kPrompt (a module referenced twice) — each at the prompt element.
inline ResolvedPrompt resolve(const Prompt& prompt, const Layout& layout,
                              const Tokenizer& tokenizer) {
  return detail::Resolver(layout, tokenizer).resolve(prompt);
}

}  // namespace promptcache::pml
