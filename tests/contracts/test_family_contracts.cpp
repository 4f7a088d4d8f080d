// The Prompt Cache contracts for every model family beyond Llama 2: a tiny random checkpoint of
// each (made by `make-model`'s code, with its family's trained tokenizer: byte-level BPE for Qwen
// and Llama 3, SentencePiece for Mistral) opened through Engine::open, as a user's folder is.
// Prefix-exact, position-exact (random schemas; the sliding window of mistral-tiny is 24
// positions, so it cuts through most of them) and batch-exact.
#include "support/catch_torch.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/cache/compiler.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/synthetic.hpp"
#include "support/position_reference.hpp"
#include "support/random_schema.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const std::vector<std::string> kFamilies = {"qwen2-tiny", "qwen3-tiny", "llama3-tiny",
                                            "mistral-tiny"};

// One model folder per family and test process.
std::string family_folder(const std::string& shape) {
  static std::map<std::string, std::unique_ptr<test::TempDir>> dirs;
  auto& dir = dirs[shape];
  if (!dir) {
    dir = std::make_unique<test::TempDir>("promptcache-" + shape);
    make_synthetic_model(dir->path().string(), shape, 5,
                         test::test_checkpoint_dtype().value_or(torch::kFloat32));
  }
  return dir->path().string();
}

std::unique_ptr<Engine> family_engine(const std::string& shape) {
  EngineOptions options;
  options.load = test::test_load_options();
  return Engine::open(family_folder(shape), options);
}

const char* kStory = R"(<schema name="story">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
</schema>)";

double max_diff(const torch::Tensor& x, const torch::Tensor& y) {
  return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
}

}  // namespace

TEST_CASE("families: the chat template follows the model folder", "[contract][families]") {
  const std::map<std::string, std::string> expected = {{"qwen2-tiny", "chatml"},
                                                       {"qwen3-tiny", "chatml"},
                                                       {"llama3-tiny", "llama-3"},
                                                       {"mistral-tiny", "mistral"}};
  for (const auto& [shape, family] : expected) {
    INFO(shape);
    auto engine = family_engine(shape);
    CHECK(engine->chat_template().family == family);
    const auto& layout = engine->add_schema_string(kStory);
    // The template's special pieces are single ids where the vocabulary has them.
    const Tokenizer& tok = engine->tokenizer();
    const std::string marker = family == "chatml"    ? "<|im_start|>"
                               : family == "llama-3" ? "<|start_header_id|>"
                                                     : "";
    if (!marker.empty()) {
      const TokenId id = tok.piece_to_id(marker);
      REQUIRE(id >= 0);
      bool found = false;
      for (const auto& span : layout.spans) {
        found = found || std::count(span.tokens.begin(), span.tokens.end(), id) > 0;
      }
      CHECK(found);
    }
    // BOS only where the family's tokenizer adds one (Llama 3, Mistral; not Qwen).
    CHECK(layout.has_bos == tok.adds_bos());
  }
}

TEST_CASE("families: prefix-exact", "[contract][prefix][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    auto engine = family_engine(shape);
    engine->add_schema_string(kStory);
    for (const std::string prompt :
         {R"(<prompt schema="story"><intro/><park/><friend/>What did Lily see?</prompt>)",
          R"(<prompt schema="story"><intro/><park/><user>Where was the ball?</user></prompt>)"}) {
      INFO(prompt);
      const auto resolved = engine->resolve(pml::parse_prompt_string(prompt));
      KVCache cached = engine->model().make_cache(0), plain = engine->model().make_cache(0);
      const auto a = engine->prefill(resolved, cached, /*use_cache=*/true);
      const auto b = engine->prefill(resolved, plain, /*use_cache=*/false);
      CHECK(a.assembled.cached_tokens > 0);
      if (shape == "mistral-tiny") CHECK(b.assembled.fresh_tokens.size() > 24);  // the window cuts
      const double diff = max_diff(a.logits, b.logits);
      INFO("max abs logit diff " << diff);
      CHECK(diff <= test::logit_tolerance(engine->model(), b.logits, 1e-4));
      SamplingParams greedy;
      greedy.max_new_tokens = 12;
      greedy.stop_at_eos = false;
      const auto with_cache = engine->generate_xml(prompt, greedy);
      const auto without = engine->generate_xml(prompt, greedy, {}, RequestOptions{false});
      CHECK(with_cache.tokens.size() == 12u);
      CHECK(with_cache.tokens == without.tokens);
      CHECK(with_cache.text == without.text);
    }
  }
}

