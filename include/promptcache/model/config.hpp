// promptcache/model/config.hpp — the Llama-family model configuration (HF config.json).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace promptcache {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 } type = Type::kNone;
  double factor = 1.0;
  // llama3 only
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // or MistralForCausalLM
  std::string model_type = "llama";
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};
  std::string torch_dtype = "float32";
  // Chat template family for PML chat tags ("llama-2", "chatml", "plain"); from config or guessed.
  std::string chat_template = "llama-2";

  // Parses a config.json file; Error(kModel) naming the file and the field on any problem
  // (missing field, wrong type, heads not dividing hidden size, kv heads not dividing heads, ...).
  static ModelConfig from_json_file(const std::string& path);
  static ModelConfig from_json_string(const std::string& json, const std::string& origin);
  std::string to_json_string() const;  // HF-compatible config.json text
  void validate(const std::string& origin) const;
};

}  // namespace promptcache
