// llama_load.cpp — making a LlamaModel: the dtype rule (choose_dtypes, checkpoint_dtype and the
// device/dtype parsers), reading a HF folder or a GGUF file, and from_tensors, which checks every
// tensor against the config and keeps it in the dtype the rule chose (mapped, converted or
// quantized), after a BLOOM, MPT or Falcon checkpoint is read under the layer's names
// (families/family_weights.hpp). Separate from the forward pass: loading decides what the layers
// hold, the forward only reads it.
#include "promptcache/model/llama.hpp"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <exception>
#include <filesystem>

#include "families/family_weights.hpp"
#include "layer_ops.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/safetensors.hpp"

namespace promptcache {

using layer_ops::inverse_frequencies;
using layer_ops::resolve_sdpa;
using layer_ops::shape_string;

torch::Device parse_device(const std::string& text) {
  if (text == "cpu") return torch::kCPU;
  if (text.rfind("cuda", 0) == 0) {
    torch::Device device(torch::kCPU);
    try {
      device = torch::Device(text);
    } catch (const std::exception&) {
      throw Error(ErrorKind::kInvalidArgument,
                  "unknown device '" + text + "' (use cpu or cuda[:N])");
    }
    if (!at::hasCUDA()) {
      throw Error(ErrorKind::kInvalidArgument,
                  "device '" + text + "' requested but this build of LibTorch has no CUDA device");
    }
    return device;
  }
  throw Error(ErrorKind::kInvalidArgument, "unknown device '" + text + "' (use cpu or cuda[:N])");
}

torch::Dtype parse_dtype(const std::string& text) {
  if (text == "f32" || text == "float32" || text == "float") return torch::kFloat32;
  if (text == "f16" || text == "float16" || text == "half") return torch::kFloat16;
  if (text == "bf16" || text == "bfloat16") return torch::kBFloat16;
  throw Error(ErrorKind::kInvalidArgument, "unknown dtype '" + text + "' (use f32, f16 or bf16)");
}

torch::Dtype parse_weight_dtype(const std::string& text) {
  if (text == "q8" || text == "int8") return torch::kInt8;
  try {
    return parse_dtype(text);
  } catch (const Error&) {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown weights dtype '" + text + "' (use f32, bf16, f16 or q8)");
  }
}

std::string dtype_name(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kInt8:
      return "q8";
    case torch::kFloat32:
      return "f32";
    case torch::kFloat16:
      return "f16";
    case torch::kBFloat16:
      return "bf16";
    default:
      return c10::toString(dtype);
  }
}

namespace {

bool is_half(torch::Dtype d) {
  return d == torch::kBFloat16 || d == torch::kFloat16;
}

}  // namespace

DtypeChoice choose_dtypes(torch::Dtype checkpoint, const LoadOptions& options) {
  DtypeChoice c;
  c.checkpoint = checkpoint;
  const bool cpu = options.device.is_cpu();
  // What the file's dtype can be kept as: f64 (and anything odd) as f32.
  const torch::Dtype file = is_half(checkpoint) ? checkpoint : torch::kFloat32;
  const std::string file_name = dtype_name(checkpoint);
  if (options.dtype) {
    c.compute = *options.dtype;
    c.compute_reason = "given (--dtype)";
  } else if (cpu) {
    c.compute = torch::kFloat32;
    c.compute_reason =
        "the CPU computes in f32 and reads 16-bit weights and states through its "
        "own kernels";
  } else if (options.weights && at::isFloatingType(*options.weights)) {
    c.compute = *options.weights;
    c.compute_reason = "as the weights (off the CPU they must be equal)";
  } else {
    c.compute = file;
    c.compute_reason = "as the checkpoint stores its matrices (" + file_name +
                       "; off the CPU the weights must equal the compute dtype)";
  }
  const bool f32_cpu = cpu && c.compute == torch::kFloat32;
  if (options.weights) {
    c.weights = *options.weights;
    c.weights_reason = "given (--weights)";
  } else if (checkpoint == torch::kInt8 && f32_cpu) {
    c.weights = torch::kInt8;
    c.weights_reason = "as the checkpoint stores them (Q8_0 blocks, repacked into q8)";
  } else if (checkpoint == torch::kUInt8 && f32_cpu) {
    c.weights = torch::kFloat32;
    c.weights_reason =
        "the checkpoint's GGML blocks computed from as they are (mapped from the file); its "
        "other matrices in f32";
  } else if (file == c.compute || (f32_cpu && is_half(file))) {
    c.weights = file;
    c.weights_reason = "as the checkpoint stores them (" + file_name + ")" +
                       (cpu && checkpoint == file ? ": mapped from the file, not copied" : "");
  } else {
    c.weights = c.compute;
    c.weights_reason = "the compute dtype (the checkpoint's " + file_name + " does not run with " +
                       dtype_name(c.compute) + " compute on " + options.device.str() + ")";
  }
  if (options.kv_dtype) {
    c.kv = *options.kv_dtype;
    c.kv_reason = "given (--kv-dtype)";
  } else if (f32_cpu && is_half(c.weights)) {
    // Half the bytes of f32 states; the fused attention converts them as it reads. f16 weights
    // keep f16 states: the model was stored for f16's range, and f16 rounds finer than bf16.
    c.kv = c.weights;
    c.kv_reason = "as the " + dtype_name(c.weights) +
                  " weights: half the bytes of f32 states; the attention converts them to f32 "
                  "as it reads";
  } else {
    c.kv = c.compute;
    c.kv_reason = "the compute dtype";
  }
  return c;
}

