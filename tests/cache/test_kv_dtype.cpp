// A bf16 or f16 KV cache with f32 compute on the CPU (LoadOptions::kv_dtype): module states take
// half the bytes in the store, in cache files and in assembly; the fused attention reads them in
// place and equals the library path over the same rounded K/V; the Prompt Cache contracts hold
// within the rounding that the half-precision K/V bring; stories260K keeps its greedy output.
#include "support/catch_torch.hpp"

#include <iostream>
#include <sstream>

#include "promptcache/cache/cache_file.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "support/cpu_kernels.hpp"
#include "support/stories260k_reference.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;
using test::KernelGuard;

namespace {

const char* kPrefixPrompt = R"(<prompt schema="trip"><city/><sunny/>Where do we go?</prompt>)";
// Not a prefix: a union member after a gap, a parameter, and fresh text between modules.
const char* kGapPrompt =
    R"(<prompt schema="trip"><rainy/><who guide="Ann"/> Then we walk by the river.</prompt>)";

std::unique_ptr<Engine> kv_engine_from(const std::map<std::string, torch::Tensor>& weights,
                                       torch::Dtype kv) {
  LoadOptions load;
  load.kv_dtype = kv;
  EngineOptions options;
  options.load = load;
  options.chat_template = "llama-2";
  return std::make_unique<Engine>(LlamaModel::from_tensors(test::tiny_config(), weights, load),
                                  load_sentencepiece_tokenizer(test::tiny_tokenizer_path()),
                                  options);
}

double relative(const torch::Tensor& got, const torch::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

SamplingParams greedy(int n) {
  SamplingParams p;
  p.max_new_tokens = n;
  p.stop_at_eos = false;
  return p;
}

}  // namespace

TEST_CASE("a bf16/f16 KV cache halves the stored states and keeps the contracts",
          "[cache][kv_dtype]") {
  if (!cpu_attention_available(test::tiny_config().head_dim)) {
    WARN("no fused CPU attention for this head size here: the in-place checks are skipped");
  }
  const auto weights = random_llama_weights(test::tiny_config(), 5);
  auto f32 = kv_engine_from(weights, torch::kFloat32);
  f32->add_schema_string(test::kTripSchema);
  const auto f32_prefill = [&](const char* prompt) {
    KVCache cache = f32->model().make_cache(0);
    return f32->prefill(f32->resolve(pml::parse_prompt_string(prompt)), cache, true).logits;
  };
  for (auto kv : {torch::kBFloat16, torch::kFloat16}) {
    INFO("KV cache in " << dtype_name(kv));
    auto engine = kv_engine_from(weights, kv);
    CHECK(engine->model().kv_dtype() == kv);
    CHECK(engine->model().dtype() == torch::kFloat32);
    engine->add_schema_string(test::kTripSchema);
    // Half the bytes of the f32 store, every state in the KV dtype.
    CHECK(engine->store().tokens("trip") == f32->store().tokens("trip"));
    CHECK(engine->store().bytes("trip") * 2 == f32->store().bytes("trip"));
    for (const auto& [span, states] : engine->store().spans_of("trip")) {
      CHECK(states.kv.scalar_type() == kv);
      const auto* wide = f32->store().find("trip", span);
      REQUIRE(wide != nullptr);
      // The same states up to half-precision rounding (of these and of the K/V they attended to).
      CHECK(relative(states.kv.to(torch::kFloat32), wide->kv) < 0.02);
    }
    for (const char* prompt : {kPrefixPrompt, kGapPrompt}) {
      INFO(prompt);
      const auto resolved = engine->resolve(pml::parse_prompt_string(prompt));
      KVCache in_place = engine->model().make_cache(0), copied = engine->model().make_cache(0),
              plain = engine->model().make_cache(0);
      AssembleOptions copy;
      copy.in_place = false;
      const auto a = engine->prefill(resolved, in_place, /*use_cache=*/true);
      const auto c = engine->prefill(resolved, copied, /*use_cache=*/true, 0, copy);
      const auto b = engine->prefill(resolved, plain, /*use_cache=*/false);
      CHECK(in_place.keys(0).scalar_type() == kv);
      CHECK(a.assembled.cached_tokens > 0);
      if (cpu_attention_available(test::tiny_config().head_dim)) {
        // The fused attention reads the stored half-precision states where they are.
        CHECK(a.assembled.in_place_tokens == a.assembled.cached_tokens);
        CHECK(a.assembled.kv_bytes == 0);
      }
      CHECK(c.assembled.in_place_tokens == 0);
      // Read in place or copied: the same K/V, the same arithmetic.
      CHECK((a.logits - c.logits).abs().max().item<double>() <= 1e-5);
      // Against f32 K/V: the rounding of the states shows, and stays small.
      const double vs_f32 = relative(a.logits, f32_prefill(prompt));
      WARN(dtype_name(kv) << " KV against f32 KV, " << prompt << ": relative logit difference "
                          << vs_f32);
      CHECK(vs_f32 < 5e-3);  // measured 7e-4 (bf16), 7e-5 (f16)
      if (std::string(prompt) == kPrefixPrompt) {
        // Prefix-exact: cached and uncached round the same K/V; only the f32 arithmetic
        // before the rounding differs (compiled in chunks against one pass), which may move a
        // value across a rounding boundary.
        const double rel = relative(a.logits, b.logits);
        WARN(dtype_name(kv) << " KV, prefix prompt: cached vs no cache, relative " << rel);
        CHECK(rel < 1e-4);  // measured 2e-7
        const auto with_cache = engine->generate_xml(prompt, greedy(16));
        const auto without = engine->generate_xml(prompt, greedy(16), {}, RequestOptions{false});
        CHECK(with_cache.tokens == without.tokens);
      }
    }
    // Batch-exact: each prompt of a batch gets the tokens it gets alone.
    const std::vector<pml::Prompt> prompts = {pml::parse_prompt_string(kPrefixPrompt),
                                              pml::parse_prompt_string(kGapPrompt)};
    const auto batch = engine->generate_batch(prompts, greedy(12));
    REQUIRE(batch.size() == 2);
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      CHECK(batch[i].tokens == engine->generate(prompts[i], greedy(12)).tokens);
    }
  }
}

