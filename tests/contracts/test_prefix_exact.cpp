// Contract 2: when the chosen spans form a gap-free prefix of the layout, cached generation
// equals no-cache generation (logits within 1e-4 in f32, identical greedy tokens).
#include "support/catch_torch.hpp"

#include "promptcache/engine.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kSchema = R"(<schema name="story">
  <system>You are a helpful assistant. Keep your answers short and clear.</system>
  <module name="intro">Once upon a time, there was a little girl named Lily.</module>
  <module name="park">She loved to play outside in the park. One day, she saw a big red ball.</module>
  <module name="friend">Her friend Tom came to help, and together they found a long stick.</module>
</schema>)";

void check_prefix_exact(Engine& engine, const std::string& prompt_xml, int new_tokens) {
  const auto resolved = engine.resolve(pml::parse_prompt_string(prompt_xml));
  KVCache cached = engine.model().make_cache(0), plain = engine.model().make_cache(0);
  const auto a = engine.prefill(resolved, cached, /*use_cache=*/true);
  const auto b = engine.prefill(resolved, plain, /*use_cache=*/false);
  INFO(prompt_xml);
  CHECK(a.assembled.cached_tokens > 0);
  CHECK(a.assembled.fresh_tokens.size() < b.assembled.fresh_tokens.size());
  const double diff = (a.logits - b.logits).abs().max().item<double>();
  INFO("max abs logit diff " << diff);
  CHECK(diff <= test::logit_tolerance(engine.model(), b.logits, 1e-4));
  CHECK(cached.max_position() == plain.max_position());

  SamplingParams greedy;
  greedy.max_new_tokens = new_tokens;
  greedy.stop_at_eos = false;
  const auto with_cache = engine.generate_xml(prompt_xml, greedy);
  const auto without = engine.generate_xml(prompt_xml, greedy, {}, RequestOptions{false});
  CHECK(with_cache.tokens.size() == static_cast<std::size_t>(new_tokens));
  CHECK(with_cache.tokens == without.tokens);
  CHECK(with_cache.text == without.text);
  CHECK(with_cache.cached_tokens > 0);
  CHECK(without.cached_tokens == 0);
}

}  // namespace

TEST_CASE("prefix-exact on a tiny random model", "[contract][prefix]") {
  for (std::uint64_t seed : {1, 2, 3}) {
    auto engine = test::tiny_engine(seed);
    engine->add_schema_string(kSchema);
    check_prefix_exact(
        *engine, R"(<prompt schema="story"><intro/><park/><friend/>What did Lily see?</prompt>)",
        16);
    check_prefix_exact(*engine, R"(<prompt schema="story"><intro/> What happened next?</prompt>)",
                       16);
    check_prefix_exact(
        *engine,
        R"(<prompt schema="story"><intro/><park/><user>Where was the ball?</user></prompt>)", 8);
  }
}

TEST_CASE("prefix-exact on stories260K", "[contract][prefix][stories260k]") {
  auto engine = test::stories260k_engine();
  engine->add_schema_string(R"(<schema name="tale">
    <module name="opening">Once upon a time, there was a little girl named Lily.</module>
    <module name="middle">She loved to play outside in the park.</module>
  </schema>)");
  check_prefix_exact(*engine, R"(<prompt schema="tale"><opening/><middle/> One day, she</prompt>)",
                     30);
  SamplingParams greedy;
  greedy.max_new_tokens = 30;
  const auto r = engine->generate_xml(
      R"(<prompt schema="tale"><opening/><middle/> One day, she</prompt>)", greedy);
  WARN("stories260K cached continuation: " << r.text);
}
