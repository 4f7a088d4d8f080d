// Integration with a real trained model: greedy output must match the recorded reference.
#include <nlohmann/json.hpp>
#include "support/catch_torch.hpp"

#include <fstream>

#include "promptcache/generation.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

TEST_CASE("stories260K greedy generation reproduces reference.json", "[stories260k]") {
  const std::string dir = test::checked_stories260k_dir();
  std::ifstream in(dir + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  const auto model = LlamaModel::load(dir);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  const auto prompt = tok->encode(ref["prompt"].get<std::string>(), /*add_bos=*/true);
  CHECK(prompt == ref["prompt_ids"].get<std::vector<TokenId>>());

  // Top-5 logits at the last prompt position, within the reference's 1e-3.
  KVCache cache = model->make_cache(64);
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  auto logits =
      model->forward(torch::tensor(ids).unsqueeze(0), torch::arange((int64_t)ids.size()), cache)
          .reshape({-1});
  for (const auto& pair : ref["last_prompt_position_top5"]) {
    CHECK(logits[pair[0].get<int>()].item<double>() == Approx(pair[1].get<double>()).margin(1e-3));
  }

  SamplingParams params;
  params.max_new_tokens = ref["greedy_new_tokens"].get<int>();
  params.stop_at_eos = false;
  std::string streamed;
  const auto result = generate(*model, *tok, prompt, params, [&](TokenId, const std::string& s) {
    streamed += s;
    return true;
  });
  CHECK(result.tokens == ref["greedy_ids"].get<std::vector<TokenId>>());
  CHECK(result.text == ref["greedy_text"].get<std::string>());
  CHECK(streamed == result.text);
  CHECK(result.timings.ttft_ms > 0);
  CHECK(result.timings.decode_tokens == params.max_new_tokens - 1);
}
