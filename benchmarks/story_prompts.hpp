// story_prompts.hpp — the fixed, seeded multi-module story prompts that bench_fidelity and the
// fidelity regression test (tests/fidelity) measure stories260K on (docs/fidelity.md): four
// schemas over one pool of paragraphs in the style of TinyStories, and prompts that each select
// a random subset of one schema that is not a prefix of it (so at least one module follows a gap
// or other modules than it was compiled after), then a continuation cue. The set was fixed
// (seed 7) before any recompute criterion was chosen from it.
#pragma once

#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace promptcache::bench {

// Story paragraphs in the style of the TinyStories data stories260K was trained on.
inline const std::vector<std::string> kParagraphs = {
    "Once upon a time, there was a little girl named Lily. She lived in a small house with her "
    "mom and dad.",
    "Lily had a big red ball. She loved to play with it in the park every day.",
    "One day, a little dog came to the park. The dog was brown and had a long tail.",
    "The dog saw the ball and wanted to play too. He ran to Lily and wagged his tail.",
    "Tom was Lily's best friend. He liked to run and jump and climb the big tree.",
    "It was a sunny day. The sky was blue and the birds were singing in the trees.",
    "Mom made a cake for the party. It was big and sweet and had pink flowers on top.",
    "The cat was sleeping on the bed. It was soft and warm and it liked to purr.",
    "Then it started to rain. Everyone ran home and sat by the warm fire.",
    "Ben had a toy car. It was blue and fast and he took it everywhere he went.",
    "The sun went down and the stars came out. Lily looked at the moon and smiled.",
    "At the beach, they built a big castle out of sand and found a pretty shell.",
};

inline const std::vector<std::string> kCues = {
    "One day,",      "Then,",   "The next day, Lily",     "After that, they", "Suddenly,",
    "Lily said,",    "The dog", "At the end of the day,", "Mom said,",        "They were happy",
    "Tom wanted to", "So they",
};

// Schemas: (name, paragraph indices in order).
inline const std::vector<std::pair<std::string, std::vector<int>>> kSchemas = {
    {"park", {0, 1, 2, 3, 5}},
    {"friends", {4, 9, 1, 6, 0, 10, 8}},
    {"home", {7, 6, 0, 8, 10, 3}},
    {"day", {5, 11, 2, 4, 9, 7, 1, 8}},
};

inline std::string schema_xml(const std::string& name, const std::vector<int>& paragraphs) {
  std::ostringstream xml;
  xml << "<schema name=\"" << name << "\">";
  for (std::size_t i = 0; i < paragraphs.size(); ++i) {
    xml << "<module name=\"p" << i << "\">" << kParagraphs[paragraphs[i]] << "</module>";
  }
  xml << "</schema>";
  return xml.str();
}

// `count` prompts, each a random non-prefix subset of one schema's modules, then a cue.
inline std::vector<std::string> make_prompts(int count, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  while (static_cast<int>(out.size()) < count) {
    const auto& [name, paragraphs] = kSchemas[rng() % kSchemas.size()];
    const int modules = static_cast<int>(paragraphs.size());
    std::vector<bool> chosen(modules, false);
    int picked = 0;
    for (int i = 0; i < modules; ++i) {
      chosen[i] = rng() % 2 == 0;
      picked += chosen[i] ? 1 : 0;
    }
    bool prefix = true;  // chosen = {0, ..., picked - 1}
    for (int i = 0; i < modules; ++i) prefix = prefix && chosen[i] == (i < picked);
    if (picked < 2 || prefix) continue;
    std::ostringstream xml;
    xml << "<prompt schema=\"" << name << "\">";
    for (int i = 0; i < modules; ++i) {
      if (chosen[i]) xml << "<p" << i << "/>";
    }
    xml << " " << kCues[rng() % kCues.size()] << "</prompt>";
    out.push_back(xml.str());
  }
  return out;
}

}  // namespace promptcache::bench
