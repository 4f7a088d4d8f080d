// promptcache/model/gguf_model.hpp — a GGUF file as a model: the ModelConfig its metadata
// describes (llama.cpp's key names), its tensors under the HuggingFace names LlamaModel takes
// (llama.cpp's names mapped back, llama's Q/K row permutation undone), and the way back for
// `promptcache convert`. `--model FILE.gguf` goes through here (LlamaModel::load).
//
// Architectures: llama (Llama 2/3.x, Mistral), qwen2, qwen3. Tensor types: F32, F16 and BF16 are
// views of the mapping (copies only where the Q/K permutation is undone, their pages in the
// mapping then dropped); Q4_0, Q4_K, Q5_K and Q6_K are the file's blocks verbatim (ggml_quant.hpp,
// views of the mapping), which linear_layer computes from directly; Q8_0 is repacked into the q8
// layout of q8_weights.hpp in a file without those types (weights default to q8, as a bf16 folder
// keeps bf16) and kept as blocks beside them (Q4_K_M's fallbacks).
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <string>

#include "promptcache/model/config.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_config.hpp"
#include "promptcache/model/llama.hpp"

namespace promptcache::gguf {

// llama.cpp's name of an HF tensor name ("model.layers.3.self_attn.q_proj.weight" ->
// "blk.3.attn_q.weight"), and back; empty when the name has no counterpart.
std::string gguf_tensor_name(const std::string& hf_name);
std::string hf_tensor_name(const std::string& gguf_name);

// llama.cpp's converter stores llama's q_proj / k_proj rows (weights and biases) permuted from
// HF's rotate-half RoPE layout to its interleaved one; the permutation acts on rows only, so it
// applies equally to f32 [n, k] matrices and to block tensors [n, blocks, bytes].
torch::Tensor permute_rows_for_gguf(const torch::Tensor& w, int64_t heads);
torch::Tensor unpermute_rows_from_gguf(const torch::Tensor& w, int64_t heads);

// The file's tensors named and shaped as in an HF checkpoint (torch shapes: GGUF dimensions
// reversed). Block-quantized types come as uint8 [n, k / block, block_bytes] views; Q8_0 as the
// q8 layout (int8 [n, q8_row_bytes(k)]) unless holds_block_types(file).
// Whether the file holds a block type other than Q8_0 (Q4_0, Q4_K, Q5_K, Q6_K).
bool holds_block_types(const File& file);

std::map<std::string, torch::Tensor> hf_tensors(const std::shared_ptr<File>& file,
                                                const ModelConfig& config);

// Q8_0 blocks (an f16 scale, then 32 int8 values) of an [n, k] matrix to the q8 layout of
// q8_weights.hpp and back: the same numbers, arranged per row (values, then scales). k % 32 == 0.
// unpermute_heads > 0: the rows also come out in unpermute_rows_from_gguf's order for that many
// heads (n % (2 * heads) == 0), in the same copy.
torch::Tensor q8_from_q8_0(const uint8_t* blocks, int64_t n, int64_t k,
                           int64_t unpermute_heads = 0);
std::string q8_0_from_q8(const torch::Tensor& q8, int64_t k);

// LlamaModel::load for a GGUF file.
std::unique_ptr<LlamaModel> load_model(const std::string& path, const LoadOptions& options);

}  // namespace promptcache::gguf
