// layer_ops.cpp — the shared pieces of a decoder layer (layer_ops.hpp): RMSNorm, biases,
// per-head norms, RoPE's rotate-half and inverse frequencies (rope_scaling), and the rule that
// decides whether a model runs scaled_dot_product_attention. The loader (llama_load.cpp), the
// attention paths (llama_attention.cpp) and the forward (llama.cpp) all use them.
#include "layer_ops.hpp"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <cstdlib>

#include "promptcache/error.hpp"
#include "promptcache/model/cpu_ops.hpp"

namespace promptcache::layer_ops {

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

torch::Tensor with_bias(torch::Tensor y, const torch::Tensor& bias) {
  return bias.defined() ? y.add_(bias) : y;
}

torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& weight, int64_t heads,
                        double eps, bool small_ops) {
  const int64_t b = x.size(0), n = x.size(1), d = x.size(2) / heads;
  auto per_head = x.reshape({b, n * heads, d});
  auto normed = small_ops ? cpu_rms_norm(per_head, weight, eps) : rms_norm(per_head, weight, eps);
  return normed.view({b, n, heads * d});
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, double eps) {
  auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat32) : t; };
  auto y = at::layer_norm(f32(x), {x.size(-1)}, f32(weight), f32(bias), eps);
  return y.to(x.scalar_type());
}

torch::Tensor slot_positions(const torch::Tensor& positions, const KVCache& cache, int64_t n) {
  const int64_t b = cache.shape().batch, past = cache.length();
  auto keys = torch::empty({b, past + n}, torch::kInt64);
  for (int64_t r = 0; r < b; ++r) {
    const auto& held = cache.row_positions(r);
    if (past > 0) keys[r].narrow(0, 0, past).copy_(torch::tensor(held, torch::kInt64));
  }
  keys.narrow(1, past, n).copy_(positions.to(torch::kCPU, torch::kInt64).expand({b, n}));
  return keys;
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

}  // namespace promptcache::layer_ops
