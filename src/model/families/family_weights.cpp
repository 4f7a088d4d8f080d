// family_weights.cpp — reading a BLOOM, MPT or Falcon checkpoint through its family's table
// (family_weights.hpp): tensors renamed into the Llama layer's names, fused QKV matrices split
// into q_proj, k_proj and v_proj by the layout the config names (FusedQkv).
#include "family_weights.hpp"

#include "promptcache/error.hpp"

namespace promptcache::family_weights {
namespace {

std::string shape_text(at::IntArrayRef shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// q, k, v rows of a fused matrix or bias t (rows along dim 0).
std::vector<torch::Tensor> split_qkv(const torch::Tensor& t, const ModelConfig& c) {
  const int64_t hq = c.num_attention_heads, hkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t g = hq / hkv;
  std::vector<int64_t> tail(t.sizes().begin() + 1, t.sizes().end());
  auto shaped = [&](std::vector<int64_t> lead) {
    lead.insert(lead.end(), tail.begin(), tail.end());
    return lead;
  };
  auto rows = [&](const torch::Tensor& x, int64_t n) { return x.reshape(shaped({n})); };
  switch (c.traits.fused_qkv) {
    case FusedQkv::kHeadsInterleaved: {  // [heads, 3, d]
      auto v = t.view(shaped({hq, 3, d}));
      return {rows(v.select(1, 0), hq * d), rows(v.select(1, 1), hq * d),
              rows(v.select(1, 2), hq * d)};
    }
    case FusedQkv::kMultiQuery: {  // [heads + 2, d]
      auto v = t.view(shaped({hq + 2, d}));
      return {rows(v.narrow(0, 0, hq), hq * d), rows(v.select(0, hq), d),
              rows(v.select(0, hq + 1), d)};
    }
    case FusedQkv::kGrouped: {  // [kv_heads, q_per_kv + 2, d]
      auto v = t.view(shaped({hkv, g + 2, d}));
      return {rows(v.narrow(1, 0, g), hq * d), rows(v.select(1, g), hkv * d),
              rows(v.select(1, g + 1), hkv * d)};
    }
    case FusedQkv::kConcatenated:  // [q; k; v]
      return {t.narrow(0, 0, hq * d), t.narrow(0, hq * d, hkv * d),
              t.narrow(0, (hq + hkv) * d, hkv * d)};
    case FusedQkv::kSeparate:
      break;
  }
  throw Error(ErrorKind::kModel, "the config names no fused QKV layout for " + c.architecture);
}

}  // namespace

std::vector<Entry> entries(const ModelConfig& config) {
  if (config.architecture == "BloomForCausalLM") return bloom_entries(config);
  if (config.architecture == "MPTForCausalLM") return mpt_entries(config);
  if (config.architecture == "FalconForCausalLM") return falcon_entries(config);
  return {};
}

std::map<std::string, torch::Tensor> layer_tensors(const ModelConfig& config,
                                                   const std::map<std::string, torch::Tensor>& w,
                                                   const std::string& origin) {
  const auto table = entries(config);
  if (table.empty()) return w;
  std::map<std::string, torch::Tensor> out;
  const std::string prefix = "transformer.";
  for (const Entry& e : table) {
    auto it = w.find(e.source);
    // Some checkpoints (bigscience/bloom-560m) name their tensors without the prefix.
    if (it == w.end() && e.source.rfind(prefix, 0) == 0)
      it = w.find(e.source.substr(prefix.size()));
    if (it == w.end()) {
      throw Error(ErrorKind::kModel, "tensor is missing from the checkpoint",
                  {origin, 0, 0, "tensor '" + e.source + "'"});
    }
    const torch::Tensor& t = it->second;
    if (t.sizes() != at::IntArrayRef(e.shape)) {
      throw Error(ErrorKind::kModel,
                  "tensor has shape " + shape_text(t.sizes()) + " but config.json implies " +
                      shape_text(e.shape),
                  {origin, 0, 0, "tensor '" + e.source + "'"});
    }
    if (e.kind == Kind::kFusedQkv || e.kind == Kind::kFusedQkvBias) {
      const char* suffix = e.kind == Kind::kFusedQkv ? "_proj.weight" : "_proj.bias";
      const auto parts = split_qkv(t, config);
      out[e.target + "q" + suffix] = parts[0];
      out[e.target + "k" + suffix] = parts[1];
      out[e.target + "v" + suffix] = parts[2];
    } else {
      out[e.target] = t;
    }
  }
  return out;
}

}  // namespace promptcache::family_weights
