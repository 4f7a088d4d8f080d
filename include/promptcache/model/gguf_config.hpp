// promptcache/model/gguf_config.hpp — a GGUF file's hyper-parameters as a ModelConfig (and back,
// for `promptcache convert`), with llama.cpp's key names. LibTorch-free (promptcache_core).
//
// Architectures: llama (Llama 2/3.x; Mistral: llama with <arch>.attention.sliding_window), qwen2
// (q/k/v biases), qwen3 (per-head q/k norms, attention.key_length as head_dim).
#pragma once

#include <string>

#include "promptcache/model/config.hpp"
#include "promptcache/model/gguf.hpp"

namespace promptcache::gguf {

// The config the metadata describes: general.architecture and the <arch>.* hyper-parameters
// (context_length, embedding_length, block_count, feed_forward_length, attention.head_count,
// attention.head_count_kv, attention.key_length, attention.layer_norm_rms_epsilon,
// rope.freq_base, rope.dimension_count, rope.scaling.type/factor, attention.sliding_window);
// vocab_size and tie_word_embeddings from token_embd.weight / output.weight; BOS/EOS from
// tokenizer.ggml.*. Error(kModel) naming the file and key when one is missing or unsupported.
ModelConfig config_from_file(const File& file);

// general.architecture for a config ("llama", "qwen2", "qwen3"), and the keys config_from_file
// reads back. Error(kInvalidArgument) for what GGUF has no key for here (llama3 RoPE scaling,
// per-layer sliding windows).
std::string architecture_of(const ModelConfig& config);
void put_config(Writer& writer, const ModelConfig& config);

// The config of a model folder (config.json) or of a GGUF file.
ModelConfig load_model_config(const std::string& folder_or_file);

}  // namespace promptcache::gguf
