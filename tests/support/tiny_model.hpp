// A tiny random Llama (GQA) with a SentencePiece tokenizer trained on the built-in corpus, made
// once per test process.
#pragma once

#include <cstdlib>
#include <memory>

#include "promptcache/builtin_data.hpp"
#include "promptcache/engine.hpp"
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

inline std::unique_ptr<LlamaModel> tiny_model(std::uint64_t seed = 1, double init_std = 0.15) {
  const ModelConfig c = tiny_config();
  return LlamaModel::from_tensors(c, random_llama_weights(c, seed, init_std), test_load_options());
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
  return Engine::open(checked_stories260k_dir(), options);
}

}  // namespace promptcache::test
