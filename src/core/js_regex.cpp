// JS-semantics split regexes on PCRE2 (see js_regex.hpp).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "js_regex.hpp"

#include <pcre2.h>

#include <new>
#include <utility>
#include <vector>

#include "promptcache/error.hpp"
#include "unicode_text.hpp"

namespace promptcache {
namespace {

// Oniguruma's \s with a Unicode encoding (its doc/RE: 0009-000D, 0085, Zl, Zp, Zs), which is
// Unicode's White_Space property. HuggingFace's tokenizers compile tokenizer.json patterns with
// Oniguruma, so a model's training data was split with this \s; @huggingface/tokenizers rewrites
// \s to \p{White_Space} for the same reason ("JS \s wrongly adds U+FEFF and misses \x85").
const char kUnicodeSpace[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// JavaScript's \s: WhiteSpace (TAB, VT, FF, ZWNBSP, every Zs) and LineTerminator (LF, CR, LS, PS).
// U+FEFF in, U+0085 out.
const char kJsSpace[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}\\x{FEFF}";
const char kJsDigit[] = "0-9";
const char kJsWord[] = "A-Za-z0-9_";

// transformers.js's PROBLEMATIC_REGEX_MAP: patterns that JS cannot parse, with its replacements.
const std::pair<const char*, const char*> kJsRewrites[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"},
    // BLOOM's pre-tokenizer pattern (invalid in JS). Oniguruma reads "[^(\\s|[...])]" as one
    // negated class whose members include '(', '|' and ')' and whose \s is Unicode's White_Space
    // (U+0085, not U+FEFF), and so do HuggingFace's tokenizers and @huggingface/tokenizers
    // (transformers.js 4); transformers.js 3 dropped the three, kept JS's \s and split "a(b" as
    // one word. BLOOM_SPLIT_CHARS spelled out in UTF-8.
    {" ?[^(\\s|[.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C])]"
     "+",
     " ?[^()|"
     "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
     "\\x{202F}\\x{205F}\\x{3000}"
     ".,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C]+"},
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
    s.replace(at, from.size(), to);
  }
}

bool is_hex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string to_hex(unsigned long v) {
  static const char digits[] = "0123456789ABCDEF";
  std::string out;
  do {
    out.insert(out.begin(), digits[v % 16]);
    v /= 16;
  } while (v);
  return out;
}

}  // namespace

std::string JsRegex::translate(const std::string& pattern, WhiteSpace space) {
  const char* const space_set = space == WhiteSpace::kUnicode ? kUnicodeSpace : kJsSpace;
  // 1. transformers.js first drops the backslash of \#, \& and \~ (valid in Rust, not in JS "u").
  std::string p;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size() &&
        (pattern[i + 1] == '#' || pattern[i + 1] == '&' || pattern[i + 1] == '~')) {
      p += pattern[++i];
    } else {
      p += pattern[i];
    }
  }
  // 2. Its literal rewrites of patterns JS cannot parse.
  for (const auto& [from, to] : kJsRewrites) replace_all(p, from, to);

  // 3. JS class semantics spelled out for PCRE2.
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      auto cls = [&](const char* set, bool negated) {
        if (in_class) {
          // A negated shorthand cannot be spelled inside a class; PCRE2's own is used there
          // (its \S under UCP agrees with Oniguruma's on U+0085 and U+FEFF, not with JS's, and
          // counts U+180E as white space; no pattern the reader builds itself has one).
          if (negated) {
            out += '\\';
            out += e;
          } else {
            out += set;
          }
        } else {
          out += negated ? "[^" : "[";
          out += set;
          out += ']';
        }
        ++i;
      };
      switch (e) {
        case 's':
          cls(space_set, false);
          continue;
        case 'S':
          cls(space_set, true);
          continue;
        case 'd':
          cls(kJsDigit, false);
          continue;
        case 'D':
          cls(kJsDigit, true);
          continue;
        case 'w':
          cls(kJsWord, false);
          continue;
        case 'W':
          cls(kJsWord, true);
          continue;
        case 'u': {
          // \u{X...} and \uXXXX (a surrogate pair of them is one code point) become \x{...}.
          std::size_t j = i + 2;
          unsigned long cp = 0;
          if (j < p.size() && p[j] == '{') {
            std::size_t k = j + 1;
            while (k < p.size() && is_hex(p[k])) ++k;
            if (k < p.size() && p[k] == '}' && k > j + 1) {
              cp = std::stoul(p.substr(j + 1, k - j - 1), nullptr, 16);
              out += "\\x{" + to_hex(cp) + "}";
              i = k;
              continue;
            }
          } else if (j + 4 <= p.size() && is_hex(p[j]) && is_hex(p[j + 1]) && is_hex(p[j + 2]) &&
                     is_hex(p[j + 3])) {
            cp = std::stoul(p.substr(j, 4), nullptr, 16);
            i = j + 3;
            if (cp >= 0xD800 && cp <= 0xDBFF && i + 6 < p.size() && p[i + 1] == '\\' &&
                p[i + 2] == 'u' && is_hex(p[i + 3]) && is_hex(p[i + 4]) && is_hex(p[i + 5]) &&
                is_hex(p[i + 6])) {
              const unsigned long low = std::stoul(p.substr(i + 3, 4), nullptr, 16);
              if (low >= 0xDC00 && low <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                i += 6;
              }
            }
            out += "\\x{" + to_hex(cp) + "}";
            continue;
          }
          out += "\\u";
          ++i;
          continue;
        }
        default:
          out += c;
          out += e;
          ++i;
          continue;
      }
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      // JS reads "[]" as a class that matches nothing and "[^]" as one that matches anything;
      // PCRE2 would take that ']' as a literal.
      if (p.compare(i, 2, "[]") == 0) {
        out += "(?!)";
        ++i;
        continue;
      }
      if (p.compare(i, 3, "[^]") == 0) {
        out += "[\\x{0}-\\x{10FFFF}]";
        i += 2;
        continue;
      }
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      continue;
    }
    if (c == '.') {
      out += "[^\\n\\r\\x{2028}\\x{2029}]";
      continue;
    }
    out += c;
  }
  return out;
}

