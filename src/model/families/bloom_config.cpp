// bloom_config.cpp — BLOOM's config.json (HF BloomConfig): hidden_size (or n_embed), n_layer,
// n_head, layer_norm_epsilon; a LayerNorm with bias everywhere and one on the embeddings, ALiBi
// with BLOOM's slopes, a fused query_key_value [heads, 3, head_dim], a tanh-GELU MLP of 4 x
// hidden, biases on every linear layer and embeddings tied to the output.
#include "family_configs.hpp"

namespace promptcache::family_configs {
namespace {

using config_reader::fail;

void read_bloom(const config_reader::Reader& r, ModelConfig& c, const std::string& origin) {
  c.hidden_size = integer_of(r, {"hidden_size", "n_embed"});
  c.num_hidden_layers = integer_of(r, {"n_layer", "num_hidden_layers"});
  c.num_attention_heads = integer_of(r, {"n_head", "num_attention_heads"});
  c.num_key_value_heads = c.num_attention_heads;
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
    fail(origin, "field 'n_head' (" + std::to_string(c.num_attention_heads) +
                     ") must be positive and divide field 'hidden_size' (" +
                     std::to_string(c.hidden_size) + ")");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = scaled_size(c.hidden_size, 4, "hidden_size", origin);
  c.vocab_size = r.integer("vocab_size");
  // ALiBi has no trained length; seq_length is the one BLOOM was trained at.
  c.max_position_embeddings = r.integer("seq_length", 2048);
  c.rms_norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  if (r.boolean("apply_residual_connection_post_layernorm", false)) {
    fail(origin,
         "field 'apply_residual_connection_post_layernorm' is true; only BLOOM's released layout "
         "(false) is supported");
  }
  FamilyTraits& t = c.traits;
  t.norm = NormKind::kLayerNorm;
  t.norm_bias = true;
  t.embed_norm = true;
  t.position = PositionKind::kAlibi;
  t.alibi_bias_max = 0.0;
  t.mlp = MlpKind::kGeluTanh;
  t.qkv_bias = t.o_bias = t.mlp_bias = true;
  t.fused_qkv = FusedQkv::kHeadsInterleaved;
}

void write_bloom(const ModelConfig& c, config_reader::json& j) {
  j["hidden_size"] = c.hidden_size;
  j["n_layer"] = c.num_hidden_layers;
  j["n_head"] = c.num_attention_heads;
  j["vocab_size"] = c.vocab_size;
  j["seq_length"] = c.max_position_embeddings;
  j["layer_norm_epsilon"] = c.rms_norm_eps;
  j["apply_residual_connection_post_layernorm"] = false;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
}

}  // namespace

const FamilyConfig kBloom = {"BloomForCausalLM", "bloom", read_bloom, write_bloom};

}  // namespace promptcache::family_configs
