// config.json: HF fields, defaults, rope_scaling, validation errors, round trip.
#include "support/catch_torch.hpp"

#include <fstream>

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
// kBase as a Mistral config (model_type "mistral"), plus `extra`.
std::string mistral(const std::string& extra) {
  std::string s = with(extra);
  const std::string llama = R"("model_type": "llama")";
  return s.replace(s.find(llama), llama.size(), R"("model_type": "mistral")");
}
}  // namespace

TEST_CASE("config.json of stories260K", "[config]") {
  const auto c = ModelConfig::from_json_file(test::checked_stories260k_dir() + "/config.json");
  CHECK(c.hidden_size == 64);
  CHECK(c.num_key_value_heads == 4);
  CHECK(c.head_dim == 8);
  CHECK(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 512);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kNone);
  CHECK(c.num_hidden_layers == 5);
  CHECK(c.vocab_size == 512);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.eos_token_ids == std::vector<int64_t>{2});
  CHECK(c.chat_template.empty());  // config.json names none: the architecture's default
  CHECK(c.default_chat_template() == "llama-2");
  // What we write reads back as the same configuration.
  const auto again = ModelConfig::from_json_string(c.to_json_string(), "round");
  CHECK(again.to_json_string() == c.to_json_string());
  CHECK(again.head_dim == 8);
  CHECK(again.tie_word_embeddings);
}

TEST_CASE("config: explicit fields, Mistral, chat template and written file", "[config]") {
  const auto m =
      ModelConfig::from_json_string(mistral(R"("architectures": null, "num_key_value_heads": 2,
              "head_dim": null, "tie_word_embeddings": true, "bos_token_id": 3,
              "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
              "promptcache_chat_template": "chatml", "sliding_window": 4096)"),
                                    "m.json");
  CHECK(m.architecture == "MistralForCausalLM");
  CHECK(m.model_type == "mistral");
  CHECK(m.num_key_value_heads == 2);
  CHECK(m.head_dim == 8);  // null: hidden / heads
  CHECK(m.bos_token_id == 3);
  CHECK(m.max_position_embeddings == 4096);
  CHECK(m.torch_dtype == "bfloat16");
  CHECK(m.chat_template == "chatml");
  // An explicit head_dim need not equal hidden / heads.
  const auto wide = ModelConfig::from_json_string(with(R"("head_dim": 16)"), "c");
  CHECK(wide.head_dim == 16);
  const auto single_eos = ModelConfig::from_json_string(with(R"("eos_token_id": 5)"), "c");
  CHECK(single_eos.eos_token_ids == std::vector<int64_t>{5});
  const auto lin = ModelConfig::from_json_string(
      with(R"("rope_scaling": {"rope_type": "linear", "factor": 2.5})"), "c");
  const auto lin2 = ModelConfig::from_json_string(lin.to_json_string(), "c");
  CHECK(lin2.rope_scaling.type == RopeScaling::Type::kLinear);
  CHECK(lin2.rope_scaling.factor == 2.5);

  // to_json_string -> file -> from_json_file keeps everything, including the chat template.
  test::TempDir dir;
  { std::ofstream(dir.file("config.json")) << m.to_json_string(); }
  const auto back = ModelConfig::from_json_file(dir.file("config.json"));
  CHECK(back.to_json_string() == m.to_json_string());
  CHECK(back.chat_template == "chatml");
  CHECK(back.architecture == "MistralForCausalLM");
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
      {with(R"("num_attention_heads": 7)"), "num_attention_heads"},
      {with(R"("intermediate_size": 0)"), "intermediate_size"},
      {with(R"("num_hidden_layers": -2)"), "num_hidden_layers"},
      {with(R"("tie_word_embeddings": "yes")"), "tie_word_embeddings"},
      {with(R"("rms_norm_eps": "small")"), "rms_norm_eps"},
      {with(R"("eos_token_id": ["two"])"), "eos_token_id"},
      {with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"), "low_freq_factor"},
      {with(R"("rope_scaling": {"type": "linear"})"), "factor"},
      {"[1, 2]", "JSON object"},
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
  // An unknown architecture says which ones are supported.
  CHECK_THROWS_WITH(
      ModelConfig::from_json_string(R"({"architectures": ["GPT2LMHeadModel"]})", "c.json"),
      Catch::Contains("LlamaForCausalLM") && Catch::Contains("MistralForCausalLM"));
  CHECK_THROWS_WITH(ModelConfig::from_json_file("/nonexistent/config.json"),
                    Catch::Contains("/nonexistent/config.json"));
}
