// The Prompt Cache contracts on a model of GGML block-quantized weights (promptcache/model/
// ggml_quant.hpp), mixed as llama.cpp's Q4_K_M mixes them: Q4_K projections, Q6_K for v_proj and
// down_proj and lm_head, a Q4_K embedding table. Its logits match the model of its dequantized
// f32 weights within the rounding of activations to 8 bits; prefix-exact and batch-exact hold
// with the f32 tolerances (every path of a quantized linear multiplies the same rounded x, so a
// row's result does not depend on how many rows its call has).
#include "support/catch_torch.hpp"

#include <map>

#include "promptcache/engine.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/synthetic.hpp"
#include "support/contract_checks.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

// The tiny shape widened to K-quant rows (multiples of 256 inputs everywhere).
ModelConfig quant_config() {
  ModelConfig c = test::tiny_config();
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.tie_word_embeddings = false;
  return c;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

ggml::Type mixed_type(const std::string& name) {
  if (ends_with(name, "v_proj.weight") || ends_with(name, "down_proj.weight") ||
      name == "lm_head.weight") {
    return ggml::Type::Q6_K;
  }
  return ggml::Type::Q4_K;
}

// The random weights with every matrix in blocks (`dequantized`: the f32 values they stand for).
std::map<std::string, torch::Tensor> quantized_weights(const ModelConfig& c, bool dequantized) {
  auto w = random_llama_weights(c, 21, 0.1);
  for (auto& [name, t] : w) {
    if (t.dim() != 2) continue;
    auto q = ggml::quantize(t, mixed_type(name));
    t = dequantized ? ggml::dequantize(q) : q;
  }
  return w;
}

std::unique_ptr<LlamaModel> quant_model(bool dequantized) {
  return LlamaModel::from_tensors(quant_config(), quantized_weights(quant_config(), dequantized),
                                  LoadOptions{});
}

std::unique_ptr<Engine> quant_engine() {
  EngineOptions options;
  options.chat_template = "llama-2";
  return std::make_unique<Engine>(
      quant_model(false), load_sentencepiece_tokenizer(test::tiny_tokenizer_path()), options);
}

double max_diff(const torch::Tensor& x, const torch::Tensor& y) {
  return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
}

}  // namespace

TEST_CASE("quantized model: Q4_K/Q6_K blocks load and match the dequantized f32 model",
          "[contract][ggml_quant]") {
  const auto blocks = quant_model(false);
  const auto dense = quant_model(true);
  // Block tensors are kept as they are: Q4_K 0.5625 and Q6_K 0.8203 bytes a weight.
  CHECK(blocks->weight_bytes() * 4 < dense->weight_bytes());
  for (int64_t n : {1, 5, 40, 160}) {
    torch::manual_seed(n);
    const auto ids = torch::randint(0, 400, {1, n}, torch::kInt64);
    const auto positions = torch::arange(n, torch::kInt64).unsqueeze(0);
    KVCache a = blocks->make_cache(n), b = dense->make_cache(n);
    const auto got = blocks->forward(ids, positions, a);
    const auto want = dense->forward(ids, positions, b);
    // The only difference: activations rounded to 8 bits before every quantized linear.
    const double rel = max_diff(got, want) / want.abs().max().item<double>();
    WARN(n << " tokens: max |logit diff| / max |logit| = " << rel);
    CHECK(rel < 0.06);  // measured 3.1-5.1% on these shapes
    // The same tokens in two calls (n - 1, then 1): the last token's logits as in one call, to
    // f32 rounding (the integer kernels' rows do not depend on the other rows of the call).
    if (n > 1) {
      KVCache c = blocks->make_cache(n);
      blocks->forward(ids.narrow(1, 0, n - 1), positions.narrow(1, 0, n - 1), c);
      const auto last = blocks->forward(ids.narrow(1, n - 1, 1), positions.narrow(1, n - 1, 1), c);
      CHECK(max_diff(last, got) <= 1e-5);
    }
  }
  // Shapes are checked against config.json.
  auto w = quantized_weights(quant_config(), false);
  w["model.layers.0.mlp.up_proj.weight"] =
      ggml::quantize(torch::randn({512, 512}), ggml::Type::Q4_K);
  CHECK_THROWS_AS(LlamaModel::from_tensors(quant_config(), w, LoadOptions{}), Error);
}

TEST_CASE("quantized model: prefix-exact", "[contract][prefix][ggml_quant]") {
  auto engine = quant_engine();
  CHECK(test::check_prefix_exact(*engine).size() == 2u);
}

TEST_CASE("quantized model: batch-exact", "[contract][batch][ggml_quant]") {
  auto engine = quant_engine();
  CHECK(test::check_batch_exact(*engine, 4, 5) >= 2);
}
