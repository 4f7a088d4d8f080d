// The C++ half of the JS cross-check (tests/tokenizer/js/crosscheck.sh):
//
//   bpe_js_crosscheck corpus OUT            writes the test corpus, one hex-encoded string a line
//   bpe_js_crosscheck train OUT_JSON        trains a tokenizer.json with train_bpe_tokenizer
//   bpe_js_crosscheck info TOKENIZER_JSON   prints BOS/EOS/end-of-turn facts, one per line
//   bpe_js_crosscheck encode TOKENIZER TEXT prints load_tokenizer(TOKENIZER)'s ids of TEXT
//   bpe_js_crosscheck compare TOKENIZER_JSON CORPUS JS_OUT LABEL nfc|raw
//                                           encodes every corpus string with load_bpe_tokenizer
//                                           and compares with the ids encode.js got from the JS
//                                           tokenizer; also checks decode(encode(s)) against the
//                                           text JS decoded from the same bytes (NFC-normalized
//                                           for "nfc": the tokenizer normalizes). Exit 1 on any
//                                           difference, printing the first ones.
//
// The corpus is made by a fixed-seed generator (SplitMix64, so every platform makes the same
// bytes): English, code, numbers, white space, emoji, CJK, accents in NFC and NFD, RTL text,
// special tokens written inline and invalid UTF-8. Characters come from blocks that have been
// stable since long before Unicode 14, the version of Debian's PCRE2 (node's ICU is newer; a
// letter assigned since would be \p{L} for one side only).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "unicode_text.hpp"  // src/core (private): the UTF-8 encoder

using promptcache::TokenId;

namespace {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi].
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + next() % (hi - lo + 1); }
  bool chance(int percent) { return range(0, 99) < static_cast<uint64_t>(percent); }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[range(0, v.size() - 1)];
  }

 private:
  uint64_t state_;
};

// The library's own encoder (src/core/unicode_text.hpp).
using promptcache::unicode::append_utf8;

std::string cps(std::initializer_list<char32_t> list) {
  std::string s;
  for (char32_t c : list) append_utf8(s, c);
  return s;
}

std::string random_from_block(Rng& rng, char32_t lo, char32_t hi, int min_len, int max_len) {
  std::string s;
  const int n = static_cast<int>(rng.range(min_len, max_len));
  for (int i = 0; i < n; ++i) append_utf8(s, static_cast<char32_t>(rng.range(lo, hi)));
  return s;
}

const std::vector<std::string>& english_words() {
  static const std::vector<std::string> words = [] {
    std::vector<std::string> w;
    std::istringstream in(promptcache::builtin_corpus());
    std::string word;
    while (in >> word) w.push_back(word);
    for (const char* extra : {"don't",
                              "I'm",
                              "they'll",
                              "WE'RE",
                              "it'S",
                              "you've",
                              "she'd",
                              "He'LL",
                              "it's",
                              "'tis",
                              "rock'n'roll",
                              "O'Neill",
                              "can't",
                              "won't",
                              "y'all",
                              "it'\xC5\xBF",
                              "THE",
                              "Hello",
                              "HELLO",
                              "hello",
                              "world",
                              "tokenizer",
                              "pre-tokenization",
                              "e-mail",
                              "U.S.A.",
                              "naïve",
                              "façade",
                              "Zürich",
                              "coöperate",
                              "résumé",
                              "mañana",
                              "straße",
                              "ǅemal",
                              "ﬁne",
                              "Ǆ",
                              "İstanbul",
                              "ΑΘΗΝΑ",
                              "Москва",
                              "Ελλάδα",
                              "Ünïcödé"}) {
      w.push_back(extra);
    }
    return w;
  }();
  return words;
}

std::string english(Rng& rng) {
  static const std::vector<std::string> punct = {".",  ",",  "!", "?", ";", ":", "...", " -",
                                                 " —", "\"", "'", "(", ")", "…", "?!"};
  std::string s;
  const int n = static_cast<int>(rng.range(1, 24));
  for (int i = 0; i < n; ++i) {
    if (i) s += rng.chance(90) ? " " : (rng.chance(50) ? "  " : "\n");
    s += rng.pick(english_words());
    if (rng.chance(15)) s += rng.pick(punct);
  }
  if (rng.chance(30)) s += ".";
  if (rng.chance(10)) s = " " + s;
  return s;
}

