// Store accounting, compiler behaviour, assembler buffer reuse and errors, and unions +
// parameters end to end on stories260K.
#include "support/catch_torch.hpp"

#include <torch/version.h>

#include "promptcache/cache/assembler.hpp"
#include "promptcache/cache/compiler.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {
const char* kSchema = test::kTripSchema;

// The schema with another preamble: every stored span's encoding context differs, so none of its
// states is the same as kSchema's (span_store.hpp: spans are keyed by their content).
std::string changed_schema() {
  std::string s = kSchema;
  return s.replace(s.find("Plan a trip."), 12, "Plan a long trip.");
}
const char* kOpenings = R"(<schema name="openings">
  A story.
  <union scaffold="forest">
    <module name="forest">In a forest lived a fox.</module>
    <module name="sea">By the sea lived an old fisher and his cat.</module>
    <module name="town">In a small town there was a baker.</module>
  </union>
  <module name="end">One day something happened.</module>
</schema>)";

// Largest difference between the stored K/V of `span` and a direct causal forward over the span's
// encoding context followed by the span itself.
double stored_states_error(const LlamaModel& model, const pml::Layout& layout,
                           const CacheStore& store, std::size_t span_index, EncodingMode mode) {
  const auto& span = layout.spans[span_index];
  std::vector<int64_t> ids, pos;
  for (std::size_t s : encoding_context(layout, span_index, mode)) {
    for (std::size_t t = 0; t < layout.spans[s].size(); ++t) {
      ids.push_back(layout.spans[s].tokens[t]);
      pos.push_back(static_cast<int64_t>(layout.spans[s].begin + t));
    }
  }
  const auto context = static_cast<int64_t>(ids.size());
  for (std::size_t t = 0; t < span.size(); ++t) {
    ids.push_back(span.tokens[t]);
    pos.push_back(static_cast<int64_t>(span.begin + t));
  }
  KVCache direct = model.make_cache(static_cast<int64_t>(ids.size()));
  model.forward(torch::tensor(ids).unsqueeze(0), torch::tensor(pos).unsqueeze(0), direct);
  const auto* st = store.find(layout.schema_name, span_index);
  REQUIRE(st != nullptr);
  REQUIRE(st->length() == static_cast<int64_t>(span.size()));
  double worst = 0;
  for (int64_t l = 0; l < direct.layers(); ++l) {
    worst = std::max(
        worst,
        (direct.key_slots(l, context, st->length())[0] - st->k[l]).abs().max().item<double>());
    worst = std::max(
        worst,
        (direct.value_slots(l, context, st->length())[0] - st->v[l]).abs().max().item<double>());
  }
  return worst;
}

std::size_t layout_span_size(const Engine& engine, const std::string& module) {
  const auto& layout = engine.layout("trip");
  return layout.spans[layout.module(module).spans[0]].size();
}

}  // namespace

TEST_CASE("store byte accounting is exactly 2 x layers x kv_heads x head_dim x dtype", "[cache]") {
  auto engine = test::tiny_engine();
  const auto& layout = engine->add_schema_string(kSchema);
  const auto& c = engine->model().config();
  const int64_t per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4;
  int64_t stored_tokens = 0;
  for (std::size_t s = 0; s < layout.spans.size(); ++s) {
    const auto* st = engine->store().find("trip", s);
    if (layout.spans[s].cacheable) {
      REQUIRE(st != nullptr);
      CHECK(st->length() == static_cast<int64_t>(layout.spans[s].size()));
      CHECK(st->begin == static_cast<int64_t>(layout.spans[s].begin));
      stored_tokens += st->length();
    } else {
      CHECK(st == nullptr);  // parameter slots and cache="false" spans are never stored
    }
  }
  CHECK(engine->store().tokens("trip") == stored_tokens);
  CHECK(engine->store().bytes("trip") == stored_tokens * per_token);
  CHECK(engine->store().bytes() == stored_tokens * per_token);
  CHECK(engine->compile_report("trip").tokens_stored == stored_tokens);
  KVCache kv = engine->model().make_cache(1);
  CHECK(kv.bytes_per_token() == per_token);
}

