// src/core/unicode_text.hpp — UTF-8 helpers of the tokenizer.json reader (private to
// promptcache_core): WHATWG-exact repair of invalid UTF-8, Unicode normalization forms (utf8proc)
// and JavaScript's notion of white space, so that encoding matches the JS reference tokenizers.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace promptcache::unicode {

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// `text` with each invalid sequence replaced by U+FFFD exactly as the WHATWG encoding standard's
// UTF-8 decoder (TextDecoder, node's Buffer.toString) does: one U+FFFD per maximal subpart.
std::string to_valid_utf8(std::string_view text);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// `text` (valid UTF-8) in the given normalization form. Pure ASCII is returned unchanged without
// calling into utf8proc.
std::string normalize(std::string_view text, NormalForm form);

// Decodes the code point at text[i] (valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view text, std::size_t& i);
void append_utf8(std::string& out, char32_t cp);
// Byte length of the UTF-8 sequence that starts with `lead` (1 for a stray byte).
std::size_t utf8_sequence_length(unsigned char lead);

// JavaScript's \s and String.prototype.trim() set: WhiteSpace (tab, VT, FF, U+FEFF, every Zs) and
// LineTerminator (LF, CR, U+2028, U+2029). Unlike Unicode's White_Space it excludes U+0085.
bool is_js_space(char32_t cp);
std::string_view trim_js_start(std::string_view text);
std::string_view trim_js_end(std::string_view text);

}  // namespace promptcache::unicode
