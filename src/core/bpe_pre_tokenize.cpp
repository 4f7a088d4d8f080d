// src/core/bpe_pre_tokenize.cpp — normalizers and pre-tokenizers: what happens to a section of
// text between the added tokens before the merge loop sees it.
//
// A section is normalized (NFC and the other forms, Replace, Prepend, Strip) as one string, then
// the pre-tokenizer steps cut it into pre-tokens, each step applied to every piece the previous
// one produced (Split on a regex or a string with one of HuggingFace's five delimiter
// behaviours, ByteLevel with GPT-2's split regex, Metaspace, Punctuation, Digits). The regexes run
// in JsRegex, which gives them the semantics the reference tokenizers give them (js_regex.hpp),
// never in the standard library's regex engine (it recurses per character).
#include <algorithm>

#include "bpe_pipeline.hpp"
#include "byte_level.hpp"

namespace promptcache::bpe {

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(text);
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit = text.find(from); hit != std::string_view::npos;
       hit = text.find(from, at)) {
    out.append(text, at, hit - at);
    out += to;
    at = hit + from.size();
  }
  out.append(text, at, std::string_view::npos);
  return out;
}

std::string regex_replace_all(const JsRegex& regex, std::string_view text, std::string_view to) {
  std::string out;
  std::size_t at = 0;
  regex.for_each_match(text, [&](std::size_t b, std::size_t e) {
    out.append(text, at, b - at);
    out += to;
    at = e;
  });
  out.append(text, at, std::string_view::npos);
  return out;
}

void split_with_behavior(std::string_view text, bool at_start,
                         const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                         SplitBehavior behavior, bool invert, const Emit& emit) {
  // Nothing to cut at (most pieces, for a Digits or Split step after another step): every
  // behavior gives the whole piece, as the general case below would.
  if (!invert && std::none_of(matches.begin(), matches.end(),
                              [](const std::pair<std::size_t, std::size_t>& m) {
                                return m.second > m.first;
                              })) {
    if (!text.empty()) emit(text, at_start);
    return;
  }
  auto emit_piece = [&](std::size_t b, std::size_t e) {
    if (e > b) emit(text.substr(b, e - b), at_start && b == 0);
  };
  // The segments in order: the text between matches (a match when inverted) and the matches.
  auto for_each_segment = [&](auto&& on_segment) {
    std::size_t prev = 0;
    for (const auto& [b, e] : matches) {
      if (e == b) continue;  // empty matches split nothing (as in transformers.js's regexSplit)
      if (b > prev) on_segment(prev, b, invert);
      on_segment(b, e, !invert);
      prev = e;
    }
    if (prev < text.size()) on_segment(prev, text.size(), invert);
  };
  // Isolated and Contiguous (ByteLevel, Split, Punctuation and Digits as the families use them)
  // emit as they go; the general case below gives the same pieces.
  if (behavior == SplitBehavior::kIsolated) {
    for_each_segment([&](std::size_t b, std::size_t e, bool) { emit_piece(b, e); });
    return;
  }
  if (behavior == SplitBehavior::kContiguous) {
    bool pending = false, pending_match = false;
    std::size_t pending_begin = 0, pending_end = 0;
    for_each_segment([&](std::size_t b, std::size_t e, bool is_match) {
      if (pending && is_match && pending_match) {
        pending_end = e;
      } else {
        if (pending) emit_piece(pending_begin, pending_end);
        pending = true;
        pending_begin = b;
        pending_end = e;
      }
      pending_match = is_match;
    });
    if (pending) emit_piece(pending_begin, pending_end);
    return;
  }

  struct Segment {
    std::size_t begin, end;
    bool is_match;
  };
  std::vector<Segment> segments;
  for_each_segment([&](std::size_t b, std::size_t e, bool is_match) {
    segments.push_back({b, e, is_match});
  });

  std::vector<std::pair<std::size_t, std::size_t>> pieces;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : segments)
        if (!s.is_match) pieces.push_back({s.begin, s.end});
      break;
    case SplitBehavior::kIsolated:
    case SplitBehavior::kContiguous:
      break;  // emitted above
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : segments) {
        if (s.is_match && !previous_match && !pieces.empty())
          pieces.back().second = s.end;
        else
          pieces.push_back({s.begin, s.end});
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = segments.rbegin(); it != segments.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty())
          pieces.back().first = it->begin;
        else
          pieces.push_back({it->begin, it->end});
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
  }
  for (const auto& [b, e] : pieces) emit_piece(b, e);
}

