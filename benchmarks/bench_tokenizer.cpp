// bench_tokenizer — encoding throughput of the byte-level BPE reader (tokenizer.json) and of the
// SentencePiece reader (tokenizer.model), on the same ~1 MB of text.
//
// Two texts, each cut into prompt-sized chunks of about 4 KB that are encoded one call each:
// "corpus", the built-in corpus repeated with variations (numbered lines, shuffled line order,
// words swapped between lines) — few distinct words, so BPE mostly hits its pre-token cache; and
// "varied", made-up words with numbers and punctuation — mostly cache misses, so it measures the
// merges themselves. The BPE tokenizer is --tokenizer FILE (e.g. Qwen3's tokenizer.json) or,
// without it, one trained on the same corpus with train_bpe_tokenizer; the SentencePiece one is
// trained as bench_common.hpp's bench_tokenizer() does (spm_train, 400 pieces). Each is timed
// --repeats times over all chunks: "first" is the first pass (the BPE pre-token cache starts
// empty), "best" the fastest. Prints one JSON line per text.
//
//   build/benchmarks/bench_tokenizer [--tokenizer tokenizer.json] [--megabytes 1] [--repeats 3]
//                                    [--vocab 2000]
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_common.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/model/tokenizer.hpp"

using namespace promptcache;

namespace {

// About `bytes` of corpus-like text in chunks of about 4 KB.
std::vector<std::string> make_chunks(std::size_t bytes) {
  std::vector<std::string> lines;
  std::istringstream in(builtin_corpus());
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  uint64_t state = 42;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33);
  };
  std::vector<std::string> chunks(1);
  std::size_t total = 0;
  for (std::size_t n = 0; total < bytes; ++n) {
    std::string line = lines[next() % lines.size()];
    // Swap one word for a word of another line, and sometimes number the line.
    const std::string& other = lines[next() % lines.size()];
    const std::size_t a = line.find(' ', next() % line.size());
    const std::size_t b = other.find(' ', next() % other.size());
    if (a != std::string::npos && b != std::string::npos) {
      const std::size_t a_end = line.find(' ', a + 1), b_end = other.find(' ', b + 1);
      line = line.substr(0, a) +
             other.substr(b, b_end == std::string::npos ? std::string::npos : b_end - b) +
             (a_end == std::string::npos ? "" : line.substr(a_end));
    }
    if (n % 5 == 0) line = std::to_string(n) + ". " + line;
    line += "\n";
    if (chunks.back().size() + line.size() > 4096) chunks.emplace_back();
    chunks.back() += line;
    total += line.size();
  }
  return chunks;
}

// About `bytes` of text with few repeated words: made-up words of 1-4 syllables, some capitalized
// or followed by numbers and punctuation, so most pre-tokens miss the BPE cache.
std::vector<std::string> make_varied_chunks(std::size_t bytes) {
  static const char* syllables[] = {"ka",  "lo", "mi",   "ren",  "tu",  "sha", "vel", "or", "qui",
                                    "ban", "de", "ix",   "zo",   "pra", "e",   "ny",  "ul", "ge",
                                    "str", "ph", "ough", "tion", "al",  "by",  "wex"};
  const std::size_t n_syllables = sizeof(syllables) / sizeof(syllables[0]);
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<std::size_t>(state >> 33);
  };
  std::vector<std::string> chunks(1);
  std::size_t total = 0;
  while (total < bytes) {
    std::string word;
    for (std::size_t k = 1 + next() % 4; k > 0; --k) word += syllables[next() % n_syllables];
    if (next() % 6 == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    if (next() % 9 == 0) word += " " + std::to_string(next() % 100000);
    word += next() % 10 == 0 ? ".\n" : next() % 7 == 0 ? ", " : " ";
    if (chunks.back().size() + word.size() > 4096) chunks.emplace_back();
    chunks.back() += word;
    total += word.size();
  }
  return chunks;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

nlohmann::json run(const Tokenizer& tok, const std::vector<std::string>& chunks, int repeats,
                   std::size_t bytes) {
  std::size_t tokens = 0;
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    std::size_t count = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const auto& c : chunks) count += tok.encode(c).size();
    times.push_back(seconds_since(start));
    tokens = count;
  }
  const double best = bench::best_time(times);
  return {{"kind", tok.kind()},
          {"vocab_size", tok.vocab_size()},
          {"tokens", tokens},
          {"bytes_per_token", static_cast<double>(bytes) / tokens},
          {"first_s", times.front()},
          {"best_s", best},
          {"median_s", bench::median_time(times)},
          {"tokens_per_s", tokens / best},
          {"first_tokens_per_s", tokens / times.front()},
          {"mb_per_s", bytes / best / 1e6}};
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_tokenizer",
                           {"tokenizer", "megabytes", "repeats", "vocab"});
  const std::string path = flags.text("tokenizer", "");
  const int repeats = std::max(1, flags.integer("repeats", 3));
  const auto bytes_wanted = static_cast<std::size_t>(std::stod(flags.text("megabytes", "1")) * 1e6);
  const std::vector<std::pair<std::string, std::vector<std::string>>> texts = {
      {"corpus", make_chunks(bytes_wanted)}, {"varied", make_varied_chunks(bytes_wanted)}};

  std::string source = path;
  if (path.empty()) {
    const auto start = std::chrono::steady_clock::now();
    source = "/tmp/promptcache-bench-tokenizer.json";
    std::string text;
    for (const auto& c : texts[0].second) text += c;
    train_bpe_tokenizer(text, flags.integer("vocab", 2000), {"<|endoftext|>"}, source);
    std::cerr << "bench_tokenizer: trained " << source << " in " << seconds_since(start) << " s\n";
  }
  const auto sentencepiece = bench::bench_tokenizer();

  for (const auto& [name, chunks] : texts) {
    std::size_t bytes = 0;
    for (const auto& c : chunks) bytes += c.size();
    // A fresh BPE tokenizer per text, so its first pass starts with an empty pre-token cache.
    const auto start = std::chrono::steady_clock::now();
    const auto bpe = load_tokenizer(source);
    const double load_s = seconds_since(start);
    nlohmann::json out = {{"bench", "tokenizer"},
                          {"text", name},
                          {"text_bytes", bytes},
                          {"chunks", chunks.size()},
                          {"repeats", repeats}};
    out["bpe"] = run(*bpe, chunks, repeats, bytes);
    out["bpe"]["source"] = path.empty() ? "train_bpe_tokenizer" : path;
    out["bpe"]["load_s"] = load_s;
    out["sentencepiece"] = run(*sentencepiece, chunks, repeats, bytes);
    out["sentencepiece"]["source"] = "spm_train, 400 pieces";
    out["bpe_to_sentencepiece_tokens_per_s"] = out["bpe"]["tokens_per_s"].get<double>() /
                                               out["sentencepiece"]["tokens_per_s"].get<double>();
    out["bpe_to_sentencepiece_bytes_per_s"] =
        out["bpe"]["mb_per_s"].get<double>() / out["sentencepiece"]["mb_per_s"].get<double>();
    std::cout << out.dump() << std::endl;
  }
  return 0;
}
