// Engine::generate_batch: prompts with different module selections decoded together, each with
// its own stop, callback and context limit; edge cases and errors. (Row-by-row equality with
// single prompts over random schemas is the batch contract in tests/contracts.)
#include "support/catch_torch.hpp"

#include "promptcache/model/synthetic.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {

const char* kTrip = test::kTripSchema;

std::vector<pml::Prompt> parse_all(const std::vector<std::string>& xml) {
  std::vector<pml::Prompt> out;
  for (const auto& x : xml) out.push_back(pml::parse_prompt_string(x));
  return out;
}

const std::vector<std::string> kPrompts = {
    R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
    R"(<prompt schema="trip"><sunny/><live/>And now?</prompt>)",
    R"(<prompt schema="trip"><city/><rainy/></prompt>)",  // nothing fresh: its last token re-runs
};

}  // namespace

TEST_CASE("generate_batch: each prompt stops on its own and streams its own text", "[batch]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kTrip);
  const auto prompts = parse_all(kPrompts);
  SamplingParams params;
  params.max_new_tokens = 10;
  params.stop_at_eos = false;
  const auto free_run = engine->generate_batch(prompts, params);
  REQUIRE(free_run.size() == 3);
  for (const auto& r : free_run) {
    CHECK(r.tokens.size() == 10);
    CHECK(r.stop_reason == StopReason::kMaxTokens);
  }
  // Prompt 0 stops at a stop token (its 4th token), prompt 1's callback stops it after 2 tokens,
  // prompt 2 runs on; what each produces up to its stop is unchanged.
  const TokenId stop = free_run[0].tokens[3];
  REQUIRE(std::find(free_run[2].tokens.begin(), free_run[2].tokens.end(), stop) ==
          free_run[2].tokens.end());
  params.stop_token_ids = {stop};
  std::vector<std::string> streamed(3);
  std::vector<int> calls(3, 0);
  const auto stopped = engine->generate_batch(
      prompts, params, [&](std::size_t index, TokenId, const std::string& text) {
        REQUIRE(index < 3);
        streamed[index] += text;
        return ++calls[index] < 2 || index != 1;
      });
  // Keeping finished rows to the end (instead of dropping them from the batch) changes nothing.
  RequestOptions keep_rows;
  keep_rows.drop_finished_rows = false;
  std::vector<int> kept_calls(3, 0);
  const auto kept = engine->generate_batch(
      prompts, params,
      [&](std::size_t index, TokenId, const std::string&) {
        return ++kept_calls[index] < 2 || index != 1;
      },
      keep_rows);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(kept[i].tokens == stopped[i].tokens);
    CHECK(kept[i].stop_reason == stopped[i].stop_reason);
  }
  const auto first = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), stop);
  CHECK(stopped[0].stop_reason == StopReason::kStopToken);
  CHECK(stopped[0].tokens == std::vector<TokenId>(free_run[0].tokens.begin(), first));
  CHECK(stopped[1].stop_reason == StopReason::kCallback);
  CHECK(stopped[1].tokens ==
        std::vector<TokenId>(free_run[1].tokens.begin(), free_run[1].tokens.begin() + 2));
  CHECK(calls[1] == 2);
  CHECK(stopped[2].tokens == free_run[2].tokens);
  CHECK(stopped[2].stop_reason == StopReason::kMaxTokens);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("prompt " << i << " streamed '" << streamed[i] << "', text '" << stopped[i].text << "'");
    CHECK((streamed[i] == stopped[i].text || streamed[i] == " " + stopped[i].text));
    CHECK(stopped[i].timings.ttft_ms > 0);
    // A decode step runs after every kept token but the last (a stop token is not kept).
    const bool stop_token = stopped[i].stop_reason == StopReason::kStopToken;
    CHECK(stopped[i].timings.decode_tokens ==
          static_cast<int64_t>(stopped[i].tokens.size()) - (stop_token ? 0 : 1));
  }
}