// Matrices already in the q8 layout (a GGUF file's Q8_0 blocks, gguf_model.hpp) count as kInt8,
// which choose_dtypes keeps as q8 weights on the CPU with f32 compute; GGML blocks
// (ggml_quant.hpp) as kUInt8, whose other matrices (a file's F16 fallbacks) go to f32.
std::pair<torch::Dtype, bool> checkpoint_dtype(const std::map<std::string, torch::Tensor>& w) {
  auto count = [&](bool projections_only) {
    std::map<torch::Dtype, int64_t> elements;
    for (const auto& [name, t] : w) {
      const bool projection =
          name.size() >= 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0;
      if (projections_only && !projection) continue;
      // GGML blocks (a GGUF file's Q4_K, ...) count as kUInt8, by their matrix's elements.
      if (t.defined()) {
        if (const auto qt = ggml::quant_type_of(t)) {
          elements[torch::kUInt8] += t.size(0) * t.size(1) * ggml::block_elements(*qt);
          continue;
        }
      }
      // q8 matrices (a GGUF file's Q8_0) count as kInt8.
      if (!t.defined() || t.dim() != 2 || !(at::isFloatingType(t.scalar_type()) || is_q8(t))) {
        continue;
      }
      elements[t.scalar_type()] += t.numel();
    }
    return elements;
  };
  auto elements = count(true);
  if (elements.empty()) elements = count(false);
  torch::Dtype most = torch::kFloat32;
  int64_t best = -1;
  for (const auto& [dtype, n] : elements) {
    if (n > best) {
      best = n;
      most = dtype;
    }
  }
  bool mixed = false;
  for (const auto& [name, t] : w) {
    if (t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != most) {
      mixed = true;
    }
  }
  return {most, mixed};
}

torch::TensorOptions LlamaModel::tensor_options() const {
  return torch::TensorOptions().device(options_.device).dtype(choice_.compute);
}

torch::TensorOptions LlamaModel::kv_options() const {
  return torch::TensorOptions().device(options_.device).dtype(kv_dtype());
}

// A folder, or a GGUF file (gguf_model.hpp).
std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& dir, const LoadOptions& options) {
  namespace fs = std::filesystem;
  if (gguf::is_gguf_file(dir)) return gguf::load_model(dir, options);
  if (!fs::is_directory(dir)) {
    throw Error(ErrorKind::kModel,
                "model folder does not exist (expected a HuggingFace folder "
                "with config.json and *.safetensors)",
                {dir});
  }
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(ErrorKind::kModel, "config.json is missing", {dir});
  const ModelConfig config = ModelConfig::from_json_file(config_path);
  const auto checkpoint = SafetensorsCheckpoint::open_folder(dir);
  std::map<std::string, torch::Tensor> weights;
  for (const auto& name : checkpoint.names()) weights.emplace(name, checkpoint.tensor(name));
  return from_tensors(config, weights, options, dir);
}

