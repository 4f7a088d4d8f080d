// promptcache/model/synthetic.hpp — deterministic random Llama checkpoints for tests and
// benchmarks.
//
// Speed does not depend on the weights' values, and correctness contracts hold for any weights,
// so tests and benchmarks make their own models instead of downloading one.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "promptcache/model/config.hpp"

namespace promptcache {

// "tiny" (hidden 64, 2 layers, GQA 4/2 heads), "bench-small" (hidden 768, 12 layers, 12/4 heads,
// ffn 2048, vocab 32000) or "tinyllama-1.1b" (hidden 2048, 22 layers, 32/4 heads, ffn 5632).
// Error(kInvalidArgument) listing the known shapes otherwise.
ModelConfig synthetic_config(const std::string& shape);
std::vector<std::string> synthetic_shapes();

// Random weights with HF names: N(0, init_std) matrices, norms near 1. Same seed, same weights.
std::map<std::string, torch::Tensor> random_llama_weights(const ModelConfig& config,
                                                          std::uint64_t seed,
                                                          double init_std = 0.02,
                                                          torch::Dtype dtype = torch::kFloat32);

// Writes config.json and model.safetensors into dir (created if needed).
void write_model_folder(const std::string& dir, const ModelConfig& config,
                        const std::map<std::string, torch::Tensor>& weights);

// The whole `promptcache make-model`: config + random weights + a SentencePiece tokenizer.model
// trained on the built-in corpus (its vocabulary may be smaller than the model's).
void make_synthetic_model(const std::string& dir, const std::string& shape, std::uint64_t seed,
                          torch::Dtype dtype = torch::kFloat32);

}  // namespace promptcache
