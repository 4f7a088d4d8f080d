// Random PML schemas with unions, gaps, parameters, nesting and cache="false" spans, and random
// prompts selecting from them (the contract and batch tests).
#pragma once

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace promptcache::test {

inline const std::vector<std::string> kWords = {
    "Lily", "park", "ball", "sun",  "tree", "happy", "friend", "big",    "red",   "little",
    "the",  "a",    "day",  "cat",  "dog",  "river", "book",   "answer", "clear", "short",
    "city", "rain", "warm", "road", "map",  "train", "bread",  "garden", "moon",  "story"};

struct Node {
  enum Kind { kText, kModule, kUnion, kParameter } kind;
  std::string name, text;
  bool cache = true;
  int length = 0;
  std::string scaffold;  // union: member name or ""
  std::vector<Node> children;
};

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  std::string words(int lo, int hi) {
    std::string s;
    const int n = lo + static_cast<int>(rng_() % (hi - lo + 1));
    for (int i = 0; i < n; ++i) s += (i ? " " : "") + kWords[rng_() % kWords.size()];
    return s;
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  Node module(int depth, bool root) {
    Node m{Node::kModule, root ? "s" : "m" + std::to_string(next_++)};
    m.cache = root || !chance(0.15);
    const int items = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < items; ++i) {
      const auto r = rng_() % 10;
      if (r < 4 || depth >= 3) {
        m.children.push_back({Node::kText, "", words(1, 6)});
      } else if (r < 6) {
        m.children.push_back(module(depth + 1, false));
      } else if (r < 8) {
        Node u{Node::kUnion};
        const int members = 2 + static_cast<int>(rng_() % 2);
        for (int k = 0; k < members; ++k) u.children.push_back(module(depth + 1, false));
        if (chance(0.7)) u.scaffold = u.children[rng_() % members].name;
        m.children.push_back(u);
      } else if (!root) {
        Node p{Node::kParameter, "p" + std::to_string(next_++)};
        p.length = 2 + static_cast<int>(rng_() % 5);
        p.scaffold = chance(0.5) ? words(1, 1) : "";
        m.children.push_back(p);
      } else {
        m.children.push_back({Node::kText, "", words(2, 5)});
      }
    }
    return m;
  }

  static void schema_xml(const Node& n, std::ostringstream& out) {
    switch (n.kind) {
      case Node::kText:
        out << n.text << " ";
        break;
      case Node::kParameter:
        out << "<parameter name=\"" << n.name << "\" length=\"" << n.length << "\"";
        if (!n.scaffold.empty()) out << " scaffold=\"" << n.scaffold << "\"";
        out << "/>";
        break;
      case Node::kUnion:
        out << "<union" << (n.scaffold.empty() ? "" : " scaffold=\"" + n.scaffold + "\"") << ">";
        for (const auto& c : n.children) schema_xml(c, out);
        out << "</union>";
        break;
      case Node::kModule:
        out << "<module name=\"" << n.name << "\"" << (n.cache ? "" : " cache=\"false\"") << ">";
        for (const auto& c : n.children) schema_xml(c, out);
        out << "</module>";
        break;
    }
  }

  // Module references for the modules nested in `m` (through unions too).
  void refs(const Node& m, std::ostringstream& out) {
    for (const auto& c : m.children) {
      if (c.kind == Node::kModule && chance(0.6)) ref(c, out);
      if (c.kind == Node::kUnion && chance(0.75)) ref(c.children[rng_() % c.children.size()], out);
    }
  }
  void ref(const Node& m, std::ostringstream& out) {
    out << "<" << m.name;
    for (const auto& c : m.children) {
      if (c.kind == Node::kParameter && chance(0.7)) {
        out << " " << c.name << "=\"" << words(1, 1) << "\"";
      }
    }
    out << ">";
    refs(m, out);
    out << "</" << m.name << ">";
  }

 private:
  std::mt19937_64 rng_;
  int next_ = 0;
};

struct Case {
  std::string schema;
  std::string prompt;                // the first prompt
  std::vector<std::string> prompts;  // every prompt, the first included
};

// A random schema named `name` and `prompts` random prompts for it (each its own selection).
inline Case make_case(std::uint64_t seed, const std::string& name = "s", int prompts = 1) {
  Generator g(seed);
  const Node root = g.module(0, true);
  std::ostringstream schema;
  schema << "<schema name=\"" << name << "\">";
  for (const auto& c : root.children) Generator::schema_xml(c, schema);
  schema << "</schema>";
  Case out{schema.str(), "", {}};
  for (int i = 0; i < prompts; ++i) {
    std::ostringstream prompt;
    prompt << "<prompt schema=\"" << name << "\">";
    g.refs(root, prompt);
    prompt << g.words(1, 5) << "</prompt>";
    out.prompts.push_back(prompt.str());
  }
  out.prompt = out.prompts.at(0);
  return out;
}

}  // namespace promptcache::test
