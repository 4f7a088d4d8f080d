// bloom.cpp — BLOOM's checkpoint (HF BloomForCausalLM): word_embeddings with their LayerNorm,
// per layer input_layernorm, self_attention.query_key_value (fused [heads, 3, head_dim], with
// bias) and dense, post_attention_layernorm, mlp.dense_h_to_4h and dense_4h_to_h (with biases),
// and ln_f; lm_head only when the config unties it.
#include "family_weights.hpp"

namespace promptcache::family_weights {

std::vector<Entry> bloom_entries(const ModelConfig& c) {
  const int64_t h = c.hidden_size, f = c.intermediate_size, hq = c.num_attention_heads;
  const int64_t qkv = (hq + 2 * c.num_key_value_heads) * c.head_dim;
  const std::string t = "transformer.";
  std::vector<Entry> e = {
      {t + "word_embeddings.weight", "model.embed_tokens.weight", {c.vocab_size, h}, Kind::kMatrix},
      {t + "word_embeddings_layernorm.weight", "model.embed_norm.weight", {h}, Kind::kNorm},
      {t + "word_embeddings_layernorm.bias", "model.embed_norm.bias", {h}, Kind::kBias},
      {t + "ln_f.weight", "model.norm.weight", {h}, Kind::kNorm},
      {t + "ln_f.bias", "model.norm.bias", {h}, Kind::kBias}};
  if (!c.tie_word_embeddings) {
    e.push_back({"lm_head.weight", "lm_head.weight", {c.vocab_size, h}, Kind::kMatrix});
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = t + "h." + std::to_string(i) + ".";
    const std::string l = "model.layers." + std::to_string(i) + ".";
    e.push_back({p + "input_layernorm.weight", l + "input_layernorm.weight", {h}, Kind::kNorm});
    e.push_back({p + "input_layernorm.bias", l + "input_layernorm.bias", {h}, Kind::kBias});
    e.push_back(
        {p + "self_attention.query_key_value.weight", l + "self_attn.", {qkv, h}, Kind::kFusedQkv});
    e.push_back(
        {p + "self_attention.query_key_value.bias", l + "self_attn.", {qkv}, Kind::kFusedQkvBias});
    e.push_back(
        {p + "self_attention.dense.weight", l + "self_attn.o_proj.weight", {h, h}, Kind::kMatrix});
    e.push_back({p + "self_attention.dense.bias", l + "self_attn.o_proj.bias", {h}, Kind::kBias});
    e.push_back({p + "post_attention_layernorm.weight",
                 l + "post_attention_layernorm.weight",
                 {h},
                 Kind::kNorm});
    e.push_back({p + "post_attention_layernorm.bias",
                 l + "post_attention_layernorm.bias",
                 {h},
                 Kind::kBias});
    e.push_back({p + "mlp.dense_h_to_4h.weight", l + "mlp.up_proj.weight", {f, h}, Kind::kMatrix});
    e.push_back({p + "mlp.dense_h_to_4h.bias", l + "mlp.up_proj.bias", {f}, Kind::kBias});
    e.push_back(
        {p + "mlp.dense_4h_to_h.weight", l + "mlp.down_proj.weight", {h, f}, Kind::kMatrix});
    e.push_back({p + "mlp.dense_4h_to_h.bias", l + "mlp.down_proj.bias", {h}, Kind::kBias});
  }
  return e;
}

}  // namespace promptcache::family_weights
