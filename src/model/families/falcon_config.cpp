// falcon_config.cpp — Falcon's config.json (HF FalconConfig; RefinedWeb's n_layer/n_head read as
// well): rotary positions, LayerNorms with bias, an erf-GELU MLP of ffn_hidden_size (4 x
// hidden), biases on the linear layers when `bias`, and the three layouts: Falcon-7B (parallel
// attention and MLP from one norm, multi_query: one KV head, QKV [heads + 2, head_dim]); the
// new_decoder_architecture of 40B/180B (num_kv_heads grouped KV heads, QKV [kv_heads, q_per_kv +
// 2, head_dim], ln_attn and ln_mlp, or one norm when num_ln_in_parallel_attn is 1); and neither
// (QKV [heads, 3, head_dim], parallel or not). ALiBi Falcons (alibi: true) are refused.
#include "family_configs.hpp"

namespace promptcache::family_configs {
namespace {

using config_reader::fail;
using config_reader::json;
using config_reader::Reader;

void read_falcon(const Reader& r, ModelConfig& c, const std::string& origin) {
  c.hidden_size = r.integer("hidden_size");
  c.num_hidden_layers = integer_of(r, {"num_hidden_layers", "n_layer"});
  c.num_attention_heads = integer_of(r, {"num_attention_heads", "n_head"});
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
    fail(origin, "field 'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
                     ") must be positive and divide field 'hidden_size' (" +
                     std::to_string(c.hidden_size) + ")");
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = r.has("ffn_hidden_size")
                            ? r.integer("ffn_hidden_size")
                            : scaled_size(c.hidden_size, 4, "hidden_size", origin);
  c.vocab_size = r.integer("vocab_size");
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
  c.rms_norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", true);
  if (r.boolean("alibi", false)) {
    fail(origin, "field 'alibi' is true; only rotary Falcon models are supported");
  }
  const std::string act = r.string("activation", "gelu");
  if (act != "gelu") fail(origin, "field 'activation' is '" + act + "'; only 'gelu' is supported");
  const bool new_arch = r.boolean("new_decoder_architecture", false);
  const bool multi_query = r.boolean("multi_query", true);
  const bool parallel = r.boolean("parallel_attn", true);
  FamilyTraits& t = c.traits;
  t.norm = NormKind::kLayerNorm;
  t.norm_bias = true;
  t.mlp = MlpKind::kGelu;
  t.qkv_bias = t.o_bias = t.mlp_bias = r.boolean("bias", false);
  if (new_arch) {
    c.num_key_value_heads = r.integer("num_kv_heads", c.num_attention_heads);
    t.fused_qkv = FusedQkv::kGrouped;
    t.parallel_residual = true;
    const int64_t norms = r.integer("num_ln_in_parallel_attn", 2);
    if (norms != 1 && norms != 2) fail(origin, "field 'num_ln_in_parallel_attn' must be 1 or 2");
    t.mlp_norm = norms == 2;
  } else {
    c.num_key_value_heads = multi_query ? 1 : c.num_attention_heads;
    t.fused_qkv = multi_query ? FusedQkv::kMultiQuery : FusedQkv::kHeadsInterleaved;
    t.parallel_residual = parallel;
    t.mlp_norm = !parallel;
  }
}

void write_falcon(const ModelConfig& c, json& j) {
  const FamilyTraits& t = c.traits;
  const bool new_arch = t.fused_qkv == FusedQkv::kGrouped;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["ffn_hidden_size"] = c.intermediate_size;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["layer_norm_epsilon"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["alibi"] = false;
  j["activation"] = "gelu";
  j["bias"] = t.qkv_bias;
  j["new_decoder_architecture"] = new_arch;
  j["multi_query"] = t.fused_qkv == FusedQkv::kMultiQuery;
  j["parallel_attn"] = t.parallel_residual;
  if (new_arch) {
    j["num_kv_heads"] = c.num_key_value_heads;
    j["num_ln_in_parallel_attn"] = t.mlp_norm ? 2 : 1;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
}

}  // namespace

const FamilyConfig kFalcon = {"FalconForCausalLM", "falcon", read_falcon, write_falcon};

}  // namespace promptcache::family_configs
