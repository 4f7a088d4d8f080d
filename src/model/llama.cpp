#include "promptcache/model/llama.hpp"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <limits>
#include <mutex>

#include "promptcache/error.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/cpu_ops.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/threads.hpp"

namespace promptcache {
namespace {

std::string shape_string(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

// A linear layer's output plus its bias, in place (the output is the forward's own tensor).
torch::Tensor with_bias(torch::Tensor y, const torch::Tensor& bias) {
  return bias.defined() ? y.add_(bias) : y;
}

// RMSNorm over each head of a projection's output x [b, n, heads * d] (Qwen3's q_norm/k_norm).
torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& weight, int64_t heads,
                        double eps, bool small_ops) {
  const int64_t b = x.size(0), n = x.size(1), d = x.size(2) / heads;
  auto per_head = x.reshape({b, n * heads, d});
  auto normed = small_ops ? cpu_rms_norm(per_head, weight, eps) : rms_norm(per_head, weight, eps);
  return normed.view({b, n, heads * d});
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor inverse_frequencies(const ModelConfig& c) {
  const int64_t d = c.head_dim;
  auto exponents =
      torch::arange(0, d, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(d);
  auto inv_freq = 1.0 / torch::pow(torch::scalar_tensor(c.rope_theta, torch::kFloat32), exponents);
  const auto& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::kLinear) {
    inv_freq = inv_freq / s.factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_len / s.low_freq_factor;
    const double high_wavelen = old_len / s.high_freq_factor;
    auto wavelen = 2.0 * M_PI / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
    auto smooth =
        (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
    auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return inv_freq.contiguous();
}

// Whether a model made with `impl` on `device` runs scaled_dot_product_attention. SDPA dispatches
// to fused (flash / memory-efficient) kernels on CUDA. On the CPU the blocked attention and the
// fused few-query kernel are faster: with LibTorch 2.6 on bench-small, SDPA made a 2048-token
// prefill 1.3-1.5x and a cached 2048 + 16 request 1.3-3.6x slower in three runs
// (docs/benchmarks-history.md).
bool resolve_sdpa(AttentionImpl impl, const torch::Device& device, const std::string& origin) {
  if (impl == AttentionImpl::kAuto) {
    const char* env = std::getenv("PROMPTCACHE_ATTENTION");
    const std::string value = env == nullptr ? "" : env;
    if (value == "sdpa") {
      impl = AttentionImpl::kSdpa;
    } else if (value == "blocked") {
      impl = AttentionImpl::kBlocked;
    } else if (!value.empty() && value != "auto") {
      throw Error(ErrorKind::kInvalidArgument, "environment variable PROMPTCACHE_ATTENTION is '" +
                                                   value + "'; use sdpa, blocked or auto");
    }
  }
  switch (impl) {
    case AttentionImpl::kSdpa:
#if TORCH_VERSION_MAJOR < 2
      throw Error(ErrorKind::kInvalidArgument,
                  "scaled_dot_product_attention needs LibTorch 2.x (this is 1.x); use the blocked "
                  "attention",
                  {origin});
#else
      return true;
#endif
    case AttentionImpl::kBlocked:
      return false;
    case AttentionImpl::kAuto:
      break;
  }
#if TORCH_VERSION_MAJOR >= 2
  return !device.is_cpu();
#else
  (void)device;
  return false;
#endif
}

}  // namespace

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
// which choose_dtypes keeps as q8 weights on the CPU with f32 compute.
std::pair<torch::Dtype, bool> checkpoint_dtype(const std::map<std::string, torch::Tensor>& w) {
  auto count = [&](bool projections_only) {
    std::map<torch::Dtype, int64_t> elements;
    for (const auto& [name, t] : w) {
      // q8 matrices (a GGUF file's Q8_0) count as kInt8.
      if (!t.defined() || t.dim() != 2 || !(at::isFloatingType(t.scalar_type()) || is_q8(t))) {
        continue;
      }
      const bool projection =
          name.size() >= 12 && name.compare(name.size() - 12, 12, "_proj.weight") == 0;
      if (projections_only && !projection) continue;
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
                                                     const std::map<std::string, torch::Tensor>& w,
                                                     const LoadOptions& options,
                                                     const std::string& origin) {
  config.validate(origin);
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
    l.post_norm = take(p + "post_attention_layernorm.weight", {h});
    l.wq = take(p + "self_attn.q_proj.weight", {hq * d, h});
    l.wk = take(p + "self_attn.k_proj.weight", {hkv * d, h});
    l.wv = take(p + "self_attn.v_proj.weight", {hkv * d, h});
    l.wo = take(p + "self_attn.o_proj.weight", {h, hq * d});
    l.w_gate = take(p + "mlp.gate_proj.weight", {f, h});
    l.w_up = take(p + "mlp.up_proj.weight", {f, h});
    l.w_down = take(p + "mlp.down_proj.weight", {h, f});
    const FamilyTraits& t = config.traits;
    if (t.qkv_bias) {
      l.bq = take(p + "self_attn.q_proj.bias", {hq * d});
      l.bk = take(p + "self_attn.k_proj.bias", {hkv * d});
      l.bv = take(p + "self_attn.v_proj.bias", {hkv * d});
    }
    if (t.o_bias) l.bo = take(p + "self_attn.o_proj.bias", {h});
    if (t.mlp_bias) {
      l.b_gate = take(p + "mlp.gate_proj.bias", {f});
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
  return m;
}

KVCache LlamaModel::make_cache(int64_t capacity, int64_t batch) const {
  KVCacheShape shape{config_.num_hidden_layers, batch, config_.num_key_value_heads,
                     config_.head_dim, capacity};
  return KVCache(shape, kv_options());
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::rope_tables(
    const torch::Tensor& positions) const {
  // As HF: float32 angles, then cos/sin, duplicated for the two rotated halves.
  auto freqs = positions.to(inv_freq_.device(), torch::kFloat32).unsqueeze(-1) * inv_freq_;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

namespace {

// Attention on the CPU goes KV head by KV head over threads through the fused kernel
// (promptcache/model/cpu_attention.hpp) for f32 heads whose size it takes. Where it does not
// apply, up to this many fresh tokens go through attend_split_heads below, longer inputs through
// the blocked attention.
constexpr int64_t kFewQueriesMaxTokens = 64;

// Attention of a few (pre-scaled) query rows per KV head over every slot with library calls, the
// KV heads shared out among `threads` threads: the fallback of the fused kernel (bf16 on the CPU,
// head sizes that are not a multiple of 8). OpenBLAS runs single-threaded meanwhile (each thread
// makes its own calls).
// qg [b, kv_heads, groups * n, d] (group-major rows), keys/values [b, kv_heads, slots, d],
// mask [n, slots], [b, n, slots] (one per batch row) or undefined; slots before `open` are seen
// by every row.
torch::Tensor attend_split_heads(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask,
                                 int64_t open, int threads) {
  const int64_t b = qg.size(0), hkv = qg.size(1), rows = qg.size(2), d = qg.size(3);
  const int64_t slots = keys.size(2);
  auto out = torch::empty({b, hkv, rows, d}, qg.options());
  torch::Tensor closed;  // [(b,) n, slots - open]: where a row must not look
  if (mask.defined() && open < slots) closed = mask.narrow(-1, open, slots - open).logical_not();
  const int64_t n = mask.defined() ? mask.size(-2) : rows;
  const int saved_blas = blas_threads();
  if (saved_blas > 1) set_blas_threads(1);
  std::exception_ptr error;
  std::mutex error_mutex;
  // Grad and inference modes are thread-local: the worker threads take the caller's, so that
  // writing into `out` (made here) is allowed under an application's InferenceMode.
  const bool inference = c10::InferenceMode::is_enabled();
  const bool grad = at::GradMode::is_enabled();
#pragma omp parallel for num_threads(threads) collapse(2) schedule(static)
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < hkv; ++h) {
      try {
        c10::InferenceMode inference_mode(inference);
        at::AutoGradMode grad_mode(grad);
        auto scores = at::mm(qg[bi][h], keys[bi][h].t());
        if (scores.scalar_type() != torch::kFloat32) scores = scores.to(torch::kFloat32);
        if (closed.defined()) {
          scores.view({rows / n, n, slots})
              .narrow(-1, open, slots - open)
              .masked_fill_(closed.dim() == 3 ? closed[bi] : closed,
                            -std::numeric_limits<float>::infinity());
        }
        auto dst = out[bi][h];
        at::mm_out(dst, scores.softmax(-1).to(values.scalar_type()), values[bi][h]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (saved_blas > 1) set_blas_threads(saved_blas);
  if (error) std::rethrow_exception(error);
  return out;
}

// The fused kernel over q [b, heads, n, d] (scaled) and the runs of slots `slots`
// (KVCache::segments) in blocks of kFusedBlockTokens query tokens, each block against the slots it
// may see: a few fresh tokens are one block; a prefill, a module compile or a long question take
// several. Against the blocked attention (OpenBLAS GEMMs with single-threaded mask and softmax
// passes between them), 1024- and 2048-token prefills of bench-small ran 15-20% faster and a
// 100-token question over 2048 slots 1.5x faster (docs/benchmarks-history.md).
constexpr int64_t kFusedBlockTokens = 64;

torch::Tensor attend_fused_blocks(const torch::Tensor& q, const std::vector<KVSegment>& slots,
                                  const torch::Tensor& mask, bool causal, int64_t past,
                                  int64_t open_slots, int threads) {
  const int64_t b = q.size(0), hq = q.size(1), n = q.size(2), d = q.size(3);
  const int64_t hkv = slots.front().keys.size(1), groups = hq / hkv;
  int64_t total = 0;
  for (const auto& s : slots) total += s.slots();
  if (n <= kFusedBlockTokens) {  // one block: the kernel's output is the result
    return attend_few_queries(q.reshape({b, hkv, groups * n, d}), slots, mask,
                              causal ? past : open_slots, threads)
        .view({b, hq, n, d});
  }
  auto out = torch::empty({b, hq, n, d}, q.options());
  for (int64_t i0 = 0; i0 < n; i0 += kFusedBlockTokens) {
    const int64_t rows = std::min(kFusedBlockTokens, n - i0);
    const int64_t visible = causal ? past + i0 + rows : total;
    torch::Tensor block_mask;
    if (mask.defined()) block_mask = mask.narrow(-2, i0, rows).narrow(-1, 0, visible);
    // Under the causal rule row i0 sees every slot before past + i0.
    const int64_t open = causal ? past + i0 : std::min(open_slots, visible);
    auto block = attend_few_queries(q.narrow(2, i0, rows).reshape({b, hkv, groups * rows, d}),
                                    first_slots(slots, visible), block_mask, open, threads);
    out.narrow(2, i0, rows).copy_(block.view({b, hq, rows, d}));
  }
  return out;
}

}  // namespace

torch::Tensor LlamaModel::attention(const Layer& layer, int64_t index, const torch::Tensor& x,
                                    KVCache& cache, const LayerInputs& in) const {
  const torch::Tensor& mask = in.mask;
  const bool causal = in.causal;
  const int64_t open_slots = in.open_slots;
  const int64_t b = x.size(0), n = x.size(1), d = config_.head_dim;
  const int64_t hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const int64_t groups = hq / hkv;
  // Scaling the queries costs n x d per head instead of n x slots for the scores (SDPA scales
  // by itself).
  const double q_scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto q = linear_layer(x, layer.wq);
  auto k = linear_layer(x, layer.wk);
  auto v = linear_layer(x, layer.wv);
  if (layer.bq.defined()) {
    q.add_(layer.bq);
    k.add_(layer.bk);
    v.add_(layer.bv);
  }
  if (layer.q_norm.defined()) {  // RMSNorm over each head's d values, before RoPE
    q = head_norm(q, layer.q_norm, hq, config_.rms_norm_eps, in.small_ops);
    k = head_norm(k, layer.k_norm, hkv, config_.rms_norm_eps, in.small_ops);
  }
  bool q_scaled = false;
  if (in.small_ops) {
    // One pass: rotated, scaled queries [b, hq, n, d]; keys and values straight into the cache.
    auto [key_dst, value_dst] = cache.pending_slots(index, n);
    if (key_dst.scalar_type() == torch::kFloat32) {
      q = cpu_rope_into_cache(q, k, v, in.cos, in.sin, q_scale, key_dst, value_dst);
    } else {
      // A bf16/f16 cache: rotated in f32, then rounded by the same conversion as
      // write_pending's, so a token's stored K/V do not depend on the path that made them.
      auto keys_f32 = torch::empty(key_dst.sizes(), q.options());
      auto values_f32 = torch::empty(value_dst.sizes(), q.options());
      q = cpu_rope_into_cache(q, k, v, in.cos, in.sin, q_scale, keys_f32, values_f32);
      key_dst.copy_(keys_f32);
      value_dst.copy_(values_f32);
    }
    q_scaled = true;
  } else {
    const torch::Tensor &cos = in.cos, &sin = in.sin;
    q = q.view({b, n, hq, d}).transpose(1, 2);
    k = k.view({b, n, hkv, d}).transpose(1, 2);
    v = v.view({b, n, hkv, d}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    cache.write_pending(index, k, v);
  }
  const int64_t total = cache.length() + n;
  // The fused kernel reads the slots where they are, module states left in the store included;
  // the other paths take views of the buffer, which copy those in first.
  const bool fused = in.fused_attention && !in.attention_mass.defined();
  torch::Tensor keys, values;
  if (!fused) {
    keys = cache.key_slots(index, 0, total);
    values = cache.value_slots(index, 0, total);
    // A bf16/f16 cache under f32 compute, read without the fused kernel (kernels off, a head
    // size it does not take): converted for the library calls.
    if (keys.scalar_type() != q.scalar_type()) {
      keys = keys.to(q.scalar_type());
      values = values.to(q.scalar_type());
    }
  }
  // Grouped-query attention without copying K/V: the query heads that share a KV head are
  // stacked along the row axis, so one matmul per KV head serves the whole group.
  torch::Tensor out;
#if TORCH_VERSION_MAJOR >= 2
  if (sdpa_ && !in.attention_mass.defined()) {
    auto qg = q.reshape({b, hkv, groups * n, d});
    // An absent mask must be nullopt: an optional holding an undefined tensor is an error there.
    c10::optional<torch::Tensor> grouped_mask;
    // Rows are group-major (g * n + i), so the mask repeats along the row axis; a per-batch-row
    // mask [b, n, slots] becomes [b, 1, groups * n, slots], broadcast over the KV heads.
    if (mask.defined()) {
      grouped_mask =
          mask.dim() == 3 ? mask.repeat({1, groups, 1}).unsqueeze(1) : mask.repeat({groups, 1});
    }
    out = at::scaled_dot_product_attention(qg, keys, values, grouped_mask);
    // reshape, not view: the fused CUDA kernels may return [b, rows, heads, d] memory seen as
    // [b, heads, rows, d], which cannot be viewed as [b, hq, n, d].
    out = out.reshape({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
    // The mask says it all for SDPA: causal is not needed.
    return with_bias(linear_layer(out, layer.wo), layer.bo);
  }
#endif
  // Queries go in blocks: score memory stays bounded, and under the causal rule a block needs
  // only the keys up to its own last row (half the work of a full square for a long prefill).
  constexpr int64_t kBlock = 256;
  const int64_t past = total - n;
  if (!q_scaled) q = q * q_scale;
  const int threads = kernel_threads();
  // Only alongside the small-row linear kernels: interleaved with multi-threaded OpenBLAS
  // linears, the two thread pools spin against each other (a 16-token forward ran 2.5x slower).
  const bool split_heads = !fused && !in.attention_mass.defined() && q.device().is_cpu() &&
                           n <= kFewQueriesMaxTokens && hkv > 1 && threads > 1 &&
                           cpu_linear_kernel() != CpuLinearKernel::kNone;
  if (fused) {
    // For a few fresh tokens in one block, for longer inputs block by block.
    out = attend_fused_blocks(q, cache.segments(index, total), mask, causal, past, open_slots,
                              threads);
  } else if (split_heads) {
    out = attend_split_heads(q.reshape({b, hkv, groups * n, d}), keys, values, mask,
                             causal ? past : open_slots, threads);
  } else if (n > kBlock) {
    out = torch::empty({b, hq, n, d}, q.options());
  }
  for (int64_t i0 = fused || split_heads ? n : 0; i0 < n; i0 += kBlock) {
    const int64_t rows = std::min(kBlock, n - i0);
    const int64_t visible = causal ? past + i0 + rows : total;
    auto qb = q.narrow(2, i0, rows).reshape({b, hkv, groups * rows, d});
    auto scores = torch::matmul(qb, keys.narrow(2, 0, visible).transpose(-1, -2));
    if (scores.scalar_type() != torch::kFloat32) scores = scores.to(torch::kFloat32);
    // Slots every row of this block sees need no masking: only the rest of the columns is
    // filled (for fresh tokens over assembled modules, that is a few columns out of thousands).
    // (Under the causal rule row i0 already sees every slot before past + i0.)
    const int64_t open = causal ? past + i0 : open_slots;
    if (mask.defined() && open < visible) {
      auto closed = mask.narrow(-2, i0, rows).narrow(-1, open, visible - open).logical_not();
      if (closed.dim() == 3) closed = closed.unsqueeze(1).unsqueeze(1);  // [b, 1, 1, rows, cols]
      scores.view({b, hkv, groups, rows, visible})
          .narrow(-1, open, visible - open)
          .masked_fill_(closed, -std::numeric_limits<float>::infinity());
    }
    auto probs = scores.softmax(-1);
    if (in.attention_mass.defined()) {
      in.attention_mass.narrow(0, 0, visible).add_(probs.sum({0, 1, 2}).to(torch::kCPU));
    }
    auto block = torch::matmul(probs.to(values.scalar_type()), values.narrow(2, 0, visible));
    if (n <= kBlock) {
      out = block;
    } else {
      out.narrow(2, i0, rows).copy_(block.view({b, hq, rows, d}));
    }
  }
  out = out.view({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
  return with_bias(linear_layer(out, layer.wo), layer.bo);
}

LlamaModel::LayerInputs LlamaModel::windowed(const LayerInputs& full,
                                             const torch::Tensor& positions, const KVCache& cache,
                                             int64_t n) const {
  const int64_t window = config_.traits.sliding_window;
  const int64_t b = cache.shape().batch, past = cache.length();
  // Each row's slot positions: the cache's, then the new tokens'.
  auto query = positions.to(torch::kCPU, torch::kInt64).expand({b, n}).contiguous();
  auto keys = torch::empty({b, past + n}, torch::kInt64);
  for (int64_t r = 0; r < b; ++r) {
    const auto& held = cache.row_positions(r);
    if (past > 0) {
      keys[r].narrow(0, 0, past).copy_(torch::tensor(held, torch::kInt64));
    }
  }
  keys.narrow(1, past, n).copy_(query);
  // A slot position of -1 is a slot a batch row leaves empty: the caller's mask hides it anyway.
  auto visible = keys.unsqueeze(1) > (query - window).unsqueeze(2);  // [b, n, past + n]
  if (visible.all().item<bool>()) return full;
  LayerInputs out = full;
  visible = visible.to(full.cos.device());
  if (full.mask.defined()) {
    out.mask = full.mask.logical_and(visible);
  } else {  // a single new token (decoding): every slot but those the window hides
    out.mask = visible;
  }
  out.causal = false;
  out.open_slots =
      out.mask.reshape({-1, past + n}).all(0).to(torch::kInt32).cumprod(0).sum().item<int64_t>();
  return out;
}

torch::Tensor LlamaModel::forward(const torch::Tensor& token_ids_in,
                                  const torch::Tensor& positions_in, KVCache& cache,
                                  const ForwardOptions& options) const {
  auto ids = token_ids_in.dim() == 1 ? token_ids_in.unsqueeze(0) : token_ids_in;
  auto positions = positions_in.dim() == 1 ? positions_in.unsqueeze(0) : positions_in;
  const int64_t b = ids.size(0), n = ids.size(1);
  if (n == 0) throw Error(ErrorKind::kInvalidArgument, "forward needs at least one token");
  if (positions.size(-1) != n) {
    throw Error(ErrorKind::kInvalidArgument, "forward: " + std::to_string(n) + " tokens but " +
                                                 std::to_string(positions.size(-1)) + " positions");
  }
  if (b != cache.shape().batch) {
    throw Error(ErrorKind::kInvalidArgument, "forward: batch does not match the KV cache");
  }
  ids = ids.to(options_.device, torch::kInt64);
  {
    auto bad = (ids < 0).logical_or(ids >= config_.vocab_size);
    if (bad.any().item<bool>()) {
      throw Error(ErrorKind::kInvalidArgument, "token id outside the model's vocabulary of " +
                                                   std::to_string(config_.vocab_size));
    }
  }
  const int64_t past = cache.length();
  torch::Tensor mask = options.attention_mask;
  int64_t open_slots = past;  // leading slots that every new token sees
  if (mask.defined()) {
    const bool shape_ok = (mask.dim() == 2 || (mask.dim() == 3 && mask.size(0) == b)) &&
                          mask.size(-2) == n && mask.size(-1) == past + n;
    if (!shape_ok) {
      const std::string rows = std::to_string(n) + ", " + std::to_string(past + n) + "]";
      throw Error(ErrorKind::kInvalidArgument, "attention mask must be [" + rows + " or [" +
                                                   std::to_string(b) + ", " + rows + " but is " +
                                                   shape_string(mask.sizes()));
    }
    mask = mask.to(options_.device, torch::kBool);
    // The blocked attention masks only the columns after these (SDPA takes the whole mask, and
    // this would cost a device synchronisation there). A forward asked for its attention mass
    // runs the blocked attention even where SDPA is on.
    if (!sdpa_ || options.attention_mass != nullptr) {
      open_slots =
          mask.reshape({-1, past + n}).all(0).to(torch::kInt32).cumprod(0).sum().item<int64_t>();
    }
  } else if (n > 1) {
    // Every cached slot, plus the new tokens causally.
    auto cols = torch::arange(past + n, torch::TensorOptions().device(options_.device));
    auto rows = torch::arange(n, torch::TensorOptions().device(options_.device)).unsqueeze(1);
    mask = cols.unsqueeze(0) <= rows + past;
  }
  const auto first_layer = static_cast<std::size_t>(options.first_layer);
  torch::Tensor x;
  if (options.first_layer != 0) {
    const auto& h = options.hidden;
    if (options.first_layer < 0 || first_layer > layers_.size() || !h.defined() || h.dim() != 3 ||
        h.size(0) != b || h.size(1) != n || h.size(2) != config_.hidden_size) {
      throw Error(ErrorKind::kInvalidArgument,
                  "forward: first_layer " + std::to_string(options.first_layer) +
                      " needs hidden states [" + std::to_string(b) + ", " + std::to_string(n) +
                      ", " + std::to_string(config_.hidden_size) + "] and at most " +
                      std::to_string(layers_.size()) + " layers");
    }
    // A copy: the layers update x in place.
    x = h.to(options_.device, choice_.compute).clone();
  } else {
    auto embedded = embed_.index_select(0, ids.reshape({-1}));
    if (is_q8(embed_)) embedded = dequantize_q8(embedded, config_.hidden_size);
    x = embedded.view({b, n, config_.hidden_size}).to(choice_.compute);
  }
  LayerInputs in;
  // A few rows on the CPU take the fused elementwise steps (promptcache/model/cpu_ops.hpp).
  in.small_ops = !sdpa_ && cpu_small_ops_apply(x);
  in.fused_attention = !sdpa_ && options_.device.is_cpu() && choice_.compute == torch::kFloat32 &&
                       cpu_attention_takes(cache.options(), config_.head_dim);
  in.mask = mask;
  in.causal = !options.attention_mask.defined();
  in.open_slots = open_slots;
  auto [cos, sin] = rope_tables(positions);  // [b or 1, n, d]: one row may serve the batch
  if (in.small_ops) {
    in.cos = cos.expand({b, n, config_.head_dim}).contiguous();
    in.sin = sin.expand({b, n, config_.head_dim}).contiguous();
  } else {
    in.cos = cos.unsqueeze(1).to(choice_.compute);
    in.sin = sin.unsqueeze(1).to(choice_.compute);
  }
  auto norm = [&](const torch::Tensor& t, const torch::Tensor& weight) {
    return in.small_ops ? cpu_rms_norm(t, weight, config_.rms_norm_eps)
                        : rms_norm(t, weight, config_.rms_norm_eps);
  };
  // x and the projections' outputs are this forward's own tensors: updated in place.
  // Layers with a sliding window: the same inputs, with the window in the mask.
  const LayerInputs in_window =
      config_.traits.sliding_window > 0 ? windowed(in, positions, cache, n) : in;
  const std::size_t run_layers =
      options.layers > 0 ? std::min(layers_.size(), static_cast<std::size_t>(options.layers))
                         : layers_.size();
  if (options.attention_mass != nullptr) {
    *options.attention_mass = torch::zeros({static_cast<int64_t>(layers_.size()), past + n},
                                           torch::TensorOptions(torch::kFloat32));
  }
  for (std::size_t i = first_layer; i < run_layers; ++i) {
    const Layer& layer = layers_[i];
    const LayerInputs& layer_in = layer.sliding ? in_window : in;
    if (options.attention_mass != nullptr) {
      LayerInputs with_mass = layer_in;
      with_mass.attention_mass = options.attention_mass->select(0, static_cast<int64_t>(i));
      x.add_(
          attention(layer, static_cast<int64_t>(i), norm(x, layer.input_norm), cache, with_mass));
    } else {
      x.add_(attention(layer, static_cast<int64_t>(i), norm(x, layer.input_norm), cache, layer_in));
    }
    auto h = norm(x, layer.post_norm);
    auto gate = with_bias(linear_layer(h, layer.w_gate), layer.b_gate);
    torch::silu_(gate).mul_(with_bias(linear_layer(h, layer.w_up), layer.b_up));
    x.add_(with_bias(linear_layer(gate, layer.w_down), layer.b_down));
  }
  auto rows = positions.to(torch::kCPU, torch::kInt64).contiguous();
  auto row_positions = [&](int64_t r) {
    const int64_t* p = rows[r].data_ptr<int64_t>();
    return std::vector<int64_t>(p, p + n);
  };
  cache.commit(row_positions(0));
  // Rows of a batch may hold other positions (the sliding window reads them).
  for (int64_t r = 1; r < rows.size(0); ++r) cache.set_row_positions(r, past, row_positions(r));
  if (options.layers > 0) return x;  // hidden states, even when every layer ran
  if (!options.all_logits) x = x.narrow(1, n - 1, 1);
  x = norm(x, final_norm_);
  return linear_layer(x, lm_head_).to(torch::kFloat32);
}

std::pair<torch::Tensor, torch::Tensor> LlamaModel::layer_key_values(
    int64_t index, const torch::Tensor& hidden, const torch::Tensor& positions_in) const {
  if (index < 0 || index >= static_cast<int64_t>(layers_.size()) || hidden.dim() != 3 ||
      hidden.size(2) != config_.hidden_size) {
    throw Error(ErrorKind::kInvalidArgument, "layer_key_values: layer " + std::to_string(index) +
                                                 " of " + std::to_string(layers_.size()) +
                                                 " and hidden states [batch, n, " +
                                                 std::to_string(config_.hidden_size) +
                                                 "] needed, got " + shape_string(hidden.sizes()));
  }
  const Layer& layer = layers_[static_cast<std::size_t>(index)];
  const int64_t b = hidden.size(0), n = hidden.size(1), d = config_.head_dim;
  const int64_t hkv = config_.num_key_value_heads;
  auto positions = positions_in.dim() == 1 ? positions_in.unsqueeze(0) : positions_in;
  auto x =
      rms_norm(hidden.to(options_.device, choice_.compute), layer.input_norm, config_.rms_norm_eps);
  auto k = linear_layer(x, layer.wk);
  auto v = linear_layer(x, layer.wv);
  if (layer.bk.defined()) {
    k.add_(layer.bk);
    v.add_(layer.bv);
  }
  if (layer.k_norm.defined()) k = head_norm(k, layer.k_norm, hkv, config_.rms_norm_eps, false);
  auto [cos, sin] = rope_tables(positions);
  cos = cos.unsqueeze(1).to(choice_.compute);
  sin = sin.unsqueeze(1).to(choice_.compute);
  k = k.view({b, n, hkv, d}).transpose(1, 2);
  v = v.view({b, n, hkv, d}).transpose(1, 2);
  k = k * cos + rotate_half(k) * sin;
  return {k.to(kv_dtype()), v.to(kv_dtype())};
}

int64_t LlamaModel::weight_bytes() const {
  auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  int64_t total = bytes(embed_) + bytes(final_norm_);
  if (!lm_head_.is_same(embed_)) total += bytes(lm_head_);
  for (const Layer& l : layers_) {
    for (const torch::Tensor* t :
         {&l.input_norm, &l.post_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down,
          &l.bq, &l.bk, &l.bv, &l.bo, &l.b_gate, &l.b_up, &l.b_down, &l.q_norm, &l.k_norm}) {
      total += bytes(*t);
    }
  }
  return total;
}

double LlamaModel::prefill_flops(int64_t n, int64_t context) const {
  const double h = config_.hidden_size, d = config_.head_dim, f = config_.intermediate_size;
  const double hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const double per_token_matmul = 2.0 * (h * hq * d + 2.0 * h * hkv * d + hq * d * h + 3.0 * h * f);
  // Each token i attends to context + i + 1 slots: QK^T and PV, 2 FLOPs per multiply-add.
  const double attended = n * static_cast<double>(context) + n * (n + 1) / 2.0;
  const double attention = 4.0 * hq * d * attended;
  return config_.num_hidden_layers * (n * per_token_matmul + attention) +
         2.0 * h * config_.vocab_size;  // lm_head for the last token only
}

}  // namespace promptcache