struct JsRegex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

JsRegex::JsRegex(const std::string& pattern, WhiteSpace space, const std::string& origin,
                 const std::string& field)
    : impl_(std::make_unique<Impl>()), compiled_(translate(pattern, space)) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP: Unicode case folding and \b, as JS's "u" flag; DOLLAR_ENDONLY: JS's $ without "m".
  impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_.data()), compiled_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(ErrorKind::kTokenizer,
                "cannot compile the regex '" + pattern +
                    "': " + reinterpret_cast<const char*>(message) + " (at offset " +
                    std::to_string(offset) + " of '" + compiled_ + "')",
                {origin, 0, 0, field});
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

JsRegex::~JsRegex() = default;

void JsRegex::for_each_match(std::string_view text,
                             const std::function<void(std::size_t, std::size_t)>& on_match) const {
  // One ovector pair is all that is read (a smaller ovector than the groups is allowed: the
  // match still sets the whole match's offsets), and one block per thread serves every call:
  // nothing reads it after on_match is called, so a nested call may reuse it.
  struct Scratch {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Scratch() { pcre2_match_data_free(data); }
  };
  thread_local Scratch scratch;
  if (!scratch.data) throw std::bad_alloc();
  pcre2_match_data* const data = scratch.data;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start <= text.size()) {
    // The text is valid UTF-8 (the tokenizer repairs it first), so PCRE2 need not check it.
    int rc =
        pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // The interpreter keeps its backtracking state on the heap.
      rc = pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw Error(ErrorKind::kTokenizer,
                  std::string("split regex failed: ") + reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
    const std::size_t begin = ov[0], end = ov[1];
    on_match(begin, end);
    if (end > begin) {
      start = end;
    } else {
      if (end >= text.size()) return;
      start = end + unicode::utf8_sequence_length(static_cast<unsigned char>(text[end]));
    }
  }
}

}  // namespace promptcache
