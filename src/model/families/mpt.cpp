// mpt.cpp — MPT's checkpoint (MosaicML / HF MptForCausalLM): transformer.wte (also the output
// projection), per block norm_1, attn.Wqkv (fused [q; k; v]) and attn.out_proj, norm_2,
// ffn.up_proj and ffn.down_proj, and norm_f; biases (norms' included) only when no_bias is false.
#include "family_weights.hpp"

namespace promptcache::family_weights {

std::vector<Entry> mpt_entries(const ModelConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, hq = c.num_attention_heads;
  const int64_t qkv = (hq + 2 * c.num_key_value_heads) * c.head_dim;
  const bool bias = c.traits.qkv_bias;
  const std::string t = "transformer.";
  std::vector<Entry> e = {
      {t + "wte.weight", "model.embed_tokens.weight", {c.vocab_size, h}, Kind::kMatrix},
      {t + "norm_f.weight", "model.norm.weight", {h}, Kind::kNorm}};
  if (c.traits.norm_bias) e.push_back({t + "norm_f.bias", "model.norm.bias", {h}, Kind::kBias});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = t + "blocks." + std::to_string(i) + ".";
    const std::string l = "model.layers." + std::to_string(i) + ".";
    e.push_back({p + "norm_1.weight", l + "input_layernorm.weight", {h}, Kind::kNorm});
    e.push_back({p + "attn.Wqkv.weight", l + "self_attn.", {qkv, h}, Kind::kFusedQkv});
    e.push_back({p + "attn.out_proj.weight", l + "self_attn.o_proj.weight", {h, h}, Kind::kMatrix});
    e.push_back({p + "norm_2.weight", l + "post_attention_layernorm.weight", {h}, Kind::kNorm});
    e.push_back({p + "ffn.up_proj.weight", l + "mlp.up_proj.weight", {f, h}, Kind::kMatrix});
    e.push_back({p + "ffn.down_proj.weight", l + "mlp.down_proj.weight", {h, f}, Kind::kMatrix});
    if (c.traits.norm_bias) {
      e.push_back({p + "norm_1.bias", l + "input_layernorm.bias", {h}, Kind::kBias});
      e.push_back({p + "norm_2.bias", l + "post_attention_layernorm.bias", {h}, Kind::kBias});
    }
    if (bias) {
      e.push_back({p + "attn.Wqkv.bias", l + "self_attn.", {qkv}, Kind::kFusedQkvBias});
      e.push_back({p + "attn.out_proj.bias", l + "self_attn.o_proj.bias", {h}, Kind::kBias});
      e.push_back({p + "ffn.up_proj.bias", l + "mlp.up_proj.bias", {f}, Kind::kBias});
      e.push_back({p + "ffn.down_proj.bias", l + "mlp.down_proj.bias", {h}, Kind::kBias});
    }
  }
  return e;
}

}  // namespace promptcache::family_weights
