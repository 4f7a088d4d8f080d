// Weights kept in bf16 or f16 with f32 compute on the CPU (LoadOptions::weights): the forward
// equals the f32 model on the same rounded weights, the weights take half the bytes, and the
// real stories260K model converted to bf16 by the test keeps its greedy output.
#include <nlohmann/json.hpp>
#include "support/catch_torch.hpp"

#include <algorithm>
#include <fstream>
#include <random>

#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/cpu_kernels.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;
using test::KernelGuard;

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

// Short (few-row kernels) and long (GEMM path) inputs, then decoding steps after them: the
// model's logits within `tolerance` of the reference's (times the largest reference logit when
// `relative`). Returns the largest difference seen (relative or not, as checked).
double check_same_forward(const LlamaModel& model, const LlamaModel& reference, int64_t vocab,
                          double tolerance = 1e-4, bool relative = false) {
  double worst = 0.0;
  auto off = [&](const torch::Tensor& got, const torch::Tensor& want) {
    const double diff = (got - want).abs().max().item<double>();
    const double d = relative ? diff / want.abs().max().item<double>() : diff;
    worst = std::max(worst, d);
    return d;
  };
  for (int64_t n : {5, 16, 100}) {
    std::mt19937 rng(static_cast<std::uint32_t>(n));
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(rng() % vocab);
    ForwardOptions all;
    all.all_logits = true;
    KVCache a = model.make_cache(n + 4), b = reference.make_cache(n + 4);
    const auto ids_t = torch::tensor(ids).unsqueeze(0);
    const auto pos = torch::arange(n).unsqueeze(0);
    const auto got = model.forward(ids_t, pos, a, all);
    const auto expected = reference.forward(ids_t, pos, b, all);
    INFO("n " << n);
    CHECK(off(got, expected) <= tolerance);
    for (int64_t t = 0; t < 3; ++t) {
      const auto step_ids = torch::tensor({ids[t]}).unsqueeze(0);
      const auto step_pos = torch::tensor({n + t}).unsqueeze(0);
      const auto x = model.forward(step_ids, step_pos, a);
      const auto y = reference.forward(step_ids, step_pos, b);
      CHECK(off(x, y) <= tolerance);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("bf16 and f16 weights with f32 compute equal f32 on the rounded weights",
          "[llama][weights]") {
  // The widening kernels (f32 products of the converted weights); the avx512-bf16 kernel, which
  // rounds x to bf16 as well, is checked in the next test.
  KernelGuard guard;
  if (cpu_linear_kernel() == CpuLinearKernel::kAvx512Bf16) {
    REQUIRE(select_cpu_linear(CpuLinearKernel::kAvx512));
  }
  for (const std::string shape : {"tiny", "qwen2-tiny", "qwen3-tiny"}) {
    for (torch::Dtype dtype : {torch::kBFloat16, torch::kFloat16}) {
      INFO(shape << " weights " << dtype_name(dtype));
      ModelConfig c = synthetic_config(shape);
      c.vocab_size = 97;
      const auto w = random_llama_weights(c, 21, 0.15);
      LoadOptions reduced;
      reduced.weights = dtype;
      reduced.kv_dtype = torch::kFloat32;  // the weights alone (16-bit states would follow them)
      // Stored in the reduced dtype (as a bf16 checkpoint is): kept as it is.
      const auto model = LlamaModel::from_tensors(c, stored_as(w, dtype), reduced);
      const auto reference = LlamaModel::from_tensors(c, rounded(w, dtype));
      CHECK(model->weight_dtype() == dtype);
      CHECK(model->dtype() == torch::kFloat32);
      // Matrices take half the bytes; the f32 norms and biases are a sliver.
      CHECK(model->weight_bytes() < reference->weight_bytes() * 0.52);
      check_same_forward(*model, *reference, c.vocab_size);
    }
  }
}

TEST_CASE("bf16 weights under avx512-bf16 (x rounded to bf16) stay close to f32",
          "[llama][weights][bf16dot]") {
  KernelGuard guard;
  if (!select_cpu_linear(CpuLinearKernel::kAvx512Bf16)) {
    WARN(
        "SKIPPED: this processor or build lacks AVX512_BF16 (vdpbf16ps): the avx512-bf16 "
        "forward is not tested here");
    return;
  }
  for (const std::string shape : {"tiny", "qwen2-tiny", "qwen3-tiny"}) {
    INFO(shape);
    ModelConfig c = synthetic_config(shape);
    c.vocab_size = 97;
    const auto w = random_llama_weights(c, 21, 0.15);
    LoadOptions reduced;
    reduced.weights = torch::kBFloat16;
    const auto model = LlamaModel::from_tensors(c, stored_as(w, torch::kBFloat16), reduced);
    const auto reference = LlamaModel::from_tensors(c, rounded(w, torch::kBFloat16));
    // Every linear's input rounded to bf16 (relative 2^-8 at most): on these random models
    // (weights of std 0.15, which amplify) the logits moved by 1.0-1.7% of the largest logit
    // (measured 2026-12-07); 5% leaves room for other seeds, and catches a wrong sum.
    const double worst = check_same_forward(*model, *reference, c.vocab_size, 5e-2, true);
    WARN(shape << ": avx512-bf16 logits within " << worst << " of the largest f32 logit");
  }
}

TEST_CASE("q8 weights with f32 compute equal f32 on the dequantized weights",
          "[llama][weights][q8]") {
  for (const std::string shape : {"tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny"}) {
    INFO(shape);
    ModelConfig c = synthetic_config(shape);
    c.vocab_size = 97;
    const auto w = random_llama_weights(c, 23, 0.15);
    // What the quantized model multiplies by: every matrix through q8 and back.
    std::map<std::string, torch::Tensor> dequantized;
    for (const auto& [name, t] : w) {
      dequantized[name] = t.dim() == 2 ? dequantize_q8(quantize_q8(t), t.size(1)) : t;
    }
    LoadOptions q8;
    q8.weights = parse_weight_dtype("q8");
    const auto model = LlamaModel::from_tensors(c, w, q8);
    const auto reference = LlamaModel::from_tensors(c, dequantized);
    CHECK(model->weight_dtype() == torch::kInt8);
    CHECK(dtype_name(model->weight_dtype()) == "q8");
    // 1 + 2/32 bytes a weight against 4.
    CHECK(model->weight_bytes() < reference->weight_bytes() * 0.28);
    {
      // The reference path (kernels off): f32 x times the dequantized weights, to f32 rounding.
      KernelGuard guard;
      select_cpu_linear(CpuLinearKernel::kNone);
      check_same_forward(*model, *reference, c.vocab_size);
    }
    // The kernels: up to 12 rows x is rounded to 8 bits per block of 32 too (llama.cpp's Q8_0
    // dot product), which moved these logits by up to 3.5% of the largest (hidden size 64).
    check_same_forward(*model, *reference, c.vocab_size, 0.06, /*relative=*/true);
  }
  CHECK_THROWS_WITH(parse_weight_dtype("q4"), Catch::Contains("use f32, bf16, f16 or q8"));
  CHECK_THROWS_WITH(parse_dtype("q8"), Catch::Contains("unknown dtype 'q8'"));
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
  o.weights = torch::kInt8;
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, o, "m"),
                    Catch::Contains("weights in q8 with bf16 compute"));
}

TEST_CASE("stories260K with bf16 weights keeps the reference's greedy output",
          "[stories260k][weights]") {
  // Converted by the test: a bf16 copy of the checkpoint, loaded as a bf16 folder is.
  const std::string dir = test::checked_stories260k_dir();
  test::TempDir bf16_dir("promptcache-bf16");
  test::write_converted_folder(dir, bf16_dir, torch::kBFloat16);
  std::ifstream in(dir + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  LoadOptions options;
  options.weights = torch::kBFloat16;
  options.kv_dtype = torch::kFloat32;  // the weights alone (tests/model/test_default_dtypes.cpp
                                       // has them with the bf16 states that follow by default)
  const auto model = LlamaModel::load(bf16_dir.path().string(), options);
  CHECK(model->weight_dtype() == torch::kBFloat16);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  const auto prompt = tok->encode(ref["prompt"].get<std::string>(), /*add_bos=*/true);
  SamplingParams params;
  params.max_new_tokens = ref["greedy_new_tokens"].get<int>();
  params.stop_at_eos = false;
  const auto expected = ref["greedy_ids"].get<std::vector<TokenId>>();
  // The default kernel, and where it is avx512-bf16 (x rounded to bf16) the widening one too.
  KernelGuard guard;
  std::vector<CpuLinearKernel> kernels{cpu_linear_kernel()};
  if (kernels[0] == CpuLinearKernel::kAvx512Bf16) kernels.push_back(CpuLinearKernel::kAvx512);
  for (const CpuLinearKernel kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    INFO("CPU kernels " << cpu_linear_name(kernel));
    const auto result = generate(*model, *tok, prompt, params);
    std::size_t same = 0;
    while (same < expected.size() && same < result.tokens.size() &&
           result.tokens[same] == expected[same]) {
      ++same;
    }
    WARN("stories260K bf16 weights, CPU kernels " << cpu_linear_name(kernel) << ": " << same
                                                  << " of " << expected.size()
                                                  << " greedy tokens equal the f32 reference");
    CHECK(result.tokens == expected);
  }
}

TEST_CASE("stories260K with q8 weights stays close to the f32 reference",
          "[stories260k][weights][q8]") {
  const std::string dir = test::checked_stories260k_dir();
  std::ifstream in(dir + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  LoadOptions options;
  options.weights = torch::kInt8;
  const auto model = LlamaModel::load(dir, options);
  const auto f32 = LlamaModel::load(dir);
  // 8-bit weights take about a quarter of the f32 bytes.
  CHECK(model->weight_bytes() < f32->weight_bytes() * 0.3);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  const auto prompt = tok->encode(ref["prompt"].get<std::string>(), /*add_bos=*/true);
  const auto expected = ref["greedy_ids"].get<std::vector<TokenId>>();
  // Teacher-forced along the reference's greedy ids: the q8 logits beside the f32 logits at
  // every step, so one near-tie cannot hide how close the rest is.
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), expected.begin(), expected.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  ForwardOptions all;
  all.all_logits = true;
  KVCache a = model->make_cache(n), b = f32->make_cache(n);
  const auto ids_t = torch::tensor(ids).unsqueeze(0);
  const auto pos = torch::arange(n).unsqueeze(0);
  const auto got = model->forward(ids_t, pos, a, all)[0];
  const auto want = f32->forward(ids_t, pos, b, all)[0];
  const auto steps = static_cast<int64_t>(expected.size());
  const auto got_steps = got.narrow(0, n - steps - 1, steps);
  const auto want_steps = want.narrow(0, n - steps - 1, steps);
  const int64_t agree = (got_steps.argmax(-1) == want_steps.argmax(-1)).sum().item<int64_t>();
  const double max_diff = (got_steps - want_steps).abs().max().item<double>();
  const double spread = want_steps.std().item<double>();
  WARN("stories260K q8 weights: teacher-forced top-1 equals f32 at "
       << agree << " of " << steps << " steps; max |logit diff| " << max_diff << " (logit std "
       << spread << ")");
  CHECK(agree >= steps - 2);
  CHECK(max_diff < 0.1 * spread);
  // Free-running greedy: report where it first leaves the reference.
  SamplingParams params;
  params.max_new_tokens = static_cast<int>(steps);
  params.stop_at_eos = false;
  const auto result = generate(*model, *tok, prompt, params);
  std::size_t same = 0;
  while (same < expected.size() && same < result.tokens.size() &&
         result.tokens[same] == expected[same]) {
    ++same;
  }
  WARN("stories260K q8 weights: " << same << " of " << expected.size()
                                  << " free-running greedy tokens equal the f32 reference");
  CHECK(same >= 8);
}
