// promptcache/jinja/template.hpp — parse and render a Jinja chat template (the subset chat
// templates use), the way HuggingFace's apply_chat_template does: trim_blocks and lstrip_blocks
// on, loop controls (break/continue), an immutable sandbox (lists and dicts are never changed;
// namespace() attributes are), raise_exception() and strftime_now() as globals, and a tojson that
// writes like Python's json.dumps(ensure_ascii=False).
//
// Templates come from model files and are untrusted: the source size, the parser's nesting, the
// work of a render (loop iterations and items built), its output size and macro recursion are all
// bounded (Limits). Every failure is an Error(kTemplateError) naming the template's origin, the
// line and column, and the construct; a template's own raise_exception(msg) is a RaisedError whose
// message() is msg. No LibTorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/jinja/value.hpp"

namespace promptcache::jinja {

struct Limits {
  std::size_t max_template_bytes = 1 << 20;  // the source
  int max_nesting = 100;                     // blocks and expressions inside each other
  std::size_t max_output_bytes = 16u << 20;  // the rendered text
  std::uint64_t max_steps = 20'000'000;      // loop iterations + list/string items built
  int max_call_depth = 50;                   // macro calls inside each other
};

// raise_exception(message) called by the template.
class RaisedError : public Error {
 public:
  RaisedError(std::string message, SourceLocation where)
      : Error(kTemplateError, std::move(message), std::move(where)) {}
};

struct Node;  // the parsed template (src/jinja/ast.hpp)

class Template {
 public:
  // Parses `source`; `origin` names it in errors (a file path, "tokenizer_config.json
  // chat_template", "GGUF tokenizer.chat_template"). Error(kTemplateError) with the line on bad
  // syntax.
  static Template parse(std::string_view source, std::string origin, const Limits& limits = {});

  // Renders with these variables (messages, add_generation_prompt, bos_token, ...), over the
  // globals range, namespace, dict, raise_exception and strftime_now.
  std::string render(const std::vector<std::pair<std::string, Value>>& variables) const;

  const std::string& origin() const { return *origin_; }
  const Limits& limits() const { return limits_; }

 private:
  std::shared_ptr<const Node> root_;
  std::shared_ptr<const std::string> origin_;
  Limits limits_;
};

}  // namespace promptcache::jinja
