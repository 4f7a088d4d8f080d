// gguf_config.cpp — a GGUF file's hyper-parameters (llama.cpp's <arch>.* keys) to ModelConfig and
// back. LibTorch-free (promptcache_core), so that commands reading only the config need none.
#include "promptcache/model/gguf_config.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

#include "promptcache/error.hpp"

namespace promptcache::gguf {
namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& message,
                       const std::string& element = {}) {
  throw Error(ErrorKind::kModel, message, {origin, 0, 0, element});
}

struct Arch {
  const char* gguf;
  const char* architecture;
  const char* model_type;
};
const Arch kArchs[] = {{"llama", "LlamaForCausalLM", "llama"},
                       {"qwen2", "Qwen2ForCausalLM", "qwen2"},
                       {"qwen3", "Qwen3ForCausalLM", "qwen3"}};

}  // namespace

std::string architecture_of(const ModelConfig& c) {
  for (const Arch& a : kArchs) {
    if (c.model_type == a.model_type) return a.gguf;
  }
  if (c.model_type == "mistral") return "llama";  // as llama.cpp's converter writes Mistral
  throw Error(ErrorKind::kModel, "model type '" + c.model_type + "' has no GGUF architecture here");
}

ModelConfig config_from_file(const File& f) {
  const std::string& origin = f.path();
  const auto arch_name = f.get_string("general.architecture");
  if (!arch_name) fail(origin, "is missing", "key 'general.architecture'");
  const Arch* arch = nullptr;
  for (const Arch& a : kArchs) {
    if (*arch_name == a.gguf) arch = &a;
  }
  if (!arch) {
    fail(origin,
         "architecture '" + *arch_name + "' is not supported (this build runs llama, qwen2, qwen3)",
         "key 'general.architecture'");
  }
  const std::string p = std::string(arch->gguf) + ".";
  auto need = [&](const std::string& key) {
    const auto v = f.get_int(p + key);
    if (!v) fail(origin, "is missing", "key '" + p + key + "'");
    return *v;
  };
  ModelConfig c;
  c.architecture = arch->architecture;
  c.model_type = arch->model_type;
  c.hidden_size = need("embedding_length");
  c.intermediate_size = need("feed_forward_length");
  c.num_hidden_layers = need("block_count");
  c.num_attention_heads = need("attention.head_count");
  c.num_key_value_heads = f.get_int(p + "attention.head_count_kv").value_or(c.num_attention_heads);
  c.max_position_embeddings = f.get_int(p + "context_length").value_or(2048);
  c.rms_norm_eps = f.get_number(p + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  c.rope_theta = f.get_number(p + "rope.freq_base").value_or(10000.0);
  if (c.num_attention_heads <= 0)
    fail(origin, "must be positive", "key '" + p + "attention.head_count'");
  c.head_dim = f.get_int(p + "attention.key_length")
                   .value_or(c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1));
  if (const auto v = f.get_int(p + "attention.value_length"); v && *v != c.head_dim) {
    fail(origin, "differs from attention.key_length (not supported)",
         "key '" + p + "attention.value_length'");
  }
  if (const auto rot = f.get_int(p + "rope.dimension_count"); rot && *rot != c.head_dim) {
    fail(origin,
         "rotates " + std::to_string(*rot) + " of " + std::to_string(c.head_dim) +
             " head dimensions (partial RoPE is not supported)",
         "key '" + p + "rope.dimension_count'");
  }
  if (const auto type = f.get_string(p + "rope.scaling.type"); type && *type != "none") {
    if (*type != "linear") {
      fail(origin, "RoPE scaling '" + *type + "' is not supported (none, linear)",
           "key '" + p + "rope.scaling.type'");
    }
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    c.rope_scaling.factor = f.get_number(p + "rope.scaling.factor").value_or(1.0);
  }
  if (f.tensor("rope_freqs.weight")) {
    fail(origin, "per-frequency RoPE factors (Llama 3.1's scaling) are not supported",
         "tensor 'rope_freqs.weight'");
  }
  if (const auto w = f.get_int(p + "attention.sliding_window")) c.traits.sliding_window = *w;
  if (c.traits.sliding_window > 0 && c.model_type == "llama") {
    c.architecture = "MistralForCausalLM";  // a llama layer with a sliding window
    c.model_type = "mistral";
  }
  if (c.model_type == "qwen2") c.traits.qkv_bias = true;
  if (c.model_type == "qwen3") c.traits.qk_norm = true;
  if (c.model_type == "llama" && f.tensor("blk.0.attn_q.bias")) c.traits.qkv_bias = true;
  if (c.model_type == "llama" && f.tensor("blk.0.attn_output.bias")) c.traits.o_bias = true;
  if (c.model_type == "llama" && f.tensor("blk.0.ffn_up.bias")) c.traits.mlp_bias = true;
  const TensorInfo* embed = f.tensor("token_embd.weight");
  if (!embed || embed->dims.size() != 2)
    fail(origin, "is missing or not 2-D", "tensor 'token_embd.weight'");
  c.vocab_size = embed->dims[1];
  c.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  if (const auto bos = f.get_int("tokenizer.ggml.bos_token_id")) c.bos_token_id = *bos;
  if (const auto eos = f.get_int("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*eos};
  if (const auto family = f.get_string("promptcache.chat_template_family"))
    c.chat_template = *family;
  // torch_dtype: the type most of the matrices are stored in.
  std::map<uint32_t, int64_t> elements;
  for (const TensorInfo& t : f.header().tensors) {
    if (t.dims.size() == 2) elements[t.type] += t.elements();
  }
  uint32_t most = 0;
  int64_t best = -1;
  for (const auto& [type, n] : elements) {
    if (n > best) best = n, most = type;
  }
  c.torch_dtype = most == 1 ? "float16" : most == 30 ? "bfloat16" : "float32";
  c.validate(origin);
  return c;
}

void put_config(Writer& w, const ModelConfig& c) {
  const std::string arch = architecture_of(c);
  const std::string p = arch + ".";
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    throw Error(ErrorKind::kInvalidArgument,
                "llama3 RoPE scaling is not converted to GGUF yet (llama.cpp stores it as a "
                "rope_freqs tensor)");
  }
  if (!c.traits.sliding_layers.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "per-layer sliding windows have no GGUF key; not converted");
  }
  if (c.model_type != "llama" && c.model_type != "mistral" &&
      (c.traits.o_bias || c.traits.mlp_bias)) {
    throw Error(ErrorKind::kInvalidArgument, "o_proj / MLP biases are only converted for llama");
  }
  w.set("general.architecture", Value::string(arch));
  w.set("general.alignment", Value::u32(kDefaultAlignment));
  auto u32 = [&](const std::string& key, int64_t v) {
    w.set(p + key, Value::u32(static_cast<uint32_t>(v)));
  };
  u32("context_length", c.max_position_embeddings);
  u32("embedding_length", c.hidden_size);
  u32("block_count", c.num_hidden_layers);
  u32("feed_forward_length", c.intermediate_size);
  u32("attention.head_count", c.num_attention_heads);
  u32("attention.head_count_kv", c.num_key_value_heads);
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  u32("rope.dimension_count", c.head_dim);
  u32("vocab_size", c.vocab_size);
  w.set(p + "rope.freq_base", Value::f32(static_cast<float>(c.rope_theta)));
  w.set(p + "attention.layer_norm_rms_epsilon", Value::f32(static_cast<float>(c.rms_norm_eps)));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w.set(p + "rope.scaling.type", Value::string("linear"));
    w.set(p + "rope.scaling.factor", Value::f32(static_cast<float>(c.rope_scaling.factor)));
  }
  if (c.traits.sliding_window > 0) u32("attention.sliding_window", c.traits.sliding_window);
  if (!c.chat_template.empty()) {
    w.set("promptcache.chat_template_family", Value::string(c.chat_template));
  }
}

ModelConfig load_model_config(const std::string& folder_or_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(folder_or_file, ec)) return config_from_file(*File::open(folder_or_file));
  return ModelConfig::from_json_file((fs::path(folder_or_file) / "config.json").string());
}

}  // namespace promptcache::gguf
