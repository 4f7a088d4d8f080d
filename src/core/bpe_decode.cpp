// src/core/bpe_decode.cpp — the decoder chain of a tokenizer.json: tokens back to text.
//
// Each decoder rewrites the list of token strings in turn, as transformers.js's decoders do:
// ByteLevel turns GPT-2's byte characters back into bytes, Metaspace turns its replacement
// character back into spaces, ByteFallback turns <0xXX> tokens into bytes, Fuse joins, Strip and
// Replace edit. Added tokens keep their text. decode_piece runs the same chain over one token in
// the middle of a text, where bytes stay raw (a character may span tokens) and nothing is
// stripped.
#include <cctype>

#include "bpe_pipeline.hpp"
#include "byte_level.hpp"

namespace promptcache::bpe {

void run_decoders(const std::vector<Decoder>& decoders, std::vector<std::string>& tokens,
                  std::vector<char>& added, bool mid_text) {
  for (const Decoder& d : decoders) {
    switch (d.kind) {
      case Decoder::kByteLevel: {
        // Added tokens are their text; other tokens' characters are bytes (transformers.js).
        std::string out, bytes;
        auto flush = [&] {
          out += mid_text ? bytes : unicode::to_valid_utf8(bytes);
          bytes.clear();
        };
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          if (added[i]) {
            flush();
            out += tokens[i];
            continue;
          }
          const std::string& t = tokens[i];
          for (std::size_t k = 0; k < t.size();) {
            const std::size_t begin = k;
            const int b = byte_level::byte_of(unicode::next_code_point(t, k));
            if (b >= 0)
              bytes += static_cast<char>(b);
            else
              bytes.append(t, begin, k - begin);
          }
        }
        flush();
        tokens.assign(1, out);
        added.assign(1, 0);
        break;
      }
      case Decoder::kMetaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          if (added[i]) continue;
          tokens[i] = replace_all(tokens[i], d.pattern, " ");
          if (!mid_text && i == 0 && d.strip_first && !tokens[i].empty() && tokens[i][0] == ' ') {
            tokens[i].erase(0, 1);
          }
        }
        break;
      case Decoder::kByteFallback: {
        std::vector<std::string> out;
        std::vector<char> out_added;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          out.push_back(mid_text ? bytes : unicode::to_valid_utf8(bytes));
          out_added.push_back(0);
          bytes.clear();
        };
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          const std::string& t = tokens[i];
          if (!added[i] && t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
              std::isxdigit(static_cast<unsigned char>(t[3])) &&
              std::isxdigit(static_cast<unsigned char>(t[4]))) {
            bytes += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
            continue;
          }
          flush();
          out.push_back(t);
          out_added.push_back(added[i]);
        }
        flush();
        tokens = std::move(out);
        added = std::move(out_added);
        break;
      }
      case Decoder::kFuse: {
        std::string joined;
        for (const auto& t : tokens) joined += t;
        tokens.assign(1, joined);
        added.assign(1, 0);
        break;
      }
      case Decoder::kStrip:
        if (mid_text) break;  // it trims the text's ends, which one token in the middle is not
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          std::string& t = tokens[i];
          const std::string& c = d.content;
          for (int k = 0; k < d.start && !c.empty() && t.compare(0, c.size(), c) == 0; ++k) {
            t.erase(0, c.size());
          }
          for (int k = 0; k < d.stop && !c.empty() && t.size() >= c.size() &&
                          t.compare(t.size() - c.size(), c.size(), c) == 0;
               ++k) {
            t.erase(t.size() - c.size());
          }
        }
        break;
      case Decoder::kReplace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          tokens[i] = d.regex ? regex_replace_all(*d.regex, tokens[i], d.content)
                              : replace_all(tokens[i], d.pattern, d.content);
        }
        break;
    }
  }
}

}  // namespace promptcache::bpe