std::string code(Rng& rng) {
  static const std::vector<std::string> lines = {
      "int main(int argc, char** argv) {",
      "  return 0;",
      "}",
      "def tokenize(text: str) -> list[int]:",
      "    return [ord(c) for c in text]",
      "\tif (a != b && c <= d) { x += 1; }",
      "for (std::size_t i = 0; i < n; ++i) sum += v[i];",
      "const re = /'s|'t|\\s+(?!\\S)/gu;",
      "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
      "#include <vector>",
      "    // TODO: handle the empty case",
      "x = {\"key\": [1, 2, 3], 'other': None}",
      "fn main() { println!(\"{}\", 42); }",
      "<div class=\"row\"><span>&nbsp;</span></div>",
      "$ git commit -m 'fix: off-by-one in merge()'",
      "    \t  mixed_indent = True",
      "a=b+c*d/e-f%g^h|i&j~k",
      "arr[0x1F] = 0b1010'1010;",
      "echo \"$HOME\" | tr -d '\\n' >> ~/.bashrc",
      "lambda x: x**2 if x>0 else -x",
      "@decorator(name='test')",
      "public static void Main(string[] args)",
      "        ",
      "    }",
      "'''docstring'''",
      "#!/usr/bin/env python3",
      "std::unordered_map<std::string, int> m{{\"a\", 1}};",
  };
  std::string s;
  const int n = static_cast<int>(rng.range(1, 8));
  for (int i = 0; i < n; ++i) {
    if (i) s += rng.chance(85) ? "\n" : (rng.chance(50) ? "\r\n" : "\n\n");
    s += rng.pick(lines);
  }
  if (rng.chance(20)) s += "\n";
  return s;
}

std::string digits(Rng& rng) {
  std::string s;
  switch (rng.range(0, 7)) {
    case 0: {
      const int n = static_cast<int>(rng.range(1, 60));
      for (int i = 0; i < n; ++i) s += static_cast<char>('0' + rng.range(0, 9));
      break;
    }
    case 1:
      s = std::to_string(rng.range(0, 1000000000)) + "." + std::to_string(rng.range(0, 99999));
      break;
    case 2: {
      s = std::to_string(rng.range(1, 999));
      const int groups = static_cast<int>(rng.range(1, 6));
      for (int i = 0; i < groups; ++i) {
        const auto g = rng.range(0, 999);
        s += "," + std::string(g < 10 ? "00" : g < 100 ? "0" : "") + std::to_string(g);
      }
      break;
    }
    case 3:
      s = "+1 (" + std::to_string(rng.range(200, 999)) + ") " +
          std::to_string(rng.range(200, 999)) + "-" + std::to_string(rng.range(1000, 9999));
      break;
    case 4:  // digits of other scripts: Arabic-Indic, Devanagari, fullwidth, superscripts
      s = random_from_block(rng, 0x0660, 0x0669, 1, 12) + " " +
          random_from_block(rng, 0x0966, 0x096F, 1, 8) + " " +
          random_from_block(rng, 0xFF10, 0xFF19, 1, 8) + " x" + cps({0xB2, 0xB3, 0xB9}) + " " +
          cps({0x2160, 0x2163, 0x216B}) + " " + cps({0xBD, 0x2153});
      break;
    case 5:
      s = "version " + std::to_string(rng.range(0, 20)) + "." + std::to_string(rng.range(0, 99)) +
          "." + std::to_string(rng.range(0, 999)) + "-rc" + std::to_string(rng.range(1, 9));
      break;
    case 6:
      s = "0x" + std::to_string(rng.next() % 100000000000ULL) + "ULL, 1e-" +
          std::to_string(rng.range(1, 300)) + ", -" + std::to_string(rng.range(0, 99)) + ".5f";
      break;
    default:
      s = "In " + std::to_string(rng.range(1900, 2100)) + ", " + std::to_string(rng.range(1, 99)) +
          "% of " + std::to_string(rng.next() % 10000000000ULL) + " people paid $" +
          std::to_string(rng.range(1, 9999)) + ".99";
  }
  return s;
}

