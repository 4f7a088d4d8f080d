// src/model/layer_ops.hpp — the pieces of a decoder layer that the loader, the attention paths
// and the forward pass share (norms, biases, rotary embeddings, shape text). Private to the
// library: declared here once instead of copied into each unit that needs them.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "promptcache/model/config.hpp"
#include "promptcache/model/kv_cache.hpp"
#include "promptcache/model/llama.hpp"

namespace promptcache::layer_ops {

// "[2, 3]"
std::string shape_string(at::IntArrayRef shape);
// HF's LlamaRMSNorm: computed in f32, weight applied in x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// A linear layer's output plus its bias, in place (the output is the forward's own tensor).
torch::Tensor with_bias(torch::Tensor y, const torch::Tensor& bias);
// RMSNorm over each head of a projection's output x [b, n, heads * d] (Qwen3's q_norm/k_norm).
torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& weight, int64_t heads,
                        double eps, bool small_ops);
// LayerNorm over the last axis (BLOOM, MPT, Falcon), computed in f32; bias may be undefined.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps);
// The position of every slot a forward of n new tokens at `positions` ([b or 1, n]) attends to:
// int64 [b, cache length + n] on the CPU, the cache's recorded positions of each batch row
// (-1 for a slot the row leaves empty), then the new tokens'. What the sliding window and ALiBi
// read.
torch::Tensor slot_positions(const torch::Tensor& positions, const KVCache& cache, int64_t n);
// HF's rotate_half: [-x2, x1] of the two halves of the last axis.
torch::Tensor rotate_half(const torch::Tensor& x);
// RoPE's inverse frequencies [head_dim / 2] (float32), rope_scaling applied.
torch::Tensor inverse_frequencies(const ModelConfig& c);
// Whether a model made with `impl` on `device` runs scaled_dot_product_attention (see
// layer_ops.cpp); Error(kInvalidArgument) for SDPA on LibTorch 1.x or a bad
// PROMPTCACHE_ATTENTION.
bool resolve_sdpa(AttentionImpl impl, const torch::Device& device, const std::string& origin);

}  // namespace promptcache::layer_ops