TEST_CASE("generate_batch: a prompt that reaches the context limit stops alone", "[batch]") {
  ModelConfig config = test::tiny_config();
  const auto weights = random_llama_weights(config, 1, 0.15);
  auto make_engine = [&](int64_t limit) {
    config.max_position_embeddings = limit;
    EngineOptions options;
    options.chat_template = "llama-2";
    auto e = std::make_unique<Engine>(
        LlamaModel::from_tensors(config, weights, test::test_load_options()),
        load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
    e->add_schema_string(kTrip);
    return e;
  };
  const auto prompts = parse_all({kPrompts[0], kPrompts[2]});
  auto roomy = make_engine(4096);
  std::vector<pml::ResolvedPrompt> resolved;
  for (const auto& p : prompts) resolved.push_back(roomy->resolve(p));
  KVCache cache = roomy->model().make_cache(0, 2);
  const auto pre = roomy->prefill_batch(resolved, cache, true);
  const int64_t p0 = pre.assembled.rows[0].max_position, p1 = pre.assembled.rows[1].max_position;
  REQUIRE(p0 > p1 + 4);  // prompt 0 ends later in the layout
  SamplingParams params;
  params.max_new_tokens = 4;
  params.stop_at_eos = false;
  const auto wide = roomy->generate_batch(prompts, params);
  // With room for 2 positions after prompt 0, it gets 3 tokens (the last needs no position),
  // as it does alone; prompt 1 gets all 4.
  auto tight = make_engine(p0 + 3);
  const auto r = tight->generate_batch(prompts, params);
  CHECK(r[0].stop_reason == StopReason::kContextFull);
  CHECK(r[0].tokens == std::vector<TokenId>(wide[0].tokens.begin(), wide[0].tokens.begin() + 3));
  const auto alone = tight->generate(prompts[0], params);
  CHECK(alone.stop_reason == StopReason::kContextFull);
  CHECK(alone.tokens == r[0].tokens);
  CHECK(r[1].stop_reason == StopReason::kMaxTokens);
  CHECK(r[1].tokens == wide[1].tokens);
  // A prompt past the limit is refused up front, naming which one.
  REQUIRE(roomy->layout("trip").total_length <= static_cast<std::size_t>(p0));
  auto small = make_engine(p0);
  CHECK_THROWS_WITH(small->generate_batch(prompts, params),
                    Catch::Contains("prompt 1 of the batch needs positions up to"));
}

TEST_CASE("generate_batch: edge cases and errors", "[batch]") {
  auto engine = test::tiny_engine();
  engine->add_schema_string(kTrip);
  SamplingParams params;
  params.max_new_tokens = 5;
  params.stop_at_eos = false;
  CHECK(engine->generate_batch({}, params).empty());
  // A batch of one is generate().
  const auto prompts = parse_all(kPrompts);
  const auto one = engine->generate_batch({prompts[0]}, params);
  REQUIRE(one.size() == 1);
  CHECK(one[0].tokens == engine->generate(prompts[0], params).tokens);
  // The same prompt twice in a batch, and the sizes changing from call to call.
  const auto twice = engine->generate_batch({prompts[1], prompts[1]}, params);
  CHECK(twice[0].tokens == twice[1].tokens);
  const auto three = engine->generate_batch(prompts, params);
  CHECK(three[1].tokens == twice[0].tokens);
  // Copies are counted per row.
  CHECK(three[0].kv_bytes ==
        three[0].cached_tokens * engine->model().make_cache(1).bytes_per_token());
  // The single-request buffer is untouched by batches: its modules are still reused.
  const auto again = engine->generate(prompts[0], params);
  CHECK(again.reused_tokens == again.cached_tokens);
  // Errors name what is wrong; nothing runs.
  auto bad = prompts;
  bad.push_back(pml::parse_prompt_string(R"(<prompt schema="nope">Hi</prompt>)"));
  CHECK_THROWS_WITH(engine->generate_batch(bad, params),
                    Catch::Contains("schema 'nope' which is not loaded"));
  params.top_p = 2.0f;
  CHECK_THROWS_WITH(engine->generate_batch(prompts, params), Catch::Contains("top-p"));
}

TEST_CASE("KVCache::keep_rows drops batch rows in place", "[batch]") {
  const auto model = test::tiny_model();
  KVCache cache = model->make_cache(10, 4);
  const auto ids = torch::randint(0, 100, {4, 6}, torch::kInt64);
  model->forward(ids, torch::arange(6, torch::kInt64).repeat({4, 1}), cache);
  std::vector<torch::Tensor> keys, values;
  for (int64_t l = 0; l < cache.layers(); ++l) {
    keys.push_back(cache.keys(l).clone());
    values.push_back(cache.values(l).clone());
  }
  KVCache view = cache;  // shares the storage, as generate_batch's working copy does
  view.keep_rows({1, 3});
  CHECK(view.shape().batch == 2);
  CHECK(cache.shape().batch == 4);  // the original keeps its full batch
  CHECK(view.length() == 6);
  CHECK(view.positions() == cache.positions());
  for (int64_t l = 0; l < cache.layers(); ++l) {
    CHECK(torch::equal(view.keys(l)[0], keys[l][1]));
    CHECK(torch::equal(view.values(l)[1], values[l][3]));
  }
  // Appending to the smaller batch works and leaves the kept rows alone.
  model->forward(torch::randint(0, 100, {2, 1}, torch::kInt64), torch::full({2, 1}, int64_t{6}),
                 view);
  CHECK(view.length() == 7);
  CHECK(torch::equal(view.keys(0)[1].narrow(1, 0, 6), keys[0][3]));
  CHECK_THROWS_WITH(view.keep_rows({1, 0}), Catch::Contains("ascending"));
  CHECK_THROWS_WITH(view.keep_rows({2}), Catch::Contains("below 2"));
}
