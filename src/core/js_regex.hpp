// src/core/js_regex.hpp — the split regexes of tokenizer.json files, run by PCRE2 with the
// semantics the reference tokenizers give them (private to promptcache_core).
//
// tokenizer.json patterns are written for Oniguruma, which HuggingFace's tokenizers (Rust; what
// Python's AutoTokenizer and apply_chat_template users get) compile with onig::Regex::new, Ruby
// syntax, UTF-8. The JS tokenizers rewrite a few of them (the "(?i:'s|'t|...)" contraction group
// becomes explicit [sS] classes; BLOOM's class, see js_regex.cpp) and run them with JS RegExp
// ("gu"): \d and \w are ASCII, "." stops at line terminators. JsRegex applies the same rewrites
// and spells those classes out for PCRE2; \p{...} classes are PCRE2's own.
//
// \s is where the two readings differ, and the caller says which one a pattern gets:
//   WhiteSpace::kUnicode     Oniguruma's \s, Unicode White_Space: TAB..CR, SPACE, U+0085 (NEL),
//                            U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F,
//                            U+3000. The patterns a tokenizer.json holds (Split, Replace):
//                            HuggingFace's tokenizers read them so, and @huggingface/tokenizers
//                            (the tokenizer code of @huggingface/transformers 4) rewrites \s to
//                            \p{White_Space} to match it.
//   WhiteSpace::kEcmaScript  JavaScript's \s: the same without U+0085, plus U+FEFF. For patterns
//                            the JS tokenizers write in JS themselves (ByteLevel's GPT-2 regex).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace promptcache {

class JsRegex {
 public:
  enum class WhiteSpace { kUnicode, kEcmaScript };

  // Compiles `pattern`; Error(kTokenizer) naming `origin` and `field` when PCRE2 rejects it.
  JsRegex(const std::string& pattern, WhiteSpace space, const std::string& origin,
          const std::string& field);
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

  // transformers.js's rewrite of a tokenizer.json pattern followed by the PCRE2 class spelling
  // described above, \s as `space` reads it.
  static std::string translate(const std::string& pattern, WhiteSpace space);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string compiled_;
};

}  // namespace promptcache
