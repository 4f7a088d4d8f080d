// promptcache/model/ggml_quant.hpp — GGML's block-quantized weight types (Q4_0, Q5_0, Q5_1, Q8_0,
// Q4_K, Q5_K, Q6_K), kept in memory as the file's blocks verbatim.
//
// A GGUF file stores a quantized matrix [n, k] as n rows of k / block_elements(t) blocks of
// block_bytes(t) bytes each, in GGML's own layouts. Keeping those bytes as they are, as one uint8
// tensor [n, k / block_elements(t), block_bytes(t)], lets a weight be a view of a memory-mapped
// file, and the CPU kernels (linear_layer, promptcache/model/cpu_linear.hpp) compute from the
// blocks directly. The last dimension identifies the type: 18 Q4_0, 22 Q5_0, 24 Q5_1, 34 Q8_0,
// 144 Q4_K, 176 Q5_K, 210 Q6_K. Bytes per weight: Q4_0 0.5625, Q5_0 0.6875, Q5_1 0.75, Q8_0
// 1.0625, Q4_K 0.5625, Q5_K 0.6875, Q6_K 0.8203. Q5_0 and Q5_1 are what llama.cpp's quantizer
// writes for Q4_K and Q5_K rows of no whole 256-block (its llama_tensor_get_type fallbacks).
//
// dequantize() is the scalar reference that defines each format (checked bit-exactly against
// llama.cpp's gguf-py, tests/model/test_ggml_quant.cpp). quantize() makes valid blocks with a
// scale search of its own (not bit-identical to ggml's quantizer); its RMS relative error on
// N(0, 1) rows is tested against the bounds in docs/architecture.md.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace promptcache::ggml {

// GGML's own type ids (as stored in GGUF tensor infos).
enum class Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30
};

std::string_view type_name(Type);            // "F32", "Q4_K", ...
std::optional<Type> type_from_id(uint32_t);  // nullopt for ids this build does not know
int64_t block_elements(Type);                // 1,1,32,32,32,32,256,256,256,1
int64_t block_bytes(Type);                   // 4,2,18,22,24,34,144,176,210,2

// A block-quantized matrix [n, k] in memory: a uint8 tensor [n, k / block_elements(t),
// block_bytes(t)] holding the file's blocks verbatim (so it can be a view of a memory-mapped GGUF
// file). The last dimension identifies the type (18 Q4_0, 22 Q5_0, 24 Q5_1, 34 Q8_0, 144 Q4_K,
// 176 Q5_K, 210 Q6_K).
// nullopt for any other tensor (a float weight, the 2-D int8 Q8 layout of q8_weights.hpp, ...).
std::optional<Type> quant_type_of(const torch::Tensor& weight);

// w [n, k] any float dtype -> uint8 [n, k/B, bytes]; k % B == 0 else kInvalidArgument (also for
// a type that is not block-quantized, or a w that is not 2-D). The result is on the CPU.
torch::Tensor quantize(const torch::Tensor& w, Type t);

// -> f32 [n, k] (CPU); kInvalidArgument for a tensor quant_type_of() does not recognize.
torch::Tensor dequantize(const torch::Tensor& q);

}  // namespace promptcache::ggml
