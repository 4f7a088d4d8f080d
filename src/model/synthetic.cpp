#include "promptcache/model/synthetic.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "families/family_weights.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache {

std::vector<std::string> synthetic_shapes() {
  return {"tiny",        "bench-small",  "tinyllama-1.1b", "qwen2-tiny", "qwen3-tiny",
          "llama3-tiny", "mistral-tiny", "bloom-tiny",     "mpt-tiny",   "falcon-tiny"};
}

namespace {

// The tiny shape every family variant starts from: hidden 64, 2 layers, GQA 4/2 heads.
ModelConfig tiny_config() {
  ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 512;
  c.max_position_embeddings = 2048;
  return c;
}

// The tiny shapes of the families with config keys of their own, as their config.json would
// write them: read through the family's unit, so their traits are the ones a real checkpoint
// gets. Head size 16 (the AVX-512 attention kernel's width).
std::string family_tiny_json(const std::string& shape) {
  if (shape == "bloom-tiny") {  // 6 heads: BLOOM's extra interleaved slopes
    return R"({"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 96,
               "n_layer": 2, "n_head": 6, "vocab_size": 512, "layer_norm_epsilon": 1e-5})";
  }
  if (shape == "mpt-tiny") {
    return R"({"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 64,
               "n_layers": 2, "n_heads": 4, "expansion_ratio": 4, "max_seq_len": 2048,
               "vocab_size": 512, "no_bias": true,
               "attn_config": {"alibi": true, "alibi_bias_max": 8}})";
  }
  if (shape == "falcon-tiny") {  // Falcon-7B's layout: parallel block, multi-query
    return R"({"architectures": ["FalconForCausalLM"], "model_type": "falcon",
               "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "vocab_size": 512, "multi_query": true, "parallel_attn": true,
               "new_decoder_architecture": false, "bias": false, "rope_theta": 10000.0})";
  }
  return "";
}

}  // namespace

