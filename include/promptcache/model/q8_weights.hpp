// promptcache/model/q8_weights.hpp — 8-bit weights (`--weights q8`): blocks of 32 int8 values
// with one f16 scale each, the same scheme as llama.cpp's Q8_0, made from the checkpoint at load.
//
// A quantized matrix [n, k] is one int8 tensor [n, q8_row_bytes(k)]: each row holds its k values,
// then ceil(k / 32) f16 scales (little-endian bits). Keeping a row's scales next to its values
// lets the CPU kernels stream one row as one run of memory, and makes the matrix one tensor that
// moves through the model like any other weight (its dtype, int8, marks it as Q8). Weights take
// 1.0625 bytes each for a k that is a multiple of 32, against 2 in bf16 and 4 in f32.
//
// Quantization: per block, scale = max |w| / 127 (stored as f16) and value = round(w / scale),
// clamped to [-127, 127]; a block of zeros has scale 0. The product value x f16 scale is exact
// in f32, so the kernels multiply by exactly dequantize_q8()'s weights, the reference they are
// tested against.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace promptcache {

constexpr int64_t kQ8BlockSize = 32;

// Bytes of one quantized row of k weights: k values and ceil(k / 32) f16 scales.
constexpr int64_t q8_row_bytes(int64_t k) {
  return k + 2 * ((k + kQ8BlockSize - 1) / kQ8BlockSize);
}

// True for a tensor in the quantized layout (int8, 2-D).
inline bool is_q8(const torch::Tensor& weight) {
  return weight.defined() && weight.scalar_type() == torch::kInt8 && weight.dim() == 2;
}

// w [n, k] (any floating dtype, any device: the result is on the CPU) quantized.
torch::Tensor quantize_q8(const torch::Tensor& w);

// The f32 weights [..., k] a quantized tensor [..., q8_row_bytes(k)] stands for; the rows of
// a 1-D tensor (one row) or 2-D tensor. Throws kInvalidArgument when the width does not fit k.
torch::Tensor dequantize_q8(const torch::Tensor& q, int64_t k);

// The k of a quantized tensor's rows (its width is q8_row_bytes(k)); -1 when no k fits.
int64_t q8_in_features(const torch::Tensor& q);

}  // namespace promptcache