TEST_CASE("the fused attention over a bf16 KV cache equals the library path over it",
          "[cache][kv_dtype][kernels]") {
  // Kernels off, the model converts the rounded K/V to f32 for the library calls: the same
  // values the fused kernel converts as it reads them.
  const auto weights = random_llama_weights(test::tiny_config(), 9);
  auto engine = kv_engine_from(weights, torch::kBFloat16);
  engine->add_schema_string(test::kTripSchema);
  const auto resolved = engine->resolve(pml::parse_prompt_string(kGapPrompt));
  KVCache fused_cache = engine->model().make_cache(0);
  const auto fused = engine->prefill(resolved, fused_cache, true);
  torch::Tensor library;
  {
    KernelGuard guard;
    REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
    KVCache cache = engine->model().make_cache(0);
    library = engine->prefill(resolved, cache, true).logits;
  }
  CHECK(relative(fused.logits, library) < 1e-4);
}

TEST_CASE("cache files keep the KV dtype", "[cache][kv_dtype][file]") {
  test::TempDir dir;
  const std::string file = dir.file("trip.states");
  const auto weights = random_llama_weights(test::tiny_config(), 5);
  auto first = kv_engine_from(weights, torch::kBFloat16);
  first->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  CHECK_THAT(first->compile_report("trip").source, Catch::StartsWith("compiled, saved"));
  const auto expected = first->generate_xml(kGapPrompt, greedy(8));
  // Loaded into a bf16-KV engine: used as it is, bit for bit.
  auto second = kv_engine_from(weights, torch::kBFloat16);
  second->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  CHECK_THAT(second->compile_report("trip").source, Catch::StartsWith("loaded from"));
  for (const auto& [span, states] : first->store().spans_of("trip")) {
    const auto* other = second->store().find("trip", span);
    REQUIRE(other != nullptr);
    CHECK(other->kv.scalar_type() == torch::kBFloat16);
    CHECK(torch::equal(states.kv, other->kv));
  }
  CHECK(second->generate_xml(kGapPrompt, greedy(8)).tokens == expected.tokens);
  // An f32-KV engine does not take it (nor does an f16 one): recompiled and replaced.
  for (auto kv : {torch::kFloat32, torch::kFloat16}) {
    auto other = kv_engine_from(weights, kv);
    other->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
    INFO(dtype_name(kv));
    CHECK_THAT(other->compile_report("trip").source,
               Catch::Contains("stale") && Catch::Contains("KV dtype"));
  }
  // load_cache_file by hand names the file and both dtypes.
  auto f16 = kv_engine_from(weights, torch::kFloat16);
  CacheStore store;
  f16->add_schema_string(test::kTripSchema);
  first->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);  // bf16 again
  CHECK_THROWS_WITH(
      load_cache_file(file, f16->layout("trip"), store, f16->model(), EncodingMode::kScaffold),
      Catch::Contains(file) && Catch::Contains("KV dtype 'bf16', not 'f16'"));
}

