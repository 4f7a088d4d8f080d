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
// ffn 2048, vocab 32000) or "tinyllama-1.1b" (hidden 2048, 22 layers, 32/4 heads, ffn 5632); and
// one tiny shape per family, each with its family's switches on: "qwen2-tiny" (q/k/v biases, tied
// embeddings), "qwen3-tiny" (q/k norms, head_dim 32 with hidden 64 / 4 heads), "llama3-tiny"
// (llama3 RoPE scaling), "mistral-tiny" (a sliding window of 24), "bloom-tiny" (ALiBi with 6
// heads, LayerNorms, fused QKV, GELU), "mpt-tiny" (ALiBi with MPT's slopes, no biases),
// "falcon-tiny" (Falcon-7B's parallel block, multi-query, rotary).
// Error(kInvalidArgument) listing the known shapes otherwise.
ModelConfig synthetic_config(const std::string& shape);
std::vector<std::string> synthetic_shapes();

// Random weights with HF names: N(0, init_std) matrices and biases, norms near 1. Same seed,
// same weights. BLOOM, MPT and Falcon configs get their checkpoints' own names (fused QKV).
std::map<std::string, torch::Tensor> random_llama_weights(const ModelConfig& config,
                                                          std::uint64_t seed,
                                                          double init_std = 0.02,
                                                          torch::Dtype dtype = torch::kFloat32);

// Writes config.json and model.safetensors into dir (created if needed).
void write_model_folder(const std::string& dir, const ModelConfig& config,
                        const std::map<std::string, torch::Tensor>& weights);

// "bpe" for the shapes whose family ships a byte-level BPE tokenizer.json (qwen2-tiny,
// qwen3-tiny, llama3-tiny, bloom-tiny, mpt-tiny, falcon-tiny), else "sentencepiece".
std::string synthetic_tokenizer_kind(const std::string& shape);

// The whole `promptcache make-model`: config + random weights + a tokenizer. The tokenizer is a
// copy of `tokenizer_file` (tokenizer.json or tokenizer.model, with the tokenizer_config.json
// and generation_config.json beside it) when given, else one trained on the built-in corpus of
// the shape's kind (synthetic_tokenizer_kind; BPE ones with the family's special tokens). The
// model's vocabulary is widened to the tokenizer's, and its BOS/EOS ids are the tokenizer's.
void make_synthetic_model(const std::string& dir, const std::string& shape, std::uint64_t seed,
                          torch::Dtype dtype = torch::kFloat32,
                          const std::string& tokenizer_file = "");

}  // namespace promptcache
