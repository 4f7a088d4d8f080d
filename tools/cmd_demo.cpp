// promptcache demo: the README's main job. Compiles a small document-QA schema once, answers one
// prompt with and without the prompt cache, and prints both TTFTs.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>

#include "docqa.hpp"
#include "engine_setup.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/model/synthetic.hpp"

namespace promptcache::cli {

namespace {
// The built-in corpus, dealt line by line into `n` documents, up to `budget` tokens in all (the
// schema must fit the model's context).
std::string demo_schema(int documents, int64_t budget, const Tokenizer& tokenizer) {
  std::istringstream in(builtin_corpus());
  std::vector<std::string> docs(documents);
  int64_t used = 0;
  int d = 0;
  for (std::string l; std::getline(in, l);) {
    if (l.empty()) continue;
    used += static_cast<int64_t>(tokenizer.encode(l).size()) + 1;
    if (used > budget) break;
    docs[d] += docqa::xml_escape(l) + " ";
    d = (d + 1) % documents;
  }
  std::string xml =
      "<schema name=\"demo\">\n  <system>You are a helpful assistant. Answer using the "
      "documents.</system>\n";
  for (int i = 0; i < documents; ++i) {
    xml += "  <module name=\"doc" + std::to_string(i) + "\">" + docs[i] + "</module>\n";
  }
  return xml + "</schema>\n";
}
// Document tokens that leave room for the system prompt, the question and the answer.
int64_t demo_budget(const Engine& engine, int new_tokens) {
  const int64_t context = engine.model().config().max_position_embeddings;
  return std::min<int64_t>(4096, context - 160 - new_tokens);
}
}  // namespace

Command register_demo(CLI::App& root) {
  struct Options {
    ModelOptions model;
    std::string shape = "tiny";
    int tokens = 24;
    int repeats = 3;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "demo",
      "Compile a document schema once, answer a prompt with and without the cache, compare TTFT.\n"
      "Without --model a synthetic model is made first (--shape tiny|bench-small).\n"
      "Example: promptcache demo --shape bench-small");
  add_model_options(*app, o->model);
  app->add_option("--shape", o->shape, "synthetic model shape when no --model is given")
      ->capture_default_str()
      ->check(CLI::IsMember(synthetic_shapes()));
  app->add_option("-n,--max-new-tokens", o->tokens, "tokens to generate")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int>::max()));
  app->add_option("--repeats", o->repeats, "runs per mode; the best TTFT is shown")
      ->capture_default_str()
      ->check(whole_number(1, std::numeric_limits<int>::max()));
  return {
      app, [o]() {
        ModelOptions model = o->model;
        std::filesystem::path temp;
        if (model.model_dir.empty()) {
          std::random_device rd;
          temp =
              std::filesystem::temp_directory_path() / ("promptcache-demo-" + std::to_string(rd()));
          std::cerr << fmt::format("no --model given: making a synthetic '{}' model in {}\n",
                                   o->shape, temp.string());
          make_synthetic_model(temp.string(), o->shape, 0);
          model.model_dir = temp.string();
        }
        struct Cleanup {
          std::filesystem::path p;
          ~Cleanup() {
            std::error_code ec;
            if (!p.empty()) std::filesystem::remove_all(p, ec);
          }
        } cleanup{temp};
        auto engine = open_engine(model, EngineFlags{});
        const auto& layout = engine->add_schema_string(
            demo_schema(4, demo_budget(*engine, o->tokens), engine->tokenizer()), "<demo schema>",
            "", progress_bar());
        const std::string prompt =
            "<prompt schema=\"demo\"><doc0/><doc1/><doc2/><doc3/><user>What did Lily see in the "
            "park?</user></prompt>";
        SamplingParams params;
        params.max_new_tokens = o->tokens;
        Response cached, plain;
        double best_cached = 1e300, best_plain = 1e300;
        for (int i = 0; i < o->repeats; ++i) {
          plain = engine->generate_xml(prompt, params, {}, RequestOptions{false});
          best_plain = std::min(best_plain, plain.timings.ttft_ms);
          cached = engine->generate_xml(prompt, params);
          best_cached = std::min(best_cached, cached.timings.ttft_ms);
        }
        std::cout << fmt::format(
            "schema: {} positions in {} modules; prompt: {} cached + {} fresh tokens\n",
            layout.total_length, layout.modules.size(), cached.cached_tokens, cached.fresh_tokens);
        if (!temp.empty()) {
          std::cout << "(synthetic model with random weights: the answer text is noise; the "
                       "timings and the cached == uncached check are what count)\n";
        }
        std::cout << "answer (cached):   " << cached.text << "\n";
        std::cout << "answer (no cache): " << plain.text << "\n";
        std::cout << fmt::format("TTFT without cache: {:8.2f} ms\n", best_plain);
        std::cout << fmt::format("TTFT with cache:    {:8.2f} ms  (assembly {:.2f} ms)\n",
                                 best_cached, cached.timings.assembly_ms);
        std::cout << fmt::format("speedup: {:.1f}x; same answer: {}\n", best_plain / best_cached,
                                 cached.tokens == plain.tokens ? "yes" : "no");
        return 0;
      }};
}

}  // namespace promptcache::cli
