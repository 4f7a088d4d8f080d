// bench_compile — module compilation with short passes batched into shared forwards vs one
// forward per pass, on a synthetic bench-small model.
//
// The schema: a preamble, then a union of M members of about T tokens each (M - 1 member passes
// besides the scaffold pass), then a closing module. Prints one JSON line per (M, T) with both
// compile times, their ratio, the forward calls each made, and whether the stored states agree.
//
//   build/benchmarks/bench_compile [--members 4,16] [--member-tokens 16,64] [--repeats 3]
//                                  [--threads N] [--shape bench-small]
#include <torch/types.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_common.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/pml/layout.hpp"

using namespace promptcache;

namespace {

// About `tokens` tokens of corpus words, from word `from` on.
std::string words_of(const Tokenizer& tok, const std::vector<std::string>& words, std::size_t& from,
                     int tokens) {
  std::string text;
  while (static_cast<int>(tok.encode(text).size()) < tokens) {
    text += (text.empty() ? "" : " ") + words[from++ % words.size()];
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_compile",
                           {"members", "member-tokens", "repeats", "threads", "shape"});
  const auto member_counts = flags.list("members", {4, 16});
  const auto member_tokens = flags.list("member-tokens", {16, 64});
  const int repeats = flags.integer("repeats", 3), threads = flags.integer("threads", 0);
  const std::string shape = flags.text("shape", "bench-small");
  const auto applied = configure_threads(threads);
  const ModelConfig config = synthetic_config(shape);
  std::cerr << "bench_compile: making " << shape << " model and tokenizer...\n";
  const auto tokenizer = bench::bench_tokenizer();
  const auto model = LlamaModel::from_tensors(config, random_llama_weights(config, 1, 0.02));
  const auto words = bench::corpus_words();

  for (int members : member_counts) {
    for (int tokens : member_tokens) {
      std::size_t from = 0;
      std::ostringstream xml;
      xml << "<schema name=\"u" << members << "x" << tokens << "\"><module name=\"intro\">"
          << words_of(*tokenizer, words, from, 128) << "</module><union>";
      for (int m = 0; m < members; ++m) {
        xml << "<module name=\"m" << m << "\">" << words_of(*tokenizer, words, from, tokens)
            << "</module>";
      }
      xml << "</union><module name=\"outro\">" << words_of(*tokenizer, words, from, 32)
          << "</module></schema>";
      const pml::Layout layout =
          pml::layout(pml::parse_schema_string(xml.str()), *tokenizer, pml::chat_template("plain"));
      CacheStore batched_store, single_store;
      CompileReport batched, single;
      double batched_ms = 1e300, single_ms = 1e300;
      for (int r = 0; r < repeats; ++r) {
        CompileOptions options;
        batched = ModuleCompiler(*model).compile(layout, batched_store, options);
        batched_ms = std::min(batched_ms, batched.ms);
        options.batch_passes = false;
        single = ModuleCompiler(*model).compile(layout, single_store, options);
        single_ms = std::min(single_ms, single.ms);
      }
      double max_diff = 0;
      for (std::size_t s = 0; s < layout.spans.size(); ++s) {
        const SpanStates* a = batched_store.find(layout.schema_name, s);
        const SpanStates* b = single_store.find(layout.schema_name, s);
        if (a == nullptr || b == nullptr) continue;
        max_diff = std::max(max_diff, (a->kv - b->kv).abs().max().item<double>());
      }
      nlohmann::json j = {{"bench", "compile"},
                          {"shape", shape},
                          {"members", members},
                          {"member_tokens", tokens},
                          {"schema_tokens", layout.total_length},
                          {"passes", batched.passes},
                          {"tokens_run", batched.tokens_run},
                          {"batched_ms", batched_ms},
                          {"unbatched_ms", single_ms},
                          {"speedup", single_ms / batched_ms},
                          {"batched_forwards", batched.forwards},
                          {"unbatched_forwards", single.forwards},
                          {"max_state_diff", max_diff},
                          {"threads", applied.blas_threads},
                          {"torch_threads", applied.torch_threads}};
      std::cout << j.dump() << std::endl;
    }
  }
  return 0;
}