ModelConfig synthetic_config(const std::string& shape) {
  if (const std::string json = family_tiny_json(shape); !json.empty()) {
    ModelConfig c = ModelConfig::from_json_string(json, shape);
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    return c;
  }
  ModelConfig c;
  if (shape == "tiny") {
    c = tiny_config();
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
  } else if (shape == "qwen2-tiny") {  // Qwen2.5: q/k/v biases, tied embeddings, ChatML
    c = tiny_config();
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.traits.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.rope_theta = 1000000.0;
  } else if (shape == "qwen3-tiny") {  // Qwen3: per-head q/k norms, head_dim != hidden / heads
    c = tiny_config();
    c.architecture = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.traits.qk_norm = true;
    c.head_dim = 32;
    c.tie_word_embeddings = true;
    c.rope_theta = 1000000.0;
  } else if (shape == "llama3-tiny") {  // Llama 3.x: llama3 RoPE scaling that bites at this size
    c = tiny_config();
    c.rope_theta = 500000.0;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 256;
  } else if (shape == "mistral-tiny") {  // Mistral: a sliding window short enough to matter
    c = tiny_config();
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
    c.traits.sliding_window = 24;
  } else {
    std::string known;
    for (const auto& s : synthetic_shapes()) known += (known.empty() ? "" : ", ") + s;
    throw Error(ErrorKind::kInvalidArgument,
                "unknown model shape '" + shape + "' (known shapes: " + known + ")");
  }
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_attention_heads;
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
  auto vector = [&](const std::string& name, int64_t size) {
    w[name] = (at::randn({size}, gen, f32) * init_std).to(dtype);
  };
  auto norm_of = [&](const std::string& name, int64_t size) {
    w[name] = (1.0 + 0.1 * at::randn({size}, gen, f32)).to(dtype);
  };
  // A family with names of its own (BLOOM, MPT, Falcon): its checkpoint's tensors, fused QKV
  // and all.
  const auto table = family_weights::entries(c);
  for (const auto& e : table) {
    using family_weights::Kind;
    if (e.kind == Kind::kMatrix || e.kind == Kind::kFusedQkv) {
      matrix(e.source, e.shape.at(0), e.shape.at(1));
    } else if (e.kind == Kind::kNorm) {
      norm_of(e.source, e.shape.at(0));
    } else {
      vector(e.source, e.shape.at(0));
    }
  }
  if (!table.empty()) return w;
  const int64_t h = c.hidden_size, d = c.head_dim, f = c.intermediate_size;
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  matrix("model.embed_tokens.weight", c.vocab_size, h);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    norm(p + "input_layernorm.weight");
    norm(p + "post_attention_layernorm.weight");
    matrix(p + "self_attn.q_proj.weight", hq * d, h);
    matrix(p + "self_attn.k_proj.weight", hkv * d, h);
    matrix(p + "self_attn.v_proj.weight", hkv * d, h);
    matrix(p + "self_attn.o_proj.weight", h, hq * d);
    matrix(p + "mlp.gate_proj.weight", f, h);
    matrix(p + "mlp.up_proj.weight", f, h);
    matrix(p + "mlp.down_proj.weight", h, f);
    const FamilyTraits& t = c.traits;
    if (t.qkv_bias) {
      vector(p + "self_attn.q_proj.bias", hq * d);
      vector(p + "self_attn.k_proj.bias", hkv * d);
      vector(p + "self_attn.v_proj.bias", hkv * d);
    }
    if (t.o_bias) vector(p + "self_attn.o_proj.bias", h);
    if (t.mlp_bias) {
      vector(p + "mlp.gate_proj.bias", f);
      vector(p + "mlp.up_proj.bias", f);
      vector(p + "mlp.down_proj.bias", h);
    }
    if (t.qk_norm) {
      norm_of(p + "self_attn.q_norm.weight", d);
      norm_of(p + "self_attn.k_norm.weight", d);
    }
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

std::string synthetic_tokenizer_kind(const std::string& shape) {
  for (const char* bpe :
       {"qwen2-tiny", "qwen3-tiny", "llama3-tiny", "bloom-tiny", "mpt-tiny", "falcon-tiny"}) {
    if (shape == bpe) return "bpe";
  }
  return "sentencepiece";
}

namespace {

// A shape's trained byte-level BPE tokenizer: its family's tokenizer.json pipeline (BLOOM's,
// GPT-NeoX's for MPT, Falcon's; Qwen2's otherwise), special tokens and tokenizer_config.json:
// ChatML's for Qwen, Llama 3's header tokens (and its BOS) for Llama 3.
struct ShapeTokenizer {
  std::vector<std::string> specials;
  std::string bos, eos;
  bool add_bos = false;
  BpeFamily pipeline = BpeFamily::kQwen2;
};
ShapeTokenizer shape_tokenizer(const std::string& shape) {
  if (shape == "llama3-tiny") {
    return {{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eot_id|>"},
            "<|begin_of_text|>",
            "<|eot_id|>",
            true};
  }
  if (shape == "bloom-tiny") {
    return {{"<unk>", "<s>", "</s>", "<pad>"}, "<s>", "</s>", false, BpeFamily::kBloom};
  }
  if (shape == "falcon-tiny") {
    return {{"<|endoftext|>"}, "", "<|endoftext|>", false, BpeFamily::kFalcon};
  }
  if (shape == "mpt-tiny") {
    // MPT's chat models use ChatML on GPT-NeoX's tokenizer.
    return {{"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
            "",
            "<|im_end|>",
            false,
            BpeFamily::kGptNeox};
  }
  return {{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, "", "<|im_end|>", false};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw Error(ErrorKind::kIo, "cannot write file", {path});
}

// Puts the tokenizer a synthetic model uses into dir: a copy of `tokenizer_file` (with the
// tokenizer_config.json and generation_config.json beside it, if any), or one trained on the
// built-in corpus.
void place_tokenizer(const std::string& dir, const std::string& shape,
                     const std::string& tokenizer_file, int64_t vocab_size) {
  namespace fs = std::filesystem;
  const fs::path folder(dir);
  if (!tokenizer_file.empty()) {
    const fs::path source(tokenizer_file);
    if (!fs::is_regular_file(source)) {
      throw Error(ErrorKind::kIo, "tokenizer file does not exist", {tokenizer_file});
    }
    const bool json = source.extension() == ".json";
    std::error_code ec;
    fs::copy_file(source, folder / (json ? "tokenizer.json" : "tokenizer.model"),
                  fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot copy tokenizer: " + ec.message(), {tokenizer_file});
    for (const char* extra : {"tokenizer_config.json", "generation_config.json"}) {
      if (fs::is_regular_file(source.parent_path() / extra)) {
        fs::copy_file(source.parent_path() / extra, folder / extra,
                      fs::copy_options::overwrite_existing, ec);
      }
    }
    return;
  }
  const int tokenizer_vocab = static_cast<int>(std::min<int64_t>(vocab_size, 512));
  if (synthetic_tokenizer_kind(shape) == "sentencepiece") {
    train_sentencepiece_tokenizer(builtin_corpus(), tokenizer_vocab,
                                  (folder / "tokenizer.model").string());
    return;
  }
  const ShapeTokenizer family = shape_tokenizer(shape);
  const int learned = tokenizer_vocab - static_cast<int>(family.specials.size());
  train_bpe_tokenizer(builtin_corpus(), learned, family.specials,
                      (folder / "tokenizer.json").string(), family.pipeline);
  nlohmann::json config = {
      {"add_bos_token", family.add_bos},
      {"bos_token", family.bos.empty() ? nlohmann::json(nullptr) : nlohmann::json(family.bos)},
      {"eos_token", family.eos}};
  write_text((folder / "tokenizer_config.json").string(), config.dump(2) + "\n");
}

}  // namespace

void make_synthetic_model(const std::string& dir, const std::string& shape, std::uint64_t seed,
                          torch::Dtype dtype, const std::string& tokenizer_file) {
  ModelConfig config = synthetic_config(shape);
  config.torch_dtype = dtype == torch::kFloat16    ? "float16"
                       : dtype == torch::kBFloat16 ? "bfloat16"
                                                   : "float32";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::kIo, "cannot create folder: " + ec.message(), {dir});
  place_tokenizer(dir, shape, tokenizer_file, config.vocab_size);
  // The model's vocabulary covers the tokenizer's (a real tokenizer.json brings 150k pieces),
  // and its BOS/EOS ids are the tokenizer's.
  const auto tokenizer = load_tokenizer(dir);
  config.vocab_size =
      std::max<int64_t>(config.vocab_size, static_cast<int64_t>(tokenizer->vocab_size()));
  config.bos_token_id =
      tokenizer->bos_id() >= 0 ? tokenizer->bos_id() : std::max(tokenizer->eos_id(), 0);
  // The tokenizer's EOS first, then its other end-of-turn ids, each once.
  const auto turn_ends = tokenizer->end_of_turn_ids();
  config.eos_token_ids.assign(turn_ends.begin(), turn_ends.end());
  // Small models get larger weights so their attention is peaked and bugs show in the logits.
  const double init_std = shape == "bench-small" || shape == "tinyllama-1.1b" ? 0.02 : 0.1;
  write_model_folder(dir, config, random_llama_weights(config, seed, init_std, dtype));
}

}  // namespace promptcache
