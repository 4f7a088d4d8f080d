// Weights kept in bf16 or f16 with f32 compute on the CPU (LoadOptions::weights): the forward
// equals the f32 model on the same rounded weights, the weights take half the bytes, and the
// real stories260K model converted to bf16 by the test keeps its greedy output.
#include <nlohmann/json.hpp>
#include "support/catch_torch.hpp"

#include <fstream>
#include <random>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

// The checkpoint as the reduced dtype stores it (norms and biases too), back in f32: what a
// model loaded from a bf16/f16 checkpoint computes with.
std::map<std::string, torch::Tensor> rounded(const std::map<std::string, torch::Tensor>& w,
                                             torch::Dtype dtype) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : w) out[name] = t.to(dtype).to(torch::kFloat32);
  return out;
}

std::map<std::string, torch::Tensor> stored_as(const std::map<std::string, torch::Tensor>& w,
                                               torch::Dtype dtype) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : w) out[name] = t.to(dtype);
  return out;
}

}  // namespace

TEST_CASE("bf16 and f16 weights with f32 compute equal f32 on the rounded weights",
          "[llama][weights]") {
  for (const std::string shape : {"tiny", "qwen2-tiny", "qwen3-tiny"}) {
    for (torch::Dtype dtype : {torch::kBFloat16, torch::kFloat16}) {
      INFO(shape << " weights " << dtype_name(dtype));
      ModelConfig c = synthetic_config(shape);
      c.vocab_size = 97;
      const auto w = random_llama_weights(c, 21, 0.15);
      LoadOptions reduced;
      reduced.weights = dtype;
      // Stored in the reduced dtype (as a bf16 checkpoint is): kept as it is.
      const auto model = LlamaModel::from_tensors(c, stored_as(w, dtype), reduced);
      const auto reference = LlamaModel::from_tensors(c, rounded(w, dtype));
      CHECK(model->weight_dtype() == dtype);
      CHECK(model->dtype() == torch::kFloat32);
      // Matrices take half the bytes; the f32 norms and biases are a sliver.
      CHECK(model->weight_bytes() < reference->weight_bytes() * 0.52);
      // Short (few-row kernels) and long (GEMM path) inputs, and decoding steps after them.
      for (int64_t n : {5, 16, 100}) {
        std::mt19937 rng(static_cast<std::uint32_t>(n));
        std::vector<int64_t> ids;
        for (int64_t i = 0; i < n; ++i) ids.push_back(rng() % c.vocab_size);
        ForwardOptions all;
        all.all_logits = true;
        KVCache a = model->make_cache(n + 4), b = reference->make_cache(n + 4);
        const auto ids_t = torch::tensor(ids).unsqueeze(0);
        const auto pos = torch::arange(n).unsqueeze(0);
        const auto got = model->forward(ids_t, pos, a, all);
        const auto expected = reference->forward(ids_t, pos, b, all);
        INFO("n " << n);
        CHECK((got - expected).abs().max().item<double>() <= 1e-4);
        for (int64_t t = 0; t < 3; ++t) {
          const auto step_ids = torch::tensor({ids[t]}).unsqueeze(0);
          const auto step_pos = torch::tensor({n + t}).unsqueeze(0);
          const auto x = model->forward(step_ids, step_pos, a);
          const auto y = reference->forward(step_ids, step_pos, b);
          CHECK((x - y).abs().max().item<double>() <= 1e-4);
        }
      }
    }
  }
}

TEST_CASE("reduced-precision weights are refused where they cannot run", "[llama][weights]") {
  ModelConfig c = synthetic_config("tiny");
  c.vocab_size = 97;
  const auto w = random_llama_weights(c, 1, 0.1);
  LoadOptions o;
  o.dtype = torch::kBFloat16;
  o.weights = torch::kFloat16;
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, o, "m"),
                    Catch::Contains("weights in f16 with bf16 compute"));
}

TEST_CASE("stories260K with bf16 weights keeps the reference's greedy output",
          "[stories260k][weights]") {
  if (!test::have_stories260k()) {
    WARN("SKIPPED: " << test::stories260k_dir() << " is absent; the real-model test needs it");
    return;
  }
  // Converted by the test: a bf16 copy of the checkpoint, loaded as a bf16 folder is.
  const std::string dir = test::stories260k_dir();
  test::TempDir bf16_dir("promptcache-bf16");
  {
    const auto checkpoint = SafetensorsCheckpoint::open_folder(dir);
    std::map<std::string, torch::Tensor> w;
    for (const auto& name : checkpoint.names())
      w[name] = checkpoint.tensor(name).to(torch::kBFloat16);
    write_safetensors(bf16_dir.file("model.safetensors"), w, {{"format", "pt"}});
    std::ifstream config(dir + "/config.json");
    std::ofstream(bf16_dir.file("config.json")) << config.rdbuf();
  }
  std::ifstream in(dir + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  LoadOptions options;
  options.weights = torch::kBFloat16;
  const auto model = LlamaModel::load(bf16_dir.path().string(), options);
  CHECK(model->weight_dtype() == torch::kBFloat16);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  const auto prompt = tok->encode(ref["prompt"].get<std::string>(), /*add_bos=*/true);
  SamplingParams params;
  params.max_new_tokens = ref["greedy_new_tokens"].get<int>();
  params.stop_at_eos = false;
  const auto result = generate(*model, *tok, prompt, params);
  const auto expected = ref["greedy_ids"].get<std::vector<TokenId>>();
  std::size_t same = 0;
  while (same < expected.size() && same < result.tokens.size() &&
         result.tokens[same] == expected[same]) {
    ++same;
  }
  WARN("stories260K bf16 weights: " << same << " of " << expected.size()
                                    << " greedy tokens equal the f32 reference");
  CHECK(result.tokens == expected);
}
