// mpt_config.cpp — MPT's config.json (HF MptConfig, MosaicML's llm-foundry): d_model, n_heads,
// n_layers, expansion_ratio, max_seq_len, attn_config {alibi, alibi_bias_max}, no_bias; a
// LayerNorm (with bias only when no_bias is false), ALiBi with MPT's slopes, a concatenated Wqkv
// [q; k; v], an erf-GELU MLP and embeddings tied to the output. Variants the layer does not run
// (learned positions, clip_qkv, qk_ln, a softmax_scale or logit_scale of their own) are refused.
#include "family_configs.hpp"

namespace promptcache::family_configs {
namespace {

using config_reader::fail;
using config_reader::json;
using config_reader::Reader;

void read_mpt(const Reader& r, ModelConfig& c, const std::string& origin) {
  c.hidden_size = r.integer("d_model");
  c.num_hidden_layers = r.integer("n_layers");
  c.num_attention_heads = r.integer("n_heads");
  c.num_key_value_heads = c.num_attention_heads;
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
    fail(origin, "field 'n_heads' (" + std::to_string(c.num_attention_heads) +
                     ") must be positive and divide field 'd_model' (" +
                     std::to_string(c.hidden_size) + ")");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  const int64_t ratio = scaled_size(r.integer("expansion_ratio", 4), 1, "expansion_ratio", origin);
  c.intermediate_size = scaled_size(c.hidden_size, ratio, "d_model", origin);
  c.vocab_size = r.integer("vocab_size");
  c.max_position_embeddings = r.integer("max_seq_len", 2048);
  c.rms_norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = true;  // MPT's output projection is its embedding table
  if (r.has("logit_scale")) fail(origin, "field 'logit_scale' is set; it is not supported");
  const std::string norm = r.string("norm_type", "low_precision_layernorm");
  if (norm != "low_precision_layernorm" && norm != "layernorm") {
    fail(origin, "field 'norm_type' is '" + norm + "' (supported: low_precision_layernorm)");
  }
  double bias_max = 8.0;
  if (r.has("attn_config")) {
    const json& a = r["attn_config"];
    if (!a.is_object()) r.type_error("attn_config", "an object", a);
    const Reader ar(a, origin);
    if (!ar.boolean("alibi", true)) {
      fail(origin, "field 'attn_config.alibi' is false; only ALiBi MPT models are supported");
    }
    bias_max = ar.number("alibi_bias_max", 8.0);
    if (ar.has("clip_qkv")) fail(origin, "field 'attn_config.clip_qkv' is set; not supported");
    if (ar.boolean("qk_ln", false))
      fail(origin, "field 'attn_config.qk_ln' is true; not supported");
    if (ar.has("softmax_scale")) {
      fail(origin, "field 'attn_config.softmax_scale' is set; only 1/sqrt(head_dim) is supported");
    }
    if (ar.has("kv_n_heads") && ar.integer("kv_n_heads") != c.num_attention_heads) {
      fail(origin, "field 'attn_config.kv_n_heads' differs from n_heads; not supported");
    }
  }
  if (!(bias_max > 0)) fail(origin, "field 'attn_config.alibi_bias_max' must be positive");
  const bool bias = !r.boolean("no_bias", true);
  FamilyTraits& t = c.traits;
  t.norm = NormKind::kLayerNorm;
  t.norm_bias = bias;
  t.position = PositionKind::kAlibi;
  t.alibi_bias_max = bias_max;
  t.mlp = MlpKind::kGelu;
  t.qkv_bias = t.o_bias = t.mlp_bias = bias;
  t.fused_qkv = FusedQkv::kConcatenated;
}

void write_mpt(const ModelConfig& c, json& j) {
  j["d_model"] = c.hidden_size;
  j["n_layers"] = c.num_hidden_layers;
  j["n_heads"] = c.num_attention_heads;
  j["expansion_ratio"] = c.intermediate_size / c.hidden_size;
  j["vocab_size"] = c.vocab_size;
  j["max_seq_len"] = c.max_position_embeddings;
  j["layer_norm_epsilon"] = c.rms_norm_eps;
  j["no_bias"] = !c.traits.qkv_bias;
  j["norm_type"] = "low_precision_layernorm";
  j["attn_config"] = {{"alibi", true},
                      {"alibi_bias_max", c.traits.alibi_bias_max},
                      {"attn_type", "multihead_attention"},
                      {"clip_qkv", nullptr},
                      {"qk_ln", false},
                      {"softmax_scale", nullptr}};
}

}  // namespace

const FamilyConfig kMpt = {"MPTForCausalLM", "mpt", read_mpt, write_mpt};

}  // namespace promptcache::family_configs
