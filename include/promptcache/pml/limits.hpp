// promptcache/pml/limits.hpp — the size limits that keep absurd input from costing minutes or
// exhausting memory: every input too large for any model is refused before it is tokenized or
// allocated for (docs/reliability.md, "Resource limits"). Header-only, no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

namespace promptcache::pml {

// The most positions one <parameter> may reserve. Above every model context we load (Qwen2.5-1M:
// 1,010,000), and small enough that the slot's placeholder ids (4 bytes each) stay under 4 MiB
// even before the layout compares the schema with the model's context.
inline constexpr std::size_t kMaxParameterLength = std::size_t{1} << 20;

// The largest schema, prompt or src file (and XML string) the parsers take: refused by its size,
// before it is read. Far above any real schema, far below what would exhaust memory (the parser
// holds the text, a repaired copy and pugixml's tree at once).
inline constexpr std::uint64_t kMaxSourceFileBytes = std::uint64_t{256} << 20;

// The most bytes of text one token stands for, counting each run of whitespace as one byte
// (SentencePiece folds whitespace runs, and some vocabularies hold long runs of spaces as one
// piece). The longest non-whitespace pieces of the vocabularies we load (Llama 2/3, Mistral,
// Qwen) are far shorter; no real text comes near an average of 256 bytes a token. So a text
// heavier than 256 bytes times n cannot be n tokens or fewer, and is refused without being
// tokenized: tokenizing 100 MB to find that out would take minutes and gigabytes.
inline constexpr std::size_t kMaxBytesPerToken = 256;

// The text's weight for that bound: its bytes, with each whitespace run counted as one byte.
// Stops counting once the weight passes `stop_above` (a 1 GB text is not read to the end).
inline std::size_t text_weight(std::string_view text,
                               std::size_t stop_above = std::numeric_limits<std::size_t>::max()) {
  std::size_t weight = 0;
  bool in_space = false;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r';
    if (!(space && in_space)) ++weight;
    in_space = space;
    if (weight > stop_above) break;
  }
  return weight;
}

// True when `text` certainly encodes to more than `positions` tokens with any tokenizer we load
// (the rule at kMaxBytesPerToken). Costs nothing for short texts; false says nothing.
inline bool cannot_fit(std::string_view text, std::size_t positions) {
  const std::size_t limit = positions > std::numeric_limits<std::size_t>::max() / kMaxBytesPerToken
                                ? std::numeric_limits<std::size_t>::max()
                                : positions * kMaxBytesPerToken;
  return text.size() > limit && text_weight(text, limit) > limit;
}

}  // namespace promptcache::pml
