// A tiny random Llama (GQA) with a SentencePiece tokenizer trained on the built-in corpus, made
// once per test process.
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include "promptcache/builtin_data.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "support/catch_torch.hpp"
#include "support/test_support.hpp"

namespace promptcache::test {

inline const std::string& tiny_tokenizer_path() {
  static TempDir dir("promptcache-tok");
  static const std::string path = [] {
    const std::string p = dir.file("tokenizer.model");
    train_sentencepiece_tokenizer(builtin_corpus(), 400, p);
    return p;
  }();
  return path;
}

inline ModelConfig tiny_config() {
  ModelConfig c = synthetic_config("tiny");
  c.num_hidden_layers = 2;
  return c;
}

// PROMPTCACHE_TEST_DEVICE (cpu, cuda) runs the engine and contract suites on another device
// (scripts/gpu-check.sh sets it); the tolerances are those of f32.
inline LoadOptions test_load_options() {
  LoadOptions o;
  if (const char* d = std::getenv("PROMPTCACHE_TEST_DEVICE")) o.device = parse_device(d);
  return o;
}

// Greedy decoding of n tokens that does not stop at EOS.
inline SamplingParams greedy_params(int n) {
  SamplingParams p;
  p.max_new_tokens = n;
  p.stop_at_eos = false;
  return p;
}

// A copy of the model folder `from` in `to` with every tensor stored in `dtype` (as a folder of
// that dtype ships), config.json and tokenizer.model beside it.
inline std::string write_converted_folder(const std::string& from, const TempDir& to,
                                          torch::Dtype dtype) {
  const auto checkpoint = SafetensorsCheckpoint::open_folder(from);
  std::map<std::string, torch::Tensor> w;
  for (const auto& name : checkpoint.names()) w[name] = checkpoint.tensor(name).to(dtype);
  write_safetensors(to.file("model.safetensors"), w, {{"format", "pt"}});
  for (const char* file : {"config.json", "tokenizer.model"}) {
    if (!std::filesystem::exists(from + "/" + file)) continue;
    std::ifstream in(from + "/" + file, std::ios::binary);
    std::ofstream(to.file(file), std::ios::binary) << in.rdbuf();
  }
  return to.path().string();
}

// PROMPTCACHE_TEST_CHECKPOINT=bf16|f16 stores the tiny model's random weights in that dtype (and
// gives stories260K converted so), loaded with every dtype unset: the engine and contract suites
// then run at the defaults chosen for such a checkpoint (bf16 weights and KV with f32 compute on
// the CPU). ctest runs the contract suite so as contract_tests_bf16_default.
inline std::optional<torch::Dtype> test_checkpoint_dtype() {
  const char* d = std::getenv("PROMPTCACHE_TEST_CHECKPOINT");
  if (d == nullptr || *d == '\0') return std::nullopt;
  return parse_dtype(d);
}
inline std::map<std::string, torch::Tensor> as_test_checkpoint(
    std::map<std::string, torch::Tensor> w) {
  if (const auto dtype = test_checkpoint_dtype()) {
    for (auto& entry : w) entry.second = entry.second.to(*dtype);
  }
  return w;
}

// Whether the model's linear layers take the AVX-512 BF16 dot-product kernel: bf16 weights on the
// CPU with that kernel selected (the default where the processor has AVX512_BF16).
inline bool bf16_dot_products(const LlamaModel& model) {
  return model.device().is_cpu() && model.weight_dtype() == torch::kBFloat16 &&
         cpu_linear_kernel() == CpuLinearKernel::kAvx512Bf16;
}

// Whether the model rounds its numbers to 16 bits on the way: a 16-bit KV cache, or bf16 weights
// multiplied by the AVX-512 BF16 kernel (cpu_linear.hpp), which rounds the activations to bf16.
inline bool rounds_to_16_bits(const LlamaModel& model) {
  if (model.kv_dtype() != torch::kFloat32 && model.kv_dtype() != torch::kFloat64) return true;
  return bf16_dot_products(model);
}

// A logit tolerance of the contract suites: `f32` (what f32 numbers are held to), or, for a model
// that rounds to 16 bits (rounds_to_16_bits), `rounded` times the largest |logit| of `reference`.
// Cached states and those of the one-pass reference come from f32 sums of different orders
// (chunked compile against one pass, few-row kernels against GEMM); rounded to bf16's 8 bits a
// last-bit difference can cross a rounding step, which f32 would keep below 1e-6. With the bf16
// dot products every linear layer's input is rounded too, and such steps add up over the layers:
// `rounded` is then at least 1e-2 (measured up to 4.4e-3 x the largest logit on the tiny models).
inline double logit_tolerance(const LlamaModel& model, const torch::Tensor& reference, double f32,
                              double rounded = 2e-3) {
  if (!rounds_to_16_bits(model)) return f32;
  if (bf16_dot_products(model)) rounded = std::max(rounded, 1e-2);
  return std::max(f32, rounded * reference.abs().max().item<double>());
}

// The same for log-probabilities (a log-softmax moves by at most twice the largest change of its
// logits): `f32`, or 5e-2 for a model that rounds to 16 bits (the tiny models' logits stay below
// 2.5 in magnitude, so twice 1e-2 of them).
inline double logprob_tolerance(const LlamaModel& model, double f32) {
  return rounds_to_16_bits(model) ? std::max(f32, 5e-2) : f32;
}

inline std::unique_ptr<LlamaModel> tiny_model(std::uint64_t seed = 1, double init_std = 0.15) {
  const ModelConfig c = tiny_config();
  return LlamaModel::from_tensors(c, as_test_checkpoint(random_llama_weights(c, seed, init_std)),
                                  test_load_options());
}

inline std::unique_ptr<Engine> tiny_engine(std::uint64_t seed = 1, EngineOptions options = {}) {
  if (options.chat_template.empty()) options.chat_template = "llama-2";
  return std::make_unique<Engine>(tiny_model(seed),
                                  load_sentencepiece_tokenizer(tiny_tokenizer_path()), options);
}

// The engine on the real stories260K model (plain chat template); std::runtime_error when the
// model's files are missing (checked_stories260k_dir).
inline std::unique_ptr<Engine> stories260k_engine() {
  EngineOptions options;
  options.chat_template = "plain";
  options.load = test_load_options();
  if (const auto dtype = test_checkpoint_dtype()) {
    // A copy of the folder stored in that dtype, made once per process.
    static TempDir converted("promptcache-stories-" + dtype_name(*dtype));
    static const std::string folder =
        write_converted_folder(checked_stories260k_dir(), converted, *dtype);
    return Engine::open(folder, options);
  }
  return Engine::open(checked_stories260k_dir(), options);
}

}  // namespace promptcache::test