std::string normalize(const std::vector<Normalizer>& normalizers, std::string_view text) {
  std::string s(text);
  for (const auto& n : normalizers) {
    switch (n.kind) {
      case Normalizer::kUnicode:
        s = unicode::normalize(s, n.form);
        break;
      case Normalizer::kReplace:
        s = n.regex ? regex_replace_all(*n.regex, s, n.content)
                    : replace_all(s, n.pattern, n.content);
        break;
      case Normalizer::kPrepend:
        if (!s.empty()) s = n.content + s;
        break;
      case Normalizer::kStrip: {
        std::string_view v = s;
        if (n.strip_left) v = unicode::trim_js_start(v);
        if (n.strip_right) v = unicode::trim_js_end(v);
        s = std::string(v);
        break;
      }
    }
  }
  return s;
}

void pre_tokenize(const std::vector<PreTokenizer>& steps, std::size_t step, std::string_view piece,
                  bool at_start, const Emit& emit) {
  if (step == steps.size()) {
    if (!piece.empty()) emit(piece, at_start);
    return;
  }
  const PreTokenizer& p = steps[step];
  const auto to_next_step = [&](std::string_view sub, bool sub_at_start) {
    pre_tokenize(steps, step + 1, sub, sub_at_start, emit);
  };
  const Emit next = to_next_step;
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  switch (p.kind) {
    case PreTokenizer::kSplit: {
      if (p.regex) {
        p.regex->for_each_match(piece, [&](std::size_t b, std::size_t e) {
          matches.push_back({b, e});
        });
      } else {
        for (std::size_t at = piece.find(p.literal); at != std::string_view::npos;
             at = piece.find(p.literal, at + p.literal.size())) {
          matches.push_back({at, at + p.literal.size()});
        }
      }
      split_with_behavior(piece, at_start, matches, p.behavior, p.invert, next);
      return;
    }
    case PreTokenizer::kByteLevel: {
      std::string prefixed;
      std::string_view text = piece;
      if (p.add_prefix_space && (text.empty() || text[0] != ' ')) {
        prefixed = " " + std::string(text);
        text = prefixed;
      }
      // Steps after it (Falcon's Digits and Split) see the byte characters, as in HuggingFace
      // and transformers.js; the merge loop then reads the pre-tokens as vocabulary strings.
      // When it is last, pre-tokens stay raw bytes and the model maps them (same result).
      const bool last = step + 1 == steps.size();
      std::string chars;  // one buffer for every piece's byte characters
      const auto to_chars = [&](std::string_view sub, bool sub_at_start) {
        chars.clear();
        for (unsigned char b : sub) chars += byte_level::utf8()[b];
        next(chars, sub_at_start);
      };
      const Emit out = last ? next : Emit(to_chars);
      if (!p.regex) {
        out(text, at_start);
        return;
      }
      p.regex->for_each_match(text, [&](std::size_t b, std::size_t e) {
        matches.push_back({b, e});
      });
      split_with_behavior(text, at_start, matches, SplitBehavior::kIsolated, false, out);
      return;
    }
    case PreTokenizer::kPunctuation:
      p.regex->for_each_match(piece, [&](std::size_t b, std::size_t e) {
        matches.push_back({b, e});
      });
      split_with_behavior(piece, at_start, matches, p.behavior, false, next);
      return;
    case PreTokenizer::kDigits:
      // Its regex is JS's \d, ASCII digits, one character a match: the digit bytes themselves
      // (no byte of a longer UTF-8 sequence is below 0x80), found without running it.
      for (std::size_t i = 0; i < piece.size(); ++i) {
        if (piece[i] >= '0' && piece[i] <= '9') matches.push_back({i, i + 1});
      }
      split_with_behavior(piece, at_start, matches, p.behavior, false, next);
      return;
    case PreTokenizer::kMetaspace: {
      std::string m = replace_all(piece, " ", p.replacement);
      const bool starts = m.compare(0, p.replacement.size(), p.replacement) == 0;
      if (!starts && (p.prepend == PrependScheme::kAlways ||
                      (p.prepend == PrependScheme::kFirst && at_start))) {
        m = p.replacement + m;
      }
      if (!p.split) {
        next(m, at_start);
        return;
      }
      for (std::size_t at = m.find(p.replacement); at != std::string::npos;
           at = m.find(p.replacement, at + p.replacement.size())) {
        matches.push_back({at, at + p.replacement.size()});
      }
      split_with_behavior(m, at_start, matches, SplitBehavior::kMergedWithNext, false, next);
      return;
    }
  }
}

}  // namespace promptcache::bpe
