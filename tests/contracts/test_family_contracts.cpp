// The Prompt Cache contracts for every model family beyond Llama 2: a tiny random checkpoint of
// each (made by `make-model`'s code, with its family's trained tokenizer: byte-level BPE for Qwen
// and Llama 3, SentencePiece for Mistral) opened through Engine::open, as a user's folder is.
// Prefix-exact, position-exact (random schemas; the sliding window of mistral-tiny is 24
// positions, so it cuts through most of them; bloom-tiny and mpt-tiny take ALiBi's bias from the
// positions the schemas reserve) and batch-exact.
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
#include "support/contract_checks.hpp"
#include "support/position_reference.hpp"
#include "support/random_schema.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const std::vector<std::string> kFamilies = {"qwen2-tiny",   "qwen3-tiny", "llama3-tiny",
                                            "mistral-tiny", "bloom-tiny", "mpt-tiny",
                                            "falcon-tiny"};

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
    const auto& layout = engine->add_schema_string(test::story_schema());
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
    const auto fresh = test::check_prefix_exact(*engine);
    if (shape == "mistral-tiny") {  // the window cuts
      for (const auto n : fresh) CHECK(n > 24u);
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
    const int batches = test::check_batch_exact(*engine, 4, 5);
    CHECK(batches >= 3);
  }
}
