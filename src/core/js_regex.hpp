// src/core/js_regex.hpp — the split regexes of tokenizer.json files, run by PCRE2 with the
// semantics the JS reference tokenizers (transformers.js) give them (private to promptcache_core).
//
// tokenizer.json patterns are written for Rust's Oniguruma; transformers.js rewrites a few of them
// for JavaScript (the "(?i:'s|'t|...)" contraction group becomes explicit [sS] classes) and then
// runs them with JS RegExp ("gu"): \s is JS white space (it includes U+FEFF, not U+0085), \d and
// \w are ASCII, "." stops at line terminators. JsRegex applies the same rewrites and spells those
// classes out for PCRE2, so both sides split identically; \p{...} classes are PCRE2's own.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace promptcache {

class JsRegex {
 public:
  // Compiles `pattern`; Error(kTokenizer) naming `origin` and `field` when PCRE2 rejects it.
  JsRegex(const std::string& pattern, const std::string& origin, const std::string& field);
  ~JsRegex();
  JsRegex(const JsRegex&) = delete;
  JsRegex& operator=(const JsRegex&) = delete;

  // Calls on_match(begin, end) for each match in `text` (valid UTF-8), left to right, as JS
  // String.prototype.matchAll does: the next search starts where a match ended, one character
  // further after an empty match.
  void for_each_match(std::string_view text,
                      const std::function<void(std::size_t, std::size_t)>& on_match) const;

  // The pattern as PCRE2 compiled it (after the JS rewrites), for messages and tests.
  const std::string& compiled_pattern() const { return compiled_; }

  // transformers.js's rewrite of a tokenizer.json pattern followed by the JS-to-PCRE2 class
  // spelling described above.
  static std::string translate(const std::string& pattern);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string compiled_;
};

}  // namespace promptcache