std::string whitespace(Rng& rng) {
  static const std::vector<std::string> spaces = {
      " ",           "  ",          "   ",         "\t",          "\t\t",        "\n",
      "\n\n",        "\r\n",        "\r",          " \n",         "\n ",         "  \n  ",
      "\x0B",        "\x0C",        cps({0xA0}),   cps({0x3000}), cps({0xFEFF}), cps({0x85}),
      cps({0x2028}), cps({0x2029}), cps({0x200B}), cps({0x2009}), cps({0x202F}), cps({0x1680}),
      cps({0x205F}), cps({0x180E}), " \t \t",      "\n\t\n",      "    ",        "        "};
  std::string s;
  const int n = static_cast<int>(rng.range(1, 10));
  for (int i = 0; i < n; ++i) {
    const int reps = static_cast<int>(rng.range(1, rng.chance(10) ? 40 : 3));
    const std::string& sp = rng.pick(spaces);
    for (int r = 0; r < reps; ++r) s += sp;
    if (rng.chance(70)) s += rng.pick(english_words());
    if (rng.chance(20)) s += rng.pick(std::vector<std::string>{".", "!", "?", "-", "*", "1", "42"});
  }
  return s;
}

std::string emoji(Rng& rng) {
  static const std::vector<std::string> pieces = {
      cps({0x1F600}), cps({0x1F64F}), cps({0x1F680}), cps({0x2764, 0xFE0F}),
      cps({0x1F44D, 0x1F3FD}),
      // ZWJ sequences: family, rainbow flag, woman technologist, pirate flag
      cps({0x1F468, 0x200D, 0x1F469, 0x200D, 0x1F467, 0x200D, 0x1F466}),
      cps({0x1F3F3, 0xFE0F, 0x200D, 0x1F308}), cps({0x1F469, 0x1F3FB, 0x200D, 0x1F4BB}),
      cps({0x1F3F4, 0x200D, 0x2620, 0xFE0F}),
      // flags and keycaps
      cps({0x1F1FA, 0x1F1F8}), cps({0x1F1EF, 0x1F1F5}), cps({0x31, 0xFE0F, 0x20E3}),
      cps({0x23, 0xFE0F, 0x20E3}), cps({0x2600}), cps({0x263A}), cps({0x2705}), cps({0x1F9E0}),
      cps({0x1F355}), cps({0x1F431}), cps({0x1F30D}), cps({0x2B50}), cps({0x26A1})};
  std::string s;
  const int n = static_cast<int>(rng.range(1, 8));
  for (int i = 0; i < n; ++i) {
    if (rng.chance(50)) s += rng.pick(english_words()) + (rng.chance(50) ? " " : "");
    const int reps = static_cast<int>(rng.range(1, 3));
    for (int r = 0; r < reps; ++r) s += rng.pick(pieces);
    if (rng.chance(30)) s += " ";
  }
  if (rng.chance(30)) s += random_from_block(rng, 0x1F600, 0x1F64F, 1, 6);
  return s;
}

std::string cjk(Rng& rng) {
  std::string s;
  const int n = static_cast<int>(rng.range(1, 6));
  for (int i = 0; i < n; ++i) {
    switch (rng.range(0, 5)) {
      case 0:
        s += random_from_block(rng, 0x4E00, 0x9FA5, 1, 12);  // CJK (Unicode 1.1)
        break;
      case 1:
        s += random_from_block(rng, 0x3041, 0x3093, 1, 8) +  // hiragana + katakana
             random_from_block(rng, 0x30A1, 0x30F6, 0, 6);
        break;
      case 2:
        s += random_from_block(rng, 0xAC00, 0xD7A3, 1, 8);  // Hangul syllables
        break;
      case 3:
        s += rng.pick(std::vector<std::string>{
            "日本語のテキスト", "你好，世界！", "我爱自然语言处理。", "東京都は晴れです",
            "한국어 문장입니다.", "「引用」と『書名』", "价格：１２３元", "中文English混合"});
        break;
      case 4:
        s += rng.pick(
            std::vector<std::string>{"。", "，", "、", "！", "？", "：", "「", "」", "（", "）"});
        break;
      default:
        s += " " + rng.pick(english_words()) + " ";
    }
  }
  return s;
}

