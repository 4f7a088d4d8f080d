// bench_ttft — cached vs uncached time-to-first-token on a synthetic bench-small model.
//
// For each schema size (tokens reserved by a document-QA style schema of 128-token modules) and
// fresh-question size, prints one JSON line with the uncached TTFT (the same tokens as one
// ordinary prefill), the cached TTFT (assemble stored states + run the fresh tokens), the
// assembly time and its bandwidth next to a plain memcpy of the same bytes measured in the run.
//
//   build/benchmarks/bench_ttft [--schema 512,1024,2048,4096] [--fresh 16,64] [--repeats 3]
//                               [--threads N] [--shape bench-small] [--device cpu|cuda]
//                               [--dtype f32|f16|bf16]
#include <torch/types.h>

#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "promptcache/builtin_data.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

namespace {

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

std::vector<std::string> corpus_words() {
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
std::string text_of_tokens(const Tokenizer& tok, const std::vector<std::string>& words,
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

double best_of(int repeats, const std::function<double()>& f) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) best = std::min(best, f());
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> schema_sizes = {512, 1024, 2048, 4096};
  std::vector<int> fresh_sizes = {16, 64};
  int repeats = 3, threads = 0;
  std::string shape = "bench-small", device = "cpu", dtype = "f32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--schema")
      schema_sizes = parse_list(value);
    else if (flag == "--fresh")
      fresh_sizes = parse_list(value);
    else if (flag == "--repeats")
      repeats = std::stoi(value);
    else if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--shape")
      shape = value;
    else {
      std::cerr << "bench_ttft: unknown flag " << flag << "\n";
      return 2;
    }
  }
  const auto applied = configure_threads(threads);
  const ModelConfig config = synthetic_config(shape);
  std::cerr << "bench_ttft: making " << shape << " model and tokenizer...\n";
  const std::string tok_path = "/tmp/promptcache-bench-tokenizer.model";
  train_sentencepiece_tokenizer(builtin_corpus(), 400, tok_path);
  EngineOptions options;
  options.chat_template = "plain";
  options.load.device = parse_device(device);
  options.load.dtype = parse_dtype(dtype);
  Engine engine(
      LlamaModel::from_tensors(config, random_llama_weights(config, 1, 0.02), options.load),
      load_sentencepiece_tokenizer(tok_path), options);
  const auto words = corpus_words();
  const int module_tokens = 128;

  for (int schema_tokens : schema_sizes) {
    // BOS + modules of 128 tokens; the last one is shortened so the total is exact.
    std::ostringstream xml;
    xml << "<schema name=\"docs" << schema_tokens << "\">";
    std::size_t from = 0;
    int remaining = schema_tokens - 1, modules = 0;
    std::ostringstream prompt_refs;
    while (remaining > 0) {
      const int n = std::min(module_tokens, remaining);
      xml << "<module name=\"d" << modules << "\">"
          << text_of_tokens(engine.tokenizer(), words, from, n) << "</module>";
      prompt_refs << "<d" << modules << "/>";
      remaining -= n;
      ++modules;
    }
    xml << "</schema>";
    const double compile_start = now_ms();
    const auto& layout = engine.add_schema_string(xml.str());
    const double compile_ms = now_ms() - compile_start;
    for (int fresh : fresh_sizes) {
      std::size_t qfrom = 7;
      const std::string prompt =
          "<prompt schema=\"docs" + std::to_string(schema_tokens) + "\">" + prompt_refs.str() +
          text_of_tokens(engine.tokenizer(), words, qfrom, fresh) + "</prompt>";
      SamplingParams one;
      one.max_new_tokens = 1;
      Response cached, uncached;
      const double uncached_ms = best_of(repeats, [&] {
        uncached = engine.generate_xml(prompt, one, {}, RequestOptions{false});
        return uncached.timings.ttft_ms;
      });
      double assembly_ms = 1e300;
      const double cached_ms = best_of(repeats + 2, [&] {
        cached = engine.generate_xml(prompt, one);
        assembly_ms = std::min(assembly_ms, cached.timings.assembly_ms);
        return cached.timings.ttft_ms;
      });
      // A plain memcpy of the same number of bytes, same run.
      const std::size_t bytes = static_cast<std::size_t>(cached.kv_bytes);
      std::vector<char> src(bytes, 1), dst(bytes, 0);
      const double memcpy_ms = best_of(repeats + 2, [&] {
        const double t = now_ms();
        std::memcpy(dst.data(), src.data(), bytes);
        return now_ms() - t;
      });
      nlohmann::json j = {{"bench", "ttft"},
                          {"shape", shape},
                          {"schema_tokens", layout.total_length},
                          {"fresh_tokens", cached.fresh_tokens},
                          {"cached_tokens", cached.cached_tokens},
                          {"uncached_ttft_ms", uncached_ms},
                          {"cached_ttft_ms", cached_ms},
                          {"assembly_ms", assembly_ms},
                          {"speedup", uncached_ms / cached_ms},
                          {"kv_bytes", cached.kv_bytes},
                          {"assembly_gbps", bytes / (assembly_ms * 1e6)},
                          {"memcpy_gbps", bytes / (memcpy_ms * 1e6)},
                          {"assembly_to_memcpy", memcpy_ms / assembly_ms},
                          {"compile_ms", compile_ms},
                          {"same_first_token", cached.tokens == uncached.tokens},
                          {"device", device},
                          {"dtype", dtype},
                          {"threads", applied.blas_threads},
                          {"torch_threads", applied.torch_threads}};
      std::cout << j.dump() << std::endl;
    }
  }
  return 0;
}
