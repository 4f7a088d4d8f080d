// benchmarks/bench_common.hpp — flag parsing and text helpers shared by the benchmarks.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "promptcache/builtin_data.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::bench {

// "--name value" flags; an unknown flag or one without a value exits with status 2 and says so,
// --help (or -h) lists the flags and exits with 0. Each benchmark's header comment says what
// they mean.
class Flags {
 public:
  Flags(int argc, char** argv, const std::string& program, const std::vector<std::string>& known) {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag == "--help" || flag == "-h") {
        std::cout << "usage: " << program;
        for (const auto& k : known) std::cout << " [--" << k << " VALUE]";
        std::cout << "\n(see the comment at the top of benchmarks/" << program << ".cpp)\n";
        std::exit(0);
      }
    }
    for (int i = 1; i < argc; i += 2) {
      const std::string flag = argv[i];
      bool ok = false;
      for (const auto& k : known) ok = ok || flag == "--" + k;
      if (!ok || i + 1 >= argc) {
        std::cerr << program << ": " << (ok ? "missing value for " : "unknown flag ") << flag
                  << " (flags:";
        for (const auto& k : known) std::cerr << " --" << k;
        std::cerr << ")\n";
        std::exit(2);
      }
      values_[flag.substr(2)] = argv[i + 1];
    }
  }
  std::string text(const std::string& name, const std::string& fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  int integer(const std::string& name, int fallback) const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : std::stoi(it->second);
  }
  // A comma-separated list of integers: "512,1024".
  std::vector<int> list(const std::string& name, std::vector<int> fallback) const {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::vector<int> out;
    for (const auto& item : split_commas(it->second)) out.push_back(std::stoi(item));
    return out;
  }
  // A comma-separated list of words: "avx512,off".
  std::vector<std::string> words(const std::string& name, const std::string& fallback) const {
    return split_commas(text(name, fallback));
  }

 private:
  static std::vector<std::string> split_commas(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) out.push_back(item);
    return out;
  }
  std::map<std::string, std::string> values_;
};

// Best (smallest) and median of a benchmark's timed repeats (at least one).
inline double best_time(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}
inline double median_time(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The words of the built-in corpus without characters that are special in XML.
inline std::vector<std::string> corpus_words() {
  std::vector<std::string> words;
  std::istringstream in(builtin_corpus());
  std::string w;
  while (in >> w) {
    std::string clean;
    for (char c : w) {
      if (c != '<' && c != '>' && c != '&' && c != '"') clean += c;
    }
    if (!clean.empty()) words.push_back(clean);
  }
  return words;
}

// Text of exactly `tokens` tokens (as one span) built from the corpus, starting at word `from`.
inline std::string text_of_tokens(const Tokenizer& tok, const std::vector<std::string>& words,
                                  std::size_t& from, int tokens) {
  std::string text;
  while (true) {
    const std::string next = text + (text.empty() ? "" : " ") + words[from % words.size()];
    if (static_cast<int>(tok.encode(next).size()) > tokens) break;
    text = next;
    ++from;
  }
  // Pad with single-token words until the count is exact.
  while (static_cast<int>(tok.encode(text).size()) < tokens) text += " a";
  return text;
}

// A tokenizer trained on the built-in corpus (as make-model does), written to a temporary file.
inline std::unique_ptr<Tokenizer> bench_tokenizer() {
  const std::string path = "/tmp/promptcache-bench-tokenizer.model";
  train_sentencepiece_tokenizer(builtin_corpus(), 400, path);
  return load_sentencepiece_tokenizer(path);
}

}  // namespace promptcache::bench