std::string accents(Rng& rng) {
  std::string s;
  const int n = static_cast<int>(rng.range(1, 6));
  for (int i = 0; i < n; ++i) {
    if (i) s += " ";
    switch (rng.range(0, 6)) {
      case 0:  // precomposed (NFC) Latin
        s += random_from_block(rng, 0xC0, 0xFF, 1, 6) + random_from_block(rng, 0x100, 0x17E, 0, 4);
        break;
      case 1: {  // base letters with combining marks (NFD and stacked)
        const int letters = static_cast<int>(rng.range(1, 6));
        for (int k = 0; k < letters; ++k) {
          append_utf8(
              s, static_cast<char32_t>(rng.chance(50) ? rng.range('a', 'z') : rng.range('A', 'Z')));
          const int marks = static_cast<int>(rng.range(0, rng.chance(10) ? 4 : 1));
          for (int m = 0; m < marks; ++m)
            append_utf8(s, static_cast<char32_t>(rng.range(0x300, 0x36F)));
        }
        break;
      }
      case 2:
        s += rng.pick(std::vector<std::string>{
            "cafe\xCC\x81", "caf\xC3\xA9", "e\xCC\x81\xCC\x81", "A\xCC\x8A", "\xE2\x84\xAB",
            "\xE2\x84\xA6", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB",  // Hangul jamo (NFD of 한)
            "Vi\xE1\xBB\x87t Nam", "Vie\xCC\xA3\xCC\x82t", "n\xCC\x83", "\xC3\xB1", "o\xCC\x88",
            "\xCE\x91\xCC\x81", "\xD0\xB8\xCC\x86", "\xD0\xB9", "\xEF\xAC\x81", "\xC7\x85"});
        break;
      case 3:
        s += random_from_block(rng, 0x391, 0x3C9, 1, 8);  // Greek
        break;
      case 4:
        s += random_from_block(rng, 0x410, 0x44F, 1, 8);  // Cyrillic
        break;
      case 5:
        s += random_from_block(rng, 0x905, 0x939, 1, 4) +  // Devanagari with vowel signs
             random_from_block(rng, 0x93E, 0x94C, 0, 2);
        break;
      default:
        s += rng.pick(english_words());
    }
  }
  return s;
}

std::string rtl(Rng& rng) {
  std::string s;
  const int n = static_cast<int>(rng.range(1, 6));
  for (int i = 0; i < n; ++i) {
    if (i) s += rng.chance(80) ? " " : "\n";
    switch (rng.range(0, 5)) {
      case 0:
        s += random_from_block(rng, 0x627, 0x64A, 2, 8);                      // Arabic letters
        if (rng.chance(40)) s += random_from_block(rng, 0x64B, 0x652, 1, 2);  // harakat
        break;
      case 1:
        s += random_from_block(rng, 0x5D0, 0x5EA, 2, 7);                      // Hebrew
        if (rng.chance(40)) s += random_from_block(rng, 0x5B0, 0x5BC, 1, 2);  // niqqud
        break;
      case 2:
        s += rng.pick(std::vector<std::string>{"مرحبا بالعالم", "السلام عليكم", "שלום עולם",
                                               "עִבְרִית", "العربية ١٢٣", "فارسی ۱۲۳", "اردو"});
        break;
      case 3:
        s += cps({0x200F}) + rng.pick(english_words()) + cps({0x200E});  // RLM/LRM
        break;
      case 4:
        s += std::to_string(rng.range(0, 99999));
        break;
      default:
        s += rng.pick(english_words());
    }
    if (rng.chance(20)) s += rng.pick(std::vector<std::string>{"،", "؟", ".", "!", "״", "׳"});
  }
  return s;
}

std::string specials(Rng& rng) {
  static const std::vector<std::string> tokens = {"<|im_start|>",
                                                  "<|im_end|>",
                                                  "<|endoftext|>",
                                                  "<|begin_of_text|>",
                                                  "<|end_of_text|>",
                                                  "<|eot_id|>",
                                                  "<|eom_id|>",
                                                  "<|start_header_id|>",
                                                  "<|end_header_id|>",
                                                  "<think>",
                                                  "</think>",
                                                  "<tool_call>",
                                                  "<|fim_prefix|>",
                                                  "<|vision_start|>",
                                                  "<|reserved_special_token_5|>",
                                                  "<|reserved_special_token_250|>",
                                                  "<|python_tag|>",
                                                  "<|im_start",
                                                  "im_end|>",
                                                  "<|",
                                                  "|>",
                                                  "<|<|im_end|>|>",
                                                  "< |eot_id|>",
                                                  "<|EOT_ID|>",
                                                  "<s>",
                                                  "</s>",
                                                  "<unk>"};
  std::string s;
  const int n = static_cast<int>(rng.range(1, 8));
  for (int i = 0; i < n; ++i) {
    switch (rng.range(0, 3)) {
      case 0:
        s += rng.pick(tokens);
        break;
      case 1:
        s += rng.pick(english_words());
        break;
      case 2:
        s += rng.pick(std::vector<std::string>{" ", "\n", "  ", "\n\n", "user\n", "assistant\n",
                                               "system", ": "});
        break;
      default:
        s += rng.pick(tokens) + rng.pick(tokens);
    }
  }
  return s;
}