std::unique_ptr<LlamaModel> LlamaModel::from_tensors(const ModelConfig& config,
                                                     const std::map<std::string, torch::Tensor>& in,
                                                     const LoadOptions& options,
                                                     const std::string& origin) {
  config.validate(origin);
  // A BLOOM, MPT or Falcon checkpoint under the layer's names (families/family_weights.hpp).
  const std::map<std::string, torch::Tensor> renamed =
      family_weights::layer_tensors(config, in, origin);
  const auto& w = renamed;
  const auto [stored, mixed] = checkpoint_dtype(w);
  DtypeChoice choice = choose_dtypes(stored, options);
  choice.mixed = mixed;
  const torch::Dtype compute = choice.compute;
#if TORCH_VERSION_MAJOR < 2
  if (options.device.is_cpu() && compute == torch::kFloat16) {
    throw Error(ErrorKind::kInvalidArgument,
                "f16 on the CPU needs LibTorch 2.x (this is 1.x, which has no f16 CPU matmul); "
                "use bf16 or f32",
                {origin});
  }
#endif
  const torch::Dtype weight_dtype = choice.weights;
  const bool q8 = weight_dtype == torch::kInt8;
  if (weight_dtype != compute &&
      !(options.device.is_cpu() && compute == torch::kFloat32 &&
        (weight_dtype == torch::kBFloat16 || weight_dtype == torch::kFloat16 || q8))) {
    throw Error(ErrorKind::kInvalidArgument,
                "weights in " + dtype_name(weight_dtype) + " with " + dtype_name(compute) +
                    " compute on " + options.device.str() +
                    ": only the CPU with f32 compute takes bf16, f16 or q8 weights; "
                    "elsewhere the weights' dtype must equal the compute dtype",
                {origin});
  }
  const torch::Dtype kv_dtype = choice.kv;
  if (kv_dtype != compute && !(options.device.is_cpu() && compute == torch::kFloat32 &&
                               (kv_dtype == torch::kBFloat16 || kv_dtype == torch::kFloat16))) {
    throw Error(ErrorKind::kInvalidArgument,
                "a KV cache in " + dtype_name(kv_dtype) + " with " + dtype_name(compute) +
                    " compute on " + options.device.str() +
                    ": only the CPU with f32 compute takes a bf16 or f16 KV cache; elsewhere "
                    "the KV cache's dtype must equal the compute dtype",
                {origin});
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->config_ = config;
  m->options_ = options;
  m->options_.dtype = compute;
  m->options_.weights = weight_dtype;
  m->options_.kv_dtype = kv_dtype;
  m->choice_ = choice;
  m->sdpa_ = resolve_sdpa(options.attention, options.device, origin);
  const auto to_model = torch::TensorOptions().device(options.device).dtype(compute);
  const auto to_weights = torch::TensorOptions().device(options.device).dtype(weight_dtype);
  // Matrices go to the weights' dtype (same dtype and device: the mmapped tensor itself, no
  // copy), vectors (norms, biases) to the compute dtype.
  auto take = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = w.find(name);
    if (it == w.end()) {
      throw Error(ErrorKind::kModel, "tensor is missing from the checkpoint",
                  {origin, 0, 0, "tensor '" + name + "'"});
    }
    // A matrix already in the q8 layout (a GGUF file's Q8_0 blocks, repacked): kept as it is
    // for q8 weights, else dequantized.
    if (shape.size() == 2 && is_q8(it->second) && it->second.size(0) == shape[0] &&
        q8_in_features(it->second) == shape[1]) {
      return q8 ? it->second : dequantize_q8(it->second, shape[1]).to(to_weights);
    }
    // GGML blocks (uint8 [n, k / B, bytes], promptcache/model/ggml_quant.hpp) for a matrix:
    // kept as they are (a view of the file) where the CPU kernels compute with f32, else
    // dequantized here to the weights' dtype.
    if (const auto qt = ggml::quant_type_of(it->second)) {
      const auto& q = it->second;
      if (shape.size() != 2 || q.size(0) != shape[0] ||
          q.size(1) * ggml::block_elements(*qt) != shape[1]) {
        throw Error(ErrorKind::kModel,
                    "tensor holds " + std::string(ggml::type_name(*qt)) + " blocks " +
                        shape_string(q.sizes()) + " but config.json implies " + shape_string(shape),
                    {origin, 0, 0, "tensor '" + name + "'"});
      }
      if (options.device.is_cpu() && compute == torch::kFloat32) return q;
      return ggml::dequantize(q).to(to_weights);
    }
    if (it->second.sizes() != at::IntArrayRef(shape)) {
      throw Error(ErrorKind::kModel,
                  "tensor has shape " + shape_string(it->second.sizes()) +
                      " but config.json implies " + shape_string(shape),
                  {origin, 0, 0, "tensor '" + name + "'"});
    }
    // An integer or bool tensor would convert to weights without a word: refused.
    if (!at::isFloatingType(it->second.scalar_type())) {
      throw Error(ErrorKind::kModel,
                  "tensor is stored as " + std::string(c10::toString(it->second.scalar_type())) +
                      "; weights must be a floating-point dtype (F32, F16, BF16, F64)",
                  {origin, 0, 0, "tensor '" + name + "'"});
    }
    if (shape.size() == 2 && q8) return quantize_q8(it->second);
    return it->second.to(shape.size() == 2 ? to_weights : to_model);
  };
  const int64_t h = config.hidden_size, d = config.head_dim, f = config.intermediate_size;
  const int64_t hq = config.num_attention_heads, hkv = config.num_key_value_heads;
  m->embed_ = take("model.embed_tokens.weight", {config.vocab_size, h});
  m->final_norm_ = take("model.norm.weight", {h});
  const FamilyTraits& t = config.traits;
  if (t.norm_bias) m->final_norm_bias_ = take("model.norm.bias", {h});
  if (t.embed_norm) {
    m->embed_norm_ = take("model.embed_norm.weight", {h});
    if (t.norm_bias) m->embed_norm_bias_ = take("model.embed_norm.bias", {h});
  }
  if (!config.tie_word_embeddings && w.count("lm_head.weight")) {
    m->lm_head_ = take("lm_head.weight", {config.vocab_size, h});
  } else if (!config.tie_word_embeddings) {
    throw Error(ErrorKind::kModel,
                "tensor is missing and tie_word_embeddings is false in config.json",
                {origin, 0, 0, "tensor 'lm_head.weight'"});
  } else {
    m->lm_head_ = m->embed_;
  }
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer l;
    l.input_norm = take(p + "input_layernorm.weight", {h});
    if (t.norm_bias) l.input_norm_bias = take(p + "input_layernorm.bias", {h});
    if (t.mlp_norm) {
      l.post_norm = take(p + "post_attention_layernorm.weight", {h});
      if (t.norm_bias) l.post_norm_bias = take(p + "post_attention_layernorm.bias", {h});
    }
    l.wq = take(p + "self_attn.q_proj.weight", {hq * d, h});
    l.wk = take(p + "self_attn.k_proj.weight", {hkv * d, h});
    l.wv = take(p + "self_attn.v_proj.weight", {hkv * d, h});
    l.wo = take(p + "self_attn.o_proj.weight", {h, hq * d});
    if (t.mlp == MlpKind::kGatedSilu) l.w_gate = take(p + "mlp.gate_proj.weight", {f, h});
    l.w_up = take(p + "mlp.up_proj.weight", {f, h});
    l.w_down = take(p + "mlp.down_proj.weight", {h, f});
    if (t.qkv_bias) {
      l.bq = take(p + "self_attn.q_proj.bias", {hq * d});
      l.bk = take(p + "self_attn.k_proj.bias", {hkv * d});
      l.bv = take(p + "self_attn.v_proj.bias", {hkv * d});
    }
    if (t.o_bias) l.bo = take(p + "self_attn.o_proj.bias", {h});
    if (t.mlp_bias) {
      if (l.w_gate.defined()) l.b_gate = take(p + "mlp.gate_proj.bias", {f});
      l.b_up = take(p + "mlp.up_proj.bias", {f});
      l.b_down = take(p + "mlp.down_proj.bias", {h});
    }
    if (t.qk_norm) {
      l.q_norm = take(p + "self_attn.q_norm.weight", {d});
      l.k_norm = take(p + "self_attn.k_norm.weight", {d});
    }
    l.sliding = t.layer_slides(i);
    m->layers_.push_back(std::move(l));
  }
  m->inv_freq_ = inverse_frequencies(config).to(options.device);
  if (t.position == PositionKind::kAlibi) {
    const auto slopes = promptcache::alibi_slopes(hq, t.alibi_bias_max);
    m->alibi_slopes_ =
        torch::tensor(std::vector<float>(slopes.begin(), slopes.end()), torch::kFloat32)
            .to(options.device);
  }
  return m;
}

