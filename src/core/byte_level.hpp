// src/core/byte_level.hpp — GPT-2's byte-to-unicode mapping (private to promptcache_core).
//
// Byte-level BPE vocabularies spell every byte as one printable character: the printable Latin-1
// bytes stand for themselves and the other 68 (controls, space, soft hyphen, ...) for U+0100..,
// so " the" is stored as "Ġthe" and "\n" as "Ċ".
#pragma once

#include <array>
#include <string>

#include "unicode_text.hpp"

namespace promptcache::byte_level {

// code_point()[b]: the character that stands for byte b.
inline const std::array<char32_t, 256>& code_points() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? static_cast<char32_t>(b) : next++;
    return t;
  }();
  return table;
}

// utf8()[b]: that character in UTF-8.
inline const std::array<std::string, 256>& utf8() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    for (int b = 0; b < 256; ++b) unicode::append_utf8(t[b], code_points()[b]);
    return t;
  }();
  return table;
}

// The byte a character stands for, or -1 when it stands for none.
inline int byte_of(char32_t cp) {
  if (cp < 0x100) {
    const bool printable = (cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || cp >= 0xAE;
    if (printable) return static_cast<int>(cp);
  }
  if (cp < 256 || cp >= 256 + 68) return -1;
  static const std::array<int, 68> shifted = [] {
    std::array<int, 68> t{};
    for (int b = 0; b < 256; ++b) {
      if (code_points()[b] >= 256) t[code_points()[b] - 256] = b;
    }
    return t;
  }();
  return shifted[cp - 256];
}

// The encoded form of raw bytes ("Ġthe" for " the").
inline std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += utf8()[b];
  return out;
}

// The raw bytes of a string of byte characters ("Ġthe" -> " the"), appended to `out`; false (with
// `out` unspecified) when a character stands for no byte.
inline bool decode(std::string_view chars, std::string& out) {
  for (std::size_t i = 0; i < chars.size();) {
    const int b = byte_of(unicode::next_code_point(chars, i));
    if (b < 0) return false;
    out += static_cast<char>(b);
  }
  return true;
}

// The Qwen2 pre-tokenizer split regex (Qwen2.5, Qwen3): contractions, letters with one leading
// non-letter, single digits, punctuation runs, newlines, other white space.
inline const char* qwen2_split_regex() {
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
         "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}

}  // namespace promptcache::byte_level