TEST_CASE("families: position-exact on random schemas", "[contract][position][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    auto engine = family_engine(shape);
    const LlamaModel& model = engine->model();
    int cases = 0, windowed = 0;
    for (std::uint64_t seed = 0; seed < 12; ++seed) {
      const test::Case c = test::make_case(seed);
      for (EncodingMode mode : {EncodingMode::kScaffold, EncodingMode::kIsolated}) {
        INFO("seed " << seed << " mode " << to_string(mode) << "\nschema: " << c.schema
                     << "\nprompt: " << c.prompt);
        const pml::Layout layout = pml::layout(pml::parse_schema_string(c.schema),
                                               engine->tokenizer(), engine->chat_template());
        pml::ResolvedPrompt resolved;
        try {
          resolved = pml::resolve(pml::parse_prompt_string(c.prompt), layout, engine->tokenizer());
        } catch (const Error& e) {
          REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);
          continue;
        }
        const auto run = test::cached_run(model, layout, resolved, mode, seed % 2 ? 7 : 512,
                                          /*in_place=*/seed % 2 == 0);
        const auto& assembled = run.assembled;
        const auto& got = run.logits;
        test::Sequence fresh;
        const auto expected = test::reference_logits(model, layout, resolved, mode, fresh);
        CHECK(assembled.fresh_positions == fresh.positions);
        const double diff = max_diff(got, expected);
        INFO("max abs diff " << diff);
        CHECK(diff <= test::logit_tolerance(model, expected, 1e-5));
        if (seed % 4 == 0) {  // sharp: one position off is far outside tolerance
          test::Sequence ignored;
          CHECK(max_diff(got, test::reference_logits(model, layout, resolved, mode, ignored, 1)) >
                1e-3);
        }
        ++cases;
        windowed += assembled.max_position >= 24;
      }
    }
    CHECK(cases >= 16);
    if (shape == "mistral-tiny") CHECK(windowed >= 8);
  }
}

TEST_CASE("families: batch-exact", "[contract][batch][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    auto engine = family_engine(shape);
    SamplingParams params;
    params.max_new_tokens = 5;
    params.stop_at_eos = false;
    int batches = 0;
    for (std::uint64_t seed = 0; seed < 4; ++seed) {
      const auto a = test::make_case(seed, "a" + std::to_string(seed), 3);
      engine->add_schema_string(a.schema);
      std::vector<pml::Prompt> prompts;
      std::vector<pml::ResolvedPrompt> resolved;
      for (const auto& p : a.prompts) {
        try {
          auto prompt = pml::parse_prompt_string(p);
          resolved.push_back(engine->resolve(prompt));
          prompts.push_back(std::move(prompt));
        } catch (const Error& e) {
          REQUIRE(e.kind() == ErrorKind::kArgumentTooLong);
        }
      }
      if (prompts.size() < 2) continue;
      INFO("seed " << seed << "\nschema: " << a.schema);
      const auto n = static_cast<int64_t>(prompts.size());
      for (bool use_cache : {true, false}) {
        INFO((use_cache ? "cached" : "uncached"));
        KVCache batch_cache = engine->model().make_cache(0, n);
        const auto together = engine->prefill_batch(resolved, batch_cache, use_cache);
        for (int64_t i = 0; i < n; ++i) {
          KVCache single = engine->model().make_cache(0);
          const auto alone = engine->prefill(resolved[i], single, use_cache);
          CHECK(max_diff(together.logits[i], alone.logits) <=
                test::logit_tolerance(engine->model(), alone.logits, 1e-5));
        }
        const auto responses =
            engine->generate_batch(prompts, params, {}, RequestOptions{use_cache});
        for (int64_t i = 0; i < n; ++i) {
          const auto alone = engine->generate(prompts[i], params, {}, RequestOptions{use_cache});
          CHECK(responses[i].tokens == alone.tokens);
        }
      }
      ++batches;
    }
    CHECK(batches >= 3);
  }
}