std::string invalid_utf8(Rng& rng) {
  static const std::vector<std::string> bad = {"\x80",
                                               "\xBF",
                                               "\xC0\x80",
                                               "\xC1\xBF",
                                               "\xC2",
                                               "\xDF",
                                               "\xE0\x80\x80",
                                               "\xE0\x9F\xBF",
                                               "\xED\xA0\x80",
                                               "\xED\xBF\xBF",
                                               "\xE2\x82",
                                               "\xE2",
                                               "\xF0\x9F\x98",
                                               "\xF0\x9F",
                                               "\xF0\x80\x80\x80",
                                               "\xF4\x90\x80\x80",
                                               "\xF5\x80\x80\x80",
                                               "\xF8\x88\x80\x80\x80",
                                               "\xFE",
                                               "\xFF",
                                               "\xC3\x28",
                                               "\xA0\xA1",
                                               "\xE2\x28\xA1",
                                               "\xF0\x28\x8C\xBC",
                                               std::string("\0", 1)};
  std::string s;
  const int n = static_cast<int>(rng.range(1, 8));
  for (int i = 0; i < n; ++i) {
    switch (rng.range(0, 3)) {
      case 0:
        s += rng.pick(bad);
        break;
      case 1:
        s += rng.pick(english_words());
        break;
      case 2: {
        // Random bytes that never form a sequence beyond U+07FF (so only long-assigned
        // characters can appear): ASCII, continuation bytes, 2-byte leads, C0/C1, F5..FF.
        const int k = static_cast<int>(rng.range(1, 12));
        for (int b = 0; b < k; ++b) {
          unsigned char c;
          switch (rng.range(0, 3)) {
            case 0:
              c = static_cast<unsigned char>(rng.range(0x00, 0x7F));
              break;
            case 1:
              c = static_cast<unsigned char>(rng.range(0x80, 0xBF));
              break;
            case 2:
              c = static_cast<unsigned char>(rng.range(0xC0, 0xDF));
              break;
            default:
              c = static_cast<unsigned char>(rng.range(0xF5, 0xFF));
          }
          s += static_cast<char>(c);
        }
        break;
      }
      default:
        s += " ";
    }
  }
  return s;
}

std::string long_string(Rng& rng) {
  std::string s;
  switch (rng.range(0, 5)) {
    case 0:
      s = std::string(rng.range(300, 3000), ' ') + "x";
      break;
    case 1:
      for (int i = static_cast<int>(rng.range(100, 2000)); i > 0; --i)
        s += static_cast<char>('0' + rng.range(0, 9));
      break;
    case 2:
      for (int i = static_cast<int>(rng.range(300, 1500)); i > 0; --i)
        s += static_cast<char>('a' + rng.range(0, 25));
      break;
    case 3:
      s = std::string(rng.range(100, 1000), '\n') + std::string(rng.range(10, 100), '\t');
      break;
    case 4:
      for (int i = 0; i < 60; ++i) s += english(rng) + "\n";
      break;
    default:
      s = random_from_block(rng, 0x4E00, 0x9FA5, 300, 1200);
  }
  return s;
}

std::string mixed(Rng& rng) {
  using Gen = std::string (*)(Rng&);
  static const std::vector<Gen> gens = {english, code,    digits, whitespace, emoji,
                                        cjk,     accents, rtl,    specials};
  std::string s;
  const int n = static_cast<int>(rng.range(2, 5));
  for (int i = 0; i < n; ++i) s += rng.pick(gens)(rng);
  return s;
}

