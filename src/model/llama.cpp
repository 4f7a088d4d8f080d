// llama.cpp — the forward pass of every family LlamaModel runs: embedding (and BLOOM's norm on
// it), the layers (attention in llama_attention.cpp; the family's norm and MLP here, one after
// the other or in parallel as FamilyTraits say), the final norm and the logits; the RoPE tables
// (identity under ALiBi); the keys and values of one layer for recompute.hpp; the FLOP count.
// Loading is in llama_load.cpp, the shared layer pieces in layer_ops.cpp.
#include "promptcache/model/llama.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "layer_ops.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/cpu_ops.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/q8_weights.hpp"

namespace promptcache {

using layer_ops::head_norm;
using layer_ops::rms_norm;
using layer_ops::rotate_half;
using layer_ops::shape_string;
using layer_ops::with_bias;

std::pair<torch::Tensor, torch::Tensor> LlamaModel::rope_tables(
    const torch::Tensor& positions) const {
  if (alibi_slopes_.defined()) {  // ALiBi: no rotation (x * 1 + rotate_half(x) * 0 is x)
    auto shape = positions.sizes().vec();
    shape.push_back(config_.head_dim);
    const auto f32 = torch::TensorOptions().device(inv_freq_.device()).dtype(torch::kFloat32);
    return {torch::ones(shape, f32), torch::zeros(shape, f32)};
  }
  // As HF: float32 angles, then cos/sin, duplicated for the two rotated halves.
  auto freqs = positions.to(inv_freq_.device(), torch::kFloat32).unsqueeze(-1) * inv_freq_;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
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
    // GGML blocks: only the looked-up rows are dequantized (the table stays in blocks).
    if (ggml::quant_type_of(embed_)) embedded = ggml::dequantize(embedded);
    x = embedded.view({b, n, config_.hidden_size}).to(choice_.compute);
    if (embed_norm_.defined()) x = norm(x, embed_norm_, embed_norm_bias_, false);  // BLOOM
  }
  LayerInputs in;
  // A few rows on the CPU take the fused elementwise steps (promptcache/model/cpu_ops.hpp).
  in.small_ops = !sdpa_ && cpu_small_ops_apply(x);
  in.fused_attention = !sdpa_ && options_.device.is_cpu() && choice_.compute == torch::kFloat32 &&
                       cpu_attention_takes(cache.options(), config_.head_dim);
  in.mask = mask;
  in.causal = !options.attention_mask.defined();
  in.open_slots = open_slots;
  if (alibi_slopes_.defined()) {  // ALiBi: from the positions of the slots and the new tokens
    in.key_positions =
        layer_ops::slot_positions(positions, cache, n).to(options_.device, torch::kFloat32);
    in.query_positions = positions.to(options_.device, torch::kFloat32).expand({b, n}).contiguous();
  }
  auto [cos, sin] = rope_tables(positions);  // [b or 1, n, d]: one row may serve the batch
  if (in.small_ops) {
    in.cos = cos.expand({b, n, config_.head_dim}).contiguous();
    in.sin = sin.expand({b, n, config_.head_dim}).contiguous();
  } else {
    in.cos = cos.unsqueeze(1).to(choice_.compute);
    in.sin = sin.unsqueeze(1).to(choice_.compute);
  }
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
  const bool small = in.small_ops;
  for (std::size_t i = first_layer; i < run_layers; ++i) {
    const Layer& layer = layers_[i];
    const LayerInputs& layer_in = layer.sliding ? in_window : in;
    const auto h = norm(x, layer.input_norm, layer.input_norm_bias, small);
    torch::Tensor attended;
    if (options.attention_mass != nullptr) {
      LayerInputs with_mass = layer_in;
      with_mass.attention_mass = options.attention_mass->select(0, static_cast<int64_t>(i));
      attended = attention(layer, static_cast<int64_t>(i), h, cache, with_mass);
    } else {
      attended = attention(layer, static_cast<int64_t>(i), h, cache, layer_in);
    }
    if (config_.traits.parallel_residual) {
      // Falcon: the MLP reads the layer's input too (through its own norm, or the attention's).
      const auto h_mlp =
          layer.post_norm.defined() ? norm(x, layer.post_norm, layer.post_norm_bias, small) : h;
      x.add_(attended).add_(mlp(layer, h_mlp));
    } else {
      x.add_(attended);
      x.add_(mlp(layer, norm(x, layer.post_norm, layer.post_norm_bias, small)));
    }
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
  x = norm(x, final_norm_, final_norm_bias_, small);
  return linear_layer(x, lm_head_).to(torch::kFloat32);
}

torch::Tensor LlamaModel::norm(const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, bool small_ops) const {
  const double eps = config_.rms_norm_eps;
  switch (config_.traits.norm) {
    case NormKind::kLayerNorm:
      return layer_ops::layer_norm(x, weight, bias, eps);
    case NormKind::kRms:
      break;
  }
  return small_ops ? cpu_rms_norm(x, weight, eps) : rms_norm(x, weight, eps);
}

torch::Tensor LlamaModel::mlp(const Layer& layer, const torch::Tensor& h) const {
  auto up = with_bias(linear_layer(h, layer.w_up), layer.b_up);
  switch (config_.traits.mlp) {
    case MlpKind::kGelu:
      up = at::gelu(up);
      break;
    case MlpKind::kGeluTanh:
      up = at::gelu(up, "tanh");
      break;
    case MlpKind::kGatedSilu: {
      auto gate = with_bias(linear_layer(h, layer.w_gate), layer.b_gate);
      up = torch::silu_(gate).mul_(up);
      break;
    }
  }
  return with_bias(linear_layer(up, layer.w_down), layer.b_down);
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
  auto x = norm(hidden.to(options_.device, choice_.compute), layer.input_norm,
                layer.input_norm_bias, false);
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

double LlamaModel::prefill_flops(int64_t n, int64_t context) const {
  const double h = config_.hidden_size, d = config_.head_dim, f = config_.intermediate_size;
  const double hq = config_.num_attention_heads, hkv = config_.num_key_value_heads;
  const double mlp_matrices = config_.traits.mlp == MlpKind::kGatedSilu ? 3.0 : 2.0;
  const double per_token_matmul =
      2.0 * (h * hq * d + 2.0 * h * hkv * d + hq * d * h + mlp_matrices * h * f);
  // Each token i attends to context + i + 1 slots: QK^T and PV, 2 FLOPs per multiply-add.
  const double attended = n * static_cast<double>(context) + n * (n + 1) / 2.0;
  const double attention = 4.0 * hq * d * attended;
  return config_.num_hidden_layers * (n * per_token_matmul + attention) +
         2.0 * h * config_.vocab_size;  // lm_head for the last token only
}

}  // namespace promptcache