TEST_CASE("compiler shares the scaffold prefix and reports progress", "[cache]") {
  auto model = test::tiny_model();
  auto tok = load_sentencepiece_tokenizer(test::tiny_tokenizer_path());
  const auto layout =
      pml::layout(pml::parse_schema_string(kSchema), *tok, pml::chat_template("plain"));
  CacheStore store;
  std::vector<CompileProgress> seen;
  CompileOptions options;
  options.on_progress = [&](const CompileProgress& p) { seen.push_back(p); };
  const auto report = ModuleCompiler(*model).compile(layout, store, options);
  CHECK(report.passes == 2);  // scaffold pass + the "rainy" member pass
  REQUIRE(seen.size() == 2);
  CHECK(seen.back().pass == 2);
  CHECK(seen.back().tokens_done == seen.back().tokens_total);
  // The rainy pass reuses everything before the union, so fewer tokens run than passes hold.
  CHECK(report.tokens_run < seen.back().tokens_total);
  // States of the rainy member equal a direct causal forward over its context.
  CHECK(stored_states_error(*model, layout, store, layout.module("rainy").spans[0],
                            EncodingMode::kScaffold) < 1e-5);
}

TEST_CASE("short passes share one forward and keep their own states", "[cache]") {
  auto model = test::tiny_model();
  auto tok = load_sentencepiece_tokenizer(test::tiny_tokenizer_path());
  const auto layout =
      pml::layout(pml::parse_schema_string(kOpenings), *tok, pml::chat_template("plain"));
  for (EncodingMode mode : {EncodingMode::kScaffold, EncodingMode::kIsolated}) {
    INFO("mode " << to_string(mode));
    for (int64_t chunk : {int64_t{512}, int64_t{3}}) {
      INFO("chunk " << chunk);
      CacheStore store;
      CompileOptions options;
      options.mode = mode;
      options.chunk_tokens = chunk;
      std::vector<CompileProgress> seen;
      options.on_progress = [&](const CompileProgress& p) { seen.push_back(p); };
      const auto report = ModuleCompiler(*model).compile(layout, store, options);
      CHECK(seen.size() == report.passes);
      if (chunk == 512) {
        // Scaffold: the scaffold pass, then the other two openings (each with the text after
        // the union) in one forward. Isolated: every module in one forward.
        CHECK(report.forwards == (mode == EncodingMode::kScaffold ? 2 : 1));
      } else {
        CHECK(report.forwards > static_cast<int64_t>(report.passes));  // chunked, unbatched
      }
      for (std::size_t s = 0; s < layout.spans.size(); ++s) {
        if (!layout.spans[s].cacheable || layout.spans[s].size() == 0) continue;
        INFO("span " << s);
        CHECK(stored_states_error(*model, layout, store, s, mode) < 1e-5);
      }
    }
  }
}

TEST_CASE("assembler reuses its buffer and rejects uncompiled schemas", "[cache]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchema);
  const auto& layout = engine->layout("trip");
  KVCache cache = engine->model().make_cache(0);
  const auto r1 = engine->resolve(pml::parse_prompt_string(
      R"(<prompt schema="trip"><city/><rainy/><live/><who guide="Anna"/>Where do we go?</prompt>)"));
  AssembleOptions copy;
  copy.in_place = false;
  const auto a1 = Assembler().assemble(r1, layout, engine->store(), cache, 16, copy);
  const int64_t capacity = cache.capacity();
  // Fresh: the cache="false" module, the argument, the question; in document order.
  const auto& live = layout.spans[layout.module("live").spans[0]];
  CHECK(std::find(a1.fresh_positions.begin(), a1.fresh_positions.end(),
                  static_cast<int64_t>(live.begin)) != a1.fresh_positions.end());
  CHECK(a1.cached_tokens == cache.length());
  CHECK(a1.kv_bytes == a1.cached_tokens * cache.bytes_per_token());
  CHECK(a1.in_place_tokens == 0);
  CHECK(cache.block_slots() == 0);
  // Rainy's positions are in the cache; sunny's are not.
  const auto& rainy = layout.spans[layout.module("rainy").spans[0]];
  const auto& positions = cache.positions();
  CHECK(std::find(positions.begin(), positions.end(), static_cast<int64_t>(rainy.begin)) !=
        positions.end());
  const auto r2 =
      engine->resolve(pml::parse_prompt_string(R"(<prompt schema="trip"><city/>Hi</prompt>)"));
  Assembler().assemble(r2, layout, engine->store(), cache, 16);
  CHECK(cache.capacity() == capacity);  // smaller prompt: same buffer, no reallocation

  CacheStore empty;
  CHECK_THROWS_WITH(Assembler().assemble(r1, layout, empty, cache, 0),
                    Catch::Contains("compile the schema"));
  CHECK_THROWS_WITH(engine->generate_xml(R"(<prompt schema="nope">x</prompt>)"),
                    Catch::Contains("nope") && Catch::Contains("trip"));
}