std::vector<std::string> make_corpus() {
  Rng rng(20261204);
  std::vector<std::string> out;
  // Fixed cases first: empty-ish strings and the classic edge cases.
  for (const char* s : {"",
                        " ",
                        "  ",
                        "\n",
                        "a",
                        "A",
                        "'s",
                        " 's",
                        "'S",
                        "1",
                        "12",
                        "123",
                        "1234",
                        "<|im_start|>",
                        "<|endoftext|><|endoftext|>",
                        "Hello world",
                        "Hello, world! How's it going?",
                        "   leading",
                        "trailing   ",
                        "tab\there",
                        "new\nline",
                        "crlf\r\nline",
                        "\xEF\xBB\xBF"
                        "BOM",
                        "\xC0",
                        "\xFF\xFE",
                        "x\xE2\x82y"}) {
    out.push_back(s);
  }
  using Gen = std::string (*)(Rng&);
  const std::vector<std::pair<Gen, int>> plan = {
      {english, 700},  {code, 450},         {digits, 450},  {whitespace, 450},
      {emoji, 400},    {cjk, 400},          {accents, 450}, {rtl, 350},
      {specials, 500}, {invalid_utf8, 450}, {mixed, 500},   {long_string, 40}};
  for (const auto& [gen, count] : plan) {
    for (int i = 0; i < count; ++i) out.push_back(gen(rng));
  }
  return out;
}

std::string to_hex(const std::string& s) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  }
  return out;
}

// Printable ASCII as is, everything else as an escape, so a message shows the exact bytes.
std::string escaped(const std::string& s, std::size_t limit = 300) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < limit; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  if (s.size() > limit) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string ids_text(const std::vector<TokenId>& ids, std::size_t limit = 40) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size() && i < limit; ++i)
    out += (i ? " " : "") + std::to_string(ids[i]);
  if (ids.size() > limit) out += " ... (" + std::to_string(ids.size()) + " ids)";
  return out + "]";
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

int compare(const std::string& tokenizer_path, const std::string& corpus_path,
            const std::string& js_path, const std::string& label, bool nfc) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok = promptcache::load_bpe_tokenizer(tokenizer_path);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto corpus = read_lines(corpus_path);
  const auto js = read_lines(js_path);
  if (corpus.size() != js.size()) {
    std::cerr << label << ": the JS output has " << js.size() << " lines for " << corpus.size()
              << " corpus strings\n";
    return 1;
  }
  std::size_t same_ids = 0, same_text = 0, shown = 0;
  double encode_s = 0;
  for (std::size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = from_hex(corpus[i]);
    // encode.js line: ids (space separated) TAB hex of the text JS decoded TAB its NFC form.
    std::istringstream fields(js[i]);
    std::string ids_field, decoded_hex, nfc_hex;
    std::getline(fields, ids_field, '\t');
    std::getline(fields, decoded_hex, '\t');
    std::getline(fields, nfc_hex, '\t');
    std::vector<TokenId> expected;
    std::istringstream ids_in(ids_field);
    for (long long id; ids_in >> id;) expected.push_back(static_cast<TokenId>(id));

    const auto t = std::chrono::steady_clock::now();
    const std::vector<TokenId> got = tok->encode(text);
    encode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    const bool ids_ok = got == expected;
    same_ids += ids_ok;
    // The text the ids stand for: what TextDecoder made of the bytes, NFC-normalized where the
    // tokenizer normalizes (nfc); decode() must give exactly that back.
    const std::string want = from_hex(nfc ? nfc_hex : decoded_hex);
    const std::string back = tok->decode(got);
    const bool text_ok = back == want;
    same_text += text_ok;
    if ((!ids_ok || !text_ok) && shown < 12) {
      ++shown;
      std::cerr << label << ": MISMATCH #" << i << " text \"" << escaped(text) << "\"\n";
      if (!ids_ok) {
        std::size_t k = 0;
        while (k < got.size() && k < expected.size() && got[k] == expected[k]) ++k;
        std::cerr << "  C++ ids " << ids_text(got) << "\n  JS  ids " << ids_text(expected)
                  << "\n  first difference at id #" << k << ": C++ '"
                  << (k < got.size() ? escaped(tok->id_to_piece(got[k])) : "(end)") << "' vs JS '"
                  << (k < expected.size() ? escaped(tok->id_to_piece(expected[k])) : "(end)")
                  << "'\n";
      }
      if (!text_ok) {
        std::cerr << "  decode(encode(s)) \"" << escaped(back) << "\"\n  expected          \""
                  << escaped(want) << "\"\n";
      }
    }
  }
  std::cout << label << ": " << same_ids << "/" << corpus.size()
            << " strings encode to the same ids as the JS tokenizer; " << same_text << "/"
            << corpus.size() << " decode back to the text (load " << load_s << " s, encode "
            << encode_s << " s)\n";
  return same_ids == corpus.size() && same_text == corpus.size() ? 0 : 1;
}