TEST_CASE("a reduced-precision KV cache is refused where it cannot run", "[cache][kv_dtype]") {
  const ModelConfig c = test::tiny_config();
  const auto w = random_llama_weights(c, 1);
  LoadOptions o;
  o.dtype = torch::kBFloat16;
  o.kv_dtype = torch::kFloat16;
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, o, "m"),
                    Catch::Contains("KV cache in f16 with bf16 compute"));
  o.kv_dtype = torch::kFloat32;
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, o, "m"),
                    Catch::Contains("KV cache in f32 with bf16 compute"));
  o.dtype = torch::kFloat32;
  o.kv_dtype = torch::kInt8;
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, o, "m"), Catch::Contains("KV cache in q8"));
  // Equal to the compute dtype is always fine.
  o.dtype = torch::kBFloat16;
  o.kv_dtype = torch::kBFloat16;
  CHECK(LlamaModel::from_tensors(c, w, o, "m")->kv_dtype() == torch::kBFloat16);
}

TEST_CASE("stories260K with a bf16 KV cache keeps the reference's greedy output",
          "[stories260k][kv_dtype]") {
  const auto ref = test::stories260k_reference();
  const std::string dir = test::stories260k_dir();
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  for (auto kv : {torch::kBFloat16, torch::kFloat16}) {
    LoadOptions options;
    options.kv_dtype = kv;
    const auto model = LlamaModel::load(dir, options);
    const auto result = generate(*model, *tok, ref.prompt_ids, greedy(ref.greedy_new_tokens));
    WARN("stories260K, " << dtype_name(kv) << " KV cache: "
                         << test::greedy_tokens_matching(ref, result.tokens) << " of "
                         << ref.greedy_ids.size() << " greedy tokens equal the f32 reference");
    CHECK(result.tokens == ref.greedy_ids);
  }
}

TEST_CASE("a states file of another KV dtype is compiled again with a message on stderr",
          "[cache][kv_dtype][file][defaults]") {
  test::TempDir dir;
  const std::string file = dir.file("trip.states");
  const auto weights = random_llama_weights(test::tiny_config(), 5);
  // Made with f32 states (as before bf16 states became the default for bf16 checkpoints).
  auto old = kv_engine_from(weights, torch::kFloat32);
  old->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  REQUIRE(read_cache_file_info(file).kv_dtype == "f32");
  // The same weights stored in bf16, loaded with nothing set: bf16 weights and bf16 states.
  std::map<std::string, torch::Tensor> bf16;
  for (const auto& [name, t] : weights) bf16[name] = t.to(torch::kBFloat16);
  EngineOptions options;
  options.chat_template = "llama-2";
  auto engine =
      std::make_unique<Engine>(LlamaModel::from_tensors(test::tiny_config(), bf16),
                               load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
  REQUIRE(engine->model().kv_dtype() == torch::kBFloat16);
  std::ostringstream err;
  auto* saved = std::cerr.rdbuf(err.rdbuf());
  try {
    engine->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  } catch (...) {
    std::cerr.rdbuf(saved);
    throw;
  }
  std::cerr.rdbuf(saved);
  INFO(err.str());
  CHECK_THAT(err.str(), Catch::Contains(file) &&
                            Catch::Contains("made for KV dtype 'f32', not 'bf16'") &&
                            Catch::Contains("compiling schema 'trip' again"));
  CHECK_THAT(engine->compile_report("trip").source,
             Catch::Contains("stale") && Catch::Contains("compiled and saved"));
  for (const auto& [span, states] : engine->store().spans_of("trip")) {
    CHECK(states.kv.scalar_type() == torch::kBFloat16);
  }
  // Replaced by a bf16 file, which the next engine of this kind loads as it is.
  CHECK(read_cache_file_info(file).kv_dtype == "bf16");
  auto next =
      std::make_unique<Engine>(LlamaModel::from_tensors(test::tiny_config(), bf16),
                               load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
  next->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  CHECK_THAT(next->compile_report("trip").source, Catch::StartsWith("loaded from"));
}