TEST_CASE("cached generation with unions and parameters on the tiny model", "[cache]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchema);
  SamplingParams greedy;
  greedy.max_new_tokens = 8;
  greedy.stop_at_eos = false;
  const auto r = engine->generate_xml(
      R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
      greedy);
  CHECK(r.tokens.size() == 8);
  CHECK(r.cached_tokens > 0);
  CHECK(r.timings.ttft_ms > 0);
  CHECK(r.timings.assembly_ms >= 0);
  // Sampling with a seed is repeatable through the engine as well.
  SamplingParams sampled = greedy;
  sampled.temperature = 0.8f;
  sampled.seed = 5;
  const auto s1 = engine->generate_xml(R"(<prompt schema="trip"><city/>Go</prompt>)", sampled);
  const auto s2 = engine->generate_xml(R"(<prompt schema="trip"><city/>Go</prompt>)", sampled);
  CHECK(s1.tokens == s2.tokens);
}

TEST_CASE("the KV buffer keeps module states across requests only while they are the same",
          "[cache]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchema);
  const std::string p1 =
      R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)";
  const std::string p2 = R"(<prompt schema="trip"><city/><sunny/><live/>And now?</prompt>)";
  const std::string p3 = R"(<prompt schema="trip"><city/><rainy/></prompt>)";  // nothing fresh
  KVCache shared = engine->model().make_cache(0);
  auto step = [&](const std::string& xml, bool use_cache = true) {
    INFO("prompt " << xml);
    const auto resolved = engine->resolve(pml::parse_prompt_string(xml));
    const auto reused = engine->prefill(resolved, shared, use_cache, 4, AssembleOptions{true});
    const int64_t reused_tokens = reused.assembled.reused_tokens;
    // The same prompt assembled from scratch into a fresh buffer, every span copied, gives the
    // same logits.
    KVCache fresh = engine->model().make_cache(0);
    const auto cold = engine->prefill(resolved, fresh, use_cache, 4, AssembleOptions{false, false});
    CHECK(cold.assembled.reused_tokens == 0);
    CHECK(reused.assembled.cached_tokens == cold.assembled.cached_tokens);
    CHECK(reused.assembled.reused_tokens <= reused.assembled.cached_tokens);
    CHECK((reused.logits - cold.logits).abs().max().item<double>() <= 1e-6);
    CHECK(shared.positions() == fresh.positions());
    // Decoding a token appends after the prompt and must not spoil the kept states.
    auto next = torch::full({1, 1}, int64_t{5});
    auto pos = torch::full({1, 1}, shared.max_position() + 1);
    engine->model().forward(next, pos, shared);
    return reused_tokens;
  };
  CHECK(step(p1) == 0);
  const auto first = engine->resolve(pml::parse_prompt_string(p1));
  const int64_t p1_cached = engine->prefill(first, shared, true, 4).assembled.cached_tokens;
  CHECK(step(p1) == p1_cached);  // everything kept
  const int64_t p2_reused = step(p2);
  CHECK(p2_reused > 0);          // the preamble and city are kept ...
  CHECK(p2_reused < p1_cached);  // ... but not what follows the union
  CHECK(step(p1) == p2_reused);
  // All of p3's modules are held, but its last token is run again (nothing fresh), so that
  // slot does not count as kept.
  CHECK(step(p3) == p2_reused + static_cast<int64_t>(layout_span_size(*engine, "rainy")) - 1);
  CHECK(step(p1) < p1_cached);  // p3 re-ran rainy's last token: that slot is not trusted
  CHECK(step(p1, /*use_cache=*/false) == 0);
  CHECK(step(p1) == 0);                // the plain prefill overwrote the buffer
  engine->add_schema_string(kSchema);  // the same spans: the stored states stay, and match
  CHECK(step(p1) == p1_cached);
  // New states after the changed preamble: only what precedes it (the BOS) still matches.
  engine->add_schema_string(changed_schema());
  CHECK(step(p1) <= 1);

  // Through generate: the same answer with and without reuse, and the reuse is reported.
  SamplingParams greedy;
  greedy.max_new_tokens = 6;
  greedy.stop_at_eos = false;
  const auto warm1 = engine->generate_xml(p1, greedy);
  const auto warm2 = engine->generate_xml(p1, greedy);
  const auto cold = engine->generate_xml(p1, greedy, {}, RequestOptions{true, false});
  RequestOptions copy;
  copy.reuse_buffer = false;
  copy.in_place = false;
  const auto copied = engine->generate_xml(p1, greedy, {}, copy);
  CHECK(warm2.reused_tokens == warm2.cached_tokens);
  CHECK(warm2.kv_bytes == 0);
  CHECK(cold.reused_tokens == 0);
  CHECK(copied.reused_tokens == 0);
  CHECK(copied.in_place_tokens == 0);
  CHECK(copied.kv_bytes == copied.cached_tokens * shared.bytes_per_token());
  // Cold, each span is either read in place or copied.
  CHECK(cold.kv_bytes + cold.in_place_tokens * shared.bytes_per_token() ==
        cold.cached_tokens * shared.bytes_per_token());
  CHECK(warm1.tokens == copied.tokens);
  CHECK(warm2.tokens == copied.tokens);
  CHECK(cold.tokens == copied.tokens);
}

