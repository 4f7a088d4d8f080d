#include "promptcache/model/synthetic.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache {

std::vector<std::string> synthetic_shapes() {
  return {"tiny", "bench-small", "tinyllama-1.1b"};
}

ModelConfig synthetic_config(const std::string& shape) {
  ModelConfig c;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (shape == "tiny") {
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.vocab_size = 512;
    c.max_position_embeddings = 2048;
  } else if (shape == "bench-small") {
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_hidden_layers = 12;
    c.num_attention_heads = 12;
    c.num_key_value_heads = 4;
    c.vocab_size = 32000;
    c.max_position_embeddings = 8192;
  } else if (shape == "tinyllama-1.1b") {
    c.hidden_size = 2048;
    c.intermediate_size = 5632;
    c.num_hidden_layers = 22;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 4;
    c.vocab_size = 32000;
    c.max_position_embeddings = 2048;
  } else {
    std::string known;
    for (const auto& s : synthetic_shapes()) known += (known.empty() ? "" : ", ") + s;
    throw Error(ErrorKind::kInvalidArgument,
                "unknown model shape '" + shape + "' (known shapes: " + known + ")");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

std::map<std::string, torch::Tensor> random_llama_weights(const ModelConfig& c, std::uint64_t seed,
                                                          double init_std, torch::Dtype dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  std::map<std::string, torch::Tensor> w;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    w[name] = (at::randn({rows, cols}, gen, f32) * init_std).to(dtype);
  };
  auto norm = [&](const std::string& name) {
    w[name] = (1.0 + 0.1 * at::randn({c.hidden_size}, gen, f32)).to(dtype);
  };
  const int64_t h = c.hidden_size, d = c.head_dim, f = c.intermediate_size;
  matrix("model.embed_tokens.weight", c.vocab_size, h);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    matrix(p + "self_attn.q_proj.weight", c.num_attention_heads * d, h);
    matrix(p + "self_attn.k_proj.weight", c.num_key_value_heads * d, h);
    matrix(p + "self_attn.v_proj.weight", c.num_key_value_heads * d, h);
    matrix(p + "self_attn.o_proj.weight", h, c.num_attention_heads * d);
    matrix(p + "mlp.gate_proj.weight", f, h);
    matrix(p + "mlp.up_proj.weight", f, h);
    matrix(p + "mlp.down_proj.weight", h, f);
  }
  norm("model.norm.weight");
  if (!c.tie_word_embeddings) matrix("lm_head.weight", c.vocab_size, h);
  return w;
}

void write_model_folder(const std::string& dir, const ModelConfig& config,
                        const std::map<std::string, torch::Tensor>& weights) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create folder: " + ec.message(), {dir});
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::ofstream out(config_path);
  out << config.to_json_string() << "\n";
  if (!out) throw Error(ErrorKind::kIo, "cannot write config.json", {config_path});
  write_safetensors((fs::path(dir) / "model.safetensors").string(), weights, {{"format", "pt"}});
}

void make_synthetic_model(const std::string& dir, const std::string& shape, std::uint64_t seed,
                          torch::Dtype dtype) {
  ModelConfig config = synthetic_config(shape);
  config.torch_dtype = dtype == torch::kFloat16    ? "float16"
                       : dtype == torch::kBFloat16 ? "bfloat16"
                                                   : "float32";
  // Small models get larger weights so their attention is peaked and bugs show in the logits.
  const double init_std = shape == "tiny" ? 0.1 : 0.02;
  write_model_folder(dir, config, random_llama_weights(config, seed, init_std, dtype));
  const int tokenizer_vocab = static_cast<int>(std::min<int64_t>(config.vocab_size, 512));
  train_sentencepiece_tokenizer(builtin_corpus(), tokenizer_vocab,
                                (std::filesystem::path(dir) / "tokenizer.model").string());
}

}  // namespace promptcache
