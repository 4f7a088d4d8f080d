// config.json: HF fields, defaults, rope_scaling, validation errors, round trip.
#include "support/catch_torch.hpp"

#include "promptcache/error.hpp"
#include "promptcache/model/config.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {
const char* kBase = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 5, "num_attention_heads": 8,
  "vocab_size": 512, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "eos_token_id": [2, 7]})";

std::string with(const std::string& extra) {
  std::string s = kBase;
  s.insert(s.size() - 1, ", " + extra);
  return s;
}
}  // namespace

TEST_CASE("config.json of stories260K", "[config]") {
  if (!test::have_stories260k()) {
    WARN("SKIPPED: " << test::stories260k_dir() << " is absent");
    return;
  }
  const auto c = ModelConfig::from_json_file(test::stories260k_dir() + "/config.json");
  CHECK(c.hidden_size == 64);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.head_dim == 8);
  CHECK(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 512);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kNone);
}

TEST_CASE("config defaults, eos lists and rope scaling", "[config]") {
  const auto c = ModelConfig::from_json_string(kBase, "c.json");
  CHECK(c.num_key_value_heads == 8);  // defaults to the attention heads
  CHECK(c.head_dim == 8);
  CHECK(c.eos_token_ids == std::vector<int64_t>{2, 7});
  const auto lin = ModelConfig::from_json_string(
      with(R"("rope_scaling": {"type": "linear", "factor": 4.0})"), "c");
  CHECK(lin.rope_scaling.type == RopeScaling::Type::kLinear);
  CHECK(lin.rope_scaling.factor == 4.0);
  const auto l3 = ModelConfig::from_json_string(
      with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
      "c");
  CHECK(l3.rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(l3.rope_scaling.original_max_position_embeddings == 8192);
  // Round trip through to_json_string.
  const auto again = ModelConfig::from_json_string(l3.to_json_string(), "round");
  CHECK(again.to_json_string() == l3.to_json_string());
  CHECK(again.rope_scaling.factor == 8.0);
  CHECK(again.eos_token_ids == l3.eos_token_ids);
}

TEST_CASE("bad config.json files name the file and the field", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "c.json"},
      {R"({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64})", "GPT2LMHeadModel"},
      {with(R"("num_key_value_heads": 3)"), "num_key_value_heads"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64})", "intermediate_size"},
      {with(R"("rope_scaling": {"type": "yarn-ish", "factor": 2})"), "rope_scaling"},
      {std::string(kBase).replace(std::string(kBase).find("64"), 2, "\"big\""), "hidden_size"},
  };
  for (const auto& [json, expect] : cases) {
    INFO(json);
    try {
      ModelConfig::from_json_string(json, "c.json");
      FAIL("accepted a bad config");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kModel);
      CHECK_THAT(e.what(), Catch::Contains("c.json") && Catch::Contains(expect));
    }
  }
  CHECK_THROWS_WITH(ModelConfig::from_json_file("/nonexistent/config.json"),
                    Catch::Contains("/nonexistent/config.json"));
}