TEST_CASE("adding a schema again lets go of the states the engine's buffer held", "[cache]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchema);
  const std::string prompt = R"(<prompt schema="trip"><city/><rainy/>Where do we go?</prompt>)";
  SamplingParams one;
  one.max_new_tokens = 1;
  const auto first = engine->generate_xml(prompt, one);
  REQUIRE(first.cached_tokens > 0);
  // One stored block the request used, held here as well.
  const auto& layout = engine->layout("trip");
  const std::size_t city = layout.module("city").spans[0];
  const torch::Tensor old = engine->store().find("trip", city)->kv;
  if (first.in_place_tokens > 0) {
    CHECK(old.use_count() >= 3);  // the store, the buffer's reference and this test
  }
  // Added again unchanged: its spans have the same keys, so the stored blocks stay.
  engine->add_schema_string(kSchema);
  CHECK(engine->store().find("trip", city)->kv.is_same(old));
  CHECK(engine->generate_xml(prompt, one).tokens == first.tokens);
  engine->add_schema_string(changed_schema());  // other content: new blocks
  CHECK(old.use_count() == 1);                  // only this test still has the old one
  const auto again = engine->generate_xml(prompt, one);
  CHECK(again.reused_tokens == 0);
  CHECK(again.cached_tokens > 0);
}

TEST_CASE("remove_schema: running requests finish on its states, new ones are refused", "[cache]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kSchema);
  engine->add_schema_string(kOpenings);
  const std::string prompt = R"(<prompt schema="trip"><city/><rainy/>Where do we go?</prompt>)";
  SamplingParams params;
  params.max_new_tokens = 8;
  params.stop_at_eos = false;
  const auto alone = engine->generate_xml(prompt, params);
  const torch::Tensor block =
      engine->store().find("trip", engine->layout("trip").module("city").spans[0])->kv;
  const int64_t openings_bytes = engine->store().bytes("openings");
  // Removed after the request's third token: it finishes on the states it holds.
  int tokens = 0;
  bool removed = false;
  const auto during = engine->generate_xml(prompt, params, [&](TokenId, const std::string&) {
    if (++tokens == 3) removed = engine->remove_schema("trip");
    return true;
  });
  CHECK(removed);
  CHECK(during.tokens == alone.tokens);
  CHECK_FALSE(engine->has_schema("trip"));
  CHECK(engine->store().bytes("trip") == 0);
  CHECK(engine->store().bytes("openings") == openings_bytes);  // the other schema is untouched
  CHECK(block.use_count() == 1);  // freed: only this test still holds the block
  try {
    engine->generate_xml(prompt, params);
    FAIL("a prompt naming a removed schema must be refused");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kUnknownSchema);
    CHECK(std::string(e.what()).find("'trip'") != std::string::npos);
  }
  CHECK_FALSE(engine->remove_schema("trip"));
  // Added again, it serves as before.
  engine->add_schema_string(kSchema);
  CHECK(engine->generate_xml(prompt, params).tokens == alone.tokens);
}

