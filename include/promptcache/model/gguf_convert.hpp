// promptcache/model/gguf_convert.hpp — `promptcache convert`: a HuggingFace folder to one GGUF
// file, with llama.cpp's metadata keys, tensor names and Q/K permutation, each tensor in the type
// the chosen file type gives it (as llama.cpp's converter and llama_model_quantize choose), and
// the quantization error of every tensor.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "promptcache/model/config.hpp"

namespace promptcache::gguf {

enum class FileType { kF32, kF16, kBF16, kQ8_0, kQ4_K, kQ6_K, kQ4_K_M };

// "f32", "f16", "bf16", "q8_0", "q4_k", "q6_k", "q4_k_m"; Error(kInvalidArgument) otherwise.
FileType parse_file_type(const std::string& text);
std::string file_type_name(FileType type);

// The ggml type id a tensor gets (`gguf_name` as llama.cpp names it, `shape` in LibTorch's order
// [rows, columns]): vectors (norms, biases) stay F32; f16/bf16/f32 files store matrices so;
// q8_0, q4_k and q6_k quantize every matrix; q4_k_m as llama_model_quantize's
// LLAMA_FTYPE_MOSTLY_Q4_K_M: Q4_K except Q6_K for output.weight (token_embd.weight when the
// embeddings are tied) and for attn_v / ffn_down of the layers use_more_bits picks (the first
// and last eighth, and every third between). A row length that is no whole number of blocks
// falls back as llama.cpp's does (llama_tensor_get_type): Q8_0 -> F16, Q4_K -> Q5_0,
// Q6_K -> Q8_0, or F16 when not even a 32-block fits.
uint32_t plan_tensor_type(FileType type, const std::string& gguf_name,
                          const std::vector<int64_t>& shape, int64_t num_layers, bool tied);

struct TensorReport {
  std::string name;  // llama.cpp's
  std::string type;  // ggml's name ("Q8_0")
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  // ||stored - original|| / ||original|| over the tensor, and max |stored - original|, against
  // the folder's values in f32 (0 for a type that holds them exactly).
  double rms_relative_error = 0;
  double max_abs_error = 0;
};

// The tensors stored as one ggml type, together: ||stored - original|| / ||original|| over all
// their elements, the worst tensor's, and the largest |stored - original|.
struct TypeReport {
  std::string type;  // ggml's name ("Q4_K")
  int64_t tensors = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
  double rms_relative_error = 0;
  double worst_rms_relative_error = 0;
  double max_abs_error = 0;
};

struct ConvertReport {
  std::string out;
  FileType type = FileType::kF16;
  int64_t file_bytes = 0;
  std::vector<TensorReport> tensors;
  std::vector<TypeReport> types;  // in ggml's id order
};

// Converts `dir` (config.json, *.safetensors, tokenizer.json or tokenizer.model) to `out`.
// Error(kModel) for a folder tensor with no llama.cpp name. Q4_K and Q6_K blocks come from
// ggml::quantize (ggml_quant.hpp: valid ggml blocks, its own scale search).
ConvertReport convert_folder(const std::string& dir, const std::string& out, FileType type);

}  // namespace promptcache::gguf
