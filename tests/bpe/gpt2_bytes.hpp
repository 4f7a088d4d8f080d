// tests/bpe/gpt2_bytes.hpp — GPT-2's byte-to-character mapping, written out independently of the
// library's, for the bpe suite's tests that build byte-level tokenizer.json files by hand.
#pragma once

#include <string>

namespace promptcache::test {

// The UTF-8 text of the character GPT-2's byte-level encoding gives byte b ("Ġ" for a space).
inline std::string byte_char(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k) {
      const bool p = (k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE;
      if (!p) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace promptcache::test