KVCache LlamaModel::make_cache(int64_t capacity, int64_t batch) const {
  KVCacheShape shape{config_.num_hidden_layers, batch, config_.num_key_value_heads,
                     config_.head_dim, capacity};
  return KVCache(shape, kv_options());
}

int64_t LlamaModel::weight_bytes() const {
  auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  int64_t total = bytes(embed_) + bytes(final_norm_) + bytes(final_norm_bias_) +
                  bytes(embed_norm_) + bytes(embed_norm_bias_);
  if (!lm_head_.is_same(embed_)) total += bytes(lm_head_);
  for (const Layer& l : layers_) {
    for (const torch::Tensor* t : {&l.input_norm,
                                   &l.post_norm,
                                   &l.input_norm_bias,
                                   &l.post_norm_bias,
                                   &l.wq,
                                   &l.wk,
                                   &l.wv,
                                   &l.wo,
                                   &l.w_gate,
                                   &l.w_up,
                                   &l.w_down,
                                   &l.bq,
                                   &l.bk,
                                   &l.bv,
                                   &l.bo,
                                   &l.b_gate,
                                   &l.b_up,
                                   &l.b_down,
                                   &l.q_norm,
                                   &l.k_norm}) {
      total += bytes(*t);
    }
  }
  return total;
}

}  // namespace promptcache