void print_info(const std::string& tokenizer_path) {
  const auto tok = promptcache::load_bpe_tokenizer(tokenizer_path);
  auto name = [&](TokenId id) { return id < 0 ? std::string("none") : tok->id_to_piece(id); };
  std::cout << "kind " << tok->kind() << "\n"
            << "vocab_size " << tok->vocab_size() << "\n"
            << "bos " << tok->bos_id() << " " << name(tok->bos_id()) << "\n"
            << "eos " << tok->eos_id() << " " << name(tok->eos_id()) << "\n"
            << "pad " << tok->pad_id() << " " << name(tok->pad_id()) << "\n"
            << "unk " << tok->unk_id() << "\n"
            << "adds_bos " << (tok->adds_bos() ? "true" : "false") << "\n"
            << "prefixes_space " << (tok->prefixes_space() ? "true" : "false") << "\n"
            << "end_of_turn";
  for (TokenId id : tok->end_of_turn_ids()) std::cout << " " << name(id);
  std::cout << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "corpus" && argc == 3) {
      std::ofstream out(argv[2], std::ios::binary);
      const auto corpus = make_corpus();
      for (const auto& s : corpus) out << to_hex(s) << "\n";
      std::cout << "corpus: " << corpus.size() << " strings\n";
      return out ? 0 : 1;
    }
    if (mode == "train" && argc == 3) {
      // A tokenizer trained on the built-in corpus and the test corpus itself, so the JS side
      // reads a file written by train_bpe_tokenizer.
      std::string text = promptcache::builtin_corpus();
      for (const auto& s : make_corpus()) text += s + "\n";
      promptcache::train_bpe_tokenizer(text, 3000, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                                       argv[2]);
      std::cout << "trained " << argv[2] << " on " << text.size() << " bytes\n";
      return 0;
    }
    if (mode == "family" && argc == 4) {
      // A tokenizer.json with a family's own pipeline sections and special tokens (bloom,
      // gpt-neox, falcon), its vocabulary trained by train_bpe_tokenizer under that pipeline on
      // the same text as "train".
      const std::string name = argv[2];
      const promptcache::BpeFamily family = promptcache::bpe_family_from_name(name);
      std::vector<std::string> specials;
      if (family == promptcache::BpeFamily::kBloom) {
        specials = {"<unk>", "<s>", "</s>", "<pad>"};
      } else if (family == promptcache::BpeFamily::kGptNeox) {
        specials = {"<|endoftext|>", "<|padding|>"};
      } else if (family == promptcache::BpeFamily::kFalcon) {
        specials = {">>TITLE<<",   ">>ABSTRACT<<", ">>INTRODUCTION<<", ">>SUMMARY<<",
                    ">>COMMENT<<", ">>ANSWER<<",   ">>QUESTION<<",     ">>DOMAIN<<",
                    ">>PREFIX<<",  ">>SUFFIX<<",   ">>MIDDLE<<",       "<|endoftext|>"};
      }
      std::string text = promptcache::builtin_corpus();
      for (const auto& s : make_corpus()) text += s + "\n";
      promptcache::train_bpe_tokenizer(text, 3000, specials, argv[3], family);
      std::cout << "trained " << name << " tokenizer " << argv[3] << "\n";
      return 0;
    }
    if (mode == "encode" && argc == 4) {
      const auto tok = promptcache::load_tokenizer(argv[2]);
      const auto ids = tok->encode(argv[3]);
      for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
      std::cout << "\n";
      return 0;
    }
    if (mode == "info" && argc == 3) {
      print_info(argv[2]);
      return 0;
    }
    if (mode == "compare" && argc == 7 &&
        (std::string(argv[6]) == "nfc" || std::string(argv[6]) == "raw")) {
      return compare(argv[2], argv[3], argv[4], argv[5], std::string(argv[6]) == "nfc");
    }
    std::cerr
        << "usage: bpe_js_crosscheck corpus OUT | train OUT_JSON | family NAME OUT_JSON | info "
           "TOKENIZER_JSON | encode "
           "TOKENIZER TEXT | compare "
           "TOKENIZER_JSON CORPUS JS_OUT LABEL nfc|raw\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bpe_js_crosscheck: " << e.what() << "\n";
    return 1;
  }
}