TEST_CASE("compile, store and assemble in bf16 and f16 on the test device", "[cache][half]") {
  const ModelConfig config = test::tiny_config();
  const auto weights = random_llama_weights(config, 1, 0.15);
  // The selected modules form the schema's contiguous prefix: cached equals uncached up to
  // rounding (contract 2), so the comparison below measures half-precision rounding only.
  const char* prompt = R"(<prompt schema="trip"><city/><sunny/>Where do we go?</prompt>)";
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    LoadOptions load = test::test_load_options();
    load.dtype = dtype;
    INFO(dtype_name(dtype) << " on " << load.device.str());
#if TORCH_VERSION_MAJOR < 2
    if (load.device.is_cpu() && dtype == torch::kFloat16) {
      WARN("f16 on the CPU needs LibTorch 2.x: only its clear error is checked here");
      CHECK_THROWS_WITH(LlamaModel::from_tensors(config, weights, load), Catch::Contains("f16"));
      continue;
    }
#endif
    EngineOptions options;
    options.load = load;
    options.chat_template = "llama-2";
    Engine engine(LlamaModel::from_tensors(config, weights, load),
                  load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
    engine.add_schema_string(kSchema);
    // The store holds half-precision states on the model's device: 2 bytes per value.
    const int64_t element = 2;
    const int64_t per_token =
        2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element;
    CHECK(engine.store().bytes("trip") == engine.store().tokens("trip") * per_token);
    for (const auto& [span, states] : engine.store().spans_of("trip")) {
      CHECK(states.kv.scalar_type() == dtype);
      CHECK(states.kv.device() == load.device);
    }
    const auto resolved = engine.resolve(pml::parse_prompt_string(prompt));
    KVCache cached = engine.model().make_cache(0), plain = engine.model().make_cache(0);
    const auto a = engine.prefill(resolved, cached, /*use_cache=*/true);
    const auto b = engine.prefill(resolved, plain, /*use_cache=*/false);
    CHECK(cached.keys(0).scalar_type() == dtype);
    CHECK(a.assembled.cached_tokens > 0);
    const double rel = ((a.logits - b.logits).abs().max() / b.logits.abs().max()).item<double>();
    INFO("relative logit diff cached vs no cache " << rel);
    CHECK(std::isfinite(rel));
    CHECK(rel < 0.1);
    SamplingParams greedy;
    greedy.max_new_tokens = 4;
    greedy.stop_at_eos = false;
    CHECK(engine.generate_xml(prompt, greedy).tokens.size() == 4);
  }
}

TEST_CASE("stories260K: a union of openings and a character parameter", "[cache][stories260k]") {
  auto engine = test::stories260k_engine();
  engine->add_schema_string(R"(<schema name="tales">
    <union scaffold="park">
      <module name="park">Once upon a time, there was a little girl who loved to play in the park.</module>
      <module name="sea">Once upon a time, a boy lived in a small house by the sea.</module>
      <module name="forest">Once upon a time, in a big green forest, there lived a little bird.</module>
    </union>
    <module name="hero">One day, <parameter name="name" length="6" scaffold="Lily"/> went outside.</module>
  </schema>)");
  SamplingParams greedy;
  greedy.max_new_tokens = 40;
  std::vector<std::string> outputs;
  std::vector<pml::Prompt> prompts;
  const char* names[] = {"Ben", "Mia", "Sam"};
  for (const char* opening : {"park", "sea", "forest"}) {
    const std::string prompt = std::string("<prompt schema=\"tales\"><") + opening +
                               "/><hero name=\"" + names[prompts.size()] + "\"/> Then</prompt>";
    prompts.push_back(pml::parse_prompt_string(prompt));
    const auto r = engine->generate(prompts.back(), greedy);
    WARN(opening << ", " << names[prompts.size() - 1] << ": " << r.text << "  [cached "
                 << r.cached_tokens << ", fresh " << r.fresh_tokens << ", TTFT "
                 << r.timings.ttft_ms << " ms]");
    CHECK(r.tokens.size() > 5);
    CHECK(r.cached_tokens > 10);
    outputs.push_back(r.text);
  }
  // Different openings lead to different stories.
  CHECK((outputs[0] != outputs[1] || outputs[1] != outputs[2]));
  // The three prompts as one batch (each row stops at its own EOS or limit): the same stories.
  const auto batch = engine->generate_batch(prompts, greedy);
  REQUIRE(batch.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(batch[i].text == outputs[i]);
    CHECK(batch[i].cached_tokens > 10);
  }
  WARN("as one batch: TTFT " << batch[0].timings.ttft_ms << " ms for all three");
}
